#!/usr/bin/env python3
"""A tiny BERT cross-encoder (BertForSequenceClassification, one label) and
transformers' own scores for a committed query and documents: the
reference for Spindle's `/v1/rerank` and `Encoder::classify`.

    target/st-venv/bin/python scripts/make_cross_encoder_fixture.py [--minilm DIR]

Needs torch, transformers and tokenizers. The vocabulary is cut from
all-MiniLM-L6-v2's (`spindle pull all-minilm-l6-v2`): the special tokens,
every single character and `##` character, and the pieces the texts below
use, renumbered, so the fixture stays a few hundred kilobytes. Weights are
random (seeded): the fixture checks arithmetic, not relevance.
"""

import argparse
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "spindle-model" / "tests" / "fixtures" / "tiny" / "bert-cross-encoder"

QUERY = "How do I reset my password?"
DOCUMENTS = [
    "To reset your password, open settings and choose 'Forgot password'.",
    "Paris is the capital of France.",
    "Passwords must be at least twelve characters long.",
    "The mitochondria is the powerhouse of the cell.",
    "Open the settings page and pick the account tab.",
    "A man is eating a piece of bread.",
    "Reset links expire after one hour; ask for a new one.",
    "Photosynthesis converts light energy into chemical energy.",
]


def main() -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import BertConfig, BertForSequenceClassification

    ap = argparse.ArgumentParser()
    home = Path(os.environ.get("SPINDLE_HOME") or Path.home() / ".cache" / "spindle")
    ap.add_argument("--minilm", type=Path, default=home / "models" / "all-MiniLM-L6-v2")
    args = ap.parse_args()

    full = json.loads((args.minilm / "tokenizer.json").read_text())
    big = Tokenizer.from_file(str(args.minilm / "tokenizer.json"))
    big.no_truncation()
    big.no_padding()
    vocab = full["model"]["vocab"]
    keep = {t for t in vocab if t.startswith("[") and t.endswith("]") and not t.startswith("[unused")}
    keep |= {t for t in vocab if len(t) == 1 or (t.startswith("##") and len(t) == 3)}
    for text in [QUERY, *DOCUMENTS]:
        keep |= set(big.encode(text).tokens)
    pieces = sorted(keep, key=lambda t: vocab[t])
    small = {t: i for i, t in enumerate(pieces)}
    tok = dict(full)
    tok["model"] = dict(full["model"], vocab=small)
    tok["truncation"] = None
    tok["padding"] = None
    tok["added_tokens"] = [dict(a, id=small[a["content"]]) for a in full["added_tokens"] if a["content"] in small]
    tok["post_processor"] = dict(full["post_processor"])
    tok["post_processor"]["special_tokens"] = {
        k: dict(v, ids=[small[k]]) for k, v in full["post_processor"]["special_tokens"].items()
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    t = Tokenizer.from_file(str(OUT / "tokenizer.json"))

    torch.manual_seed(7)
    cfg = BertConfig(vocab_size=len(small), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=128, type_vocab_size=2, num_labels=1,
                     pad_token_id=small["[PAD]"])
    model = BertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Spread enough that the pooler's tanh does not saturate and the
            # documents' scores differ by far more than rounding.
            if "LayerNorm.weight" in name:
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0.0, 1.0 if name.startswith("classifier") else 0.12)
    model.save_pretrained(OUT, safe_serialization=True)
    logits = []
    pairs = []
    with torch.no_grad():
        for d in DOCUMENTS:
            e = t.encode(QUERY, d)
            pairs.append({"ids": e.ids, "type_ids": e.type_ids})
            out = model(input_ids=torch.tensor([e.ids]), token_type_ids=torch.tensor([e.type_ids]))
            logits.append(float(out.logits[0, 0]))
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -logits[i])
    (OUT / "refs.json").write_text(json.dumps({
        "query": QUERY, "documents": DOCUMENTS, "pairs": pairs, "logits": logits, "order": order,
        "made_by": "transformers BertForSequenceClassification (scripts/make_cross_encoder_fixture.py)",
    }, indent=1) + "\n")
    print(OUT, logits, order)


if __name__ == "__main__":
    main()
