#!/usr/bin/env python3
"""Independent float32 reference for the real Gemma 3 270M GGUF (Q4_K_M).

Loads /root/.cache/spindle/models/gemma-3-270m-q4_k_m.gguf into transformers'
Gemma3ForCausalLM (text only) with every tensor dequantized to float32
(transformers' GGUF loader: gguf.quants dequantization, norm weights w+1 -> w),
cross-checks every loaded tensor against our own gguf.quants.dequantize of the file,
then writes

  crates/spindle-model/tests/fixtures/real/gemma3_score_reference.json
      ids:       BOS (2) + tokenization of score_text.txt (transformers GGUF tokenizer)
      positions: for i = 1..len-1: the actual next id, its log-prob, the top-1 id and
                 log-prob and the top-2 log-prob, predicting ids[i] from ids[:i]
                 (float32 log-softmax over the full 262144 vocab)
      greedy_continuation: 24 greedy tokens after BOS + "The capital of France is"
                 (full recompute per step) with per-step top1-top2 logit margins

Run with the project python env (CPU only, a few minutes):
    /work/pyenv/bin/python scripts/make_real_reference.py [path/to/model.gguf]
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(2)

import gguf  # noqa: E402
from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "crates" / "spindle-model" / "tests" / "fixtures" / "real"
DEFAULT_GGUF = Path("/root/.cache/spindle/models/gemma-3-270m-q4_k_m.gguf")
PROMPT = "The capital of France is"
N_GREEDY = 24


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_config(cfg) -> None:
    expect = dict(
        num_hidden_layers=18,
        hidden_size=640,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        intermediate_size=2048,
        sliding_window=512,
        query_pre_attn_scalar=256,
        vocab_size=262144,
        tie_word_embeddings=True,
    )
    for k, v in expect.items():
        got = getattr(cfg, k)
        assert got == v, f"config.{k} = {got}, expected {v}"
    assert cfg.final_logit_softcapping is None and cfg.attn_logit_softcapping is None
    lt = list(cfg.layer_types)
    want = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)]
    assert lt == want, lt
    rp = cfg.rope_parameters
    assert rp["full_attention"]["rope_theta"] == 1_000_000.0, rp
    assert rp["sliding_attention"]["rope_theta"] == 10_000.0, rp
    assert rp["full_attention"].get("rope_type", "default") == "default", rp
    assert abs(cfg.rms_norm_eps - 1e-6) < 1e-12
    assert cfg.hidden_activation == "gelu_pytorch_tanh"


def load_model(path: Path) -> Gemma3ForCausalLM:
    """Build Gemma3ForCausalLM from GGUF metadata and load every tensor dequantized to
    float32, undoing llama.cpp's conversion (Gemma3 RMSNorm weights stored as 1 + w)."""
    r = gguf.GGUFReader(str(path))

    def f(key, default=None):
        fld = r.fields.get(f"gemma3.{key}")
        return default if fld is None else fld.contents()

    assert r.fields["general.architecture"].contents() == "gemma3"
    n_layer = f("block_count")
    vocab = len(r.fields["tokenizer.ggml.tokens"].data)
    cfg = Gemma3TextConfig(
        vocab_size=vocab,
        hidden_size=f("embedding_length"),
        intermediate_size=f("feed_forward_length"),
        num_hidden_layers=n_layer,
        num_attention_heads=f("attention.head_count"),
        num_key_value_heads=f("attention.head_count_kv"),
        head_dim=f("attention.key_length"),
        # llama.cpp uses 1/sqrt(head_dim) for every gemma3 size but 27B; 270M: 256
        query_pre_attn_scalar=f("attention.key_length"),
        max_position_embeddings=f("context_length"),
        rms_norm_eps=f("attention.layer_norm_rms_epsilon"),
        sliding_window=f("attention.sliding_window"),
        # llama.cpp hard-codes the gemma3 SWA pattern (5 sliding : 1 full)
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n_layer)],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": f("rope.freq_base")},
            # not in this GGUF: llama.cpp's gemma3 default for SWA layers is 10000
            "sliding_attention": {"rope_type": "default", "rope_theta": f("rope.freq_base_swa", 10000.0)},
        },
        final_logit_softcapping=f("final_logit_softcapping"),
        attn_logit_softcapping=None,
        hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=all(t.name != "output.weight" for t in r.tensors),
        bos_token_id=r.fields["tokenizer.ggml.bos_token_id"].contents(),
        eos_token_id=r.fields["tokenizer.ggml.eos_token_id"].contents(),
        pad_token_id=r.fields["tokenizer.ggml.padding_token_id"].contents(),
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg).float().eval()  # random init, fully overwritten below
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, n_layer)
    rev = {}
    for hf_name, _ in model.named_parameters():
        g = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if g is not None:
            rev[g] = hf_name
    params = dict(model.named_parameters())
    seen = set()
    with torch.no_grad():
        for t in r.tensors:
            hf_name = rev.get(t.name)
            assert hf_name is not None, f"unmapped GGUF tensor {t.name}"
            w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            w = w.reshape(tuple(int(x) for x in reversed(t.shape)))
            if t.name.endswith("norm.weight"):
                w = w - 1.0
            assert tuple(params[hf_name].shape) == w.shape, (t.name, w.shape)
            params[hf_name].copy_(torch.from_numpy(w))
            seen.add(hf_name)
    assert seen == set(params), set(params) - seen  # lm_head is tied to embed_tokens
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


