# Sourced by the scripts that run `ember serve` (tools/run_demo.sh, tests/cli/server_clients.sh,
# tests/js/server_load.sh).
#
# start_server LOG COMMAND...: runs COMMAND (an `ember serve ... --port 0`) in the background with
# its output in LOG, stops it when the calling script exits, and waits for its ready line; then
# sets `pid` and `url` (http://host:port). Returns 1, saying why, when the server exits first or
# prints no ready line within 120 s.
start_server() {
  local log=$1
  shift
  : >"$log" # exists before the server's first line, for the reads below
  "$@" >"$log" 2>&1 &
  pid=$!
  trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null' EXIT
  url=
  for _ in $(seq 1200); do
    url=$(sed -n 's|^ember serve: listening on \(http://[^ ]*\) .*|\1|p' "$log")
    [ -n "$url" ] && return 0
    kill -0 "$pid" 2>/dev/null || { echo "ember serve exited before it was ready: $(tail -5 "$log")"; return 1; }
    sleep 0.1
  done
  echo "ember serve printed no ready line within 120 s: $(tail -5 "$log")"
  return 1
}
