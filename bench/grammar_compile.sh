#!/usr/bin/env bash
# What a request's grammar costs to compile (bench/grammar_compile.c): schemas of N properties
# (optional, required), an enum of N values, a GBNF of R rules, each shape's CPU seconds:
#   bash bench/grammar_compile.sh BUILD_DIR [N] [R]
# BUILD_DIR holds libember_core.a (a Release build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: grammar_compile.sh BUILD_DIR [N] [R]}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -std=c11 -D_GNU_SOURCE -I"$root/src" "$root/bench/grammar_compile.c" "$build/libember_core.a" \
  $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lm -lpthread -o "$work/grammar_compile"
"$work/grammar_compile" "${2:-10000}" "${3:-100000}"
