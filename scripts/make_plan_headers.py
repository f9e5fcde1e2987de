#!/usr/bin/env python3
"""Header-only GGUF copies of two public mixture-of-experts models, for the
planner's tests: Qwen3-30B-A3B and gpt-oss-20b, with their published shapes
(from their config.json files) and the tensor names and types llama.cpp's
converter writes. Only the header is written (metadata and tensor infos):
the planner reads no more, and the files stay a few tens of KiB.

Beside each file, `<name>.expected.json` holds what gguf-py computes from
the same tensor list: the sum of the tensor sizes, the experts' share, and
the bytes one token reads (shared tensors plus `n_used` of `n_experts`
experts). The planner's figures are checked against these.

    /work/pyenv/bin/python scripts/make_plan_headers.py
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "crates" / "spindle-plan" / "tests" / "fixtures" / "moe"
Q = gguf.GGMLQuantizationType


def nbytes(shape: list[int], ty: Q) -> int:
    block, size = gguf.GGML_QUANT_SIZES[ty]
    n = int(np.prod(shape))
    assert shape[-1] % block == 0, (shape, ty)
    return n // block * size


def write(name: str, arch: str, kv: dict, tensors: list[tuple[str, list[int], Q]], experts: tuple[int, int]):
    w = gguf.GGUFWriter(str(OUT / f"{name}.gguf"), arch)
    w.add_name(name)
    for key, value in kv.items():
        if isinstance(value, float):
            w.add_float32(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", value)
    total = expert_total = 0
    for tname, shape, ty in tensors:
        b = nbytes(shape, ty)
        total += b
        if "_exps." in tname:
            expert_total += b
        # a quantized tensor's info is its byte shape (rows x bytes per row)
        byte_shape = shape[:-1] + [nbytes([shape[-1]], ty)]
        w.add_tensor_info(tname, byte_shape, np.dtype(np.uint8), b, raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    n_experts, n_used = experts
    embd = next(nbytes(s, t) for n, s, t in tensors if n == "token_embd.weight")
    read = total - embd - expert_total + expert_total * n_used // n_experts
    expected = dict(
        tensor_bytes=total,
        expert_bytes=expert_total,
        n_experts=n_experts,
        n_used=n_used,
        decode_read_bytes_one_token=read,
        note="gguf-py's GGML_QUANT_SIZES over the tensor list; one token reads every "
        "tensor but the (untied) embedding and n_used/n_experts of the experts",
    )
    (OUT / f"{name}.expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    size = (OUT / f"{name}.gguf").stat().st_size
    print(f"{name}: {len(tensors)} tensors, {total / 1e9:.3f} GB, header {size / 1024:.1f} KiB")


def qwen3_30b_a3b():
    # config.json of Qwen3-30B-A3B; types of a Q4_K_M quantization
    L, E, H, KV, D, X, K, FF, V = 48, 2048, 32, 4, 128, 128, 8, 768, 151936
    t = [("token_embd.weight", [V, E], Q.Q4_K), ("output_norm.weight", [E], Q.F32), ("output.weight", [V, E], Q.Q6_K)]
    for l in range(L):
        p = f"blk.{l}."
        t += [
            (p + "attn_norm.weight", [E], Q.F32),
            (p + "attn_q.weight", [H * D, E], Q.Q4_K),
            (p + "attn_k.weight", [KV * D, E], Q.Q4_K),
            (p + "attn_v.weight", [KV * D, E], Q.Q6_K),
            (p + "attn_output.weight", [E, H * D], Q.Q4_K),
            (p + "attn_q_norm.weight", [D], Q.F32),
            (p + "attn_k_norm.weight", [D], Q.F32),
            (p + "ffn_norm.weight", [E], Q.F32),
            (p + "ffn_gate_inp.weight", [X, E], Q.F32),
            (p + "ffn_gate_exps.weight", [X, FF, E], Q.Q4_K),
            (p + "ffn_up_exps.weight", [X, FF, E], Q.Q4_K),
            (p + "ffn_down_exps.weight", [X, E, FF], Q.Q6_K),
        ]
    kv = {
        "block_count": L, "context_length": 40960, "embedding_length": E, "feed_forward_length": 6144,
        "attention.head_count": H, "attention.head_count_kv": KV, "attention.key_length": D,
        "attention.value_length": D, "rope.freq_base": 1_000_000.0, "attention.layer_norm_rms_epsilon": 1e-6,
        "expert_count": X, "expert_used_count": K, "expert_feed_forward_length": FF,
    }
    write("qwen3-30b-a3b", "qwen3moe", kv, t, (X, K))


def gpt_oss_20b():
    # config.json of gpt-oss-20b; MXFP4 experts, the rest as the published GGUF (F32 / Q8_0)
    L, E, H, KV, D, X, K, FF, V = 24, 2880, 64, 8, 64, 32, 4, 2880, 201088
    t = [("token_embd.weight", [V, E], Q.Q8_0), ("output_norm.weight", [E], Q.F32), ("output.weight", [V, E], Q.Q8_0)]
    for l in range(L):
        p = f"blk.{l}."
        t += [
            (p + "attn_norm.weight", [E], Q.F32),
            (p + "attn_q.weight", [H * D, E], Q.Q8_0),
            (p + "attn_q.bias", [H * D], Q.F32),
            (p + "attn_k.weight", [KV * D, E], Q.Q8_0),
            (p + "attn_k.bias", [KV * D], Q.F32),
            (p + "attn_v.weight", [KV * D, E], Q.Q8_0),
            (p + "attn_v.bias", [KV * D], Q.F32),
            (p + "attn_output.weight", [E, H * D], Q.Q8_0),
            (p + "attn_output.bias", [E], Q.F32),
            (p + "attn_sinks.weight", [H], Q.F32),
            (p + "post_attention_norm.weight", [E], Q.F32),
            (p + "ffn_gate_inp.weight", [X, E], Q.F32),
            (p + "ffn_gate_inp.bias", [X], Q.F32),
            (p + "ffn_gate_exps.weight", [X, FF, E], Q.MXFP4),
            (p + "ffn_gate_exps.bias", [X, FF], Q.F32),
            (p + "ffn_up_exps.weight", [X, FF, E], Q.MXFP4),
            (p + "ffn_up_exps.bias", [X, FF], Q.F32),
            (p + "ffn_down_exps.weight", [X, E, FF], Q.MXFP4),
            (p + "ffn_down_exps.bias", [X, E], Q.F32),
        ]
    kv = {
        "block_count": L, "context_length": 131072, "embedding_length": E, "feed_forward_length": FF,
        "attention.head_count": H, "attention.head_count_kv": KV, "attention.key_length": D,
        "attention.value_length": D, "rope.freq_base": 150000.0, "attention.layer_norm_rms_epsilon": 1e-5,
        "attention.sliding_window": 128, "expert_count": X, "expert_used_count": K,
        "expert_feed_forward_length": FF, "rope.scaling.factor": 32.0,
        "rope.scaling.original_context_length": 4096,
    }
    write("gpt-oss-20b", "gpt-oss", kv, t, (X, K))


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    qwen3_30b_a3b()
    gpt_oss_20b()
