#!/usr/bin/env bash
# Runs the client tests in this folder against a running server:
#   tests/js/run.sh BASE_URL MODEL API_KEY WORK_DIR [SCRIPT...]
# (the scripts by name without .mjs; openai_client, anthropic_client and raw_http when none are given)
# The official client packages (pinned) are installed by npm into WORK_DIR/node_modules (an
# ignored build folder), and the scripts are copied beside them so that Node resolves them there.
set -u
url=$1 model=$2 key=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
packages=(openai@6.30.1 @anthropic-ai/sdk@1.14.0)
command -v node >/dev/null && command -v npm >/dev/null || {
  echo "FAIL: node and npm are needed for the client tests (tools/deps.sh --with-node installs them)"; exit 1; }
mkdir -p "$work"
installed() { # name version
  [ -f "$work/node_modules/$1/package.json" ] && grep -q "\"version\": \"$2\"" "$work/node_modules/$1/package.json"
}
if ! installed openai 6.30.1 || ! installed @anthropic-ai/sdk 1.14.0; then
  npm install --prefix "$work" --no-audit --no-fund --no-save --loglevel=error "${packages[@]}" >"$work/npm.log" 2>&1 || {
    echo "FAIL: npm install ${packages[*]} failed:"; tail -20 "$work/npm.log"; exit 1; }
fi
cp "$here"/*.mjs "$work"/
status=0
scripts=("${@:5}")
[ ${#scripts[@]} -gt 0 ] || scripts=(openai_client anthropic_client raw_http)
for script in "${scripts[@]}"; do
  echo "== $script"
  node "$work/$script.mjs" "$url" "$model" "$key" || status=1
done
exit $status
