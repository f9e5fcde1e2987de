//! Shared by the engine's tests (included with `mod`).

use std::path::PathBuf;

use spindle_model::LoadedModel;

#[allow(dead_code)]
/// A tiny test model of `arch` from spindle-model's fixtures, on 2 threads.
pub fn tiny(arch: &str) -> LoadedModel {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../spindle-model/tests/fixtures/tiny")
        .join(arch)
        .join("model.gguf");
    spindle_model::load(&path, 2).expect("tiny model loads")
}

/// The real model, or `None` (with a note) when it has not been pulled.
/// With `SPINDLE_REQUIRE_MODEL=1` (CI) a missing model fails the test.
#[allow(dead_code)]
pub fn real_model() -> Option<PathBuf> {
    let home = std::env::var_os("SPINDLE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/spindle")
        });
    let path = home.join("models/gemma-3-270m-q4_k_m.gguf");
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var("SPINDLE_REQUIRE_MODEL").ok().as_deref() != Some("1"),
        "SPINDLE_REQUIRE_MODEL=1 but {} is missing: run `spindle pull`",
        path.display()
    );
    eprintln!(
        "skipping: {} not found (run `spindle pull`)",
        path.display()
    );
    None
}

#[allow(dead_code)]
/// The tokens of one request of the serving loop, until it finishes.
pub fn tokens_until_finished(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<spindle_engine::scheduler::Event>,
) -> Vec<u32> {
    use spindle_engine::scheduler::Event;
    let mut tokens = Vec::new();
    loop {
        match rx.blocking_recv().expect("the engine answers") {
            Event::Token { id, .. } => tokens.push(id),
            Event::Finished(_) => return tokens,
            Event::Speculated { drafted, accepted } => assert!(accepted <= drafted),
            other => panic!("{other:?}"),
        }
    }
}

#[allow(dead_code)]
/// Temperature 0.8 and top-p 0.9 with `seed`: the sampled setting the
/// losslessness tests use.
pub fn nucleus(seed: u64) -> spindle_engine::SamplerConfig {
    spindle_engine::SamplerConfig {
        temperature: 0.8,
        top_p: 0.9,
        seed,
        ..spindle_engine::SamplerConfig::default()
    }
}
