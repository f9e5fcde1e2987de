"""A script written against llama-cpp-python's documented API, as its users
write them. The test runs it on Spindle with the import line changed and
nothing else; it prints what it got as one JSON line.

    MODEL_PATH=model.gguf python3 llama_cpp_python_style.py
"""

import json
import os

import jsonschema
from llama_cpp import Llama

llm = Llama(
    model_path=os.environ["MODEL_PATH"],
    n_ctx=1024,
    n_threads=2,
    n_gpu_layers=0,
    seed=1337,
    verbose=False,
)
got = {}

# Completion: echo and stop strings.
out = llm("Q: Name the planets in the solar system? A: ", max_tokens=32, stop=["Q:", "\n"], echo=True)
assert out["object"] == "text_completion", out
assert out["choices"][0]["text"].startswith("Q: Name the planets in the solar system? A: "), out
assert "\n" not in out["choices"][0]["text"], out

# Greedy completion (compared with `spindle run` by the test).
out = llm.create_completion("The history of the printing press", max_tokens=40, temperature=0.0)
got["greedy"] = out["choices"][0]["text"]
assert out["usage"]["completion_tokens"] <= 40
assert out["usage"]["prompt_tokens"] > 0

# Log-probabilities of the top alternatives.
out = llm("The capital of France is", max_tokens=4, temperature=0.0, logprobs=3)
lp = out["choices"][0]["logprobs"]
assert len(lp["tokens"]) == len(lp["token_logprobs"]) == out["usage"]["completion_tokens"]
assert all(len(alts) == 3 for alts in lp["top_logprobs"]), lp
assert all(v <= 0.0 for v in lp["token_logprobs"])

# Streaming: the chunks add up to the reply without streaming.
pieces = []
for chunk in llm("Once upon a time", max_tokens=24, temperature=0.0, stream=True):
    pieces.append(chunk["choices"][0]["text"])
whole = llm("Once upon a time", max_tokens=24, temperature=0.0)["choices"][0]["text"]
assert "".join(pieces) == whole, (pieces, whole)
got["streamed"] = whole

# Chat, then chat streaming.
messages = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write one sentence about the sea."},
]
chat = llm.create_chat_completion(messages=messages, max_tokens=24, temperature=0.0)
assert chat["object"] == "chat.completion"
assert chat["choices"][0]["message"]["role"] == "assistant"
got["chat"] = chat["choices"][0]["message"]["content"]
deltas = [c["choices"][0]["delta"] for c in llm.create_chat_completion(messages=messages, max_tokens=24, temperature=0.0, stream=True) if c["choices"]]
assert deltas[0].get("role") == "assistant", deltas[0]
assert "".join(d.get("content") or "" for d in deltas) == got["chat"]

# Tools, with tool_choice naming the function.
tools = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given location",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "The city, e.g. San Francisco"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["location", "unit"],
            },
        },
    }
]
out = llm.create_chat_completion(
    messages=[{"role": "user", "content": "What's the weather like in Paris?"}],
    tools=tools,
    tool_choice={"type": "function", "function": {"name": "get_current_weather"}},
    temperature=0.0,
)
call = out["choices"][0]["message"]["tool_calls"][0]
assert call["type"] == "function" and call["function"]["name"] == "get_current_weather", call
arguments = json.loads(call["function"]["arguments"])
jsonschema.validate(arguments, tools[0]["function"]["parameters"])
got["tool_arguments"] = arguments

# JSON mode with a schema (llama-cpp-python's response_format).
schema = {
    "type": "object",
    "properties": {"team_name": {"type": "string"}, "founded": {"type": "integer"}},
    "required": ["team_name", "founded"],
    "additionalProperties": False,
}
out = llm.create_chat_completion(
    messages=[
        {"role": "system", "content": "You are a helpful assistant that outputs in JSON."},
        {"role": "user", "content": "Who won the world series in 2020?"},
    ],
    response_format={"type": "json_object", "schema": schema},
    temperature=0.0,
    max_tokens=200,
)
assert out["choices"][0]["finish_reason"] == "stop", out
reply = json.loads(out["choices"][0]["message"]["content"])
jsonschema.validate(reply, schema)
got["json_reply"] = reply

# Tokens.
tokens = llm.tokenize(b"Hello, world! How are you?")
assert tokens and all(isinstance(t, int) for t in tokens)
text = llm.detokenize(tokens)
assert isinstance(text, bytes) and text.strip() == b"Hello, world! How are you?", text
got["tokens"] = tokens

print(json.dumps(got))
