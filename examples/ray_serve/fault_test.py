#!/usr/bin/env python3
"""Spindle on a Ray Serve cluster of three nodes on one machine
(cluster.py), checked through the official `openai` client, then a worker
node killed under load and brought back.

    python3 examples/ray_serve/fault_test.py            # 4 clients, 60 s of load
    python3 examples/ray_serve/fault_test.py --ci       # the short form CI runs
    python3 examples/ray_serve/fault_test.py --keep     # leave the cluster up

Needs root, iproute2, the default model (`spindle pull`), target/ray-venv
(`python3 -m venv target/ray-venv && target/ray-venv/bin/pip install
'ray[serve]' openai`) and the package: installed in that venv (`pip install
./crates/spindle-py`), or laid out from a cargo build with `--package-dir`
(what CI does: target/ray-pkg, see .ci/run).

What it checks, every wait bounded:

1. the official client through the ingress: a greedy completion equals
   `spindle run`'s; a streamed chat equals the same chat unstreamed; a bad
   request is a 400 with the engine's message; `/v1/decide` answers;
2. affinity: the turns of a conversation land on one replica, whose
   `spindle:prefix_cache_hits_total` grows by at least the tokens of the
   earlier turns, while the other replica sees no request at all;
3. faults: clients stream seeded chats (16 conversations) through
   `spindle.client.resumable_stream` (and one more client sends them
   unstreamed, with the openai client's own retries); worker w2 is killed
   while a stream is in progress there (SIGKILL to its raylet and
   replica), then started again. Every request must finish
   (retried where its replica was lost) with exactly the text the same
   request gives when nothing fails, none may take longer than its bound,
   requests keep finishing while w2 is down, and after w2 returns Serve
   places a replica there that serves requests again.

It writes what the clients saw (counts, latencies, errors, by phase) to
target/ray-cluster/fault-report.json and prints a summary; the exit status
is 0 only when every check held. The cluster is torn down at the end
(unless --keep), whatever happened.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import cluster  # noqa: E402

INGRESS = f"http://{cluster.address('head')}:{cluster.SERVE_PORT}"
REPORT = cluster.LOGS / "fault-report.json"
MODEL_NAME = "gemma-3-270m-q4_k_m"
SYSTEM = (
    "You are the support assistant of a bicycle shop. You answer questions about repairs, "
    "spare parts, opening hours and prices briefly and politely. The shop is open from nine "
    "to six on weekdays and from ten to two on Saturdays. A tyre change costs twelve euros."
)
# Conversations of the load: distinct starts, so the router spreads them.
# 16 of them: the chance that all go to one of two replicas is 2^-15.
LOAD_TOPICS = [
    "a flat tyre", "squeaking brakes", "a loose chain", "a bent wheel", "gear cables",
    "saddle height", "a broken spoke", "winter storage", "lights for the night", "a child seat",
    "a rusty frame", "tubeless tyres", "a wobbly handlebar", "pedals that click", "a new bell",
    "mudguards",
]


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- root side


def run_checked(cmd, timeout, **kw):
    log("$ " + " ".join(str(c) for c in cmd))
    out = subprocess.run([str(c) for c in cmd], timeout=timeout, **kw)
    if out.returncode != 0:
        raise SystemExit(f"failed ({out.returncode}): {' '.join(str(c) for c in cmd)}")
    return out


def reference_completion(spindle_bin, model, prompt, n):
    """`spindle run`'s greedy text: the reference for the first check."""
    out = subprocess.run(
        [spindle_bin, "run", "-m", model, "-t", "1", "--temp", "0", "-n", str(n), "--json", "-p", prompt],
        capture_output=True, text=True, timeout=300,
    )
    if out.returncode != 0:
        raise SystemExit(f"spindle run failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)["text"]


def main_root(a):
    if os.geteuid() != 0:
        raise SystemExit("the cluster needs root (network namespaces)")
    model = a.model or str(Path(os.environ.get("SPINDLE_HOME", Path.home() / ".cache/spindle")) / "models/gemma-3-270m-q4_k_m.gguf")
    if not Path(model).exists():
        raise SystemExit(f"{model} is missing: run `spindle pull` first")
    if a.package_dir:
        os.environ["SPINDLE_PYTHONPATH"] = str(Path(a.package_dir).resolve())
    probe = subprocess.run(
        [cluster.PYTHON, "-c", "import spindle.ray_serve, spindle.client, openai; print(spindle.__file__)"],
        capture_output=True, text=True, timeout=120, env=cluster.node_env(),
    )
    if probe.returncode != 0:
        raise SystemExit(f"{cluster.PYTHON} cannot import spindle.ray_serve and openai:\n{probe.stderr[-3000:]}")
    log(f"spindle from {probe.stdout.strip()}")
    prompt = "The history of the bicycle begins"
    reference = reference_completion(a.spindle, model, prompt, 24)

    # A hard bound on the whole run: the cluster comes down even if a step hangs.
    def on_alarm(*_):
        raise TimeoutError(f"the fault test ran past {a.max_seconds} s")

    def on_term(signum, _frame):
        raise SystemExit(128 + signum)  # so that `finally` tears the cluster down

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    signal.alarm(a.max_seconds)
    status = 1
    try:
        cluster.down()
        t = time.time()
        cluster.up()
        log(f"cluster up in {time.time() - t:.1f} s")
        t = time.time()
        run_checked(
            ["ip", "netns", "exec", cluster.ns("head"), cluster.PYTHON, __file__, "_deploy", "--model", model],
            timeout=420, env=cluster.node_env(),
        )
        log(f"deployed in {time.time() - t:.1f} s")
        args = [
            "ip", "netns", "exec", cluster.ns("client"), cluster.PYTHON, __file__, "_client",
            "--reference", json.dumps({"prompt": prompt, "text": reference}),
            "--duration", a.duration, "--clients", a.clients, "--kill-at", a.kill_at, "--down-for", a.down_for,
            "--max-tokens", a.max_tokens,
        ]
        status = subprocess.run([str(x) for x in args], env=cluster.node_env(), timeout=a.max_seconds).returncode
    finally:
        signal.alarm(0)
        if a.keep:
            log(f"cluster left up (--keep): {INGRESS} from namespace {cluster.ns('client')}")
        else:
            cluster.down()
    log("PASSED" if status == 0 else f"FAILED (status {status})")
    return status


def main_deploy(a):
    """In the head's namespace: Serve with one proxy on the head, the
    ingress pinned to the head, one replica per worker (1 thread each)."""
    import ray
    from ray import serve

    from spindle.ray_serve import build_app

    ray.init(address=cluster.head_address(), logging_level="ERROR")
    serve.start(proxy_location="HeadOnly", http_options={"host": "0.0.0.0", "port": cluster.SERVE_PORT})
    app = build_app(
        a.model,
        n_threads=1,
        num_replicas=2,
        max_ongoing_requests=8,
        llama_kwargs={"n_ctx": 2048, "max_seqs": 4},
        ingress_actor_options={"num_cpus": 0, "resources": {"node:__internal_head__": 0.001}},
        request_timeout_s=120,
        stream_idle_s=30,
    )
    serve.run(app, name="spindle", route_prefix="/", blocking=False)
    print(json.dumps(serve.status().applications["spindle"].status), flush=True)


# -------------------------------------------------------------- client side


def http_json(path, timeout=15):
    import urllib.request

    with urllib.request.urlopen(INGRESS + path, timeout=timeout) as r:
        return json.loads(r.read())


def http_text(path, timeout=15):
    import urllib.request

    with urllib.request.urlopen(INGRESS + path, timeout=timeout) as r:
        return r.read().decode()


def metric(text, name):
    total = None
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    if total is None:
        raise AssertionError(f"{name} is not in the metrics")
    return total


def replicas(timeout=15):
    try:
        return http_json("/replicas", timeout)["replicas"]
    except Exception:  # noqa: BLE001 - the caller polls
        return []


def wait_for(what, cond, deadline_s, every_s=1.0):
    end = time.time() + deadline_s
    while time.time() < end:
        got = cond()
        if got:
            return got
        time.sleep(every_s)
    raise AssertionError(f"{what}: not within {deadline_s} s")


FAILURES = []


def check(ok, what):
    log(("ok: " if ok else "FAILED: ") + what)
    if not ok:
        FAILURES.append(what)


def openai_client(**kw):
    from openai import OpenAI

    return OpenAI(base_url=INGRESS + "/v1", api_key="none", **kw)


def check_openai(reference):
    import openai

    client = openai_client(timeout=60, max_retries=2)
    out = client.completions.create(model=MODEL_NAME, prompt=reference["prompt"], max_tokens=24, temperature=0)
    check(out.choices[0].text == reference["text"], f"greedy completion through the ingress equals `spindle run`'s ({out.choices[0].text!r})")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "When are you open on Saturday?"}]
    whole = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=24, temperature=0)
    text = whole.choices[0].message.content
    pieces = []
    for chunk in client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=24, temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    check(len(pieces) > 1 and "".join(pieces) == text, f"a streamed chat ({len(pieces)} chunks) equals the same chat unstreamed")
    try:
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=4, temperature=-1)
        check(False, "temperature=-1 is refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "temperature" in str(e), f"temperature=-1 is a 400 naming it ({e.message[:80]!r})")
    decide = client.post(
        "/decide",
        cast_to=object,
        body={"model": MODEL_NAME, "state": "The shop's card reader is broken.",
              "questions": [{"id": "urgent", "kind": "yes_no"}]},
    )
    probs = decide["questions"][0]["probabilities"]
    check(set(probs) == {"yes", "no"} and abs(sum(probs.values()) - 1) < 1e-6, f"/v1/decide answers ({probs})")


def check_affinity():
    """Three turns of one conversation: one replica serves them all and its
    prefix cache finds the earlier turns; the other replica sees nothing."""
    client = openai_client(timeout=60, max_retries=0)
    reps = {r["id"] for r in replicas()}
    check(len(reps) == 2, f"two replicas answer /replicas ({sorted(reps)})")
    before = {r: http_text(f"/replicas/{r}/metrics") for r in reps}
    messages = [{"role": "system", "content": SYSTEM}]
    served, prompt_tokens = [], []
    for question in ["Can you fix a flat tyre today?", "How much does that cost?", "And on Saturday?"]:
        messages.append({"role": "user", "content": question})
        raw = client.chat.completions.with_raw_response.create(model=MODEL_NAME, messages=messages, max_tokens=16, temperature=0)
        out = raw.parse()
        served.append(raw.headers.get("x-spindle-replica"))
        prompt_tokens.append(out.usage.prompt_tokens)
        messages.append({"role": "assistant", "content": out.choices[0].message.content})
    check(len(set(served)) == 1 and served[0] in reps, f"the three turns landed on one replica ({served})")
    home = served[0]
    after = {r: http_text(f"/replicas/{r}/metrics") for r in reps}
    hits = metric(after[home], "spindle:prefix_cache_hits_total") - metric(before[home], "spindle:prefix_cache_hits_total")
    # Turns 2 and 3 find at least the whole blocks of the turn before
    # (16 tokens a block; the last, partly filled block may be missed).
    want = sum(16 * (p // 16) - 16 for p in prompt_tokens[:2])
    check(hits >= want, f"replica {home}: prefix-cache hits grew by {hits:.0f} tokens (prompts {prompt_tokens}; at least {want})")
    for other in reps - {home}:
        q = metric(after[other], "spindle:prefix_cache_queries_total") - metric(before[other], "spindle:prefix_cache_queries_total")
        check(q == 0, f"replica {other} looked up no prompt meanwhile ({q:.0f} tokens)")
    return home


class Load:
    """Clients streaming seeded chats through resumable_stream until told to
    stop; each request's outcome is recorded."""

    def __init__(self, clients, max_tokens):
        self.clients = clients
        self.max_tokens = max_tokens
        self.records = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.expected = {}
        self.active = {}  # id(rec) -> (rec, stream) of the streams in progress

    def body(self, topic_index):
        topic = LOAD_TOPICS[topic_index]
        return dict(
            model=MODEL_NAME,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"I have a question about {topic}."}],
            max_tokens=self.max_tokens,
            temperature=0.7,
            seed=1000 + topic_index,
        )

    def one(self, client, topic_index, deadline_s):
        from spindle.client import resumable_stream

        rec = {"topic": topic_index, "start": time.time(), "first": None, "end": None, "text": "", "error": None,
               "sends": [], "stream": True, "chunks": 0}

        def create(**kw):
            rec["sends"].append(time.time())
            return client.chat.completions.create(**kw)

        stream = resumable_stream(create, max_attempts=4, deadline_s=deadline_s, backoff_s=0.5, **self.body(topic_index))
        pieces = []
        with self.lock:
            self.active[id(rec)] = (rec, stream)
        try:
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    if rec["first"] is None:
                        rec["first"] = time.time()
                    rec["chunks"] += 1
                    pieces.append(chunk.choices[0].delta.content)
        except Exception as e:  # noqa: BLE001 - recorded, judged later
            rec["error"] = f"{type(e).__name__}: {e}"[:300]
        with self.lock:
            self.active.pop(id(rec), None)
        rec["end"] = time.time()
        rec["text"] = "".join(pieces)
        rec["attempts"] = stream.attempts
        rec["errors"] = [f"{type(e).__name__}: {e}"[:200] for e in stream.errors]
        rec["served_by"] = [(h.get("x-spindle-replica"), h.get("x-spindle-node")) for h in stream.headers]
        return rec

    def one_unstreamed(self, client, topic_index):
        """The same chat without streaming: the openai client's own retries
        (of a 503, or a connection that failed) are the whole recovery."""
        rec = {"topic": topic_index, "start": time.time(), "first": None, "end": None, "text": "", "error": None,
               "sends": [], "stream": False, "errors": [], "served_by": []}
        try:
            raw = client.chat.completions.with_raw_response.create(**self.body(topic_index))
            out = raw.parse()
            rec["text"] = out.choices[0].message.content
            rec["attempts"] = 1 + raw.retries_taken
            rec["served_by"] = [(raw.headers.get("x-spindle-replica"), raw.headers.get("x-spindle-node"))]
            rec["errors"] = ["a retry by the openai client"] * raw.retries_taken
        except Exception as e:  # noqa: BLE001 - recorded, judged later
            rec["error"] = f"{type(e).__name__}: {e}"[:300]
            rec["attempts"] = 1
        rec["end"] = time.time()
        return rec

    def streaming_on(self, node, at_most_chunks=None):
        """Streams in progress that have had text from a replica on `node`
        (and, given `at_most_chunks`, no more than that many pieces yet: most
        of their answer is still to be generated there)."""
        with self.lock:
            active = list(self.active.values())
        return sum(
            1 for rec, stream in active
            if rec["first"] is not None and stream.headers and stream.headers[-1].get("x-spindle-node") == node
            and (at_most_chunks is None or rec["chunks"] <= at_most_chunks)
        )

    def expect(self):
        """Each topic's text when nothing fails (before the fault)."""
        from concurrent.futures import ThreadPoolExecutor

        client = openai_client(timeout=60, max_retries=0)

        def one(i):
            return i, client.chat.completions.create(**self.body(i)).choices[0].message.content

        with ThreadPoolExecutor(self.clients) as pool:
            self.expected.update(pool.map(one, range(len(LOAD_TOPICS)), timeout=180))

    def worker(self, k, request_deadline_s):
        streaming = k < self.clients
        client = openai_client(timeout=20, max_retries=2 if streaming else 4)
        i = k
        for _ in range(10_000):  # bounded; the stop event ends it long before
            if self.stop.is_set():
                return
            if streaming:
                rec = self.one(client, i % len(LOAD_TOPICS), request_deadline_s)
            else:
                rec = self.one_unstreamed(client, i % len(LOAD_TOPICS))
            rec["client"] = k
            with self.lock:
                self.records.append(rec)
            i += self.clients

    def run_in_background(self, request_deadline_s):
        # The streaming clients, and one more that does not stream.
        self.threads = [
            threading.Thread(target=self.worker, args=(k, request_deadline_s), daemon=True) for k in range(self.clients + 1)
        ]
        for t in self.threads:
            t.start()

    def finish(self, join_s):
        self.stop.set()
        end = time.time() + join_s
        for t in self.threads:
            t.join(max(0.0, end - time.time()))
        return [t for t in self.threads if t.is_alive()]


def pct(values, q):
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


def summarise(recs, expected):
    lat = [r["end"] - r["start"] for r in recs]
    first = [r["first"] - r["start"] for r in recs if r["first"] is not None]
    return {
        "requests": len(recs),
        "completed": sum(1 for r in recs if r["error"] is None),
        "failed": sum(1 for r in recs if r["error"] is not None),
        "retried": sum(1 for r in recs if r["attempts"] > 1),
        "text_as_expected": sum(1 for r in recs if r["error"] is None and r["text"] == expected[r["topic"]]),
        "latency_s": {"p50": pct(lat, 0.5), "p95": pct(lat, 0.95), "max": round(max(lat), 3) if lat else None,
                      "mean": round(statistics.mean(lat), 3) if lat else None},
        "first_token_s": {"p50": pct(first, 0.5), "p95": pct(first, 0.95), "max": round(max(first), 3) if first else None},
    }


def main_client(a):
    reference = json.loads(a.reference)
    wait_for("the ingress answers with two replicas", lambda: len(replicas()) == 2, 180, 2)
    check_openai(reference)
    check_affinity()

    load = Load(a.clients, a.max_tokens)
    load.expect()
    log(f"expected texts of {len(load.expected)} seeded chats computed")
    request_deadline_s = 60.0
    t0 = time.time()
    load.run_in_background(request_deadline_s)
    events = {"load_start": t0}
    monitor = []

    def watch(until):
        while time.time() < until:
            monitor.append((time.time(), sorted((r["id"], r["node_ip"]) for r in replicas(5))))
            time.sleep(1.0)

    watch(t0 + a.kill_at)
    # Kill while a stream is in progress on w2 (bounded: at most 30 s more),
    # one that has most of its answer still to come: a stream near its end
    # can have been generated whole before the kill lands (the ingress still
    # passing its last pieces on), and then nothing on w2 was cut.
    end = time.time() + 30
    young = max(1, a.max_tokens // 4)
    while load.streaming_on(cluster.address("w2"), young) == 0 and time.time() < end:
        time.sleep(0.02)
    events["kill"] = time.time()
    killed = cluster.kill_node("w2")
    log(f"killed {killed} processes of w2 ({cluster.address('w2')})")
    watch(events["kill"] + a.down_for)
    events["restart"] = time.time()
    cluster.start_node("w2")
    log("w2 started again")
    w2 = cluster.address("w2")

    def replica_back():
        monitor.append((time.time(), sorted((r["id"], r["node_ip"]) for r in replicas(5))))
        return [r for r in monitor[-1][1] if r[1] == w2 and r[0] not in old_w2]

    # The replica w2 had before the kill: the one that comes back is another.
    old_w2 = {r[0] for t, reps in monitor if t < events["kill"] for r in reps if r[1] == w2}
    try:
        back = wait_for("a replica on w2 again", replica_back, 240, 1.0)
        events["replica_back"] = time.time()
        new_w2 = back[0][0]
        log(f"replica {new_w2} on w2 after {events['replica_back'] - events['restart']:.1f} s")

        def served_by_new():
            with load.lock:
                return sum(1 for r in load.records if r["error"] is None and any(s[0] == new_w2 for s in r["served_by"]))

        # The rest of the load; then until the new replica served a few.
        watch(max(time.time() + 5, t0 + a.duration))
        wait_for("requests served by the returned replica", lambda: served_by_new() >= 3, 120, 1.0)
    except AssertionError as e:
        check(False, str(e))
        new_w2 = None
    events["load_stop"] = time.time()
    hung = load.finish(join_s=request_deadline_s * 2)
    events["load_end"] = time.time()
    recs = sorted(load.records, key=lambda r: r["start"])

    # Phases by when a request started.
    back_t = events.get("replica_back", events["load_stop"])
    phases = {
        "before_kill": [r for r in recs if r["start"] < events["kill"]],
        "w2_down": [r for r in recs if events["kill"] <= r["start"] < back_t],
        "after_return": [r for r in recs if r["start"] >= back_t],
    }
    in_flight = [r for r in recs if r["start"] < events["kill"] < r["end"]]
    # In flight on w2 when it died: their first send was answered from there.
    # One that finished untouched (no second send, no error) within 0.3 s of
    # the kill had its answer generated before the processes went; it is
    # reported, not judged.
    from_w2 = [r for r in in_flight if r["stream"] and r["served_by"] and r["served_by"][0][1] == w2]
    done_before_kill = [r for r in from_w2 if r["attempts"] == 1 and r["error"] is None and r["end"] < events["kill"] + 0.3]
    on_w2 = [r for r in from_w2 if r not in done_before_kill]
    unstreamed = [r for r in recs if not r["stream"]]
    streamed = [r for r in recs if r["stream"]]
    report = {
        "clients": a.clients,
        "max_tokens": a.max_tokens,
        "events_s": {k: round(v - t0, 2) for k, v in events.items()},
        "all": summarise(recs, load.expected),
        "streamed": summarise(streamed, load.expected),
        "unstreamed": summarise(unstreamed, load.expected),
        "phases": {k: summarise(v, load.expected) for k, v in phases.items()},
        "in_flight_at_kill": {
            "requests": len(in_flight),
            "retried": sum(1 for r in in_flight if r["attempts"] > 1),
            "completed": sum(1 for r in in_flight if r["error"] is None),
            "errors_seen": sorted({e.split(":")[0] for r in in_flight for e in r["errors"]}),
            "latency_s": [round(r["end"] - r["start"], 2) for r in in_flight],
            "on_w2": len(on_w2),
            "on_w2_done_before_the_kill_landed": len(done_before_kill),
            "on_w2_retried_and_completed": sum(1 for r in on_w2 if r["attempts"] > 1 and r["error"] is None),
            "on_w2_latency_s": [round(r["end"] - r["start"], 2) for r in on_w2],
            # From the kill to the wrapper's second send (the failure seen,
            # plus its pause of 0.5 s).
            "on_w2_resent_after_kill_s": [round(r["sends"][1] - events["kill"], 2) for r in on_w2 if len(r["sends"]) > 1],
            "unstreamed_in_flight": sum(1 for r in in_flight if not r["stream"]),
            "unstreamed_in_flight_retried_by_openai": sum(1 for r in in_flight if not r["stream"] and r["attempts"] > 1),
        },
        "served_by": {},
        "failures_seen_by_the_wrapper": sorted({e[:120] for r in recs for e in r["errors"]}),
        "final_errors": [r["error"] for r in recs if r["error"]],
        "hung_clients": len(hung),
        "replicas_over_time": [(round(t - t0, 1), reps) for t, reps in monitor[:: max(1, len(monitor) // 40)]],
    }
    for r in recs:
        for rep, node in r["served_by"]:
            key = f"{node} {rep}"
            report["served_by"][key] = report["served_by"].get(key, 0) + 1
    cluster.LOGS.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=1))

    total = report["all"]
    log(f"load: {json.dumps(total)}")
    log(f"  streamed: {json.dumps(report['streamed'])}")
    log(f"  unstreamed: {json.dumps(report['unstreamed'])}")
    for k, v in report["phases"].items():
        log(f"  {k}: {json.dumps(v)}")
    log(f"  in flight at the kill: {json.dumps(report['in_flight_at_kill'])}")
    log(f"  served by: {json.dumps(report['served_by'])}")
    log(f"  events (s after the load began): {json.dumps(report['events_s'])}")
    check(not hung, f"every client stopped within its bound ({len(hung)} still running)")
    check(report["unstreamed"]["requests"] > 0, f"the unstreamed client was served ({report['unstreamed']['requests']})")
    check(total["requests"] > 0 and total["failed"] == 0, f"no request lost: {total['completed']} of {total['requests']} finished ({report['final_errors'][:3]})")
    check(total["text_as_expected"] == total["completed"], f"every finished request has the text of the same request without faults ({total['text_as_expected']} of {total['completed']})")
    max_latency = total["latency_s"]["max"] or 0
    check(max_latency < request_deadline_s, f"no request took longer than {request_deadline_s:.0f} s (slowest {max_latency:.1f} s)")
    fixed = report["in_flight_at_kill"]["on_w2_retried_and_completed"]
    check(len(on_w2) > 0 and fixed == len(on_w2), f"the kill caught requests in flight on w2, and each was retried and finished ({fixed} of {len(on_w2)})")
    down = report["phases"]["w2_down"]
    check(down["completed"] > 0, f"requests kept finishing while w2 was down ({down['completed']})")
    if new_w2 is not None:
        n = sum(1 for r in recs if r["error"] is None and any(s[0] == new_w2 for s in r["served_by"]))
        check(n >= 3, f"the replica on the returned node served {n} requests")
    check(len(replicas()) == 2, "two replicas answer at the end")
    log(f"report: {REPORT}")
    if FAILURES:
        log(f"{len(FAILURES)} checks failed: {FAILURES}")
        return 1
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", nargs="?", default="run", choices=["run", "_deploy", "_client"])
    p.add_argument("--ci", action="store_true", help="the short form: 24 s of load, w2 killed after 8 s, down for 6 s")
    p.add_argument("--model")
    p.add_argument("--spindle", default=str(ROOT / "target/debug/spindle"), help="the binary for the reference completion")
    p.add_argument("--package-dir", help="a directory holding the package spindle/ (PYTHONPATH of the nodes)")
    p.add_argument("--clients", type=int, default=4, help="streaming clients (one unstreamed client runs beside them)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (at least; until the returned replica served)")
    p.add_argument("--kill-at", type=float, default=15.0, help="seconds into the load when w2 is killed")
    p.add_argument("--down-for", type=float, default=10.0, help="seconds w2 stays down")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--max-seconds", type=int, default=900, help="a hard bound on the whole run")
    p.add_argument("--keep", action="store_true", help="leave the cluster up")
    p.add_argument("--reference")
    a = p.parse_args()
    if a.ci:
        a.duration, a.kill_at, a.down_for, a.max_seconds = 24.0, 8.0, 6.0, 600
    for name in ("clients", "max_tokens"):
        if getattr(a, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < a.kill_at < a.duration:
        raise SystemExit("--kill-at must fall inside --duration")
    if a.role == "_deploy":
        return main_deploy(a)
    if a.role == "_client":
        return main_client(a)
    return main_root(a)


if __name__ == "__main__":
    sys.exit(main())
