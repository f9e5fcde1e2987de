#!/usr/bin/env python3
"""Random-weight GGUFs at the shapes of the models people run, with their
real tokenizers, quantized the way `llama-quantize` quantizes them, for
speed and memory measurements (no real weights of these sizes can be
fetched here). Outputs mean nothing; a pass costs what the real model's
pass costs: same tensors, shapes, types and metadata.

    python3 bench/synthetic_shapes.py SHAPE OUT.gguf [--type Q4_K_M|Q8_0]
    python3 bench/synthetic_shapes.py --list

SHAPE is one of llama3.2-1b, llama3.1-8b, qwen3-8b, qwen3-30b-a3b. The
tokenizer comes from the vocab-only GGUFs scripts/make_vocab_ggufs.py
writes (target/vocab-gguf: Llama 3.1's for the Llama shapes, Qwen3's for
the Qwen ones), padded to the model's vocabulary size as the converter pads
it. Files are 0.8-18 GB: write them outside the repository.

Quantization types per tensor follow llama.cpp's rules for the preset
(`llama_tensor_get_type`): for Q4_K_M, Q4_K everywhere except Q6_K for the
output head (the embedding when it is tied), and for `attn_v` and
`ffn_down` in the first and last eighth of the layers and every third layer
between; norms, the MoE router and `rope_freqs` stay F32. bench/shapes
checks the assignment against llama-quantize's on the 1B shape. Blocks are
random bytes with fixed, small scales (so activations stay finite).

Needs numpy and gguf-py (target/llama-src/llama.cpp/gguf-py, or pip's gguf).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "target" / "llama-src" / "llama.cpp" / "gguf-py"))
import gguf  # noqa: E402

Q = gguf.GGMLQuantizationType


@dataclass
class Shape:
    arch: str
    tokenizer: str  # a vocab-only GGUF in target/vocab-gguf
    vocab: int
    embd: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ff: int
    tied: bool = False
    rope_base: float = 500000.0
    context: int = 131072
    llama3_rope: bool = False
    experts: int = 0
    experts_used: int = 0
    expert_ff: int = 0


SHAPES = {
    # meta-llama/Llama-3.2-1B-Instruct config.json
    "llama3.2-1b": Shape("llama", "llama3_1", 128256, 2048, 16, 32, 8, 64, 8192, tied=True, llama3_rope=True),
    # meta-llama/Llama-3.1-8B-Instruct
    "llama3.1-8b": Shape("llama", "llama3_1", 128256, 4096, 32, 32, 8, 128, 14336, llama3_rope=True),
    # Qwen/Qwen3-8B
    "qwen3-8b": Shape("qwen3", "qwen3", 151936, 4096, 36, 32, 8, 128, 12288, rope_base=1e6, context=40960),
    # Qwen/Qwen3-30B-A3B
    "qwen3-30b-a3b": Shape("qwen3moe", "qwen3", 151936, 2048, 48, 32, 4, 128, 6144, rope_base=1e6,
                           context=40960, experts=128, experts_used=8, expert_ff=768),
}

FILE_TYPE = {"Q4_K_M": 15, "Q8_0": 7, "F16": 1}


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's `use_more_bits`: the first and last eighth, every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(preset: str, name: str, layer: int, n_layer: int, tied: bool) -> Q:
    if preset in ("Q8_0", "F16"):
        return Q[preset]
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return Q.Q6_K
    if (".attn_v." in name or ".ffn_down" in name) and more_bits(layer, n_layer):
        return Q.Q6_K
    return Q.Q4_K


def tensors(s: Shape):
    """(name, numpy-order shape, layer or -1, quantized?) in llama.cpp's order."""
    yield "token_embd.weight", (s.vocab, s.embd), -1, True
    if s.llama3_rope:
        yield "rope_freqs.weight", (s.head_dim // 2,), -1, False
    for i in range(s.layers):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", (s.embd,), i, False
        yield p + "attn_q.weight", (s.heads * s.head_dim, s.embd), i, True
        yield p + "attn_k.weight", (s.kv_heads * s.head_dim, s.embd), i, True
        yield p + "attn_v.weight", (s.kv_heads * s.head_dim, s.embd), i, True
        yield p + "attn_output.weight", (s.embd, s.heads * s.head_dim), i, True
        if s.arch in ("qwen3", "qwen3moe"):
            yield p + "attn_q_norm.weight", (s.head_dim,), i, False
            yield p + "attn_k_norm.weight", (s.head_dim,), i, False
        yield p + "ffn_norm.weight", (s.embd,), i, False
        if s.experts:
            yield p + "ffn_gate_inp.weight", (s.experts, s.embd), i, False
            yield p + "ffn_gate_exps.weight", (s.experts, s.expert_ff, s.embd), i, True
            yield p + "ffn_down_exps.weight", (s.experts, s.embd, s.expert_ff), i, True
            yield p + "ffn_up_exps.weight", (s.experts, s.expert_ff, s.embd), i, True
        else:
            yield p + "ffn_gate.weight", (s.ff, s.embd), i, True
            yield p + "ffn_down.weight", (s.embd, s.ff), i, True
            yield p + "ffn_up.weight", (s.ff, s.embd), i, True
    yield "output_norm.weight", (s.embd,), -1, False
    if not s.tied:
        yield "output.weight", (s.vocab, s.embd), -1, True


# Where each block keeps its f16 scales, and the scale that keeps a random
# block's weights near 0.05.
SCALES = {Q.Q4_K: ([0, 2], 1e-4), Q.Q6_K: ([208], 2e-5), Q.Q8_0: ([0], 2e-3)}

POOL = np.random.default_rng(0).integers(0, 256, size=1 << 26, dtype=np.uint8)


def random_blocks(qt: Q, n_blocks: int, offset: int) -> np.ndarray:
    if qt == Q.F16:
        # Finite values for llama-quantize to start from (the check of the
        # preset's types).
        normal = np.random.default_rng(offset % 1000).standard_normal(n_blocks, dtype=np.float32)
        return (normal * 0.02).astype(np.float16).view(np.uint8)
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qt]
    n = n_blocks * block_bytes
    start = offset % (len(POOL) - n) if n < len(POOL) else 0
    data = (POOL[start:start + n] if n <= len(POOL) else np.resize(POOL, n)).copy()
    blocks = data.reshape(n_blocks, block_bytes)
    offsets, scale = SCALES[qt]
    d = np.frombuffer(np.float16(scale).tobytes(), dtype=np.uint8)
    for o in offsets:
        blocks[:, o:o + 2] = d
    return data


