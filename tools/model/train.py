#!/usr/bin/env python3
"""Train Ember's demo models on one GPU: a byte-level BPE tokenizer, then a Llama target and a small
Llama draft (for speculative decoding) sharing it, from the corpus of make_corpus.py.

Usage: train.py CORPUS_DIR OUT_DIR [--target-steps N] [--draft-steps N] [--models target,draft]
Writes OUT_DIR/{target,draft}/ (transformers checkpoints with tokenizer and chat template, bf16),
OUT_DIR/loss.csv, OUT_DIR/loss.png and OUT_DIR/reference.json: each model's perplexity over the
held-out text (windows cut as llama.cpp's perplexity tool cuts them) and its greedy answers to a few
chat questions, the references tests/fixtures/models/transformers.json keeps.

The run is deterministic (fixed seeds, deterministic kernels, fixed step counts): the same
corpus on the same software gives the same weights, which the build script checks by hash.
"""
import argparse
import json
import math
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers as T  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS, EOS = 0, 2  # <|endoftext|> starts every document; <|im_end|> ends every turn
VOCAB = 4096
SEQ = 1024
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MODELS = {
    # name: (hidden, layers, heads, kv heads, ffn, peak lr, batch sequences)
    "target": (512, 6, 8, 4, 1536, 2e-3, 64),
    "draft": (256, 4, 4, 2, 768, 3e-3, 64),
}


def train_tokenizer(texts, out_dir):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[(SPECIALS[0], BOS)])
    return tok


def write_tokenizer(tok, path):
    tok.save(os.path.join(path, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIALS[0], "eos_token": SPECIALS[2], "pad_token": SPECIALS[0],
        "add_bos_token": True, "add_eos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": SEQ,
    }
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def make_model(name):
    hidden, layers, heads, kv, ffn, _, _ = MODELS[name]
    v5 = int(T.__version__.split(".")[0]) >= 5
    rope = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}} if v5 else {"rope_theta": 10000.0}
    cfg = T.LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=SEQ,
                        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=EOS,
                        pad_token_id=BOS, initializer_range=0.02,
                        attn_implementation="eager",  # a deterministic backward, unlike fused attention
                        **rope)
    return T.LlamaForCausalLM(cfg)


