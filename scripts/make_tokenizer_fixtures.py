#!/usr/bin/env python3
"""Regenerate the tokenizer reference fixtures of `spindle-model`.

Run with the project's Python venv (transformers, tokenizers, gguf):

    /work/pyenv/bin/python scripts/make_tokenizer_fixtures.py [--gemma PATH]

Writes into crates/spindle-model/tests/fixtures/tokenizer/:

* gemma3_reference.json: ids and decoded text of tricky strings for the real
  Gemma 3 vocabulary, from transformers' own GGUF tokenizer conversion (code
  independent of ours). Skipped when the Gemma GGUF is absent.
* bpe_<pre>.gguf, hf_<pre>/tokenizer.json, hf_<pre>/tokenizer_config.json and
  bpe_reference.json: a tiny byte-level BPE trained here with the Qwen2 and
  Llama 3 pre-tokenizer regexes, as a metadata-only GGUF and as a Hugging Face
  directory, with reference ids from the Python `tokenizers` library.

The tests need none of this Python: the outputs are committed.
"""

import argparse
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "spindle-model" / "tests" / "fixtures" / "tokenizer"

GEMMA_CASES = [
    "Hello world",
    " Hello world",
    "   three leading spaces",
    "repeated    spaces   inside  words",
    "trailing space ",
    " ",
    "",
    "line one\nline two",
    "\n\n\n",
    "a\r\nb\r\n",
    "tabs\tand\t\ttabs",
    "\t\tindented with tabs",
    "café naïve résumé Ünïcödé",
    "combining e\u0301 vs \u00e9",
    "日本語のテキスト",
    "English, Русский, العربية, हिन्दी, 中文, 한국어",
    "👨\u200d👩\u200d👧\u200d👦 family",
    "flags 🇯🇵🇺🇸 and 😀😃😄 ✨",
    "1234567890 3.14159 -42 1e-9",
    "supercalifragilisticexpialidocious" * 3,
    "https://example.com/path/to?query=1&x=y#frag",
    "def f(x):\n    if x:\n        return x * 2\n    return None\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<unused0>",
    "<bos>text after bos",
    "Mixed<b>html</b> <table><tr><td>1</td></tr></table>",
    "\ue000 private use \U000f0000",
    "rare 𝔹𝕆𝕃𝔻 Ⅷ ꙮ 𓀀 ∮ ⨌",
    "literal <0x41> byte text",
    "don't you're I'm WE'LL",
    "    ",
    "x" + " " * 40 + "y",
]

# Cases also encoded with parse_special = false (special-token text is plain text).
GEMMA_PLAIN_CASES = [
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<unused0>",
    "<bos>text after bos",
    "Mixed<b>html</b> <table><tr><td>1</td></tr></table>",
]


