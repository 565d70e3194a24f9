#!/usr/bin/env bash
# Codex CLI (npm @openai/codex, pinned; a native binary in the package) runs `codex exec` turns
# against `ember serve` through a custom provider with wire_api = "responses":
#   bash tests/js/codex_exec.sh EMBER_EXE BUILD_DIR
# Codex talks to the server through tests/js/codex_proxy.mjs, which records every request.
#   1. A plain turn: codex exits 0 with an answer, reports no protocol error, and every request was
#      a 200 on /v1/responses.
#   2. A turn with a tool call: the proxy sends the turn's first request with tool_choice naming
#      Codex's command tool (exec_command) and that tool's arguments narrowed to one command, as a
#      client that wants the call would (the project's small model never chooses a tool by itself).
#      Codex must run the command and send its result back as a function_call_output with the
#      call's call_id and the command's output, and the turn must end with an answer.
# Codex's own instructions are about 10,000 tokens, so the project's model is served with a context
# past its trained 1,024 (the answers are nonsense; the protocol is what is checked). Codex's
# sandbox is off for the tool turn (`--dangerously-bypass-approvals-and-sandbox`): the one command
# it can run is the echo below, and a container may not allow the sandbox's namespaces.
set -u
ember=$(realpath "$1") build=$(cd "$2" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
model=$(cd "$here/../../models" && pwd)/ember-wordnet-21m.Q4_K_M.gguf
work=$build/js-codex
version=0.171.0
mkdir -p "$work/home" "$work/project"
fail() { echo "FAIL: $*"; exit 1; }
command -v node >/dev/null && command -v npm >/dev/null || fail "node and npm are needed (tools/deps.sh --with-node installs them)"
grep -qs "\"version\": \"$version\"" "$work/node_modules/@openai/codex/package.json" ||
  npm install --prefix "$work" --no-audit --no-fund --no-save --loglevel=error "@openai/codex@$version" >"$work/npm.log" 2>&1 ||
  fail "npm install @openai/codex@$version: $(tail -5 "$work/npm.log")"
. "$here/../../tools/serve_lib.sh"
start_server "$work/serve.log" "$ember" serve -m "$model" --port 0 --api-key sk-ember --ctx 32768 --kv-sequences 2 --device cpu ||
  fail "ember serve did not start"

proxy_pid=
stop_proxy() { [ -n "$proxy_pid" ] && kill "$proxy_pid" 2>/dev/null; wait "$proxy_pid" 2>/dev/null; proxy_pid=; }
# Starts the proxy (arguments: the log file, then FORCE_TOOL FORCED_ARGUMENTS_JSON or nothing) and
# points Codex's provider at it.
start_proxy() {
  local log=$1
  shift
  rm -f "$log" "$work/proxy.port"
  node "$here/codex_proxy.mjs" "$url" "$log" "$work/proxy.port" "$@" >"$work/proxy.out" 2>&1 &
  proxy_pid=$!
  for _ in $(seq 100); do [ -s "$work/proxy.port" ] && break; sleep 0.1; done
  [ -s "$work/proxy.port" ] || fail "the proxy did not start: $(cat "$work/proxy.out")"
  cat >"$work/home/config.toml" <<TOML
model = "ember-wordnet-21m"
model_provider = "ember"

[model_providers.ember]
name = "Ember"
base_url = "http://127.0.0.1:$(cat "$work/proxy.port")/v1"
wire_api = "responses"
env_key = "EMBER_API_KEY"
TOML
}
trap 'stop_proxy; [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null' EXIT
codex() { # codex exec ARGS... > $work/codex.log
  (cd "$work/project" && CODEX_HOME="$work/home" EMBER_API_KEY=sk-ember timeout 300 \
    "$work/node_modules/.bin/codex" exec --skip-git-repo-check "$@" </dev/null >"$work/codex.log" 2>&1)
}
# Every logged request was a 200 on /v1/responses, and there were at least $2.
all_ok() { # log minimum
  node -e 'const lines = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse);
    const bad = lines.filter((l) => l.url !== "/v1/responses" || l.status !== 200);
    if (lines.length < Number(process.argv[2]) || bad.length) {
      console.log(`${lines.length} requests; not a 200 on /v1/responses:`, bad.map((l) => `${l.method} ${l.url} ${l.status}`));
      process.exit(1);
    }' "$1" "$2"
}
status=0

echo "== a plain turn"
start_proxy "$work/plain.jsonl"
codex "What is the opposite of happy?"
rc=$?
cat "$work/codex.log"
stop_proxy
[ $rc -eq 0 ] || { echo "FAIL: codex exec exited $rc"; status=1; }
grep -qi "stream disconnected\|unexpected status\|error" "$work/codex.log" && { echo "FAIL: codex reported an error"; status=1; }
all_ok "$work/plain.jsonl" 1 || { echo "FAIL: the plain turn's requests"; status=1; }

echo "== a turn with a tool call"
marker=ember-tool-call-ok
start_proxy "$work/tool.jsonl" exec_command "{\"cmd\":\"echo $marker\"}"
codex --dangerously-bypass-approvals-and-sandbox "Run a command that prints something."
rc=$?
cat "$work/codex.log"
stop_proxy
[ $rc -eq 0 ] || { echo "FAIL: codex exec exited $rc"; status=1; }
grep -qi "stream disconnected\|unexpected status" "$work/codex.log" && { echo "FAIL: codex reported a protocol error"; status=1; }
all_ok "$work/tool.jsonl" 2 || { echo "FAIL: the tool turn's requests"; status=1; }
# The second request carries Codex's function_call item (as the server named it) and the command's
# output under the same call_id.
node -e 'const [first, second] = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse);
  const marker = process.argv[2];
  if (first.body.tool_choice?.name !== "exec_command") { console.log("the first request did not force exec_command"); process.exit(1); }
  const call = second.body.input.find((i) => i.type === "function_call");
  const output = second.body.input.find((i) => i.type === "function_call_output");
  if (!call || call.name !== "exec_command" || JSON.parse(call.arguments).cmd !== `echo ${marker}` || !/^call_resp_/.test(call.call_id)) {
    console.log("no function_call of exec_command sent back:", JSON.stringify(call)); process.exit(1);
  }
  const text = typeof output?.output === "string" ? output.output : JSON.stringify(output?.output);
  if (!output || output.call_id !== call.call_id || !text.includes(marker)) {
    console.log("no function_call_output with the command output:", JSON.stringify(output)); process.exit(1);
  }
  if (second.body.tool_choice !== "auto") { console.log("the result went back with tool_choice", second.body.tool_choice); process.exit(1); }
  console.log(`ok: ${call.name}(${call.arguments}) ran; its output came back under ${call.call_id}`);' \
  "$work/tool.jsonl" "$marker" || { echo "FAIL: the tool call's round trip"; status=1; }

[ $status -eq 0 ] && echo "ok: codex exec completed a plain turn and a tool turn through the Responses API"
exit $status
