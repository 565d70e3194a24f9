#!/usr/bin/env python3
"""Reference embeddings from transformers for the tiny random Qwen3 checkpoint of the converter's
fixtures (tests/fixtures/hf/qwen3, written by make_hf_fixtures.py).

Qwen3-Embedding is Qwen3Model with last-token pooling: its vector is the final hidden state (after
the model's last RMSNorm, transformers' last_hidden_state) of the last token, divided by its L2
norm. This computes that vector, and the mean over all tokens and the first token's (the other two
poolings Ember offers), for a few inputs of token ids, in float64 with the eager attention, from
the weights exactly as saved, and writes them to OUT_DIR/embeddings.json:

  {"transformers_version", "torch_version", "inputs": [[ids], ...],
   "last": [[...], ...], "mean": [[...], ...], "cls": [[...], ...]}

tests/test_engine_embed.c converts the same checkpoint with `ember convert`, embeds the inputs
through the engine and requires cosine >= 0.9999 with these vectors for each pooling.

Usage: python3 tools/reference/make_embed_fixtures.py [CHECKPOINT_DIR [OUT_DIR]]
  (both default to tests/fixtures/hf/qwen3; needs torch and transformers)
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModel

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(HERE, "..", "..", "tests", "fixtures", "hf", "qwen3")


def token_ids(n, seed, vocab):
    """n ids from a fixed linear congruential sequence, above the checkpoint's special tokens."""
    ids, x = [], seed
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2147483648
        ids.append(5 + x % (vocab - 5))
    return ids


def main():
    checkpoint = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else DEFAULT)
    out_dir = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else checkpoint)
    torch.manual_seed(0)
    model = AutoModel.from_pretrained(checkpoint, attn_implementation="eager").to(torch.float64)
    model.eval()
    vocab = model.config.vocab_size
    inputs = [token_ids(1, 1, vocab), token_ids(7, 2, vocab), token_ids(40, 3, vocab), token_ids(150, 4, vocab)]
    pooled = {"last": [], "mean": [], "cls": []}
    with torch.no_grad():
        for ids in inputs:
            states = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            for name, vector in (("last", states[-1]), ("mean", states.mean(dim=0)), ("cls", states[0])):
                pooled[name].append((vector / vector.norm()).tolist())
    result = {"transformers_version": transformers.__version__, "torch_version": torch.__version__,
              "checkpoint": os.path.basename(checkpoint), "inputs": inputs, **pooled}
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "embeddings.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"wrote {path}: {len(inputs)} inputs, {len(pooled['last'][0])} numbers a vector")


if __name__ == "__main__":
    main()