def gemma_fixture(gguf_path: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    cases = []
    for text in GEMMA_CASES:
        ids = tok(text).input_ids  # BOS added: the GGUF says add_bos_token = true
        case = {
            "text": text,
            "ids": ids,
            "decoded": tok.decode(ids, skip_special_tokens=True),
        }
        if text in GEMMA_PLAIN_CASES:
            case["ids_plain"] = tok(text, split_special_tokens=True).input_ids
        cases.append(case)
    check_against_spm(gguf_path, cases)
    return {
        "source": "transformers AutoTokenizer.from_pretrained(gguf_file=gemma-3-270m-q4_k_m.gguf)",
        "bos_id": tok.bos_token_id,
        "eos_id": tok.eos_token_id,
        "cases": cases,
    }


def check_against_spm(gguf_path: Path, cases):
    """Cross-check with an independent, llama.cpp-style SentencePiece BPE.

    Only reported, not saved: merges by highest vocabulary score, control and
    user-defined tokens matched whole in the raw text (spaces-only tokens
    as their "▁" spelling), byte fallback for pieces missing from the vocabulary.
    """
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    scores = reader.fields["tokenizer.ggml.scores"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    spelled = ["\u2581" * len(t) if t and not t.strip(" ") else t for t in tokens]
    ids = {t: i for i, t in enumerate(spelled)}
    specials = sorted((t for t, ty in zip(spelled, types) if ty in (3, 4)), key=len, reverse=True)

    def spm(fragment):
        syms = list(fragment.replace(" ", "\u2581"))
        while True:
            best = None
            for i in range(len(syms) - 1):
                tid = ids.get(syms[i] + syms[i + 1])
                if tid is not None and (best is None or scores[tid] > best[0]):
                    best = (scores[tid], i)
            if best is None:
                break
            i = best[1]
            syms[i : i + 2] = [syms[i] + syms[i + 1]]
        out = []
        for s in syms:
            if s in ids:
                out.append(ids[s])
            else:
                out.extend(ids["<0x%02X>" % b] for b in s.encode("utf-8"))
        return out

    def encode(text):
        out, plain, i = [2], "", 0
        text = text.replace(" ", "\u2581")
        while i < len(text):
            for s in specials:
                if text.startswith(s, i):
                    out += spm(plain) + [ids[s]]
                    plain, i = "", i + len(s)
                    break
            else:
                plain += text[i]
                i += 1
        return out + spm(plain)

    for case in cases:
        mine = encode(case["text"])
        if mine != case["ids"]:
            print(f"note: llama.cpp-style SPM differs on {case['text']!r}: {mine} vs transformers {case['ids']}")


CORPUS = """
The quick brown fox jumps over the lazy dog. The dog didn't care; it's sleeping.
We're testing a tiny byte-level BPE tokenizer. They'll see what we've built, and I'd say it's fine.
Numbers: 1, 22, 333, 4444, 55555, 3.14159, 2.71828, 1e-9, 100%, $42.50, 2024-06-01.
def tokenize(text):
    return [piece for piece in text.split() if piece]

for i in range(10):
    print(f"value {i}: {i * i}")
Café, naïve, résumé, über, jalapeño. Ünïcödé text survives byte-level encoding.
日本語のテキストと中文文本。한국어 텍스트. Русский текст. العربية.
Emoji: 😀 😃 😄 👍 🎉 and newlines

multiple blank lines



end. Tabs\tand\tmore\ttabs. URLs like https://example.com/path?query=1&x=y#frag are common.
Hello world! Hello, World? HELLO WORLD. hello-world_hello.world
In 1999, 2000 and 2024 we counted 123 456 789 items; 1234567890 is ten digits, 3.14159 is pi.
    indented code     with    runs of spaces		and tabs
""".strip()


QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

VARIANTS = {
    "qwen2": {
        "arch": "qwen2",
        "split": QWEN2_SPLIT,
        "specials": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "bos": None,
        "eos": "<|im_end|>",
        "eot": None,
        "add_bos": False,
        "ignore_merges": False,
        "template": CHATML,
    },
    "llama-bpe": {
        "arch": "llama",
        "split": LLAMA3_SPLIT,
        "specials": [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ],
        "bos": "<|begin_of_text|>",
        "eos": "<|end_of_text|>",
        "eot": "<|eot_id|>",
        "add_bos": True,
        # Llama 3's tokenizer.json (and llama.cpp for llama-bpe) look a whole pre-token up first.
        "ignore_merges": True,
        "template": LLAMA3,
    },
}

BPE_CASES = [
    "Hello world",
    " Hello world",
    "Hello  world   spaced",
    "The quick brown fox jumps over the lazy dog.",
    "don't you're I'M we'll they'd",
    "1234567890 3.14159",
    "12 345 6789",
    "line one\nline two\n\n\nthree",
    "\t\ttabs\tand  spaces \n",
    "café naïve résumé",
    "日本語のテキスト",
    "👨\u200d👩\u200d👧\u200d👦 😀",
    "https://example.com/path?query=1&x=y#frag",
    "def f(x):\n    return x * 2\n",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<think>reasoning</think> answer",
    "",
    " ",
    "trailing   ",
    "   ",
    "!!!??? ... ---",
]


def bpe_variant(pre: str, cfg: dict):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(cfg["split"]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=800,
        special_tokens=cfg["specials"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines() * 5, trainer)
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False)])
    if cfg["ignore_merges"]:
        data = json.loads(tok.to_str())
        data["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(data))
    if cfg["bos"] is not None and cfg["add_bos"]:
        bos = cfg["bos"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )

    hf_dir = OUT / f"hf_{pre}"
    hf_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(hf_dir / "tokenizer.json"))
    config = {
        "bos_token": cfg["bos"],
        "eos_token": cfg["eot"] or cfg["eos"],
        "chat_template": cfg["template"],
    }
    if pre == "qwen2":
        config["add_bos_token"] = False  # llama3 leaves it to the post-processor
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    write_gguf(pre, cfg, tok)

    cases = []
    for text in BPE_CASES:
        enc = tok.encode(text, add_special_tokens=False)
        tok.encode_special_tokens = True
        plain = tok.encode(text, add_special_tokens=False)
        tok.encode_special_tokens = False
        cases.append(
            {
                "text": text,
                "ids": enc.ids,
                "ids_plain": plain.ids,
                "decoded": tok.decode(enc.ids, skip_special_tokens=True),
            }
        )
    return {
        "bos_id": tok.token_to_id(cfg["bos"]) if cfg["bos"] else None,
        "eos_id": tok.token_to_id(cfg["eos"]),
        "eot_id": tok.token_to_id(cfg["eot"]) if cfg["eot"] else None,
        "add_bos": cfg["add_bos"],
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "cases": cases,
    }


def write_gguf(pre: str, cfg: dict, tok):
    import gguf

    data = json.loads(tok.to_str())
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    added = {a["content"]: a for a in data["added_tokens"]}
    types = []
    for t in tokens:
        if t in added:
            types.append(gguf.TokenType.CONTROL if added[t]["special"] else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]

    path = OUT / f"bpe_{pre}.gguf"
    writer = gguf.GGUFWriter(str(path), cfg["arch"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    if cfg["bos"] is not None:
        writer.add_bos_token_id(vocab[cfg["bos"]])
    writer.add_eos_token_id(vocab[cfg["eos"]])
    if cfg["eot"] is not None:
        writer.add_eot_token_id(vocab[cfg["eot"]])
    writer.add_add_bos_token(cfg["add_bos"])
    writer.add_chat_template(cfg["template"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    home = Path(os.environ.get("SPINDLE_HOME", Path.home() / ".cache" / "spindle"))
    parser = argparse.ArgumentParser()
    parser.add_argument("--gemma", type=Path, default=home / "models" / "gemma-3-270m-q4_k_m.gguf")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)

    bpe = {pre: bpe_variant(pre, cfg) for pre, cfg in VARIANTS.items()}
    (OUT / "bpe_reference.json").write_text(json.dumps(bpe, ensure_ascii=False, indent=1) + "\n")

    if args.gemma.exists():
        ref = gemma_fixture(args.gemma)
        (OUT / "gemma3_reference.json").write_text(json.dumps(ref, ensure_ascii=False, indent=1) + "\n")
    else:
        print(f"skipping the Gemma 3 fixture: {args.gemma} not found")


if __name__ == "__main__":
    main()
