#!/usr/bin/env python3
"""Builds tiny randomly initialised Hugging Face checkpoints and their reference outputs.

For each architecture that `ember convert` supports this writes, under OUT_DIR/<name>/:
  config.json, *.safetensors (sharded with an index for one model), tokenizer.json,
  tokenizer_config.json  -- a checkpoint as transformers saves it;
  logits.f32             -- float32 little-endian logits [n_positions, n_vocab] of one forward pass
                            over prompt + greedy continuation (position t predicts token t+1);
  expected.json          -- prompt ids, the 16 greedy ids, shapes, versions, and feature checks;
  logits_truncated.f32   -- gpt-oss only: the same weights with YaRN's correction range rounded
                            (truncate true, as GGUF computes it), over its own greedy continuation
                            (expected.json: greedy_ids_truncated, truncate_max_abs_change).

The references are computed on the CPU in float64 (float32 for MoE models, whose grouped expert
matmul in transformers takes nothing wider) with attn_implementation="eager" (so sliding
windows and softcaps are applied by transformers' own eager path), from the weights exactly as
saved (bf16/f16 checkpoints are rounded first). Each model turns on the features that break naive
implementations; `checks` in expected.json records, for each feature, that switching it off
changes the logits (so the fixture really exercises it).

Usage: python3 make_hf_fixtures.py OUT_DIR [NAME...]   (needs torch, transformers, tokenizers, safetensors)
  NAME... limits the run to those fixtures, e.g. `python3 tools/reference/make_hf_fixtures.py "$OUT"
  gemma3pattern` writes only "$OUT/gemma3pattern/".

Gemma 4 (gemma4, gemma4moe, gemma4ple; transformers 5.x): `ember convert` does not convert these
checkpoints; with LLAMA_CPP_CONVERT set to llama.cpp's convert_hf_to_gguf.py, each fixture also gets
model.f32.gguf, written by that converter (--outtype f32), the file ember loads.
"""
import copy
import json
import os
import sys
import traceback

import torch
import transformers
import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

N_PROMPT = 24
N_GEN = 16
MAX_SEEDS = 12
VOCAB_TARGET = 384
V5 = int(transformers.__version__.split(".")[0]) >= 5

# Training text for the tokenizers: plain prose, enough distinct words for VOCAB_TARGET tokens.
TEXT = """
The river ran quietly past the old mill, where a miller once ground wheat and barley for the
village. In spring the water rose high and fast; in autumn it slowed, and children threw sticks
from the bridge to watch them race. Nobody remembered when the wheel had last turned. Travellers
asked about it, and the baker always told the same story: a storm, a broken axle, a winter too
cold to mend anything. Some believed her. Others said the miller simply grew tired and left for
the city, where machines did the grinding and nobody needed a wheel at all. Numbers matter too:
one, two, three, 42, 1999, 3.14159, and dates like 2024-05-17. Code looks different: def f(x):
return x * 2 + 1; if (a != b) { print("hello, world"); } Questions? Answers! Lists: apples,
oranges, pears, plums, cherries, grapes, lemons, limes. Weather reports spoke of rain, wind,
sunshine, fog, frost, snow, thunder and lightning over the northern hills and southern valleys.
"""

SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_tokenizer(vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TEXT] * 4, trainer)
    return tok


def write_tokenizer(tok, path):
    tok.save(os.path.join(path, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>",
        "add_bos_token": True, "add_eos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 256,
    }
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def rope(theta, scaling=None, local_theta=None):
    """rope arguments in the layout of the installed transformers (4.x rope_theta/rope_scaling,
    5.x rope_parameters, per layer type when local_theta is given)."""
    if V5:
        full = {"rope_type": "default", "rope_theta": theta}
        if scaling:
            full.update(scaling)
        if local_theta is not None:
            return {"rope_parameters": {"full_attention": full,
                                        "sliding_attention": {"rope_type": "default", "rope_theta": local_theta}}}
        return {"rope_parameters": full}
    out = {"rope_theta": theta}
    if scaling:
        out["rope_scaling"] = scaling
    if local_theta is not None:
        out["rope_local_base_freq"] = local_theta
    return out


def common(vocab, **kw):
    base = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                initializer_range=0.1, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1, pad_token_id=2,
                tie_word_embeddings=False, attn_implementation="eager")
    base.update(kw)
    return base


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}


