"""Checks of the Python package against independent references and against
``spindle serve`` itself (run by crates/spindle-cli/tests/python_package.rs).

Environment: MODEL_PATH (the default model), SERVER_URL (a ``spindle serve``
of the same model, for /v1/decide and error messages), GEMMA_TOKENIZER
(Gemma 3's own tokenizer.json), EMBED_FIXTURES (sentence-transformers'
vectors of all-MiniLM-L6-v2), CHECK_EMBED=1 to check ``embed``.
"""

import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import spindle

MODEL = os.environ["MODEL_PATH"]
SERVER = os.environ["SERVER_URL"]


def post(path, body):
    req = urllib.request.Request(
        SERVER + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def metric(llm, name):
    for line in llm.metrics().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not in /metrics")


llm = spindle.Llama(MODEL, n_ctx=1024, n_threads=2, max_seqs=4, verbose=False)
model_name = llm.request("GET", "/v1/models")["data"][0]["id"]


def check_tokenizer():
    """Ids equal those of Gemma 3's own tokenizer.json (Hugging Face's
    `tokenizers`), with and without BOS; control-token text stays text
    unless special=True."""
    import tokenizers

    ref = tokenizers.Tokenizer.from_file(os.environ["GEMMA_TOKENIZER"])
    texts = [
        "Hello, world! How are you?",
        "  leading spaces and\ttabs\nnewlines",
        "naïve café — 東京 🚀",
        "def f(x):\n    return x**2  # comment",
    ]
    for text in texts:
        want = ref.encode(text).ids
        assert llm.tokenize(text.encode()) == want, (text, llm.tokenize(text.encode()), want)
        assert llm.tokenize(text, add_bos=False) == ref.encode(text, add_special_tokens=False).ids
        assert llm.detokenize(want[1:]) == text.encode(), (text, llm.detokenize(want[1:]))
    plain = llm.tokenize("<start_of_turn>user", add_bos=False)
    special = llm.tokenize("<start_of_turn>user", add_bos=False, special=True)
    assert special == ref.encode("<start_of_turn>user", add_special_tokens=False).ids, special
    assert len(plain) > len(special), (plain, special)
    print("tokenizer: ids equal Gemma 3's tokenizer.json")


def check_errors_are_the_servers():
    """A refused request raises SpindleError with the status and message the
    server answers the same body with."""
    cases = [
        ("/v1/completions", {"prompt": "hi", "temperature": -1}),
        ("/v1/chat/completions", {"messages": [], "max_tokens": 4}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}}),
    ]
    for path, body in cases:
        body = dict(body, model=model_name)
        status, answer = post(path, body)
        assert status == 400, (status, answer)
        try:
            llm.request("POST", path, body)
        except spindle.SpindleError as e:
            assert e.status == status and e.message == answer["error"]["message"], (e.status, e.message, answer)
        else:
            raise AssertionError(f"{path} {body} did not raise")
    try:
        llm.create_completion("hi", max_tokens=4, temperature=5)
    except spindle.SpindleError as e:
        assert e.status == 400 and e.param == "temperature", (e.status, e.param, e.message)
    else:
        raise AssertionError("temperature=5 did not raise")
    print("errors: SpindleError with the server's status and message")


def check_decide_is_the_servers():
    state = "Ticket: the checkout page returns error 500 for every user since the last deploy."
    questions = [
        {"id": "severity", "kind": "choice", "question": "How severe is this incident?", "options": ["low", "medium", "high", "critical"]},
        {"id": "rollback", "kind": "yes_no", "question": "Should the last deploy be rolled back?"},
    ]
    status, want = post("/v1/decide", {"model": model_name, "state": state, "questions": questions})
    assert status == 200, want
    got = llm.decide(state, questions)
    assert [q["id"] for q in got["questions"]] == ["severity", "rollback"], got
    assert _close(got["questions"], want["questions"]), (got["questions"], want["questions"])
    print("decide: the same answers and probabilities as /v1/decide")


