#!/usr/bin/env bash
# Every command `ember --help` lists answers `--help` with its usage and status 0; `ember
# --version` names the version; an unknown command is an error with status 1.
# Usage: tests/cli/help.sh EMBER FIXTURES_DIR BUILD_DIR
set -u
ember=$1
fail=0
check() { # WHAT CONDITION-RESULT
  if [ "$2" = 0 ]; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi
}
commands=$("$ember" --help | sed -n 's/^  \([a-z-]*\) .*/\1/p')
[ -n "$commands" ]; check "ember --help lists the commands" $?
for c in $commands; do
  out=$("$ember" "$c" --help 2>&1); rc=$?
  [ $rc = 0 ] && grep -q "usage: ember $c" <<<"$out"; check "ember $c --help" $?
done
out=$("$ember" --version); rc=$?
[ $rc = 0 ] && grep -Eq '^ember [0-9]+\.[0-9]+\.[0-9]+ \(CUDA backend (built|not built)\)$' <<<"$out"
check "ember --version ($out)" $?
"$ember" no-such-command >/dev/null 2>&1
[ $? = 1 ]; check "an unknown command fails" $?
exit $fail