def f32_tensor(name: str, shape, s: Shape) -> np.ndarray:
    if name == "rope_freqs.weight":
        # Llama 3.1's scaling (factor 8, low/high frequency factors 1 and 4,
        # original context 8192), as the converter bakes it in.
        out = []
        for i in range(0, s.head_dim, 2):
            freq = 1.0 / (s.rope_base ** (i / s.head_dim))
            wavelen = 2 * math.pi / freq
            if wavelen < 8192 / 4:
                out.append(1.0)
            elif wavelen > 8192 / 1:
                out.append(8.0)
            else:
                smooth = (8192 / wavelen - 1) / (4 - 1)
                out.append(1 / ((1 - smooth) / 8 + smooth))
        return np.array(out, dtype=np.float32)
    if name.endswith("ffn_gate_inp.weight"):
        return np.random.default_rng(1).standard_normal(shape).astype(np.float32) * 0.02
    return np.ones(shape, dtype=np.float32)


def copy_tokenizer(w: gguf.GGUFWriter, path: Path, vocab: int) -> None:
    r = gguf.GGUFReader(str(path))

    def field(key):
        f = r.fields.get(key)
        if f is None:
            return None
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            if f.types[-1] == gguf.GGUFValueType.STRING:
                return [bytes(f.parts[i]).decode() for i in f.data]
            return [f.parts[i].tolist()[0] for i in f.data]
        v = f.parts[f.data[0]]
        return bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else v.tolist()[0]

    tokens, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type")
    # The converter pads a vocabulary to the model's rows with unused tokens.
    tokens += [f"[PAD{i}]" for i in range(len(tokens), vocab)]
    types += [gguf.TokenType.UNUSED] * (vocab - len(types))
    w.add_tokenizer_model(field("tokenizer.ggml.model"))
    w.add_tokenizer_pre(field("tokenizer.ggml.pre"))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(field("tokenizer.ggml.merges"))
    for key, add in [("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                     ("padding_token_id", w.add_pad_token_id), ("add_bos_token", w.add_add_bos_token)]:
        v = field("tokenizer.ggml." + key)
        if v is not None:
            add(v)
    if (t := field("tokenizer.chat_template")) is not None:
        w.add_chat_template(t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", nargs="?", choices=sorted(SHAPES))
    ap.add_argument("out", nargs="?")
    ap.add_argument("--type", default="Q4_K_M", choices=sorted(FILE_TYPE))
    ap.add_argument("--vocab-dir", default=str(ROOT / "target" / "vocab-gguf"))
    ap.add_argument("--list", action="store_true", help="print each tensor's type and stop")
    a = ap.parse_args()
    if not a.shape:
        ap.error("give a SHAPE")
    s = SHAPES[a.shape]
    plan = [(name, shape, layer, quant, tensor_type(a.type, name, layer, s.layers, s.tied) if quant else Q.F32)
            for name, shape, layer, quant in tensors(s)]
    if a.list:
        for name, shape, _, _, qt in plan:
            print(name, qt.name)
        return
    if not a.out:
        ap.error("give OUT.gguf")
    tok = Path(a.vocab_dir) / f"{s.tokenizer}.gguf"
    if not tok.exists():
        sys.exit(f"{tok} is missing: python3 scripts/make_vocab_ggufs.py")

    w = gguf.GGUFWriter(a.out, s.arch)
    w.add_name(f"synthetic {a.shape} {a.type}")
    w.add_file_type(FILE_TYPE[a.type])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(s.context)
    w.add_embedding_length(s.embd)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.ff)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_dimension_count(s.head_dim)
    w.add_rope_freq_base(s.rope_base)
    w.add_layer_norm_rms_eps(1e-6 if s.arch.startswith("qwen") else 1e-5)
    w.add_vocab_size(s.vocab)
    if s.experts:
        w.add_expert_count(s.experts)
        w.add_expert_used_count(s.experts_used)
        w.add_expert_feed_forward_length(s.expert_ff)
    copy_tokenizer(w, tok, s.vocab)

    total = 0
    for name, shape, _, quant, qt in plan:
        if quant and qt == Q.F16:
            nbytes = int(np.prod(shape)) * 2
            w.add_tensor_info(name, shape, np.dtype(np.float16), nbytes)
        elif quant:
            block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qt]
            rows = int(np.prod(shape[:-1]))
            nbytes = rows * shape[-1] // block_elems * block_bytes
            w.add_tensor_info(name, (*shape[:-1], shape[-1] // block_elems * block_bytes),
                              np.dtype(np.uint8), nbytes, raw_dtype=qt)
        else:
            nbytes = int(np.prod(shape)) * 4
            w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes)
        total += nbytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    offset = 0
    for name, shape, _, quant, qt in plan:
        if quant:
            block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qt]
            n_blocks = int(np.prod(shape)) // block_elems
            data = random_blocks(qt, n_blocks, offset)
            offset += len(data) * 7919
        else:
            data = f32_tensor(name, shape, s)
        w.write_tensor_data(data)
    w.close()
    print(f"wrote {a.out}: {a.shape} {a.type}, {total / 1e9:.2f} GB of tensors")


if __name__ == "__main__":
    main()
