//! Shared by the CLI tests on the real default model (included with `mod`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The real default model, or `None` (with a note) when it has not been
/// pulled; with `SPINDLE_REQUIRE_MODEL=1` (CI) a missing model fails.
#[allow(dead_code)]
pub fn real_model() -> Option<PathBuf> {
    let home = std::env::var_os("SPINDLE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/spindle")
        });
    let p = home.join("models/gemma-3-270m-q4_k_m.gguf");
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var("SPINDLE_REQUIRE_MODEL").ok().as_deref() != Some("1"),
        "{} missing",
        p.display()
    );
    eprintln!("skipping: {} not found (run `spindle pull`)", p.display());
    None
}

/// The `host:port` a `spindle serve` child listens on, from the URL it
/// prints on stdout (piped) once it is ready.
#[allow(dead_code)]
pub fn serve_addr(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout is piped"))
        .read_line(&mut line)
        .expect("the server prints its URL");
    let addr = line
        .trim()
        .trim_start_matches("http://")
        .trim_end_matches("/v1")
        .to_string();
    assert!(!addr.is_empty(), "the server did not start");
    addr
}

/// Where the Python packages the tests use live: `SPINDLE_PYDEPS`, or
/// `target/pydeps` (`.ci/run` installs them there).
#[allow(dead_code)]
pub fn pydeps() -> PathBuf {
    std::env::var_os("SPINDLE_PYDEPS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/pydeps"))
}

/// Says the test is skipped because `what` is missing, and returns false;
/// under `SPINDLE_REQUIRE_MODEL=1` (CI) a missing piece fails the test.
#[allow(dead_code)]
pub fn required(what: &str) -> bool {
    let required = std::env::var("SPINDLE_REQUIRE_MODEL").ok().as_deref() == Some("1");
    assert!(!required, "{what}");
    eprintln!("skipping: {what}");
    false
}

/// Whether `python3` with [`pydeps`] on its path can import `modules`
/// (a comma-separated list, as an import statement takes it).
#[allow(dead_code)]
pub fn python_has(modules: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .env("PYTHONPATH", pydeps())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
