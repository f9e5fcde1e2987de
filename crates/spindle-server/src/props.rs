//! `GET /props`: how this server was started (the model, its context and
//! KV pool, speculation, threads, build), for clients and people who need
//! to know what they are talking to.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use spindle_model::{KvLayout, BLOCK};

use crate::Shared;

/// What `/props` reports beyond what the engine handle knows; filled in by
/// whoever starts the server (the CLI knows the files and the flags).
/// Unknown parts are reported as `null`.
#[derive(Debug, Clone, Default)]
pub struct Props {
    /// The model file or directory, as given.
    pub model_path: Option<String>,
    /// The architecture family (`gemma3`, `llama`, ...).
    pub architecture: Option<String>,
    pub kv: Option<KvProps>,
    pub speculation: Option<SpecProps>,
    /// Compute threads.
    pub threads: Option<usize>,
    /// Sequences decoded at once.
    pub max_seqs: Option<usize>,
    /// The kernels' instruction-set path (`avx2`, `avx512vnni`, `scalar`).
    pub isa: Option<String>,
}

/// The KV pool: its element type and, for the full-attention layers (the
/// ones whose blocks sequences compete for), how many blocks it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct KvProps {
    /// `f16`, `q8_0` or `f32`.
    pub ty: String,
    /// Tokens per block.
    pub block_tokens: usize,
    /// Blocks of the full-attention pool (of the first group when every
    /// layer slides).
    pub blocks: usize,
    /// Bytes of the whole cache, every layer.
    pub bytes: usize,
    /// Whether sequences share the pool (`--kv-memory`) rather than each
    /// having room for the whole context.
    pub shared: bool,
    /// Per group of layers with one attention window: the window (`None`
    /// for full attention) and its blocks.
    pub groups: Vec<(Option<usize>, usize)>,
}

impl KvProps {
    pub fn of(layout: &KvLayout) -> KvProps {
        let groups: Vec<(Option<usize>, usize)> = layout
            .groups()
            .into_iter()
            .map(|w| (w, layout.pool_blocks(w)))
            .collect();
        let blocks = groups
            .iter()
            .find(|g| g.0.is_none())
            .or(groups.first())
            .map_or(0, |g| g.1);
        KvProps {
            ty: layout.ty.name().to_string(),
            block_tokens: BLOCK,
            blocks,
            bytes: layout.bytes(),
            shared: layout.pool_tokens.is_some(),
            groups,
        }
    }
}

/// Speculative decoding as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecProps {
    /// `--spec` as given: `auto`, `ngram`, `suffix`, `draft:PATH`, `self`
    /// or `off`.
    pub mode: String,
    /// Most drafted tokens verified in one pass; `None` when off.
    pub budget: Option<usize>,
    /// The bound of the cache of earlier outputs (`--spec-cache-mb`), in
    /// bytes; `None` without one.
    pub traffic_cache_bytes: Option<usize>,
}

/// `GET /props`: the server's configuration as JSON:
/// `model` (`name` clients send, `path`, `architecture`), `context_length`,
/// `max_seqs`, `kv` (`type`, `block_tokens`, `blocks`, `tokens`, `bytes`,
/// `shared`, `groups`), `speculation` (`mode`, `budget`), `threads`,
/// `tool_format`, `reasoning_format` (`think-tags`, `harmony`, or null
/// when replies are left whole), `memory_bounds` (bytes: the bound of each part that grows
/// with the traffic served, and `kv_pool`, allocated up front) and `build`
/// (`version`, `isa`). Needs the API key when
/// one is set (it names the model's path).
pub(crate) async fn props(State(state): State<Shared>) -> Json<Value> {
    let p = &state.props;
    let kv = p.kv.as_ref().map(|kv| {
        json!({
            "type": kv.ty,
            "block_tokens": kv.block_tokens,
            "blocks": kv.blocks,
            "tokens": kv.blocks * kv.block_tokens,
            "bytes": kv.bytes,
            "shared": kv.shared,
            "groups": kv.groups.iter().map(|&(window, blocks)| json!({
                "window": window,
                "blocks": blocks,
                "tokens": blocks * kv.block_tokens,
            })).collect::<Vec<_>>(),
        })
    });
    let speculation = p
        .speculation
        .as_ref()
        .map(|s| json!({"mode": s.mode, "budget": s.budget}));
    let mut bounds = serde_json::Map::new();
    for (part, bytes) in crate::memory::bounds(&state) {
        bounds.insert(part.to_string(), json!(bytes));
    }
    if let Some(kv) = &p.kv {
        bounds.insert("kv_pool".to_string(), json!(kv.bytes));
    }
    Json(json!({
        "model": {
            "name": state.model_name,
            "path": p.model_path,
            "architecture": p.architecture,
        },
        "context_length": state.engine.ctx,
        "max_seqs": p.max_seqs,
        "kv": kv,
        "speculation": speculation,
        "threads": p.threads,
        "tool_format": state.tool_format.name(),
        "reasoning_format": state.reasoning.as_ref().map(|r| r.name()),
        "memory_bounds": bounds,
        "build": {
            "version": env!("CARGO_PKG_VERSION"),
            "isa": p.isa,
        },
    }))
}
