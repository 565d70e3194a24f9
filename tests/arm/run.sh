#!/usr/bin/env bash
# The NEON kernels and the CPU forward pass on AArch64, on this (x86-64) machine: cross-builds
# tests/arm/CMakeLists.txt (quant, model, backend; test_quant; greedy_tokens) with Debian's
# aarch64 compiler into BUILD/arm and runs it under qemu-user:
#   - test_quant three times: on qemu's "max" CPU (which has the dot-product instructions), with
#     EMBER_CPU_ISA=neon (the plain NEON kernels), and on a Cortex-A53 (no dot product: the run-time
#     probe must pick plain NEON); each run holds every NEON kernel bitwise to the scalar path;
#   - greedy_tokens on the project's model and on its draft model requantized by this machine's
#     ember to BF16, Q8_0, Q4_0, Q5_K_M and IQ3_XXS: the tokens must equal `ember run --temp 0`'s here.
# Installs the cross tools when missing and running as root (apt-get, as tools/deps.sh does);
# otherwise, or when apt-get fails, it says so and exits 77, which ctest reports as skipped.
# Usage: run.sh EMBER GREEDY_TOKENS BUILD
set -u
ember=$1 greedy_host=$2 build=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
arm=$build/arm
status=0
fail() { echo "FAIL: $*"; status=1; }

packages=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libcmocka-dev:arm64)
have_tools() {
  command -v aarch64-linux-gnu-gcc && command -v qemu-aarch64 && [ -e /usr/lib/aarch64-linux-gnu/libcmocka.so ]
} >/dev/null 2>&1
if ! have_tools; then
  # libcmocka-dev:arm64 (test_quant's test library) comes from Debian's arm64 archive: multiarch.
  command="dpkg --add-architecture arm64 && apt-get update && apt-get install --no-install-recommends ${packages[*]}"
  if [ "$(id -u)" != 0 ]; then
    echo "SKIP: the AArch64 cross tools are missing; as root run: $command"
    exit 77
  fi
  echo "installing ${packages[*]}"
  mkdir -p "$arm"
  export DEBIAN_FRONTEND=noninteractive
  { dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64; } &&
    apt-get update -qq >"$arm/apt.log" 2>&1 &&
    apt-get install -y -qq --no-install-recommends "${packages[@]}" >>"$arm/apt.log" 2>&1 ||
    { tail -n 20 "$arm/apt.log"; echo "SKIP: installing the AArch64 cross tools failed; run: $command"; exit 77; }
  have_tools || { echo "SKIP: the AArch64 cross tools are still missing after apt-get"; exit 77; }
fi

# Only the targets the checks run, quietly (the log is shown on failure).
if ! { cmake -S "$root/tests/arm" -B "$arm" -DCMAKE_TOOLCHAIN_FILE="$root/cmake/aarch64.cmake" &&
       cmake --build "$arm" -j 1 --target test_quant greedy_tokens; } >"$arm.log" 2>&1; then
  tail -n 40 "$arm.log"
  echo "FAIL: the AArch64 build (log: $arm.log)"
  exit 1
fi

qemu() { # qemu CPU, then the program and its arguments
  local cpu=$1
  shift
  qemu-aarch64 -cpu "$cpu" -L /usr/aarch64-linux-gnu "$@"
}

# Each configuration: the qemu CPU, the EMBER_CPU_ISA value, the kernel family it must pick.
configs=("max||neon-dotprod" "max|neon|neon" "cortex-a53||neon")
for config in "${configs[@]}"; do
  IFS='|' read -r cpu isa want <<<"$config"
  label="cpu $cpu${isa:+, EMBER_CPU_ISA=$isa}"
  out=$(cd "$build" && EMBER_CPU_ISA=$isa CMOCKA_MESSAGE_OUTPUT=stdout qemu "$cpu" "$arm/test_quant" 2>&1) ||
    { echo "$out"; fail "test_quant ($label)"; }
  echo "$out" | grep -q "OK \] test_dot_neon_equals_scalar" || fail "test_quant ($label) did not run the NEON check"
  echo "test_quant ($label): $(echo "$out" | tail -n 1)"
done

# Greedy tokens: the prompt is the model's chat format around a question (tokenized here).
model=$root/models/ember-wordnet-21m.Q4_K_M.gguf draft=$root/models/ember-wordnet-draft-4m.Q4_K_M.gguf
prompt=$(printf '<|im_start|>user\nWhat does the word harbor mean?<|im_end|>\n<|im_start|>assistant\n')
ids=$("$ember" tokenize -m "$model" --ids "$prompt") || { fail "ember tokenize"; exit 1; }
models=("$model")
for type in BF16 Q8_0 Q4_0 Q5_K_M IQ3_XXS; do
  out=$arm/draft-$type.gguf
  [ -s "$out" ] || "$ember" quantize "$draft" "$out" "$type" --allow-requantize --threads 1 >"$arm/quantize.log" 2>&1 ||
    { cat "$arm/quantize.log"; fail "ember quantize $type"; continue; }
  models+=("$out")
done
for m in "${models[@]}"; do
  name=$(basename "$m")
  want=$("$ember" run -m "$m" --prompt-ids "$ids" --temp 0 --ignore-eos --print-ids -n 24 2>/dev/null)
  [ -n "$want" ] || { fail "$name: ember run gave no tokens"; continue; }
  got=$("$greedy_host" "$m" 24 $ids 2>/dev/null)
  [ "$got" = "$want" ] || fail "$name: greedy_tokens here [$got], ember run [$want]"
  for config in "${configs[@]}"; do
    IFS='|' read -r cpu isa expect <<<"$config"
    label="cpu $cpu${isa:+, EMBER_CPU_ISA=$isa}"
    got=$(EMBER_CPU_ISA=$isa qemu "$cpu" "$arm/greedy_tokens" "$m" 24 $ids 2>"$arm/greedy.err")
    grep -qx "isa: $expect" "$arm/greedy.err" || fail "$name ($label): $(cat "$arm/greedy.err"), expected isa: $expect"
    [ "$got" = "$want" ] || fail "$name ($label): AArch64 tokens [$got], x86-64 [$want]"
  done
  echo "$name: the same 24 tokens on AArch64 (${#configs[@]} configurations) as here"
done

[ $status -eq 0 ] && echo "arm: all checks passed"
exit $status