def train(name, tokens, steps, time_limit, out_dir, log):
    hidden, layers, heads, kv, ffn, lr, batch = MODELS[name]
    torch.manual_seed(1234)
    model = make_model(name).cuda()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    n_seq = (len(tokens) - 1) // SEQ
    data = torch.from_numpy(tokens[: n_seq * SEQ + 1].astype(np.int64))
    gen = torch.Generator().manual_seed(99)
    order, cursor = torch.randperm(n_seq, generator=gen), 0
    warmup = 100
    print(f"{name}: {n_params / 1e6:.2f} M parameters, {n_seq} sequences of {SEQ}, {steps} steps of {batch}",
          flush=True)
    start = time.time()
    model.train()
    step = 0
    while step < steps:
        if step == 5:
            torch.cuda.synchronize()
            t5 = time.time()
        if step == 25 and steps > 25:
            torch.cuda.synchronize()
            # The schedule depends on the step count only after the warm-up, so it can be fitted to the
            # time limit here and stays reproducible by passing the printed count.
            fit = int(time_limit / ((time.time() - t5) / 20))
            if fit < steps:
                steps = max(fit, warmup + 1)
                print(f"{name}: {steps} steps fit the time limit (pass --{name}-steps {steps} to reproduce)", flush=True)
        if cursor + batch > n_seq:
            order, cursor = torch.randperm(n_seq, generator=gen), 0
        idx = order[cursor: cursor + batch]
        cursor += batch
        rows = torch.stack([data[i * SEQ: i * SEQ + SEQ + 1] for i in idx.tolist()]).cuda(non_blocking=True)
        x, y = rows[:, :-1], rows[:, 1:]
        frac = step / max(1, steps - 1)
        scale = (step + 1) / warmup if step < warmup else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))
        for g in opt.param_groups:
            g["lr"] = lr * scale
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.float().view(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == steps - 1 or step < 25 and step % 5 == 0:
            value = loss.item()
            log.write(f"{name},{step},{step * batch * SEQ},{value:.5f},{time.time() - start:.1f}\n")
            if step % 200 == 0 or step == steps - 1:
                print(f"{name} step {step} loss {value:.4f} ({time.time() - start:.0f} s)", flush=True)
        step += 1
    elapsed = time.time() - start
    print(f"{name}: {steps * batch * SEQ / elapsed / 1e3:.0f} k tokens/s, {elapsed:.0f} s", flush=True)
    path = os.path.join(out_dir, name)
    model.to(torch.bfloat16).save_pretrained(path)
    return path


@torch.no_grad()
def perplexity(path, tokens, ctx):
    """llama.cpp's rule: windows of ctx tokens, the first replaced by BOS, the second half scored."""
    model = T.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    n_chunks = len(tokens) // ctx
    nll, count, running = 0.0, 0, []
    for c in range(n_chunks):
        window = torch.tensor(tokens[c * ctx: (c + 1) * ctx], dtype=torch.int64)
        window[0] = BOS
        logits = model(input_ids=window[None].cuda()).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        first = ctx // 2
        targets = window[first + 1:].cuda()
        nll -= logp[first: ctx - 1].gather(1, targets[:, None]).sum().item()
        count += ctx - 1 - first
        running.append(math.exp(nll / count))
    return {"ctx": ctx, "n_chunks": n_chunks, "n_tokens": len(tokens), "ppl": math.exp(nll / count),
            "chunk_ppl": running, "tokens_first_64": [int(t) for t in tokens[:64]]}


@torch.no_grad()
def samples(path, tok, prompts):
    """Greedy answers to one-turn chat questions, as the chat template renders them."""
    model = T.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    answers = {}
    for p in prompts:
        text = f"<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n"
        ids = torch.tensor([tok.encode(text).ids]).cuda()
        out = model.generate(ids, max_new_tokens=60, do_sample=False, eos_token_id=EOS, pad_token_id=BOS)
        answers[p] = tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
        print(f"  {p!r} -> {answers[p]!r}", flush=True)
    return answers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--target-steps", type=int, default=1600)
    ap.add_argument("--draft-steps", type=int, default=1200)
    ap.add_argument("--models", default="target,draft", help="which models to train (comma-separated)")
    ap.add_argument("--time-limit", type=float, default=1e9, help="seconds for the target (the draft gets 0.4 of it): fewer steps if they do not fit")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.corpus, "train.jsonl")) as f:
        texts = [json.loads(line)["text"] for line in f]
    t0 = time.time()
    plain = [t.replace(SPECIALS[1], "").replace(SPECIALS[2], "") for t in texts[::8]]  # merges for words only
    tok = train_tokenizer(plain, args.out)
    parts = []
    for k in range(0, len(texts), 20000):  # in slices: an Encoding per document costs far more than its ids
        parts += [np.array(e.ids, dtype=np.uint16) for e in tok.encode_batch(texts[k: k + 20000])]
    tokens = np.concatenate(parts)
    del parts
    print(f"tokenizer: {tok.get_vocab_size()} tokens; corpus {len(texts)} documents, {len(tokens) / 1e6:.1f} M tokens "
          f"({time.time() - t0:.0f} s)", flush=True)
    with open(os.path.join(args.corpus, "heldout.txt")) as f:
        heldout = [BOS] + tok.encode(f.read(), add_special_tokens=False).ids
    refs = {}
    with open(os.path.join(args.out, "loss.csv"), "w") as log:
        log.write("model,step,tokens,loss,seconds\n")
        for name, steps in (("target", args.target_steps), ("draft", args.draft_steps)):
            if name not in args.models.split(","):
                continue
            limit = args.time_limit * (1.0 if name == "target" else 0.4)
            path = train(name, tokens, steps, limit, args.out, log)
            write_tokenizer(tok, path)
            ppl = perplexity(path, heldout, 512)
            print(f"{name}: held-out perplexity {ppl['ppl']:.4f} over {ppl['n_chunks']} windows of 512", flush=True)
            answers = samples(path, tok, ["What is a volcano?", "What does the word \"ember\" mean?",
                                          "Hello, who are you?", "What is the opposite of happy?",
                                          "Use the word garden in a sentence."])
            refs[name] = {"perplexity": ppl, "greedy_answers": answers}
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(refs, f, indent=1)
    plot(os.path.join(args.out, "loss.csv"), os.path.join(args.out, "loss.png"))


def plot(csv_path, png_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [line.strip().split(",") for line in open(csv_path).readlines()[1:]]
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in MODELS:
        pts = [(int(r[2]) / 1e6, float(r[3])) for r in rows if r[0] == name]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name)
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("training loss (nats per token)")
    ax.set_ylim(0, 6)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Ember demo models: training loss")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)


if __name__ == "__main__":
    main()
