#!/usr/bin/env python3
"""Reference vectors for the types gguf-py cannot dequantize: Q1_0 and Q2_0.

gguf-py 0.19 (the newest on the registry) lists Q1_0's geometry without a
dequantizer and does not know Q2_0, so the reference here is llama.cpp
itself: its `libggml-base.so`, called through ctypes. Rows are quantized by
ggml's own `quantize_q1_0` / `quantize_q2_0` from random data, plus crafted
random block bytes (finite f16 scales, every bit pattern of the codes), and
the expected values are what ggml's `dequantize_row_q1_0` /
`dequantize_row_q2_0` make of the bytes. Same JSON shape as
`make_quant_fixtures.py` writes.

Needs a llama.cpp build (bench/vs-llamacpp makes one in bench/.llama-venv, or
set LLAMA_BIN to a directory holding libggml-base.so). Run from the
repository root:
    /work/pyenv/bin/python scripts/make_ggml_fixtures.py
"""

import ctypes
import json
import os
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "crates/spindle-kernels/tests/fixtures"
rng = np.random.default_rng(20261202)

# name: (ggml type id, values per block, bytes per block)
TYPES = {"Q1_0": (41, 128, 18), "Q2_0": (42, 64, 18)}


def libggml():
    env = os.environ.get("LLAMA_BIN")
    dirs = [pathlib.Path(env)] if env else sorted((ROOT / "bench/.llama-venv").glob("lib/python3*/site-packages/*/bin"))
    for d in dirs:
        if (d / "libggml-base.so").exists():
            return ctypes.CDLL(str(d / "libggml-base.so"))
    sys.exit("libggml-base.so not found: run bench/vs-llamacpp once (it builds bench/.llama-venv), or set LLAMA_BIN")


lib = libggml()
F32P = ctypes.POINTER(ctypes.c_float)


def dequantize(name, raw, n):
    fn = getattr(lib, f"dequantize_row_{name.lower()}")
    fn.argtypes = [ctypes.c_void_p, F32P, ctypes.c_int64]
    out = np.zeros(n, dtype=np.float32)
    fn(raw.ctypes.data, out.ctypes.data_as(F32P), n)
    return out


def quantize(name, x):
    """One row through ggml's quantizer (no importance matrix)."""
    _, bl, bb = TYPES[name]
    fn = getattr(lib, f"quantize_{name.lower()}")
    fn.argtypes = [F32P, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, F32P]
    fn.restype = ctypes.c_size_t
    x = np.ascontiguousarray(x, dtype=np.float32)
    dst = np.zeros(len(x) // bl * bb, dtype=np.uint8)
    written = fn(x.ctypes.data_as(F32P), dst.ctypes.data, 1, len(x), None)
    assert written == len(dst), (name, written, len(dst))
    return dst


def crafted_block(bb):
    b = rng.integers(0, 256, size=bb, dtype=np.uint8)
    d = rng.uniform(1e-3, 0.5) * (-1 if rng.random() < 0.3 else 1)
    b[0:2] = np.array([d], dtype=np.float32).astype(np.float16).view(np.uint8)
    return b


def main():
    for name, (_, bl, bb) in TYPES.items():
        cols = 2 * bl  # two blocks per row
        rows = [
            quantize(name, rng.standard_normal(cols)),
            quantize(name, np.concatenate([np.zeros(bl), rng.standard_normal(bl) * 1e-3])),
            np.concatenate([crafted_block(bb), crafted_block(bb)]),
            np.concatenate([crafted_block(bb), crafted_block(bb)]),
        ]
        raw = np.concatenate(rows)
        expected = np.concatenate([dequantize(name, r, cols) for r in rows])
        doc = {
            "type": name,
            "rows": len(rows),
            "cols": cols,
            "bytes_hex": raw.tobytes().hex(),
            "f32_bits": [int(v) for v in expected.view(np.uint32)],
        }
        path = OUT / f"{name.lower()}.json"
        path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
        print(f"{path.relative_to(ROOT)}: {len(rows)}x{cols}, {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