def gemma3(V, layer_types):
    """A Gemma 3 text config with one layer per entry of layer_types."""
    return common(V, head_dim=16, num_hidden_layers=len(layer_types), tie_word_embeddings=True, sliding_window=8,
                  query_pre_attn_scalar=16, hidden_activation="gelu_pytorch_tanh", layer_types=layer_types,
                  rms_norm_eps=1e-6, **rope(1000000.0, {"rope_type": "linear", "factor": 4.0}, 10000.0))


def qwen35(V):
    """(config class, model class, kwargs) of a tiny Qwen3.5 text model: three Gated DeltaNet layers
    then a gated attention layer, with twice as many value heads as key heads (so the order of the
    value heads matters), 16 of 64 head dims rotated. The text-only class where transformers has one,
    else the multimodal class with a one-block vision tower (whose text part is what gets converted)."""
    T = transformers
    text = common(V, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6, hidden_act="silu",
                  layer_types=["linear_attention"] * 3 + ["full_attention"], full_attention_interval=4,
                  linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                  linear_num_key_heads=2, linear_num_value_heads=4,
                  **rope(10000000.0, {"partial_rotary_factor": 0.25, "mrope_section": [3, 3, 2],
                                      "mrope_interleaved": True}))
    if hasattr(T, "Qwen3_5ForCausalLM") and hasattr(T, "Qwen3_5TextConfig"):
        return T.Qwen3_5TextConfig, T.Qwen3_5ForCausalLM, text
    del text["attn_implementation"]
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3, num_position_embeddings=16)
    return T.Qwen3_5Config, T.Qwen3_5ForConditionalGeneration, dict(
        text_config=text, vision_config=vision, attn_implementation="eager", initializer_range=0.1,
        tie_word_embeddings=False)


def gemma4(V, **kw):
    """(config class, model class, kwargs) of a tiny Gemma 4: the multimodal class without its vision
    and audio towers (the text part is what converters read). Sliding layers of head size 16, full
    ones of 32 with their own KV heads and proportional RoPE (a quarter of the pairs rotate), V
    normalized, attention scale 1; `kw` adds a layout's own fields to the text config."""
    T = transformers
    text = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, global_head_dim=32, max_position_embeddings=256, initializer_range=0.1, rms_norm_eps=1e-6,
                bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=True, sliding_window=8,
                hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=2.0,
                hidden_size_per_layer_input=0, num_kv_shared_layers=0, enable_moe_block=False,
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0,
                                                    "partial_rotary_factor": 0.25}})
    text.update(kw)
    return T.Gemma4Config, T.Gemma4ForConditionalGeneration, dict(
        text_config=text, vision_config=None, audio_config=None, tie_word_embeddings=True, initializer_range=0.1)


def gemma4_off(**kw):
    """A gemma4 spec's check: the same model with text_config fields changed."""
    return {"text_config_update": kw}


