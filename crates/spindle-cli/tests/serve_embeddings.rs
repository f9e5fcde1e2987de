//! `spindle serve --embedding-model` checked from outside
//! (tests/openai/check_embeddings.py): the official `openai` client's
//! `embeddings.create`, float and base64, against sentence-transformers'
//! vectors; `/v1/rerank` by cosine and by a cross-encoder against
//! transformers' order; bad requests as 400s; the embedding metrics.
//!
//! Needs the default chat model, all-MiniLM-L6-v2 (`spindle pull
//! all-minilm-l6-v2`) and the `openai` client (target/pydeps); without them
//! it skips with a note, except under `SPINDLE_REQUIRE_MODEL=1` (CI).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(model: &Path, embedding: &Path) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["serve", "-m"])
        .arg(model)
        .args([
            "--port",
            "0",
            "-t",
            "2",
            "--max-seqs",
            "2",
            "--ctx",
            "512",
            "--embedding-model",
        ])
        .arg(embedding)
        .env("SPINDLE_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spindle serve starts");
    let addr = common::serve_addr(&mut child);
    (Server(child), format!("http://{addr}/v1"))
}

#[test]
fn embeddings_and_rerank_through_the_openai_client() {
    let Some(model) = common::real_model() else {
        return;
    };
    let home = std::env::var_os("SPINDLE_HOME").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/spindle"),
        PathBuf::from,
    );
    let minilm = home.join("models/all-MiniLM-L6-v2");
    if !minilm.join("model.safetensors").exists() {
        common::required("all-MiniLM-L6-v2 is missing (spindle pull all-minilm-l6-v2)");
        return;
    }
    let pydeps = common::pydeps();
    if !common::python_has("openai") {
        common::required("the openai Python client is missing (python3 -m pip install --target target/pydeps openai)");
        return;
    }
    let model_fixtures =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../spindle-model/tests/fixtures");
    let cross = model_fixtures.join("tiny/bert-cross-encoder");
    let (_s1, url) = start(&model, &minilm);
    let (_s2, cross_url) = start(&model, &cross);
    let status = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai/check_embeddings.py"))
        .env("PYTHONPATH", &pydeps)
        .env("SPINDLE_URL", &url)
        .env("SPINDLE_CROSS_URL", &cross_url)
        .env("SPINDLE_MODEL", "gemma-3-270m-q4_k_m")
        .env("SPINDLE_EMBED_FIXTURES", model_fixtures.join("embeddings"))
        .env("SPINDLE_CROSS_REFS", cross.join("refs.json"))
        .status()
        .expect("python3 runs");
    assert!(
        status.success(),
        "check_embeddings.py failed (its output is above)"
    );
}