def _close(a, b):
    """Equal, floats within 1e-6 (the same engine computes both)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) <= 1e-6
    return a == b


def greedy_stream(m, prompt, n):
    return "".join(c["choices"][0]["text"] for c in m(prompt, max_tokens=n, temperature=0.0, stream=True))


def check_threads_share_the_batch():
    """Two Python threads streaming from one Llama get the tokens each gets
    alone, in less wall time than one after the other. Without speculation:
    with it, the second run of a prompt drafts from the first one's output
    (earlier traffic), which would flatter the threads."""
    m = spindle.Llama(MODEL, n_ctx=512, n_threads=2, max_seqs=2, spec="off", verbose=False)
    prompts = ["The origins of the violin", "A recipe for bread begins with"]
    n = 64
    greedy_stream(m, prompts[0], 4)  # warm
    alone, start = [], time.perf_counter()
    for p in prompts:
        alone.append(greedy_stream(m, p, n))
    sequential = time.perf_counter() - start
    together = [None, None]

    def run(i):
        together[i] = greedy_stream(m, prompts[i], n)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    parallel = time.perf_counter() - start
    assert together == alone, (together, alone)
    assert parallel < sequential, (parallel, sequential)
    del m
    print(f"threads: same tokens; together {parallel:.2f} s, one after the other {sequential:.2f} s")


def check_dropped_stream_cancels():
    """Leaving a stream early frees its sequence: nothing stays running."""
    before = metric(llm, "vllm:num_requests_running")
    stream = llm("Write a very long story about a lighthouse keeper.", max_tokens=900, temperature=0.8, stream=True)
    for _, _chunk in zip(range(3), stream):
        pass
    assert metric(llm, "vllm:num_requests_running") == before + 1
    stream.close()
    deadline = time.time() + 5
    while metric(llm, "vllm:num_requests_running") != before and time.time() < deadline:
        time.sleep(0.05)
    assert metric(llm, "vllm:num_requests_running") == before, "the dropped stream is still running"
    print("streams: a dropped stream cancels its request")


def check_ctrl_c_cancels():
    """Ctrl-C during a long call raises KeyboardInterrupt at once (the call
    waits in slices and checks for signals)."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import spindle, sys, time\n"
            f"llm = spindle.Llama({MODEL!r}, n_ctx=1024, n_threads=2, verbose=False)\n"
            "print('ready', flush=True)\n"
            "try:\n"
            "    llm('Tell me a long story.', max_tokens=1000, temperature=0.8)\n"
            "    print('finished', flush=True)\n"
            "except KeyboardInterrupt:\n"
            "    t = time.time(); out = llm('Hi', max_tokens=2)\n"
            "    print('interrupted', out['usage']['completion_tokens'], flush=True)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    sent = time.time()
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=30)
    assert out.startswith("interrupted"), out
    assert time.time() - sent < 10
    print("signals: Ctrl-C interrupts a call; the engine keeps serving")


def check_bad_arguments():
    """Bad constructor arguments are refused before anything loads, naming
    the argument."""
    for kwargs, name in (({"n_ctx": -5}, "n_ctx"), ({"n_threads": 0}, "n_threads"), ({"max_seqs": 1.5}, "max_seqs"), ({"n_gpu_layerz": 1}, "n_gpu_layerz")):
        try:
            spindle.Llama(MODEL, verbose=False, **kwargs)
        except (ValueError, TypeError) as e:
            assert name in str(e), (kwargs, str(e))
        else:
            raise AssertionError(f"Llama(**{kwargs}) was accepted")
    try:
        spindle.Llama(MODEL + ".missing", verbose=False)
    except ValueError as e:
        assert "no such file" in str(e), str(e)
    else:
        raise AssertionError("a missing model file was accepted")
    print("arguments: bad ones are refused with their names")


def check_pickle():
    clone = pickle.loads(pickle.dumps(llm))
    a = llm("The old lighthouse", max_tokens=12, temperature=0.0)["choices"][0]["text"]
    b = clone("The old lighthouse", max_tokens=12, temperature=0.0)["choices"][0]["text"]
    assert a == b, (a, b)
    assert clone.n_ctx() == llm.n_ctx() == 1024
    del clone
    print("pickle: reloads from the constructor's arguments")


def check_seeded_sampling():
    """A Llama built with a seed repeats its sampled outputs."""
    outs = []
    for _ in range(2):
        m = spindle.Llama(MODEL, n_ctx=256, n_threads=2, max_seqs=1, seed=7, verbose=False)
        outs.append([m("Once", max_tokens=8, temperature=1.0)["choices"][0]["text"] for _ in range(2)])
        del m
    assert outs[0] == outs[1], outs
    print("seed: a seeded Llama repeats its samples")


def check_embed():
    if os.environ.get("CHECK_EMBED") != "1":
        print("embed: not checked (CHECK_EMBED unset)")
        return
    fixtures = os.environ["EMBED_FIXTURES"]
    sentences = json.load(open(os.path.join(fixtures, "sentences.json")))[:16]
    raw = open(os.path.join(fixtures, "minilm_st.f32"), "rb").read()
    dim = 384
    m = spindle.Llama(MODEL, n_ctx=256, n_threads=2, max_seqs=1, embedding_model="default", verbose=False)
    vectors = m.embed(sentences)
    one = m.embed(sentences[0])
    assert one == vectors[0]
    for i, v in enumerate(vectors):
        ref = struct.unpack_from(f"<{dim}f", raw, i * dim * 4)
        cos = sum(a * b for a, b in zip(v, ref)) / (sum(a * a for a in v) ** 0.5 * sum(b * b for b in ref) ** 0.5)
        assert cos > 0.9999, (i, cos)
    print(f"embed: {len(vectors)} vectors match sentence-transformers (cosine > 0.9999)")


check_tokenizer()
check_errors_are_the_servers()
check_decide_is_the_servers()
check_threads_share_the_batch()
check_dropped_stream_cancels()
check_ctrl_c_cancels()
check_bad_arguments()
check_pickle()
check_seeded_sampling()
check_embed()
print("all checks passed")