def gemma4_specs(V):
    """Gemma 4's three layouts: dense with K = V in the full layers (31B); experts beside the dense
    unit (26B-A4B); per-layer inputs with the last two layers sharing KV and twice as wide (E2B/E4B)."""
    if not hasattr(transformers, "Gemma4Config"):
        return []
    four = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    six = ["sliding_attention"] * 3 + ["full_attention", "sliding_attention", "full_attention"]
    return [
        ("gemma4", *gemma4(V, num_hidden_layers=4, layer_types=four, attention_k_eq_v=True,
                           num_global_key_value_heads=1), "float32", None,
         [("sliding_window", gemma4_off(sliding_window=4096)),
          ("final_softcap", gemma4_off(final_logit_softcapping=None)),
          ("layer_types", gemma4_off(layer_types=["sliding_attention"] * 3 + ["full_attention"]))]),
        ("gemma4moe", *gemma4(V, num_hidden_layers=4, layer_types=four, attention_k_eq_v=True,
                              num_global_key_value_heads=1, enable_moe_block=True, num_experts=4, top_k_experts=2,
                              moe_intermediate_size=32), "float32", None,
         [("sliding_window", gemma4_off(sliding_window=4096))]),
        ("gemma4ple", *gemma4(V, num_hidden_layers=6, layer_types=six, hidden_size_per_layer_input=16,
                              vocab_size_per_layer_input=V, num_kv_shared_layers=2, use_double_wide_mlp=True),
         "float32", None,
         [("sliding_window", gemma4_off(sliding_window=4096))]),
    ]


def specs(V):
    """(name, config class, model class, kwargs, saved dtype, shard size, [(check, kwargs that turn it off)])"""
    T = transformers
    gemma3_types = ["sliding_attention"] * 5 + ["full_attention"]
    gemma3pattern_types = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
    gemma3_text = gemma3(V, gemma3_types)
    del gemma3_text["attn_implementation"]
    qwen35_specs = []
    if hasattr(T, "Qwen3_5Config"):  # transformers 5.x
        qwen35_specs.append(("qwen35", *qwen35(V), "float32", None, []))
    return qwen35_specs + gemma4_specs(V) + [
        ("llama", T.LlamaConfig, T.LlamaForCausalLM,
         common(V, **rope(500000.0, LLAMA3)), "float32", "100KB",
         [("llama3_rope_scaling", rope(500000.0))]),
        ("mistral", T.MistralConfig, T.MistralForCausalLM,
         common(V, sliding_window=8, **rope(10000.0)), "bfloat16", None,
         [("sliding_window", {"sliding_window": None})]),
        ("mixtral", T.MixtralConfig, T.MixtralForCausalLM,
         common(V, num_local_experts=4, num_experts_per_tok=2, sliding_window=None, router_aux_loss_coef=0.0,
                **rope(1000000.0)), "float32", None, []),
        ("qwen2", T.Qwen2Config, T.Qwen2ForCausalLM,
         common(V, tie_word_embeddings=True, use_sliding_window=False, **rope(1000000.0)), "float16", None, []),
        ("qwen3", T.Qwen3Config, T.Qwen3ForCausalLM,
         common(V, head_dim=32, use_sliding_window=False, **rope(1000000.0)), "float32", None, []),
        ("qwen3moe", T.Qwen3MoeConfig, T.Qwen3MoeForCausalLM,
         common(V, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.0,
                use_sliding_window=False, **rope(1000000.0)), "float32", None,
         [("norm_topk_prob", {"norm_topk_prob": False})]),
        ("gemma2", T.Gemma2Config, T.Gemma2ForCausalLM,
         common(V, head_dim=16, tie_word_embeddings=True, sliding_window=8, query_pre_attn_scalar=16,
                attn_logit_softcapping=1.0, final_logit_softcapping=2.0, hidden_activation="gelu_pytorch_tanh",
                layer_types=["sliding_attention", "full_attention"], rms_norm_eps=1e-6, **rope(10000.0)),
         "float32", None,
         [("sliding_window", {"sliding_window": 4096}),
          ("attn_softcap", {"attn_logit_softcapping": None}),
          ("final_softcap", {"final_logit_softcapping": None})]),
        ("gemma3mm", T.Gemma3Config, T.Gemma3ForConditionalGeneration,
         dict(text_config=gemma3_text, vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                          num_attention_heads=2, image_size=28, patch_size=14),
              mm_tokens_per_image=4, attn_implementation="eager", initializer_range=0.1), "float32", None, []),
        ("gemma3", T.Gemma3TextConfig, T.Gemma3ForCausalLM, gemma3(V, gemma3_types), "float32", None,
         [("sliding_window", {"sliding_window": 4096}),
          ("linear_rope_scaling", rope(1000000.0, None, 10000.0))]),
        # Gemma 3 with a layer pattern other than five sliding layers then one global: the second
        # layer is global. The default period of 6 would make all four layers sliding, which the
        # "layer_types" check proves changes the logits.
        ("gemma3pattern", T.Gemma3TextConfig, T.Gemma3ForCausalLM, gemma3(V, gemma3pattern_types), "float32", None,
         [("sliding_window", {"sliding_window": 4096}),
          ("layer_types", {"layer_types": ["sliding_attention"] * 4})]),
        # gpt-oss: sinks, an 8-token window on even layers (the sequence has 40), YaRN as released
        # (factor 32 over 4096, truncate false), biased attention, router and experts, bf16. The
        # extra reference with truncate true is what GGUF's (llama.cpp's) rounded YaRN computes.
        ("gpt-oss", T.GptOssConfig, T.GptOssForCausalLM, gpt_oss(V, truncate=False), "bfloat16", None,
         [("sliding_window", {"sliding_window": 4096}),
          ("yarn", rope(150000.0)),
          ("truncate", gpt_oss_rope(True))]),
    ]


