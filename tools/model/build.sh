#!/usr/bin/env bash
# Rebuild the models of models/ from scratch (docs/model.md): WordNet 3.0 from Debian's
# wordnet-base package, the corpus, the tokenizer and both models trained on one NVIDIA GPU
# (python3 with torch, transformers and tokenizers), then GGUF files made by ember.
#
# Usage: tools/model/build.sh EMBER WORK_DIR
#   WORK_DIR/wordnet-base*.deb is used when present (the GPU machine has no network); otherwise it
#   is downloaded with apt-get. MODELS=target (or draft) trains only that one.
# The step counts are the ones the shipped models were trained with; the run is deterministic, so
# the files it writes should equal models/ byte for byte (it says so at the end).
set -eu
ember=$(realpath "$1") work=$2
here=$(cd "$(dirname "$0")" && pwd)
models=$here/../../models
mkdir -p "$work"
cd "$work"

if [ ! -d wordnet ]; then
  deb=$(ls wordnet-base*.deb 2>/dev/null | head -n 1 || true)
  if [ -z "$deb" ]; then
    apt-get download wordnet-base
    deb=$(ls wordnet-base*.deb | head -n 1)
  fi
  dpkg-deb -x "$deb" pkg 2>/dev/null || { mkdir -p pkg && (cd pkg && ar x "../$deb" && tar xf data.tar.*); }
  ln -sfn pkg/usr/share/wordnet wordnet
fi
python3 "$here/make_corpus.py" wordnet corpus
PYTHONUNBUFFERED=1 python3 "$here/train.py" corpus train --target-steps 1078 --draft-steps 1175 \
  --models "${MODELS:-target,draft}"

made() {  # SOURCE NAME FILE TYPE: convert, quantize, compare with the shipped file
  "$ember" convert "train/$1" -o "$1-f16.gguf" --type f16 --name "$2"
  "$ember" quantize "$1-f16.gguf" "$3" "$4"
  if cmp -s "$3" "$models/$3"; then echo "$3: the same bytes as models/$3"; else echo "$3: differs from models/$3"; fi
}
[ ! -d train/target ] || made target "Ember WordNet 21M" ember-wordnet-21m.Q4_K_M.gguf Q4_K_M
[ ! -d train/draft ] || made draft "Ember WordNet draft 4M" ember-wordnet-draft-4m.Q4_K_M.gguf Q4_K_M
sha256sum train/*/model.safetensors