@torch.no_grad()
def logits_of(model, ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_GGUF
    print(f"loading {path}")
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = load_model(path)
    check_config(model.config)
    print(f"config ok: {model.config.num_hidden_layers} layers, layer_types {model.config.layer_types}")
    emb = model.model.embed_tokens
    assert abs(float(emb.embed_scale) - math.sqrt(640)) < 1e-3, emb.embed_scale
    assert model.lm_head.weight.data_ptr() == emb.weight.data_ptr()

    # ---- scoring text --------------------------------------------------------------
    text = (FIX / "score_text.txt").read_text(encoding="utf-8")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    ids = [2] + [int(i) for i in ids]
    assert tok.convert_tokens_to_ids(tok.bos_token) == 2
    assert tok.decode(ids[1:]) == text, "tokenizer round trip failed"
    print(f"score text: {len(ids)} tokens (incl. BOS)")
    lp = torch.log_softmax(logits_of(model, ids), dim=-1)  # float32
    positions = []
    for i in range(1, len(ids)):
        row = lp[i - 1]
        top = torch.topk(row, 2)
        positions.append(
            dict(
                id=ids[i],
                logprob=float(row[ids[i]]),
                top1=int(top.indices[0]),
                top1_logprob=float(top.values[0]),
                top2_logprob=float(top.values[1]),
            )
        )
    nll = -np.mean([p["logprob"] for p in positions])
    acc = np.mean([p["top1"] == p["id"] for p in positions])
    print(f"mean NLL {nll:.4f} nats (ppl {math.exp(nll):.2f}), top-1 acc {acc:.3f}")

    # ---- greedy continuation -------------------------------------------------------
    pids = [2] + [int(i) for i in tok(PROMPT, add_special_tokens=False)["input_ids"]]
    seq = list(pids)
    gen, margins = [], []
    for _ in range(N_GREEDY):
        last = logits_of(model, seq)[-1]
        top = torch.topk(last, 2)
        t = int(top.indices[0])
        gen.append(t)
        margins.append(float(top.values[0] - top.values[1]))
        seq.append(t)
    gen_text = tok.decode(gen)
    print(f"greedy: {PROMPT!r} -> {gen_text!r}")

    out = dict(
        model=path.name,
        model_sha256=sha256(path),
        reference="transformers Gemma3ForCausalLM, float32 dequantized weights, eager attention",
        text_file="score_text.txt",
        bos_id=2,
        ids=ids,
        mean_nll=float(nll),
        top1_accuracy=float(acc),
        positions=positions,
        greedy_continuation=dict(
            prompt=PROMPT,
            prompt_ids=pids,
            generated_ids=gen,
            generated_text=gen_text,
            margins=margins,
        ),
    )
    with open(FIX / "gemma3_score_reference.json", "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {FIX / 'gemma3_score_reference.json'} ({(FIX / 'gemma3_score_reference.json').stat().st_size/1024:.1f} KiB)")


if __name__ == "__main__":
    main()
