#!/usr/bin/env python3
"""Reference vectors for spindle-kernels' `dequantize`, one JSON file per type.

Uses the `gguf` Python package (llama.cpp's gguf-py) as the reference:
types it can quantize (Q8_0, Q4_0, Q5_0, BF16) get rows quantized from random
data; every type also gets rows of crafted random block bytes (finite f16
scales, every bit pattern of the quantized values), and the expected values
are what `gguf.quants.dequantize` makes of the bytes.

Each fixture: {"type", "rows", "cols", "bytes_hex", "f32_bits"}: `rows` rows of
`cols` values, the raw row-major bytes as hex, and the expected values as u32
bit patterns (exact, NaN/inf included).

Run from the repository root:
    /work/pyenv/bin/python scripts/make_quant_fixtures.py
"""

import json
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

OUT = pathlib.Path(__file__).resolve().parent.parent / "crates/spindle-kernels/tests/fixtures"
rng = np.random.default_rng(20240611)


def f16_bytes(values):
    return np.asarray(values, dtype=np.float32).astype(np.float16).view(np.uint8)


def random_scale(lo=1e-3, hi=0.5, signed=True):
    v = rng.uniform(lo, hi)
    if signed and rng.random() < 0.3:
        v = -v
    return v


def crafted_block(qtype):
    """One block of random bytes with finite f16 scales at the type's scale offsets."""
    size = quants.GGML_QUANT_SIZES[qtype][1]
    b = rng.integers(0, 256, size=size, dtype=np.uint8)
    if qtype in (T.Q8_0, T.Q4_0, T.Q5_0):
        b[0:2] = f16_bytes([random_scale()])
    elif qtype in (T.Q4_K, T.Q5_K):
        b[0:4] = f16_bytes([random_scale(signed=False), random_scale(signed=False)])
    elif qtype == T.Q6_K:
        b[208:210] = f16_bytes([random_scale()])
    elif qtype in F16_SCALES:
        for at, signed in F16_SCALES[qtype]:
            b[at:at + 2] = f16_bytes([random_scale(signed=signed)])
    elif qtype == T.MXFP4:
        b[0] = rng.integers(100, 140)  # E8M0 exponent: a moderate power of two
    elif qtype == T.IQ1_M:
        # The f16 `d` sits in the top nibbles of the last four u16 words.
        d = int(f16_bytes([random_scale()]).view(np.uint16)[0])
        w = b[48:56].view(np.uint16)
        for i in range(4):
            w[i] = (int(w[i]) & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12)
    else:
        raise ValueError(qtype)
    return b


# Types added later: their f16 scales as (byte offset, signed).
F16_SCALES = {
    T.Q4_1: [(0, False), (2, True)],
    T.Q5_1: [(0, False), (2, True)],
    T.IQ4_NL: [(0, True)],
    T.IQ4_XS: [(0, True)],
    T.Q2_K: [(80, False), (82, False)],
    T.Q3_K: [(108, True)],
    T.TQ1_0: [(52, True)],
    T.TQ2_0: [(64, True)],
    T.IQ2_XXS: [(0, True)],
    T.IQ2_XS: [(0, True)],
    T.IQ2_S: [(0, True)],
    T.IQ3_XXS: [(0, True)],
    T.IQ3_S: [(0, True)],
    T.IQ1_S: [(0, True)],
}


def write(name, qtype_for_ref, raw_rows, cols):
    raw = np.concatenate([np.asarray(r, dtype=np.uint8).ravel() for r in raw_rows])
    rows = len(raw_rows)
    expected = quants.dequantize(raw.reshape(rows, -1), qtype_for_ref).astype(np.float32)
    assert expected.shape == (rows, cols), (name, expected.shape)
    doc = {
        "type": name,
        "rows": rows,
        "cols": cols,
        "bytes_hex": raw.tobytes().hex(),
        "f32_bits": [int(x) for x in expected.ravel().view(np.uint32)],
    }
    path = OUT / f"{name.lower()}.json"
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"{path.relative_to(OUT.parent.parent.parent.parent)}: {rows}x{cols}, {path.stat().st_size} bytes")


