#!/usr/bin/env bash
# Installs the Debian packages Ember builds and tests with (and Node.js for the client tests, Chromium
# for the chat page's browser test), when they are missing.
# As root it runs apt-get; otherwise it prints the exact command to run and fails.
set -u
packages=(cmake make gcc pkg-config libcmocka-dev libjansson-dev libpcre2-dev libutf8proc-dev
          libmicrohttpd-dev libcurl4-openssl-dev libssl-dev libedit-dev curl libxml2-utils chromium python3 tmux
          xz-utils)
missing=()
# The real-client and reference tests run Node.js; take Debian's only when the machine has none.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
command="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" = 0 ]; then
  echo "ember: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || {
    echo "ember: apt-get failed; run: $command" >&2; exit 1; }
else
  echo "ember: missing Debian packages; run as root: $command" >&2
  exit 1
fi
