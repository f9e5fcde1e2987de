//! A plan: what a model needs at a context and batch, whether it fits a
//! device, and how fast it can go there.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::device::Device;
use crate::error::PlanError;
use crate::memory::{self, Term};
use crate::profile::EngineProfile;
use crate::roofline;
use crate::shape::{Family, ModelShape};

/// Prompt tokens per prefill pass, as the engine chunks prompts
/// (spindle-engine `PREFILL_CHUNK`).
pub const DEFAULT_PREFILL_CHUNK: u64 = 2048;

/// Batches the crossover context is reported for.
const CROSSOVER_BATCHES: [u64; 3] = [1, 8, 32];

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvType {
    F16,
    /// Blocks of 32 int8 values with an f16 scale: 34 bytes per 32 values.
    Q8_0,
    /// The engine's choice for float32 reference models.
    F32,
}

impl KvType {
    /// Bytes of a row of `n` values (one token's keys, or values, in one
    /// layer); q8_0 rows are whole blocks.
    pub fn row_bytes(self, n: u64) -> u64 {
        match self {
            KvType::F16 => n.saturating_mul(2),
            KvType::Q8_0 => n.div_ceil(32).saturating_mul(34),
            KvType::F32 => n.saturating_mul(4),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::F32 => "f32",
        }
    }

    /// `f16`, `q8_0` or `f32`.
    pub fn parse(s: &str) -> Result<KvType, PlanError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "q8_0" | "q8" => Ok(KvType::Q8_0),
            "f32" => Ok(KvType::F32),
            _ => Err(PlanError::Config {
                what: format!("KV type '{s}'"),
                source_name: "the request".into(),
                reason: "use f16 or q8_0 (or f32)".into(),
            }),
        }
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What to plan for.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanRequest {
    /// Tokens per sequence.
    pub ctx: u64,
    /// Sequences decoded together.
    pub batch: u64,
    pub kv_type: KvType,
    pub device: Device,
    /// Prompt tokens per prefill pass.
    pub prefill_chunk: u64,
    /// The bound of the server's cache of earlier outputs for speculative
    /// drafts (`--spec-cache-mb`), 0 without one.
    pub spec_cache_bytes: u64,
    /// The bound of the server's cache of decisions' content-free answers
    /// (`--decide-cache-mb`), 0 when not counted.
    pub decide_cache_bytes: u64,
}

impl PlanRequest {
    /// A request with the engine's prefill chunk.
    pub fn new(ctx: u64, batch: u64, kv_type: KvType, device: Device) -> PlanRequest {
        PlanRequest {
            ctx,
            batch,
            kv_type,
            device,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            spec_cache_bytes: 0,
            decide_cache_bytes: 0,
        }
    }

    /// Rejects zero sizes ([`plan`] itself plans them as 1).
    pub fn validate(&self) -> Result<(), PlanError> {
        for (what, v) in [
            ("ctx", self.ctx),
            ("batch", self.batch),
            ("prefill chunk", self.prefill_chunk),
        ] {
            if v == 0 {
                return Err(PlanError::Config {
                    what: what.into(),
                    source_name: "the request".into(),
                    reason: "it must be at least 1".into(),
                });
            }
        }
        Ok(())
    }
}

/// A figure at batch 1 and at the requested batch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PerBatch {
    pub batch_1: f64,
    pub batch_b: f64,
}

/// Context at which KV reads overtake weight reads, per batch; `None`
/// (JSON null) when they never do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Crossover {
    #[serde(rename = "1")]
    pub batch_1: Option<u64>,
    #[serde(rename = "8")]
    pub batch_8: Option<u64>,
    #[serde(rename = "32")]
    pub batch_32: Option<u64>,
}