def gpt_oss_rope(truncate):
    return rope(150000.0, {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                           "original_max_position_embeddings": 4096, "truncate": truncate})


def gpt_oss(V, truncate):
    """A GptOss config: 4 layers alternating sliding and full, 4 experts of 96 choosing 2, heads of 16."""
    return common(V, head_dim=16, intermediate_size=96, num_hidden_layers=4, num_local_experts=4,
                  num_experts_per_tok=2, sliding_window=8, attention_bias=True, router_aux_loss_coef=0.0,
                  max_position_embeddings=131072, swiglu_limit=7.0,
                  layer_types=["sliding_attention", "full_attention"] * 2, **gpt_oss_rope(truncate))


def build(cfg_cls, model_cls, kwargs):
    cfg = cfg_cls(**kwargs)
    cfg._attn_implementation = "eager"
    if hasattr(cfg, "text_config"):
        cfg.text_config._attn_implementation = "eager"
    model = model_cls(cfg)
    model.eval()
    return model


@torch.no_grad()
def perturb_vectors(model):
    """transformers initialises biases to 0 and norm weights to 1 (Gemma: 0); random offsets make
    the fixtures check that these values, not just their shapes, arrive. gpt-oss's experts keep their
    biases as [experts, width] and its sinks get logits as large as the scores, so they matter."""
    for name, p in model.named_parameters():
        if p.dim() == 1 or name.endswith("_bias"):
            p.add_(torch.randn_like(p) * (1.0 if name.endswith("sinks") else 0.1))
    # Gemma 4's layer_scalar is a saved buffer of ones (the GGUF's layer_output_scale)
    for name, b in model.named_buffers():
        if name.endswith("layer_scalar"):
            b.mul_(1.0 + 0.3 * torch.randn_like(b))


@torch.no_grad()
def logits_of(model, ids):
    return model(torch.tensor([ids]), use_cache=False).logits[0]


@torch.no_grad()
def greedy(model, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(logits_of(model, ids)[-1].argmax()))
    return ids[len(prompt):]


def saved_keys(path):
    from safetensors import safe_open
    keys = {}
    for fn in sorted(os.listdir(path)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(path, fn), "pt") as f:
                for k in f.keys():
                    keys[k] = [fn, list(f.get_slice(k).get_shape()), str(f.get_slice(k).get_dtype())]
    return keys