def float_fixtures():
    # F32: specials plus random values; the reference is a bit copy.
    specials = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-40, 3.4028235e38, 1.0, -2.5, 65504.0, 1e-8],
        dtype=np.float32,
    )
    rows = [specials, rng.standard_normal(12).astype(np.float32), (rng.standard_normal(12) * 1e3).astype(np.float32)]
    write("F32", T.F32, [r.view(np.uint8) for r in rows], 12)

    # F16: every class but NaN (NaN payload conversion is not pinned down).
    sp = np.array([0x0000, 0x8000, 0x7C00, 0xFC00, 0x0001, 0x83FF, 0x7BFF, 0x3C00, 0x0400, 0xBC00, 0x3555, 0x1234],
                  dtype=np.uint16)
    r1 = rng.integers(0, 0x7C00, size=12).astype(np.uint16) | (rng.integers(0, 2, size=12).astype(np.uint16) << 15)
    r2 = rng.integers(0, 0x7C00, size=12).astype(np.uint16)
    write("F16", T.F16, [sp.view(np.uint8), r1.view(np.uint8), r2.view(np.uint8)], 12)

    # BF16: quantized from f32 by gguf, plus raw patterns with specials (NaN is
    # a plain bit shift, so it is exact too).
    x = rng.standard_normal(12).astype(np.float32) * 7
    q = quants.quantize(x.reshape(1, -1), T.BF16)
    sp = np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0x0001, 0x807F, 0x7F7F, 0x3F80, 0xC020, 0x0080, 0x4049],
                  dtype=np.uint16)
    r2 = rng.integers(0, 0x10000, size=12).astype(np.uint16)
    write("BF16", T.BF16, [q.ravel(), sp.view(np.uint8), r2.view(np.uint8)], 12)


def small_block_fixtures():
    cols = 64  # two blocks per row
    for name, qtype in (("Q8_0", T.Q8_0), ("Q4_0", T.Q4_0), ("Q5_0", T.Q5_0)):
        x0 = rng.standard_normal(cols).astype(np.float32)
        x1 = np.concatenate([np.zeros(32, np.float32), (rng.standard_normal(32) * 1e-3).astype(np.float32)])
        rows = [quants.quantize(x0.reshape(1, -1), qtype).ravel(), quants.quantize(x1.reshape(1, -1), qtype).ravel()]
        crafted = np.concatenate([crafted_block(qtype), crafted_block(qtype)])
        if qtype == T.Q8_0:
            crafted[2] = 0x80  # -128: never made by the quantizer, legal in a file
            crafted[3] = 0x7F
        rows.append(crafted)
        write(name, qtype, rows, cols)


def k_block_fixtures():
    for name, qtype in (("Q4_K", T.Q4_K), ("Q5_K", T.Q5_K), ("Q6_K", T.Q6_K)):
        rows = [crafted_block(qtype), crafted_block(qtype)]
        # A block with all-ones bit patterns in the packed fields (max scales,
        # mins and values) but finite f16 scales.
        b = np.full(quants.GGML_QUANT_SIZES[qtype][1], 0xFF, dtype=np.uint8)
        if qtype == T.Q6_K:
            b[208:210] = f16_bytes([0.25])
        else:
            b[0:4] = f16_bytes([0.125, 0.0625])
        rows.append(b)
        write(name, qtype, rows, 256)


def later_fixtures():
    """Types added after the first fixtures, from their own seed (so the
    earlier files stay byte-identical): rows gguf-py quantizes where it can,
    crafted random blocks, and a block of all-ones bit patterns."""
    global rng
    rng = np.random.default_rng(20261202)
    quantizable = (T.Q4_1, T.Q5_1, T.TQ1_0, T.TQ2_0, T.MXFP4)
    for qtype in (T.Q4_1, T.Q5_1, T.IQ4_NL, T.MXFP4, T.Q2_K, T.Q3_K, T.IQ4_XS, T.TQ1_0, T.TQ2_0,
                  T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M):
        block_len, size = quants.GGML_QUANT_SIZES[qtype]
        cols = 64 if block_len == 32 else 256
        rows = []
        if qtype in quantizable:
            x = rng.standard_normal(cols).astype(np.float32)
            rows.append(quants.quantize(x.reshape(1, -1), qtype).ravel())
        rows.append(np.concatenate([crafted_block(qtype) for _ in range(cols // block_len)]))
        rows.append(np.concatenate([crafted_block(qtype) for _ in range(cols // block_len)]))
        ones = np.full(size * (cols // block_len), 0xFF, dtype=np.uint8)
        for b in range(cols // block_len):
            blk = ones[b * size:(b + 1) * size]
            if qtype == T.MXFP4:
                blk[0] = 127
            if qtype == T.IQ1_M:
                blk[48:56].view(np.uint16)[:] = 0x0FFF | (0x3 << 12)  # d = f16 0x3333
            for at, _ in F16_SCALES.get(qtype, []):
                blk[at:at + 2] = f16_bytes([0.125])
        rows.append(ones)
        write(qtype.name, qtype, rows, cols)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    float_fixtures()
    small_block_fixtures()
    k_block_fixtures()
    later_fixtures()


if __name__ == "__main__":
    main()
