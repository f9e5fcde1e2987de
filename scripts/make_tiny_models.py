#!/usr/bin/env python3
"""Generate tiny random-weight correctness fixtures for Spindle.

For each architecture (llama, mistral, qwen2, qwen3, gemma2, gemma3) this writes
crates/spindle-model/tests/fixtures/tiny/<arch>/ containing

  config.json, model.safetensors   HF transformers checkpoint (float32)
  model.gguf                       the same weights, converted the way llama.cpp's
                                   convert_hf_to_gguf.py does it (all tensors F32)
  reference.json                   float32 logits for every position of 3 prompts
                                   (transformers, eager attention) + 16 greedy tokens

The GGUF files are self-validated: an independent float64 numpy forward pass that
reads ONLY the GGUF (gguf.GGUFReader) and follows llama.cpp semantics (rope style per
arch, hard-coded SWA patterns, default bases) must reproduce the transformers logits.

Run with the project python env (CPU only, ~1 min):
    /work/pyenv/bin/python scripts/make_tiny_models.py

llama.cpp conventions mirrored (convert_hf_to_gguf.py / conversion/{base,llama,qwen,gemma}.py):
  * LlamaForCausalLM and MistralForCausalLM both convert to arch "llama"; Q and K
    weights (and biases) are row-permuted so GGUF uses llama.cpp's "normal"
    (interleaved pair) rope:
        permute(w, n_head) = w.reshape(n_head, 2, rows//n_head//2, cols)
                              .swapaxes(1, 2).reshape(rows, cols)
    with n_head = num_attention_heads for Q and num_key_value_heads for K.
  * qwen2 / qwen3 / gemma2 / gemma3: no permutation; llama.cpp uses NEOX rope
    (rotate_half pairs (i, i + d/2)), same as HF.
  * llama3 rope scaling is not written as metadata; it is baked into a
    "rope_freqs.weight" F32 tensor of head_dim/2 divisors of the base frequency.
  * Gemma2/Gemma3: every tensor whose HF name ends in "norm.weight" is stored as
    (w + 1) (input/post_attention/pre_feedforward/post_feedforward layernorms, the
    final norm, and gemma3's q_norm/k_norm).  GGUF consumers multiply by the stored
    weight directly.
  * Tied embeddings: HF checkpoint has no lm_head.weight, so the GGUF has no
    "output.weight" and the consumer must fall back to token_embd.weight.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(2)

import gguf  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "crates" / "spindle-model" / "tests" / "fixtures" / "tiny"

SEED = 1234
VOCAB = 256
MAX_POS = 512
PROMPT_LENS = (5, 17, 37)
N_GREEDY = 16
BOS, EOS = 2, 1  # only recorded as metadata; prompts are BOS-free random ids

COMMON = dict(
    vocab_size=VOCAB,
    max_position_embeddings=MAX_POS,
    rms_norm_eps=1e-6,
    bos_token_id=BOS,
    eos_token_id=EOS,
    pad_token_id=0,
)

# --------------------------------------------------------------------------------------
# Architectures.  "gguf_arch" is the llama.cpp architecture string.
# --------------------------------------------------------------------------------------
ARCHS: dict[str, dict] = {
    "llama": dict(
        emb_std=1.0,
        out_gain=1.0,
        config_cls=LlamaConfig,
        model_cls=LlamaForCausalLM,
        gguf_arch="llama",
        kwargs=dict(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            tie_word_embeddings=False,
            # llama3 scaling with a small original context so that, at the fixture's
            # positions (< 60), all three regimes (unscaled / smoothed / divided by
            # factor) produce clearly visible rotations.
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=10000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
            # llama.cpp's converter reads this from the top level of the config (default
            # 8192), not from rope_scaling; put it there too so that the real
            # convert_hf_to_gguf.py would produce the same rope_freqs as we do.
            original_max_position_embeddings=64,
        ),
    ),
    "mistral": dict(
        emb_std=1.0,
        out_gain=1.0,
        config_cls=MistralConfig,
        model_cls=MistralForCausalLM,
        gguf_arch="llama",  # MistralForCausalLM is registered on LlamaModel
        kwargs=dict(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            tie_word_embeddings=False,
            # llama.cpp's LlamaModel writes no sliding window, so use the Mistral
            # v0.2+ style config without one.
            sliding_window=None,
            rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0),
        ),
    ),
    "qwen2": dict(
        emb_std=0.3,
        out_gain=1.0,
        config_cls=Qwen2Config,
        model_cls=Qwen2ForCausalLM,
        gguf_arch="qwen2",
        kwargs=dict(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            use_sliding_window=False,
            rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0),
        ),
    ),
    "qwen3": dict(
        emb_std=0.3,
        out_gain=2.5,
        config_cls=Qwen3Config,
        model_cls=Qwen3ForCausalLM,
        gguf_arch="qwen3",
        kwargs=dict(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,  # heads*head_dim (128) != hidden (64), like real Qwen3
            tie_word_embeddings=True,
            use_sliding_window=False,
            attention_bias=False,
            rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0),
        ),
    ),
    "gemma2": dict(
        emb_std=0.3,
        out_gain=1.0,
        config_cls=Gemma2Config,
        model_cls=Gemma2ForCausalLM,
        gguf_arch="gemma2",
        kwargs=dict(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=3,  # sliding, full, sliding
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            # llama.cpp uses 1/sqrt(key_length) for non-27B gemma2: keep them equal
            query_pre_attn_scalar=16,
            sliding_window=8,
            # small caps so that tanh is clearly non-linear for this tiny model
            attn_logit_softcapping=3.0,
            final_logit_softcapping=4.0,
            tie_word_embeddings=True,
            hidden_activation="gelu_pytorch_tanh",
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        ),
    ),
    "gemma3": dict(
        emb_std=0.3,
        out_gain=1.0,
        config_cls=Gemma3TextConfig,
        model_cls=Gemma3ForCausalLM,
        gguf_arch="gemma3",
        kwargs=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=6,  # 5 sliding : 1 full (layer 5)
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,  # heads*head_dim (64) != hidden (32), like real Gemma3
            query_pre_attn_scalar=16,
            sliding_window=8,
            tie_word_embeddings=True,
            hidden_activation="gelu_pytorch_tanh",
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
            rope_parameters={
                "full_attention": dict(rope_type="default", rope_theta=1_000_000.0),
                "sliding_attention": dict(rope_type="default", rope_theta=10_000.0),
            },
        ),
    ),
    "qwen3moe": dict(
        emb_std=0.3,
        out_gain=2.5,
        config_cls=Qwen3MoeConfig,
        model_cls=Qwen3MoeForCausalLM,
        gguf_arch="qwen3moe",
        kwargs=dict(
            hidden_size=64,
            intermediate_size=96,  # the dense width the config states; unused
            moe_intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,  # as Qwen3-30B-A3B; llama.cpp always renormalizes
            decoder_sparse_step=1,
            mlp_only_layers=[],
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            tie_word_embeddings=True,
            use_sliding_window=False,
            attention_bias=False,
            rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0),
        ),
    ),
    "mixtral": dict(
        emb_std=1.0,
        out_gain=1.0,
        config_cls=MixtralConfig,
        model_cls=MixtralForCausalLM,
        gguf_arch="llama",  # MixtralForCausalLM converts to llama with expert tensors
        kwargs=dict(
            hidden_size=64,
            intermediate_size=48,
            num_local_experts=4,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            tie_word_embeddings=False,
            sliding_window=None,
            rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0),
        ),
    ),
    "phi3": dict(
        emb_std=1.0,
        out_gain=1.0,
        config_cls=Phi3Config,
        model_cls=Phi3ForCausalLM,
        gguf_arch="phi3",
        kwargs=dict(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            sliding_window=None,
            # LongRoPE as Phi-3-128k has it: distinct short and long factors and
            # an attention factor from 16384 / 4096. The fixture's prompts are
            # within the original context, so transformers uses the short ones
            # (as does a cache of at most 4096 tokens).
            max_position_embeddings=16384,
            original_max_position_embeddings=4096,
            rope_parameters=dict(
                rope_type="longrope",
                rope_theta=10000.0,
                short_factor=[1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0],
                long_factor=[1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0],
                original_max_position_embeddings=4096,
            ),
        ),
    ),
    "gpt-oss": dict(
        emb_std=1.0,
        out_gain=1.0,
        config_cls=GptOssConfig,
        model_cls=GptOssForCausalLM,
        gguf_arch="gpt-oss",
        kwargs=dict(
            hidden_size=64,
            intermediate_size=32,  # each expert's width
            num_local_experts=4,
            num_experts_per_tok=2,
            num_hidden_layers=2,  # sliding, full
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=8,
            max_position_embeddings=64,  # factor x original
            attention_bias=True,
            tie_word_embeddings=False,
            rms_norm_eps=1e-5,
            swiglu_limit=7.0,
            # YaRN as gpt-oss has it (truncate false: a fractional ramp), with
            # a tiny original context so the fixture's positions see it
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=4.0,
                beta_fast=32.0,
                beta_slow=1.0,
                truncate=False,
                original_max_position_embeddings=16,
            ),
        ),
    ),
}

GEMMA = ("gemma2", "gemma3")
MOE = ("qwen3moe", "mixtral")


# --------------------------------------------------------------------------------------
# Model construction / init
# --------------------------------------------------------------------------------------
def build_model(arch: str, emb_std=None, out_gain=None):
    spec = ARCHS[arch]
    emb_std = spec.get("emb_std", 1.0) if emb_std is None else emb_std
    out_gain = spec.get("out_gain", 1.0) if out_gain is None else out_gain
    cfg = spec["config_cls"](**{**COMMON, **spec["kwargs"]})
    cfg._attn_implementation = "eager"
    torch.manual_seed(SEED + sum(map(ord, arch)))
    model = spec["model_cls"](cfg).to(torch.float32).eval()
    model.config._attn_implementation = "eager"
    is_gemma = arch in GEMMA
    hidden = cfg.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "model.norm.weight":
                # final norm: effective scale ~ N(0, 1) with random signs.  With tied
                # embeddings this cancels the input token's self-affinity E_t.(g*E_t),
                # which otherwise makes random tied models loop on one token.
                p.copy_(torch.randn_like(p) - (1.0 if is_gemma else 0.0))
            elif name.endswith("norm.weight"):
                if is_gemma:  # effective scale is (1 + w)
                    p.copy_(torch.randn_like(p) * 0.3)
                else:
                    p.copy_(1.0 + torch.randn_like(p) * 0.3)
            elif "embed_tokens" in name:
                # per-arch: with tied embeddings a large embedding makes the residual
                # copy of the input token dominate the logits (greedy self-loops)
                p.copy_(torch.randn_like(p) * emb_std)
            elif name == "lm_head.weight":
                p.copy_(torch.randn_like(p) * (2.0 / math.sqrt(hidden)))
            elif name.endswith((".bias", "_bias")):
                p.copy_(torch.randn_like(p) * 0.3)
            elif name.endswith(".sinks"):
                p.copy_(torch.randn_like(p))  # logits of the size scores have
            elif arch == "gpt-oss" and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                # gpt-oss stores experts input-major: [E, in, out]
                p.copy_(torch.randn_like(p) * (1.0 / math.sqrt(p.shape[1])))
            elif name.endswith(".weight") and p.dim() == 2 or ".experts." in name:  # noqa: E501
                fan_in = p.shape[1]
                gain = 1.0
                if "q_proj" in name or "k_proj" in name:
                    gain = 1.6  # sharper attention so rope / windows matter
                elif name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight", "mlp.router.weight")):
                    gain = 2.0  # a router that prefers clearly: distinct choices per token
                elif "o_proj" in name or "down_proj" in name:
                    gain = out_gain
                p.copy_(torch.randn_like(p) * (gain / math.sqrt(fan_in)))
            else:
                raise RuntimeError(f"unhandled parameter {name}")
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return cfg, model


@torch.no_grad()
def hf_logits(model, ids: list[int]) -> np.ndarray:
    out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].float().numpy()


@torch.no_grad()
def greedy(model, ids: list[int], n: int):
    seq = list(ids)
    toks, margins = [], []
    for _ in range(n):
        last = hf_logits(model, seq)[-1]  # full recompute every step
        order = np.argsort(-last.astype(np.float64), kind="stable")
        t = int(order[0])
        toks.append(t)
        margins.append(float(last[order[0]] - last[order[1]]))
        seq.append(t)
    return toks, margins


def r6(x: float) -> float:
    return float(f"{float(x):.6g}")


# --------------------------------------------------------------------------------------
# GGUF writing (mirrors convert_hf_to_gguf.py)
# --------------------------------------------------------------------------------------
def permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """LlamaModel.permute from convert_hf_to_gguf.py (HF rotate_half -> GGUF interleaved)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def llama3_rope_factors(rope: dict, head_dim: int, old_context_len: int) -> np.ndarray:
    """LlamaModel.generate_extra_tensors (rope_freqs.weight)."""
    base = rope.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor = rope.get("factor", 8.0)
    low_freq_factor = rope.get("low_freq_factor", 1.0)
    high_freq_factor = rope.get("high_freq_factor", 4.0)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            out.append(1)
        elif wavelen > low_freq_wavelen:
            out.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


