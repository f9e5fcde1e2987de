//! What the engine itself costs, apart from the model: every constant the
//! plan knows about Spindle's runtime, in one place so that it can be
//! calibrated against measured peak RSS.

use serde::{Deserialize, Serialize};

/// Runtime bytes of the CPU engine apart from the model (binary, libc,
/// allocator, thread stacks). Calibrated: the peak resident memory of
/// `spindle plan --measure` on the tiny test models, whose weights,
/// vocabulary and activations are all under a megabyte, is 6.5-7 MiB.
pub const CPU_RUNTIME_BYTES: u64 = 6_815_744;

/// Tokenizer bytes per vocabulary entry once built (token strings, the id
/// maps, the merge table the SentencePiece vocabulary becomes). Calibrated on
/// Gemma 3's 262,144 entries (`bench/plan-vs-rss`): resident memory after
/// loading, less the file copy, runtime and KV, is 106 MB.
pub const CPU_TOKENIZER_BYTES_PER_ENTRY: u64 = 404;

/// Peak tokenizer bytes per vocabulary entry while it is built (the loader
/// builds it while the weights are read): calibrated the same way from the
/// peak while loading, 232 MB for Gemma 3.
pub const CPU_TOKENIZER_BUILD_BYTES_PER_ENTRY: u64 = 886;

/// Engine constants the plan adds to the model's own sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineProfile {
    /// The backend the constants describe ("cpu").
    pub name: String,
    /// Compute threads: per-thread scratch (attention scores, packed weight
    /// tiles) is counted once per thread.
    pub threads: u64,
    /// Fixed bytes of the running engine, model aside.
    pub runtime_bytes: u64,
    /// Tokenizer bytes per vocabulary entry, once built.
    pub tokenizer_bytes_per_entry: u64,
    /// Peak bytes per vocabulary entry while the tokenizer is built.
    pub tokenizer_build_bytes_per_entry: u64,
    /// Whether a GGUF file is copied whole into resident memory, header and
    /// alignment padding included (the CPU loader does so, for huge pages,
    /// when the copy leaves room: `spindle_model`'s `fits_resident`), rather
    /// than only its tensor pages being mapped in.
    pub resident_gguf_copy: bool,
}

impl EngineProfile {
    /// The CPU engine on this machine, with one thread per available core.
    pub fn cpu() -> EngineProfile {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        EngineProfile::cpu_with_threads(threads)
    }

    /// The CPU engine with `threads` compute threads.
    pub fn cpu_with_threads(threads: u64) -> EngineProfile {
        EngineProfile {
            name: "cpu".into(),
            threads: threads.max(1),
            runtime_bytes: CPU_RUNTIME_BYTES,
            tokenizer_bytes_per_entry: CPU_TOKENIZER_BYTES_PER_ENTRY,
            tokenizer_build_bytes_per_entry: CPU_TOKENIZER_BUILD_BYTES_PER_ENTRY,
            resident_gguf_copy: true,
        }
    }
}
