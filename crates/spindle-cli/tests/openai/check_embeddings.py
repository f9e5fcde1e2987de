#!/usr/bin/env python3
"""/v1/embeddings and /v1/rerank of `spindle serve --embedding-model`,
checked with the official `openai` client and plain HTTP (run by
tests/serve_embeddings.rs).

References are independent of Spindle: sentence-transformers' vectors for
the committed sentences (crates/spindle-model/tests/fixtures/embeddings,
made by scripts/make_embedding_fixtures.py --refs) and transformers' scores
of the tiny cross-encoder (tests/fixtures/tiny/bert-cross-encoder/refs.json).
"""

import base64
import http.client
import json
import math
import os
import struct
import threading
import urllib.parse

import openai

URL = os.environ["SPINDLE_URL"]  # chat model + all-MiniLM-L6-v2
CROSS = os.environ["SPINDLE_CROSS_URL"]  # chat model + the tiny cross-encoder
CHAT_MODEL = os.environ["SPINDLE_MODEL"]
FIXTURES = os.environ["SPINDLE_EMBED_FIXTURES"]
CROSS_REFS = os.environ["SPINDLE_CROSS_REFS"]
MODEL = "all-MiniLM-L6-v2"

client = openai.OpenAI(base_url=URL, api_key="none", max_retries=0, timeout=120)
sentences = json.load(open(os.path.join(FIXTURES, "sentences.json")))
raw_refs = open(os.path.join(FIXTURES, "minilm_st.f32"), "rb").read()
refs = [struct.unpack_from("<384f", raw_refs, 384 * 4 * i) for i in range(len(sentences))]


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def post(base, path, body):
    u = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    # `base` ends in /v1; paths are given from the root.
    conn.request("POST", path, body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    status, text = r.status, r.read().decode()
    conn.close()
    return status, json.loads(text)


def check(name):
    def wrap(f):
        f()
        print(f"ok {name}", flush=True)
        return f
    return wrap


@check("embeddings.create (float) equals sentence-transformers")
def _():
    picked = list(range(0, 200, 5))
    r = client.embeddings.create(model=MODEL, input=[sentences[i] for i in picked])
    assert r.model == MODEL and len(r.data) == len(picked)
    assert r.usage.prompt_tokens == r.usage.total_tokens > len(picked) * 2
    for d, i in zip(r.data, picked):
        assert len(d.embedding) == 384
        c = cosine(d.embedding, refs[i])
        assert c >= 0.99999, (i, c)


@check("embeddings.create (base64) decodes to the float vectors")
def _():
    texts = [sentences[3], sentences[40]]
    f = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    b = client.embeddings.create(model=MODEL, input=texts, encoding_format="base64")
    for fd, bd in zip(f.data, b.data):
        # The client decodes base64 itself (into floats) when numpy is absent
        # or hands back the string; accept both, compare the values.
        emb = bd.embedding
        if isinstance(emb, str):
            emb = list(struct.unpack(f"<{len(base64.b64decode(emb)) // 4}f", base64.b64decode(emb)))
        assert emb == fd.embedding


@check("token-id inputs, a single string, and dimensions")
def _():
    one = client.embeddings.create(model=MODEL, input=sentences[0]).data[0].embedding
    assert cosine(one, refs[0]) >= 0.99999
    status, ids = post(URL, "/v1/embeddings", {"model": MODEL, "input": [[101, 1037, 2158, 2003, 5983, 2833, 1012, 102]]})
    assert status == 200, ids
    # "A man is eating food." as BERT ids: the same vector as the text.
    text = client.embeddings.create(model=MODEL, input="A man is eating food.").data[0].embedding
    assert cosine(ids["data"][0]["embedding"], text) > 0.999999
    short = client.embeddings.create(model=MODEL, input=sentences[0], dimensions=64).data[0].embedding
    assert len(short) == 64 and abs(sum(x * x for x in short) - 1) < 1e-5


@check("concurrent requests share passes and get their own vectors")
def _():
    out = {}

    def one(i):
        out[i] = client.embeddings.create(model=MODEL, input=[sentences[i], sentences[i + 1]]).data

    threads = [threading.Thread(target=one, args=(i,)) for i in range(0, 64, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, data in out.items():
        assert cosine(data[0].embedding, refs[i]) >= 0.99999
        assert cosine(data[1].embedding, refs[i + 1]) >= 0.99999


@check("bad requests are 400s naming the problem")
def _():
    cases = [
        ({"model": MODEL, "input": []}, "empty"),
        ({"model": MODEL, "input": ""}, "empty string"),
        ({"model": MODEL, "input": "word " * 600}, "over the model's limit"),
        ({"model": MODEL, "input": [[101, 999999, 102]]}, "past the vocabulary"),
        ({"model": MODEL, "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": MODEL, "input": "x", "dimensions": 4096}, "dimensions"),
        ({"model": CHAT_MODEL, "input": "x"}, "generates text"),
        ({"model": MODEL, "input": 3.5}, "invalid request body"),
    ]
    for body, words in cases:
        status, reply = post(URL, "/v1/embeddings", body)
        assert status == 400, (body, status, reply)
        assert words in reply["error"]["message"], (words, reply)
    status, reply = post(URL, "/v1/embeddings", {"model": MODEL, "input": "word " * 600, "truncate": True})
    assert status == 200 and reply["usage"]["prompt_tokens"] == 256, reply
    status, reply = post(URL, "/v1/embeddings", {"model": "nope", "input": "x"})
    assert status == 404, reply
    with_client = None
    try:
        client.embeddings.create(model=MODEL, input=[])
    except openai.BadRequestError as e:
        with_client = e
    assert with_client is not None


@check("rerank by cosine orders the relevant document first")
def _():
    status, r = post(URL, "/v1/rerank", {
        "model": MODEL, "query": "What is the capital of France?", "top_n": 2, "return_documents": True,
        "documents": ["A man is eating food.", "Paris is the capital of France.", {"text": "The cell's powerhouse."}],
    })
    assert status == 200, r
    assert [x["index"] for x in r["results"]][0] == 1 and len(r["results"]) == 2
    assert r["results"][0]["document"]["text"] == "Paris is the capital of France."
    for body, words in [({"model": MODEL, "query": "q", "documents": []}, "empty"),
                        ({"model": MODEL, "query": "", "documents": ["d"]}, "empty string")]:
        status, reply = post(URL, "/v1/rerank", body)
        assert status == 400 and words in reply["error"]["message"], reply


@check("rerank with a cross-encoder orders as transformers does")
def _():
    want = json.load(open(CROSS_REFS))
    status, r = post(CROSS, "/v1/rerank", {"model": "bert-cross-encoder", "query": want["query"],
                                           "documents": want["documents"]})
    assert status == 200, r
    assert [x["index"] for x in r["results"]] == want["order"], r
    for x in r["results"]:
        assert abs(x["relevance_score"] - want["logits"][x["index"]]) < 1e-4


@check("embedding metrics count the traffic")
def _():
    u = urllib.parse.urlparse(URL)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1])
              for line in text.splitlines() if line.startswith("spindle:embedding_")}
    assert values["spindle:embedding_requests_total"] >= 30, values
    assert values["spindle:embedding_tokens_total"] > 1000, values
    assert values["spindle:embedding_requests_waiting"] == 0, values
    # The 32 concurrent requests shared passes.
    assert values["spindle:embedding_passes_total"] < values["spindle:embedding_requests_total"] - 10, values
