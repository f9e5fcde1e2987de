#!/usr/bin/env python3
"""transformers' pooled final hidden states of the tiny Llama fixture, the
reference for decoders used as embedders (`spindle embed -m DECODER
--pooling mean|last`, `spindle_engine::embed::embed_with_decoder`).

    target/st-venv/bin/python scripts/make_decoder_pooling_refs.py

For each prompt of tests/fixtures/tiny/llama/reference.json: the last
hidden state (after the final norm, as transformers returns it) averaged
over the positions, and at the last position; both L2-normalised.
"""

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

DIR = Path(__file__).resolve().parent.parent / "crates" / "spindle-model" / "tests" / "fixtures" / "tiny" / "llama"


def main():
    model = AutoModelForCausalLM.from_pretrained(DIR, dtype=torch.float32).eval()
    prompts = [p["ids"] for p in json.loads((DIR / "reference.json").read_text())["prompts"]]
    out = []
    with torch.no_grad():
        for ids in prompts:
            h = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
            mean = torch.nn.functional.normalize(h.mean(0), dim=0)
            last = torch.nn.functional.normalize(h[-1], dim=0)
            out.append({"ids": ids, "mean": [round(float(x), 7) for x in mean],
                        "last": [round(float(x), 7) for x in last]})
    (DIR / "pooled.json").write_text(json.dumps({
        "note": "transformers eager float32: final normed hidden states, mean and last pooled, L2-normalised",
        "prompts": out}) + "\n")


if __name__ == "__main__":
    main()
