//! Shared by the CLI tests on the real default model (included with `mod`).

use std::path::PathBuf;

/// The real default model, or `None` (with a note) when it has not been
/// pulled; with `SPINDLE_REQUIRE_MODEL=1` (CI) a missing model fails.
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
