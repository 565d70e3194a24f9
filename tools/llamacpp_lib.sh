# Sourced by the scripts that run llama.cpp beside Ember (tests/cli/*peer*.sh, bench/cpu.sh).
#
# need_llamacpp JS_DIR LOG: node-llama-cpp 3.21.1 (llama.cpp's CPU build) installed under
# JS_DIR/node_modules, installing it with npm when it is not there (npm's output in LOG). Prints
# "FAIL: ..." and returns 1 when node or npm is missing or the install fails.
need_llamacpp() {
  local js=$1 log=$2
  command -v node >/dev/null && command -v npm >/dev/null ||
    { echo "FAIL: node and npm are needed for the llama.cpp comparison (tools/deps.sh --with-node)"; return 1; }
  grep -qs '"version": "3.21.1"' "$js/node_modules/node-llama-cpp/package.json" && return 0
  npm install --prefix "$js" --no-audit --no-fund --loglevel=error -E --omit=optional \
    node-llama-cpp@3.21.1 @node-llama-cpp/linux-x64@3.21.1 >"$log" 2>&1 ||
    { cat "$log"; echo "FAIL: npm install node-llama-cpp"; return 1; }
}