/// The plan. Field names are a stable JSON interface: add, never rename.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub model: String,
    /// An encoder (BERT): no KV cache, no decoding, memory flat in ctx and
    /// batch (its passes are at most `memory::ENCODER_PASS_TOKENS` tokens).
    #[serde(default)]
    pub encoder: bool,
    pub architecture: String,
    pub device: Device,
    /// The engine profile activations and overhead were computed with.
    pub engine_profile: EngineProfile,
    pub ctx: u64,
    pub batch: u64,
    pub kv_type: KvType,
    pub prefill_chunk: u64,
    pub n_layers: u64,
    pub sliding_layers: u64,
    pub sliding_window: Option<u64>,
    pub context_length: u64,

    /// Sum of every tensor's bytes, from the headers.
    pub weights_bytes: u64,
    pub weights_by_type: BTreeMap<String, u64>,
    /// KV bytes of one token, all layers as full attention.
    pub kv_bytes_per_token: u64,
    /// KV bytes of ctx x batch, sliding windows honoured.
    pub kv_bytes: u64,
    pub activation_bytes: u64,
    pub overhead_bytes: u64,
    /// The cache of earlier outputs speculative drafts come from, at its
    /// bound (`serve --spec-cache-mb`; 0 when not asked for).
    pub spec_cache_bytes: u64,
    /// The server's cache of decisions' content-free answers, at its bound
    /// (`serve --decide-cache-mb`; 0 when not asked for).
    pub decide_cache_bytes: u64,
    /// Peak while loading (weights read while the tokenizer is built); the
    /// total is the larger of this and the running peak.
    pub load_peak_bytes: u64,
    pub total_bytes: u64,
    pub fits: bool,
    pub max_ctx: u64,
    pub max_batch: u64,
    pub decode_tokens_per_s: PerBatch,
    pub prefill_tokens_per_s: f64,
    pub kv_crossover_ctx: Crossover,

    /// Decode tokens/s with a q8_0 KV cache over those with f16.
    pub q8_kv_gain: PerBatch,
    /// Weight bytes one decode step streams.
    pub weights_read_per_step_bytes: u64,
    /// KV bytes one sequence's decode step streams at ctx.
    pub kv_read_per_seq_bytes: u64,
    pub activation_terms: Vec<Term>,
    pub overhead_terms: Vec<Term>,
    /// Assumptions and caveats worth reading.
    pub notes: Vec<String>,
}

