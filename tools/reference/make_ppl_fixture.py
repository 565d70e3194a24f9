#!/usr/bin/env python3
"""Perplexity of a Hugging Face checkpoint over a text, by the window rules `ember perplexity` and
llama.cpp's llama-perplexity follow, computed with transformers: the reference the test
tests/cli/perplexity.sh compares Ember with.

The text is tokenized whole with the checkpoint's tokenizer (no special tokens), with BOS first when
the GGUF that `ember convert` writes would add one (tokenizer_config.json's add_bos_token, else the
post-processor's template, as src/tokenizer/hf_json.c decides). The tokens are cut into
n_chunks = n_tokens // ctx windows of ctx tokens; each window's first token becomes BOS when BOS is
added; the window is one forward pass in float32 (eager attention) from position 0, and positions
ctx//2 .. ctx-2 are scored, each by -log_softmax(logits)[next token] computed in float64 from the
float32 logits. PPL = exp(mean NLL).

Usage: python3 tools/reference/make_ppl_fixture.py HF_DIR TEXT_FILE CTX OUT.json [--chunks N]
Writes {"ctx", "n_chunks", "n_tokens", "add_bos", "ppl", "ppl_uncertainty", "chunk_ppl" (running PPL
after each window), "tokens_first_64", "tokens_last_64", versions}.
"""
import argparse
import json
import math
import os

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def gguf_adds_bos(hf_dir):
    """The add_bos that `ember convert` writes: the config's flag, else the post-processor's template."""
    config_path = os.path.join(hf_dir, "tokenizer_config.json")
    config = json.load(open(config_path)) if os.path.exists(config_path) else {}
    if isinstance(config.get("add_bos_token"), bool):
        return config["add_bos_token"]
    post = json.load(open(os.path.join(hf_dir, "tokenizer.json"))).get("post_processor") or {}
    steps = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
    for step in steps:
        if step.get("type") == "TemplateProcessing" and step.get("single"):
            return "SpecialToken" in step["single"][0]
    raise SystemExit(f"{hf_dir}: neither add_bos_token nor a template says whether BOS is added")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hf_dir")
    ap.add_argument("text_file")
    ap.add_argument("ctx", type=int)
    ap.add_argument("out")
    ap.add_argument("--chunks", type=int, default=0, help="only the first N windows")
    args = ap.parse_args()
    ctx, first = args.ctx, args.ctx // 2

    tokenizer = AutoTokenizer.from_pretrained(args.hf_dir)
    text = open(args.text_file, encoding="utf-8").read()
    tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
    add_bos = gguf_adds_bos(args.hf_dir)
    bos = tokenizer.bos_token_id
    if add_bos:
        if bos is None:
            raise SystemExit(f"{args.hf_dir}: BOS is added but the tokenizer names no bos_token")
        tokens = [bos] + tokens
    n_chunks = len(tokens) // ctx
    if args.chunks:
        n_chunks = min(n_chunks, args.chunks)
    if n_chunks < 1:
        raise SystemExit(f"{args.text_file}: {len(tokens)} tokens, less than one window of {ctx}")

    model = AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    nll_sum, nll2_sum, count, chunk_ppl = 0.0, 0.0, 0, []
    with torch.no_grad():
        for c in range(n_chunks):
            window = tokens[c * ctx:(c + 1) * ctx]
            inputs = list(window)
            if add_bos:
                inputs[0] = bos
            logits = model(torch.tensor([inputs])).logits[0]
            assert logits.dtype == torch.float32
            log_probs = torch.log_softmax(logits.double(), dim=-1)
            for j in range(first, ctx - 1):
                nll = -log_probs[j, window[j + 1]].item()
                nll_sum += nll
                nll2_sum += nll * nll
                count += 1
            chunk_ppl.append(math.exp(nll_sum / count))
    mean = nll_sum / count
    var = nll2_sum / count - mean * mean
    ppl = math.exp(mean)
    result = {
        "ctx": ctx,
        "n_chunks": n_chunks,
        "n_tokens": len(tokens),
        "add_bos": add_bos,
        "scored": count,
        "ppl": ppl,
        "ppl_uncertainty": ppl * math.sqrt(var / (count - 1)) if var > 0 and count > 1 else 0.0,
        "chunk_ppl": chunk_ppl,
        "tokens_first_64": tokens[:64],
        "tokens_last_64": tokens[-64:],
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"{args.out}: PPL = {ppl:.4f} over {n_chunks} windows of {ctx} ({count} scored of {len(tokens)} tokens)")


if __name__ == "__main__":
    main()
