#!/usr/bin/env python3
"""A synthetic mixture-of-experts GGUF for speed measurements: random
weights in the shape of a small Qwen3-MoE (no real model of that kind can be
fetched here), quantized with gguf-py, with a minimal byte-level BPE
vocabulary so llama.cpp's tools load it too. Its outputs mean nothing; its
passes cost what a real model of the same shape and types costs.

    python3 bench/synthetic_moe.py OUT.gguf [--layers 6] [--experts 64] [--used 8]
        [--embd 1024] [--expert-ff 512] [--type Q4_0]

Needs numpy and gguf (pip).
"""

from __future__ import annotations

import argparse

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--used", type=int, default=8)
    ap.add_argument("--embd", type=int, default=1024)
    ap.add_argument("--expert-ff", type=int, default=512)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--type", default="Q4_0", help="type of the expert and attention matrices")
    a = ap.parse_args()
    qt = Q[a.type]
    rng = np.random.default_rng(0)
    hd = 128 if a.embd >= 2048 else 64
    E, L = a.embd, a.layers

    w = gguf.GGUFWriter(a.out, "qwen3moe")
    w.add_name(f"synthetic-qwen3moe-{L}L-{a.experts}x{a.used}")
    w.add_block_count(L)
    w.add_context_length(4096)
    w.add_embedding_length(E)
    w.add_feed_forward_length(4 * E)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(a.experts)
    w.add_expert_used_count(a.used)
    w.add_expert_feed_forward_length(a.expert_ff)
    # A byte-level BPE vocabulary: 256 byte tokens, then merged pairs.
    tokens = [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"t{i}" for i in range(a.vocab - 256 - 2)] + ["<|endoftext|>", "<|pad|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * (a.vocab - 2) + [3, 3])
    w.add_token_merges(["t 0"])
    w.add_eos_token_id(a.vocab - 2)
    w.add_bos_token_id(a.vocab - 2)

    def mat(name, rows, cols, ty=qt, *lead):
        x = (rng.standard_normal((*lead, rows, cols), dtype=np.float32) / np.float32(np.sqrt(cols))).astype(np.float32)
        if ty == Q.F32:
            w.add_tensor(name, x)
        else:
            w.add_tensor(name, gguf.quants.quantize(x, ty), raw_dtype=ty)

    def vec(name, n):
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    mat("token_embd.weight", a.vocab, E, Q.Q8_0)
    vec("output_norm.weight", E)
    for l in range(L):
        p = f"blk.{l}."
        vec(p + "attn_norm.weight", E)
        mat(p + "attn_q.weight", a.heads * hd, E)
        mat(p + "attn_k.weight", a.kv_heads * hd, E)
        mat(p + "attn_v.weight", a.kv_heads * hd, E)
        mat(p + "attn_output.weight", E, a.heads * hd)
        vec(p + "attn_q_norm.weight", hd)
        vec(p + "attn_k_norm.weight", hd)
        vec(p + "ffn_norm.weight", E)
        mat(p + "ffn_gate_inp.weight", a.experts, E, Q.F32)
        for kind, rows, cols in (("gate", a.expert_ff, E), ("up", a.expert_ff, E), ("down", E, a.expert_ff)):
            mat(p + f"ffn_{kind}_exps.weight", rows, cols, qt, a.experts)
        print(f"layer {l + 1}/{L}", flush=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