impl Plan {
    /// The plan as pretty JSON.
    pub fn to_json(&self) -> String {
        // Serialising plain data with string keys cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// Plans `shape` for `request` on the engine described by `profile`. Zero
/// sizes in the request are planned as 1 (see [`PlanRequest::validate`]).
pub fn plan(shape: &ModelShape, request: &PlanRequest, profile: &EngineProfile) -> Plan {
    let ctx = request.ctx.max(1);
    let batch = request.batch.max(1);
    let chunk = request.prefill_chunk.max(1);
    let kv = request.kv_type;
    let device = &request.device;

    let activation_terms = memory::activation_terms(shape, ctx, batch, kv, chunk, profile);
    let overhead_terms = memory::overhead_terms(shape, profile);
    let activation_bytes = memory::activation_peak(&activation_terms);
    let overhead_bytes = memory::sum(&overhead_terms);
    let kv_bytes = shape.kv_bytes(ctx, batch, kv);
    let load_peak_bytes = memory::load_peak_bytes(shape, profile);
    let spec_cache_bytes = request.spec_cache_bytes;
    let decide_cache_bytes = request.decide_cache_bytes;
    let total_bytes = memory::total_bytes(shape, ctx, batch, kv, chunk, profile)
        .saturating_add(spec_cache_bytes)
        .saturating_add(decide_cache_bytes);
    let memory = device.memory_bytes;

    let decode = |kv: KvType| PerBatch {
        batch_1: roofline::decode_tokens_per_s(shape, ctx, 1, kv, device),
        batch_b: roofline::decode_tokens_per_s(shape, ctx, batch, kv, device),
    };
    let decode_tokens_per_s = decode(kv);
    let (f16, q8) = (decode(KvType::F16), decode(KvType::Q8_0));
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let q8_kv_gain = PerBatch {
        batch_1: ratio(q8.batch_1, f16.batch_1),
        batch_b: ratio(q8.batch_b, f16.batch_b),
    };
    let [c1, c8, c32] = CROSSOVER_BATCHES.map(|b| roofline::kv_crossover_ctx(shape, b, kv));

    Plan {
        model: shape.name.clone(),
        encoder: shape.is_encoder(),
        architecture: shape.family.name().to_string(),
        device: device.clone(),
        engine_profile: profile.clone(),
        ctx,
        batch,
        kv_type: kv,
        prefill_chunk: chunk,
        n_layers: shape.n_layers,
        sliding_layers: shape.sliding_layers(),
        sliding_window: shape.sliding_window,
        context_length: shape.context_length,
        weights_bytes: shape.weights.bytes,
        weights_by_type: shape.weights.by_type.clone(),
        kv_bytes_per_token: shape.kv_bytes_per_token(kv),
        kv_bytes,
        activation_bytes,
        overhead_bytes,
        spec_cache_bytes,
        decide_cache_bytes,
        load_peak_bytes,
        total_bytes,
        fits: total_bytes <= memory,
        max_ctx: memory::max_ctx(shape, batch, kv, chunk, profile, memory),
        max_batch: memory::max_batch(shape, ctx, kv, chunk, profile, memory),
        decode_tokens_per_s,
        prefill_tokens_per_s: roofline::prefill_tokens_per_s(shape, chunk.min(ctx), device),
        kv_crossover_ctx: Crossover {
            batch_1: c1,
            batch_8: c8,
            batch_32: c32,
        },
        q8_kv_gain,
        weights_read_per_step_bytes: shape.decode_read_bytes(batch),
        kv_read_per_seq_bytes: shape.kv_bytes_per_seq(ctx, kv),
        activation_terms,
        overhead_terms,
        notes: notes(shape, request, profile),
    }
}

fn notes(shape: &ModelShape, request: &PlanRequest, profile: &EngineProfile) -> Vec<String> {
    let mut notes = Vec::new();
    if request.ctx > shape.context_length {
        notes.push(format!(
            "ctx {} is past the model's context length {}: quality beyond it is not promised",
            request.ctx, shape.context_length
        ));
    }
    if request.ctx == 0 || request.batch == 0 || request.prefill_chunk == 0 {
        notes.push("a zero ctx, batch or prefill chunk was planned as 1".into());
    }
    if shape.is_encoder() {
        notes.push(format!(
            "an encoder (BERT): `spindle embed` and `serve --embedding-model` run it in passes of \
             up to {} tokens, so its memory does not grow with ctx or batch; it keeps no KV \
             cache and does not decode (the decode and KV figures do not apply); float matrices \
             are packed as f32 beside the file's copy; every page of the file counted resident \
             (the token embedding's rows are read only for the tokens used)",
            memory::ENCODER_PASS_TOKENS
        ));
    } else if let Family::Other(name) = &shape.family {
        notes.push(format!(
            "architecture '{name}' is not one Spindle runs; planned as a plain decoder"
        ));
    }
    if let Some(x) = shape.experts {
        let b = request.batch.max(1);
        notes.push(format!(
            "mixture of experts: {} experts a layer, {} per token; a decode step of {b} row{} \
             reads {:.1} of them on average (E x (1 - (1 - k/E)^B)), so {} of the weights",
            x.n_experts,
            x.n_used,
            if b == 1 { "" } else { "s" },
            x.expected_distinct(b),
            crate::report::human_bytes(shape.decode_read_bytes(b)),
        ));
    }
    if shape.weights.tensors == 0 {
        notes.push("no weight files were read: weights count as 0 bytes".into());
    }
    if request.device.name != profile.name {
        notes.push(format!(
            "activations and overhead use the {} engine profile; on {} they are an estimate",
            profile.name, request.device.name
        ));
    }
    notes.push(
        "speeds are ceilings: decode = bandwidth / bytes read per step, prefill = the slower of \
         peak arithmetic and one weight read per chunk"
            .into(),
    );
    notes
}
