//! Shared by the engine's tests (included with `mod`).

use std::path::PathBuf;

use spindle_model::LoadedModel;

/// A tiny test model of `arch` from spindle-model's fixtures, on 2 threads.
pub fn tiny(arch: &str) -> LoadedModel {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../spindle-model/tests/fixtures/tiny")
        .join(arch)
        .join("model.gguf");
    spindle_model::load(&path, 2).expect("tiny model loads")
}