def write_gguf(arch: str, cfg, state: dict[str, torch.Tensor], path: Path) -> None:
    spec = ARCHS[arch]
    garch = spec["gguf_arch"]
    march = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[garch]
    hp = cfg.to_dict()
    n_layer = hp["num_hidden_layers"]
    tmap = gguf.get_tensor_name_map(march, n_layer)

    w = gguf.GGUFWriter(str(path), garch)
    # general.*
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"spindle-tiny-{arch}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    # key_length/value_length are only written when the HF config has head_dim
    # (qwen2 configs don't: consumers derive n_embd / n_head)
    cfg_head_dim = hp.get("head_dim")
    head_dim = cfg_head_dim or hp["hidden_size"] // hp["num_attention_heads"]
    rope = hp.get("rope_parameters") or {}
    if arch not in ("gemma2", "phi3"):
        # TextModel.set_gguf_parameters (llama, qwen2, qwen3, gemma3 call it)
        w.add_block_count(n_layer)
        w.add_context_length(hp["max_position_embeddings"])
        w.add_embedding_length(hp["hidden_size"])
        w.add_feed_forward_length(hp["intermediate_size"])
        w.add_head_count(hp["num_attention_heads"])
        w.add_head_count_kv(hp["num_key_value_heads"])
        full = rope.get("full_attention", rope)
        w.add_rope_freq_base(full["rope_theta"])
        if "sliding_attention" in rope:
            w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
        w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
        if cfg_head_dim is not None:
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)
    if garch == "llama":
        # LlamaModel.set_gguf_parameters
        w.add_vocab_size(hp["vocab_size"])
        w.add_rope_dimension_count(head_dim)
    if arch == "phi3":
        # Phi3MiniModel.set_gguf_parameters and its rope factor tensors
        w.add_context_length(hp["max_position_embeddings"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_embedding_length(hp["hidden_size"])
        w.add_feed_forward_length(hp["intermediate_size"])
        w.add_block_count(n_layer)
        w.add_head_count(hp["num_attention_heads"])
        w.add_head_count_kv(hp["num_key_value_heads"])
        w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(rope["rope_theta"])
        scale = hp["max_position_embeddings"] / rope["original_max_position_embeddings"]
        attn_factor = 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(rope["original_max_position_embeddings"]))
        w.add_rope_scaling_attn_factors(attn_factor)
        w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    if arch == "gpt-oss":
        # GptOssModel.set_gguf_parameters (on top of TextModel's)
        w.add_sliding_window(hp["sliding_window"])
        w.add_expert_count(hp["num_local_experts"])
        w.add_expert_used_count(hp["num_experts_per_tok"])
        w.add_expert_feed_forward_length(hp["intermediate_size"])
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if arch == "mixtral":
        # TextModel.set_gguf_parameters writes these for any config that has them
        w.add_expert_count(hp["num_local_experts"])
        w.add_expert_used_count(hp["num_experts_per_tok"])
    if arch == "qwen3moe":
        # Qwen2MoeModel.set_gguf_parameters (Qwen3MoeModel inherits it)
        w.add_expert_count(hp.get("num_experts") or hp["num_local_experts"])
        w.add_expert_used_count(hp["num_experts_per_tok"])
        w.add_expert_feed_forward_length(hp["moe_intermediate_size"])
    if arch == "gemma2":
        # Gemma2Model.set_gguf_parameters (does not call super: no rope.freq_base,
        # llama.cpp's default 10000 applies)
        w.add_context_length(hp["max_position_embeddings"])
        w.add_embedding_length(hp["hidden_size"])
        w.add_block_count(n_layer)
        w.add_feed_forward_length(hp["intermediate_size"])
        w.add_head_count(hp["num_attention_heads"])
        w.add_head_count_kv(hp["num_key_value_heads"])
        w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_attn_logit_softcapping(hp["attn_logit_softcapping"])
        w.add_final_logit_softcapping(hp["final_logit_softcapping"])
        w.add_sliding_window(hp["sliding_window"])
        assert rope["rope_theta"] == 10000.0
    if arch == "gemma3":
        # Gemma3Model.set_gguf_parameters (on top of TextModel's)
        assert hp.get("attn_logit_softcapping") is None
        if hp.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(hp["final_logit_softcapping"])
        w.add_sliding_window(hp["sliding_window"])
    # tokenizer ids only (tests use token ids; no vocab is written)
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)

    # tensors
    n_head, n_kv = hp["num_attention_heads"], hp["num_key_value_heads"]
    if garch == "llama" and rope.get("rope_type") == "llama3":
        old_ctx = hp.get("original_max_position_embeddings", 8192)
        assert old_ctx == rope["original_max_position_embeddings"]
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(rope, head_dim, old_ctx))
    # Experts: one stacked [n_experts, rows, cols] tensor per layer and kind,
    # as the converter merges them (experts.{j}.{gate,up,down}_proj / w1, w3, w2).
    expert_kinds = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps",
                    "w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps"}
    stacks: dict[str, dict[int, np.ndarray]] = {}
    for name in list(state):
        if ".experts." not in name or arch == "gpt-oss":
            continue
        parts = name.split(".")
        il, j, kind = int(parts[2]), int(parts[parts.index("experts") + 1]), parts[-2]
        stacks.setdefault(f"blk.{il}.{expert_kinds[kind]}.weight", {})[j] = (
            state[name].detach().to(torch.float32).numpy()
        )
    if arch == "gpt-oss":
        # GptOssModel.modify_tensors: transformers keeps each layer's experts
        # input-major with gate and up interleaved; GGUF gets them split and
        # output-major, biases split the same way
        for name in list(state):
            if not name.endswith(("experts.gate_up_proj", "experts.down_proj",
                                  "experts.gate_up_proj_bias", "experts.down_proj_bias")):
                continue
            il = int(name.split(".")[2])
            t = state.pop(name).detach().to(torch.float32).numpy()
            blk = f"blk.{il}."
            if name.endswith("gate_up_proj"):
                w.add_tensor(blk + "ffn_gate_exps.weight", np.ascontiguousarray(t[:, :, 0::2].transpose(0, 2, 1)))
                w.add_tensor(blk + "ffn_up_exps.weight", np.ascontiguousarray(t[:, :, 1::2].transpose(0, 2, 1)))
            elif name.endswith("gate_up_proj_bias"):
                w.add_tensor(blk + "ffn_gate_exps.bias", np.ascontiguousarray(t[:, 0::2]))
                w.add_tensor(blk + "ffn_up_exps.bias", np.ascontiguousarray(t[:, 1::2]))
            elif name.endswith("down_proj"):
                w.add_tensor(blk + "ffn_down_exps.weight", np.ascontiguousarray(t.transpose(0, 2, 1)))
            else:
                w.add_tensor(blk + "ffn_down_exps.bias", np.ascontiguousarray(t))
    for new, by_j in sorted(stacks.items()):
        w.add_tensor(new, np.ascontiguousarray(np.stack([by_j[j] for j in sorted(by_j)]), dtype=np.float32))
    for name in sorted(state):
        t = state[name].detach().to(torch.float32).numpy().copy()
        if name == "lm_head.weight" and hp["tie_word_embeddings"]:
            continue
        if ".experts." in name and arch != "gpt-oss":
            continue
        if name.endswith(".sinks"):
            w.add_tensor(f"blk.{name.split('.')[2]}.attn_sinks.weight", np.ascontiguousarray(t, dtype=np.float32))
            continue
        if name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
            w.add_tensor(f"blk.{name.split('.')[2]}.ffn_gate_inp.weight", np.ascontiguousarray(t, dtype=np.float32))
            continue
        if garch == "llama":
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                t = permute(t, n_head, n_head)
            if name.endswith(("k_proj.weight", "k_proj.bias")):
                t = permute(t, n_head, n_kv)
        if arch in GEMMA and name.endswith("norm.weight"):
            t = t + 1.0
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise RuntimeError(f"cannot map {name}")
        w.add_tensor(new, np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# --------------------------------------------------------------------------------------
# Independent numpy forward pass from the GGUF (llama.cpp semantics), float64
# --------------------------------------------------------------------------------------
def _field(r: gguf.GGUFReader, key: str, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _rope(x, pos, base, neox, freq_factors=None):
    # x: [T, H, D]
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if freq_factors is not None:
        inv = inv / freq_factors
    ang = pos[:, None].astype(np.float64) * inv[None, :]  # [T, D/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if neox:
        x0, x1 = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def _q8(x):
    """Int8 activations as the engines quantize them for a quantized matrix:
    per 32 values, scale amax / 127, values rounded half to even (float32)."""
    x32 = np.asarray(x, dtype=np.float32)
    blocks = x32.reshape(*x32.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127.0) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.clip(np.round(blocks * inv), -127, 127)
    return (q * (amax / np.float32(127.0))).reshape(x32.shape).astype(np.float64)


class _Acts:
    """What a matmul input becomes: itself, or with `emulate` its int8
    quantization when the matrix is quantized."""

    def __init__(self, quantized: set, emulate: bool):
        self.quantized, self.emulate = quantized, emulate

    def __call__(self, x, name):
        return _q8(x) if self.emulate and name in self.quantized else x


def _moe(h, T, p, k, route_gaps, acts=None):
    """llama.cpp's build_moe_ffn with softmax gating and normalized weights."""
    logits = h @ T[p + "ffn_gate_inp.weight"].T  # [n, E]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    gate, up, down = (T[p + f"ffn_{s}_exps.weight"] for s in ("gate", "up", "down"))
    out = np.zeros_like(h)
    for i in range(h.shape[0]):
        order = np.argsort(-probs[i], kind="stable")
        top = order[:k]
        route_gaps.append(float(probs[i, order[k - 1]] - probs[i, order[k]]))
        wts = probs[i, top] / probs[i, top].sum()
        for j, wt in zip(top, wts):
            x = acts(h[i], p + "ffn_gate_exps.weight") if acts else h[i]
            a = _silu(gate[j] @ x) * (up[j] @ x)
            out[i] += wt * (down[j] @ (acts(a, p + "ffn_down_exps.weight") if acts else a))
    return out


def _yarn(g, hd, base, truncate):
    """YaRN per-pair divisors and attention factor from the GGUF keys."""
    factor = g("rope.scaling.factor")
    orig = g("rope.scaling.original_context_length")
    beta_fast, beta_slow = 32.0, 1.0

    def dim_of(rot):
        return hd * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, hd - 1)
    span = (high - low) if high != low else 0.001
    ramp = np.clip((np.arange(hd // 2) - low) / span, 0, 1)
    extrapolate = 1 - ramp
    divisors = 1 / ((1 - extrapolate) / factor + extrapolate)
    return divisors, 0.1 * math.log(factor) + 1


def _moe_gpt_oss(h, T, p, k, route_gaps, acts=None, alpha=1.702, limit=7.0):
    """gpt-oss's experts: top-k router logits, softmax over them, biased
    projections and the clamped SwiGLU."""
    logits = h @ T[p + "ffn_gate_inp.weight"].T + T[p + "ffn_gate_inp.bias"]
    gate, up, down = (T[p + f"ffn_{s}_exps.weight"] for s in ("gate", "up", "down"))
    gb, ub, db = (T[p + f"ffn_{s}_exps.bias"] for s in ("gate", "up", "down"))
    out = np.zeros_like(h)
    for i in range(h.shape[0]):
        order = np.argsort(-logits[i], kind="stable")
        top = order[:k]
        route_gaps.append(float(logits[i, order[k - 1]] - logits[i, order[k]]))
        wts = np.exp(logits[i, top] - logits[i, top].max())
        wts /= wts.sum()
        for j, wt in zip(top, wts):
            hq = acts(h[i], p + "ffn_gate_exps.weight") if acts else h[i]
            x = np.minimum(gate[j] @ hq + gb[j], limit)
            u = np.clip(up[j] @ hq + ub[j], -limit, limit)
            a = x / (1 + np.exp(-alpha * x)) * (u + 1)
            a = acts(a, p + "ffn_down_exps.weight") if acts else a
            out[i] += wt * (down[j] @ a + db[j])
    return out


def gguf_forward(path: Path, ids: list[int], route_gaps: list | None = None, long_rope=False,
                 int8_acts=False) -> np.ndarray:
    route_gaps = [] if route_gaps is None else route_gaps
    r = gguf.GGUFReader(str(path))
    acts = _Acts({t.name for t in r.tensors if t.tensor_type != gguf.GGMLQuantizationType.F32}, int8_acts)
    arch = _field(r, "general.architecture")
    T = {
        t.name: np.array(
            t.data if t.tensor_type == gguf.GGMLQuantizationType.F32
            else gguf.quants.dequantize(t.data, t.tensor_type),
            dtype=np.float64,
        )
        for t in r.tensors
    }
    g = lambda k, d=None: _field(r, f"{arch}.{k}", d)  # noqa: E731
    n_layer = g("block_count")
    n_embd = g("embedding_length")
    n_head = g("attention.head_count")
    n_kv = g("attention.head_count_kv")
    hd = g("attention.key_length", n_embd // n_head)
    eps = g("attention.layer_norm_rms_epsilon")
    base = g("rope.freq_base", 10000.0)
    base_swa = g("rope.freq_base_swa", 10000.0)
    n_swa = g("attention.sliding_window", 0)
    attn_cap = g("attn_logit_softcapping")
    final_cap = g("final_logit_softcapping")
    neox = arch != "llama"
    is_gemma = arch in ("gemma2", "gemma3")
    # hard-coded in llama.cpp (llama-model.cpp): gemma2 swa pattern 2, gemma3 pattern 6;
    # layer il uses SWA iff il % pattern < pattern - 1
    pattern = {"gemma2": 2, "gemma3": 6, "gpt-oss": 2}.get(arch, 0)
    gpt_oss = arch == "gpt-oss"
    freq_factors = T.get("rope_freqs.weight")
    # phi3 LongRoPE: llama.cpp takes the short factors while the context is
    # within the original one (the fixture's is), and scales q and k
    if "rope_factors_short.weight" in T:
        freq_factors = T["rope_factors_long.weight" if long_rope else "rope_factors_short.weight"]
    attn_factor = g("rope.scaling.attn_factor", 1.0)
    if g("rope.scaling.type") == "yarn":
        freq_factors, attn_factor = _yarn(g, hd, base, truncate=not gpt_oss)

    n = len(ids)
    pos = np.arange(n)
    x = T["token_embd.weight"][ids]
    if is_gemma:
        x = x * math.sqrt(n_embd)
    for il in range(n_layer):
        p = f"blk.{il}."
        swa = pattern and n_swa and (il % pattern < pattern - 1)
        h = _rms(x, T[p + "attn_norm.weight"], eps)
        if p + "attn_qkv.weight" in T:  # phi3: fused q, k, v
            qkv = acts(h, p + "attn_qkv.weight") @ T[p + "attn_qkv.weight"].T
            q, k, v = np.split(qkv, [n_head * hd, n_head * hd + n_kv * hd], axis=-1)
        else:
            q = acts(h, p + "attn_q.weight") @ T[p + "attn_q.weight"].T
            k = acts(h, p + "attn_k.weight") @ T[p + "attn_k.weight"].T
            v = acts(h, p + "attn_v.weight") @ T[p + "attn_v.weight"].T
        if p + "attn_q.bias" in T:
            q, k, v = q + T[p + "attn_q.bias"], k + T[p + "attn_k.bias"], v + T[p + "attn_v.bias"]
        q = q.reshape(n, n_head, hd)
        k = k.reshape(n, n_kv, hd)
        v = v.reshape(n, n_kv, hd)
        if p + "attn_q_norm.weight" in T:
            q = _rms(q, T[p + "attn_q_norm.weight"], eps)
            k = _rms(k, T[p + "attn_k_norm.weight"], eps)
        b = base_swa if (arch == "gemma3" and swa) else base
        q = _rope(q, pos, b, neox, freq_factors) * attn_factor
        k = _rope(k, pos, b, neox, freq_factors) * attn_factor
        grp = n_head // n_kv
        k = np.repeat(k, grp, axis=1)
        v = np.repeat(v, grp, axis=1)
        s = np.einsum("ihd,jhd->hij", q, k) / math.sqrt(hd)
        if attn_cap:
            s = np.tanh(s / attn_cap) * attn_cap
        i_, j_ = np.meshgrid(pos, pos, indexing="ij")
        allowed = j_ <= i_
        if swa:
            allowed &= (i_ - j_) < n_swa
        s = np.where(allowed[None], s, -np.inf)
        if p + "attn_sinks.weight" in T:
            # a logit per head that joins the softmax without a value
            sink = np.broadcast_to(T[p + "attn_sinks.weight"][:, None, None], (n_head, n, 1))
            both = np.concatenate([s, sink], axis=-1)
            both = np.exp(both - both.max(-1, keepdims=True))
            a = both[..., :-1] / both.sum(-1, keepdims=True)
        else:
            s = s - s.max(-1, keepdims=True)
            a = np.exp(s)
            a /= a.sum(-1, keepdims=True)
        o = np.einsum("hij,jhd->ihd", a, v).reshape(n, n_head * hd)
        o = acts(o, p + "attn_output.weight") @ T[p + "attn_output.weight"].T
        if p + "attn_output.bias" in T:
            o = o + T[p + "attn_output.bias"]
        if p + "post_attention_norm.weight" in T and not gpt_oss:
            o = _rms(o, T[p + "post_attention_norm.weight"], eps)
        x = x + o
        # llama.cpp names gpt-oss's pre-FFN norm post_attention_norm
        h = _rms(x, T[p + ("post_attention_norm.weight" if gpt_oss else "ffn_norm.weight")], eps)
        if gpt_oss:
            f = _moe_gpt_oss(h, T, p, g("expert_used_count"), route_gaps, acts)
        elif p + "ffn_gate_inp.weight" in T:
            f = _moe(h, T, p, g("expert_used_count"), route_gaps, acts)
        elif p + "ffn_gate.weight" not in T:  # phi3: gate and up fused in ffn_up
            gate, up = np.split(acts(h, p + "ffn_up.weight") @ T[p + "ffn_up.weight"].T, 2, axis=-1)
            f = acts(_silu(gate) * up, p + "ffn_down.weight") @ T[p + "ffn_down.weight"].T
        else:
            gate = acts(h, p + "ffn_gate.weight") @ T[p + "ffn_gate.weight"].T
            up = acts(h, p + "ffn_up.weight") @ T[p + "ffn_up.weight"].T
            act = _gelu_tanh(gate) if is_gemma else _silu(gate)
            f = acts(act * up, p + "ffn_down.weight") @ T[p + "ffn_down.weight"].T
        if p + "post_ffw_norm.weight" in T:
            f = _rms(f, T[p + "post_ffw_norm.weight"], eps)
        x = x + f
    x = _rms(x, T["output_norm.weight"], eps)
    head = "output.weight" if "output.weight" in T else "token_embd.weight"
    logits = acts(x, head) @ T[head].T
    if final_cap:
        logits = np.tanh(logits / final_cap) * final_cap
    return logits


# --------------------------------------------------------------------------------------
def make(arch: str, rng: np.random.Generator) -> dict:
    cfg, model = build_model(arch)
    d = OUT / arch
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    model.save_pretrained(d, safe_serialization=True)
    for f in d.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            f.unlink()

    # reload from disk (proves the saved checkpoint is what the reference describes)
    model = ARCHS[arch]["model_cls"].from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    from safetensors.torch import load_file

    state = load_file(str(d / "model.safetensors"))
    assert ("lm_head.weight" in state) == (not cfg.tie_word_embeddings), (arch, sorted(state)[:3])
    write_gguf(arch, model.config, state, d / "model.gguf")

    prompts = []
    worst = 0.0
    route_gap = float("inf")
    for L in PROMPT_LENS:
        ids = [int(t) for t in rng.integers(3, VOCAB, size=L)]
        logits = hf_logits(model, ids)
        gaps: list[float] = []
        ref = gguf_forward(d / "model.gguf", ids, gaps)
        if gaps:
            # a near tie between the k-th and the next expert would make the
            # choice, and so the logits, hang on rounding (float32 moves a
            # probability by ~1e-7 here)
            assert min(gaps) > 1e-5, f"{arch}: router near-tie {min(gaps)}"
        err = float(np.max(np.abs(ref - logits)))
        worst = max(worst, err)
        assert err < 1e-4, f"{arch}: GGUF numpy forward differs from transformers by {err}"
        toks, margins = greedy(model, ids, N_GREEDY)
        # the same greedy continuation from the GGUF path where the margin is safe
        full = hf_logits(model, ids + toks)
        gaps_full: list[float] = []
        ref_full = gguf_forward(d / "model.gguf", ids + toks, gaps_full)
        assert not gaps_full or min(gaps_full) > 1e-5, f"{arch}: router near-tie in greedy"
        route_gap = min([route_gap, *gaps_full]) if gaps_full else route_gap
        assert float(np.max(np.abs(ref_full - full))) < 1e-4
        for i, (t, m) in enumerate(zip(toks, margins)):
            if m > 1e-4:
                assert int(np.argmax(ref_full[L - 1 + i])) == t
        prompts.append(
            dict(
                ids=ids,
                logits=[[r6(v) for v in row] for row in logits],
                greedy=toks,
                greedy_margin=[r6(m) for m in margins],
            )
        )
        distinct = len(set(toks))
        assert distinct >= 3, f"{arch}: degenerate greedy output {toks}"
    if arch == "phi3":
        # a cache past the original context switches to the long factors
        # (llama.cpp's rule); transformers has no fixed-cache equivalent, so
        # the reference is the float64 GGUF forward pass
        long = gguf_forward(d / "model.gguf", prompts[0]["ids"], long_rope=True)
        prompts[0]["long_rope_logits"] = [[r6(v) for v in row] for row in long]
    hp = model.config
    layer_types = getattr(hp, "layer_types", None)
    ref = dict(
        arch=arch,
        gguf_arch=ARCHS[arch]["gguf_arch"],
        vocab_size=VOCAB,
        sliding_window=getattr(hp, "sliding_window", None) if arch in GEMMA else None,
        layer_types=list(layer_types) if (layer_types and arch in GEMMA) else None,
        note="logits: transformers eager float32, every position, 6 significant digits; "
        "greedy: argmax with full recompute; greedy_margin: top1-top2 logit gap per step",
        prompts=prompts,
    )
    with open(d / "reference.json", "w") as f:
        json.dump(ref, f, separators=(",", ":"))
    if arch in QUANTIZED:
        write_quantized(arch, d, prompts)
    lg = np.array([v for p in prompts for row in p["logits"] for v in row])
    print(
        f"{arch:8s} gguf-vs-hf max|d|={worst:.2e}  logits std={lg.std():.2f}  "
        f"greedy={[p['greedy'] for p in prompts][2]}  min margin={min(min(p['greedy_margin']) for p in prompts):.3g}"
        + (f"  min router gap={route_gap:.2e}" if route_gap < float("inf") else "")
    )
    return ref


# Quantized copies of the mixture-of-experts models, typed as the published
# files are: experts in a 4-bit type (Q4_0 for Qwen3-MoE, MXFP4 for gpt-oss),
# attention and the head in Q8_0, router, norms, biases and sinks in F32.
QUANTIZED = {
    "qwen3moe": gguf.GGMLQuantizationType.Q4_0,
    "gpt-oss": gguf.GGMLQuantizationType.MXFP4,
}


def write_quantized(arch: str, d: Path, prompts: list[dict]) -> None:
    src = gguf.GGUFReader(str(d / "model.gguf"))
    out = d / "model-quant.gguf"
    w = gguf.GGUFWriter(str(out), ARCHS[arch]["gguf_arch"])
    for field in src.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        w.add_key_value(field.name, field.contents(), field.types[0], field.types[-1] if len(field.types) > 1 else None)
    for t in src.tensors:
        data = np.array(t.data, dtype=np.float32)
        if "_exps.weight" in t.name:
            qt = QUANTIZED[arch]
        elif data.ndim == 2 and "ffn_gate_inp" not in t.name:
            qt = gguf.GGMLQuantizationType.Q8_0
        else:
            qt = gguf.GGMLQuantizationType.F32
        if qt == gguf.GGMLQuantizationType.F32:
            w.add_tensor(t.name, data)
        else:
            w.add_tensor(t.name, gguf.quants.quantize(data, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ref = []
    for p in prompts:
        gaps: list[float] = []
        logits = gguf_forward(out, p["ids"], gaps)
        assert min(gaps) > 1e-5, f"{arch} quantized: router near-tie {min(gaps)}"
        gaps_int8: list[float] = []
        emulated = gguf_forward(out, p["ids"], gaps_int8, int8_acts=True)
        assert min(gaps_int8) > 1e-5, f"{arch} quantized int8: router near-tie {min(gaps_int8)}"
        ref.append(dict(
            ids=p["ids"],
            logits=[[r6(v) for v in row] for row in logits],
            logits_int8_acts=[[r6(v) for v in row] for row in emulated],
        ))
    (d / "reference-quant.json").write_text(json.dumps(dict(
        arch=arch,
        types={"experts": QUANTIZED[arch].name, "matrices": "Q8_0", "router, vectors": "F32"},
        note="float64 forward pass over gguf-py's dequantization of model-quant.gguf; "
        "logits_int8_acts: the same with every quantized matrix's input rounded to int8 "
        "per 32 values (scale amax/127, ties to even), as the engines compute",
        prompts=ref,
    ), separators=(",", ":")))
    print(f"  {arch}: model-quant.gguf {out.stat().st_size / 1024:.1f} KiB")


def main(argv: list[str]) -> None:
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, gguf {gguf.__file__}")
    archs = argv or list(ARCHS)
    rng = np.random.default_rng(SEED)
    for arch in ARCHS:  # consume the rng identically whatever subset is requested
        sub = np.random.default_rng(rng.integers(1 << 31))
        if arch in archs:
            make(arch, sub)
    for a in ARCHS:
        if not (OUT / a).is_dir():
            continue
        for f in sorted((OUT / a).iterdir()):
            print(f"  {f.relative_to(REPO)}  {f.stat().st_size/1024:.1f} KiB")
    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"total tiny fixture size: {total/1e6:.2f} MB")


if __name__ == "__main__":
    main(sys.argv[1:])