def fake_q8_0(state):
    """The weights after a round trip through GGUF's q8_0 blocks (32 values along the input
    dimension, one scale = max|w| / 127 stored as f16), for choosing well-conditioned fixtures."""
    out = {}
    for k, v in state.items():
        # gpt-oss's expert matrices are stored [experts, input, output]: blocks run along the input
        transposed = k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj")
        if transposed:
            v = v.transpose(-1, -2)
        if (v.dim() >= 2 and v.shape[-1] % 32 == 0 and not k.endswith("mlp.gate.weight") and "block_sparse_moe.gate" not in k
                and not k.endswith("mlp.router.weight") and not k.endswith("_bias")):
            b = v.reshape(-1, 32)
            d = (b.abs().amax(-1, keepdim=True) / 127).to(torch.float16).to(v.dtype)
            q = torch.where(d > 0, (b / torch.where(d > 0, d, torch.ones_like(d))).round(), torch.zeros_like(b))
            v = (q * d).reshape(v.shape)
        out[k] = v.transpose(-1, -2).contiguous() if transposed else v
    return out


def one(name, cfg_cls, model_cls, kwargs, dtype, shard, checks, tok, out_root):
    # float64 everywhere except MoE blocks: transformers' grouped expert matmul takes float32 at most.
    text_kw = kwargs.get("text_config") if isinstance(kwargs.get("text_config"), dict) else {}
    moe = any(k in kwargs for k in ("num_local_experts", "num_experts")) or text_kw.get("enable_moe_block", False)
    compute = torch.float32 if moe else torch.float64
    prompt = tok.encode("The river ran quietly past the old mill, and children threw sticks from the bridge").ids
    while len(prompt) < N_PROMPT:
        prompt = prompt + prompt
    prompt = prompt[:N_PROMPT]
    # Random tiny models often have near-ties between the top two logits; a fixture whose greedy
    # path survives q8_0 weights (simulated here) keeps the q8_0 test about Ember, not about luck.
    for attempt in range(MAX_SEEDS):
        seed = 1234 + sum(map(ord, name)) + 1000 * attempt
        torch.manual_seed(seed)
        saved = build(cfg_cls, model_cls, kwargs)
        perturb_vectors(saved)
        saved = saved.to(getattr(torch, dtype))
        # The reference uses exactly the saved (rounded) weights, loaded into a model built in the
        # compute dtype, so buffers such as RoPE's inv_freq are not rounded to the saved dtype.
        state = {k: v.to(compute) for k, v in saved.state_dict().items()}
        model = build(cfg_cls, model_cls, kwargs).to(compute)
        model.load_state_dict(state)
        gen = greedy(model, prompt, N_GEN)
        seq = prompt + gen
        logits = logits_of(model, seq)
        top2 = logits[N_PROMPT - 1:-1].topk(2, -1).values
        q8 = build(cfg_cls, model_cls, kwargs).to(compute)
        q8.load_state_dict(fake_q8_0(state))
        q8_top1 = [int(x) for x in logits_of(q8, seq)[N_PROMPT - 1:-1].argmax(-1)]
        q8_same = sum(a == b for a, b in zip(q8_top1, gen))
        min_margin = float((top2[:, 0] - top2[:, 1]).min())
        print("   %s seed %d: q8_0 top-1 %d/16, min margin %.4f" % (name, seed, q8_same, min_margin))
        if q8_same == N_GEN and min_margin > 1e-2:
            break
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    save_kw = {"safe_serialization": True}
    if shard:
        save_kw["max_shard_size"] = shard
    saved.save_pretrained(out, **save_kw)
    write_tokenizer(tok, out)

    assert [int(x) for x in logits[N_PROMPT - 1:-1].argmax(-1)] == gen
    logits.to(torch.float32).numpy().astype("<f4").tofile(os.path.join(out, "logits.f32"))

    # Cached generation through generate(): another path through transformers; recorded, not required.
    cached = None
    try:
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 2
        g = model.generate(torch.tensor([prompt]), max_new_tokens=N_GEN, min_new_tokens=N_GEN, do_sample=False)
        cached = [int(x) for x in g[0, N_PROMPT:]]
    except Exception as e:  # noqa: BLE001
        cached = "failed: %s" % e

    check_out = {}
    for check, off in checks:
        kw2 = copy.deepcopy(kwargs)
        if "text_config_update" in off:
            kw2["text_config"].update(off["text_config_update"])
        else:
            kw2.update(off)
        m2 = build(cfg_cls, model_cls, kw2).to(compute)
        m2.load_state_dict(state, strict=False)
        diff = float((logits_of(m2, seq) - logits).abs().max())
        check_out[check] = {"max_abs_change_when_off": diff, "exercised": diff > 1e-4}

    truncated = {}
    if name == "gpt-oss":
        # The same weights with YaRN's correction range rounded (truncate true), as GGUF computes it:
        # its own greedy continuation and logits, and how far rounding moves transformers' logits.
        kw2 = copy.deepcopy(kwargs)
        kw2.update(gpt_oss_rope(True))
        m2 = build(cfg_cls, model_cls, kw2).to(compute)
        m2.load_state_dict(state)
        gen_t = greedy(m2, prompt, N_GEN)
        logits_t = logits_of(m2, prompt + gen_t)
        logits_t.to(torch.float32).numpy().astype("<f4").tofile(os.path.join(out, "logits_truncated.f32"))
        same_seq = logits_of(m2, seq)
        truncated = {"greedy_ids_truncated": gen_t, "logits_truncated_file": "logits_truncated.f32",
                     "truncate_max_abs_change": float((same_seq - logits).abs().max())}
        print("   gpt-oss truncated: greedy %s, max |change| %.4g" % (gen_t, truncated["truncate_max_abs_change"]))

    rng = float(logits.max() - logits.min())
    top2 = logits[N_PROMPT - 1:-1].topk(2, -1).values
    margins = (top2[:, 0] - top2[:, 1]).tolist()
    expected = {
        "name": name,
        "architecture": model_cls.__name__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "tokenizers_version": tokenizers.__version__,
        "seed": seed,
        "simulated_q8_0_top1_equal": q8_same,
        "saved_dtype": dtype,
        "compute_dtype": str(compute).replace("torch.", ""),
        "n_vocab": logits.shape[1],
        "n_prompt": N_PROMPT,
        "prompt_ids": prompt,
        "greedy_ids": gen,
        "generate_cached_ids": cached,
        "logits_file": "logits.f32",
        "logits_shape": [logits.shape[0], logits.shape[1]],
        "logits_range": rng,
        "greedy_top2_margins": margins,
        "checks": check_out,
        "safetensors_keys": saved_keys(out),
    }
    expected.update(truncated)
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    with open(os.path.join(out, "config.json")) as f:
        cfgtext = f.read()
    print("== %s: vocab %d, range %.3f, min margin %.4f, greedy %s, cached %s, checks %s" %
          (name, logits.shape[1], rng, min(margins), gen, "same" if cached == gen else cached, check_out))
    print(cfgtext)
    print("keys:", json.dumps(expected["safetensors_keys"])[:3000])
    converter = os.environ.get("LLAMA_CPP_CONVERT")
    if converter and name.startswith("gemma4"):
        import subprocess
        gguf = os.path.join(out, "model.f32.gguf")
        subprocess.run([sys.executable, converter, out, "--outtype", "f32", "--outfile", gguf], check=True)
        print("   %s: llama.cpp's converter wrote %s" % (name, gguf))


def main():
    out_root = sys.argv[1] if len(sys.argv) > 1 else "hf_fixtures"
    only = sys.argv[2:]
    os.makedirs(out_root, exist_ok=True)
    torch.set_num_threads(4)
    print("transformers", transformers.__version__, "torch", torch.__version__, "tokenizers", tokenizers.__version__)
    tok = make_tokenizer(VOCAB_TARGET)
    V = tok.get_vocab_size()
    print("tokenizer vocab", V)
    failed = []
    for spec in specs(V):
        if only and spec[0] not in only:
            continue
        try:
            one(*spec, tok, out_root)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            failed.append(spec[0])
    print("failed:", failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
