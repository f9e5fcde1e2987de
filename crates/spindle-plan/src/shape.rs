//! The shape of a model: the hyper-parameters memory and speed depend on,
//! built from the [`HeaderShape`] that `spindle-model` builds its config
//! from too, so the plan describes the model the engine will actually run.

use std::path::Path;

use serde::{Deserialize, Serialize};
use spindle_formats::{ArchFamily, GgufFile, HeaderShape, HeaderSource, HfConfig, KV_BLOCK_TOKENS};

use crate::error::PlanError;
use crate::plan::KvType;
use crate::source::{self, WeightStats};

/// Tokens per block of the engine's KV pool.
pub const KV_BLOCK: u64 = KV_BLOCK_TOKENS as u64;

/// A model family, as far as the plan cares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma2,
    Gemma3,
    Qwen3Moe,
    Mixtral,
    Phi3,
    #[serde(rename = "gpt-oss")]
    GptOss,
    /// An architecture Spindle does not run; planned as a plain decoder.
    Other(String),
}

impl From<ArchFamily> for Family {
    fn from(f: ArchFamily) -> Family {
        match f {
            ArchFamily::Llama => Family::Llama,
            ArchFamily::Mistral => Family::Mistral,
            ArchFamily::Qwen2 => Family::Qwen2,
            ArchFamily::Qwen3 => Family::Qwen3,
            ArchFamily::Gemma2 => Family::Gemma2,
            ArchFamily::Gemma3 => Family::Gemma3,
            ArchFamily::Qwen3Moe => Family::Qwen3Moe,
            ArchFamily::Mixtral => Family::Mixtral,
            ArchFamily::Phi3 => Family::Phi3,
            ArchFamily::GptOss => Family::GptOss,
        }
    }
}

impl Family {
    /// From a GGUF `general.architecture` or a Hugging Face `model_type`.
    pub fn from_name(name: &str) -> Family {
        ArchFamily::from_name(name).map_or_else(|| Family::Other(name.to_string()), Family::from)
    }

    pub fn name(&self) -> &str {
        match self {
            Family::Other(name) => name,
            _ => self.known().map_or("", ArchFamily::name),
        }
    }

    fn known(&self) -> Option<ArchFamily> {
        Some(match self {
            Family::Llama => ArchFamily::Llama,
            Family::Mistral => ArchFamily::Mistral,
            Family::Qwen2 => ArchFamily::Qwen2,
            Family::Qwen3 => ArchFamily::Qwen3,
            Family::Gemma2 => ArchFamily::Gemma2,
            Family::Gemma3 => ArchFamily::Gemma3,
            Family::Qwen3Moe => ArchFamily::Qwen3Moe,
            Family::Mixtral => ArchFamily::Mixtral,
            Family::Phi3 => ArchFamily::Phi3,
            Family::GptOss => ArchFamily::GptOss,
            Family::Other(_) => return None,
        })
    }
}

/// Everything the plan needs to know about a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelShape {
    /// File or directory name, or `general.name`.
    pub name: String,
    pub family: Family,
    pub n_layers: u64,
    pub n_embd: u64,
    pub n_heads: u64,
    pub n_kv_heads: u64,
    pub head_dim: u64,
    pub n_ff: u64,
    pub vocab_size: u64,
    pub context_length: u64,
    /// Window of the sliding layers, when any layer slides.
    pub sliding_window: Option<u64>,
    /// Per layer: whether it attends over the window only.
    pub layer_sliding: Vec<bool>,
    /// Whether the output head is the token embedding.
    pub tied_embeddings: bool,
    /// The experts of each layer, for a mixture-of-experts model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts: Option<Experts>,
    pub weights: WeightStats,
}

/// A layer's mixture of experts as the plan counts it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Experts {
    pub n_experts: u64,
    /// Experts a token is routed to.
    pub n_used: u64,
    /// Hidden width of one expert.
    pub n_ff: u64,
}

impl Experts {
    /// Expected distinct experts a layer reads for `rows` rows routed
    /// independently and uniformly: `E x (1 - (1 - k/E)^rows)`.
    pub fn expected_distinct(&self, rows: u64) -> f64 {
        let e = self.n_experts.max(1) as f64;
        let p = (self.n_used as f64 / e).min(1.0);
        let rows = rows.min(i32::MAX as u64) as i32;
        e * (1.0 - (1.0 - p).powi(rows))
    }
}

impl ModelShape {
    /// A `.gguf` file (header-only copies work) or a Hugging Face directory
    /// (`config.json` and safetensors files, of which only headers are read).
    /// A path to a `.safetensors` file plans its directory.
    pub fn from_path(path: &Path) -> Result<ModelShape, PlanError> {
        // A symlink loop is named as one; other failures read as before.
        let meta = spindle_formats::file_kind::metadata(path).map_err(|e| match e {
            spindle_formats::FormatError::Io { source, .. } => PlanError::io(path, source),
            e => e.into(),
        })?;
        let is_st_file = path.extension().is_some_and(|e| e == "safetensors");
        if meta.is_dir() || is_st_file {
            let dir = if meta.is_dir() {
                path
            } else {
                path.parent().unwrap_or(Path::new("."))
            };
            return ModelShape::from_hf_dir(dir);
        }
        let gguf = GgufFile::open_header_only(path)?;
        ModelShape::from_gguf(&gguf, &file_name(path))
    }

    /// A Hugging Face directory: `config.json` plus safetensors headers.
    pub fn from_hf_dir(dir: &Path) -> Result<ModelShape, PlanError> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(PlanError::MissingConfig {
                dir: dir.to_path_buf(),
            });
        }
        let config = HfConfig::load(&config_path)?;
        let files = source::safetensors_files(dir)?;
        let weights = source::safetensors_weights(&files)?;
        let vocab_hint = source::safetensors_vocab(&files);
        let mut shape = ModelShape::from_hf_config_with(&config, &file_name(dir), vocab_hint)?;
        // The files decide whether there is a separate head.
        if weights.embedding_bytes > 0 {
            shape.tied_embeddings = !weights.has_output_head();
        }
        shape.weights = weights;
        Ok(shape)
    }

    /// The shape in a `config.json` alone, without weights.
    pub fn from_hf_config(config: &HfConfig, name: &str) -> Result<ModelShape, PlanError> {
        ModelShape::from_hf_config_with(config, name, None)
    }

    fn from_hf_config_with(
        config: &HfConfig,
        name: &str,
        vocab_hint: Option<u64>,
    ) -> Result<ModelShape, PlanError> {
        let header = HeaderShape::from_hf(config)?;
        ModelShape::from_header(header, name.to_string(), vocab_hint, WeightStats::empty())
    }

    /// From a GGUF header (`{arch}.*` keys as llama.cpp writes them).
    pub fn from_gguf(gguf: &GgufFile, file_name: &str) -> Result<ModelShape, PlanError> {
        let header = HeaderShape::from_gguf(gguf)?;
        let name = gguf
            .get_str("general.name")
            .map_or_else(|| file_name.to_string(), str::to_string);
        ModelShape::from_header(header, name, None, source::gguf_weights(gguf))
    }

    /// The plan's view of a header: an unknown family is planned as a plain
    /// decoder; a vocabulary the header leaves out comes from `vocab_hint`
    /// (the weights' embedding rows).
    fn from_header(
        h: HeaderShape,
        name: String,
        vocab_hint: Option<u64>,
        weights: WeightStats,
    ) -> Result<ModelShape, PlanError> {
        let vocab_size = h
            .vocab_size
            .map(|v| v as u64)
            .or(vocab_hint)
            .ok_or_else(|| PlanError::Config {
                what: "the vocabulary size".into(),
                source_name: h.source.to_string(),
                reason: match h.source {
                    HeaderSource::Gguf => {
                        "the file has no token_embd.weight tensor, tokenizer.ggml.tokens or \
                         vocab_size key: it is incomplete"
                    }
                    HeaderSource::HfConfig => {
                        "key 'vocab_size' is missing or not a non-negative integer and the \
                         weights have no token embedding; the config is incomplete"
                    }
                }
                .into(),
            })?;
        Ok(ModelShape {
            name,
            family: Family::from_name(&h.arch.name),
            n_layers: h.n_layers as u64,
            n_embd: h.n_embd as u64,
            n_heads: h.n_heads as u64,
            n_kv_heads: h.n_kv_heads as u64,
            head_dim: h.head_dim as u64,
            n_ff: h.n_ff as u64,
            vocab_size,
            context_length: h.context_length as u64,
            sliding_window: h.sliding_window.map(|w| w as u64),
            layer_sliding: h.layer_sliding,
            tied_embeddings: h.tied_embeddings.unwrap_or(false),
            experts: h.experts.map(|x| Experts {
                n_experts: x.n_experts as u64,
                n_used: x.n_used as u64,
                n_ff: x.n_ff as u64,
            }),
            weights,
        })
    }

    /// Weight bytes one decode step with `rows` rows streams: every
    /// matrix but the experts once, and of the experts the share a pass
    /// of `rows` rows is expected to touch (all of them for a dense model).
    pub fn decode_read_bytes(&self, rows: u64) -> u64 {
        let all = self.weights.decode_read_bytes();
        match self.experts {
            Some(x) if self.weights.expert_bytes > 0 => {
                let share = x.expected_distinct(rows.max(1)) / x.n_experts.max(1) as f64;
                let experts = self.weights.expert_bytes;
                all - experts + (experts as f64 * share).round() as u64
            }
            _ => all,
        }
    }

    /// Multiply-accumulates of the decoder layers' matrices per token: all
    /// of a dense model's, the shared ones and `n_used` experts' of a
    /// mixture.
    pub fn active_matmul_params(&self) -> u64 {
        let w = &self.weights;
        match self.experts {
            Some(x) if w.expert_matmul_params > 0 => {
                let share = x.n_used as f64 / x.n_experts.max(1) as f64;
                w.layer_matmul_params + (w.expert_matmul_params as f64 * share).round() as u64
            }
            _ => w.layer_matmul_params + w.expert_matmul_params,
        }
    }

    /// Width of all query heads.
    pub fn q_dim(&self) -> u64 {
        self.n_heads * self.head_dim
    }

    /// Width of the keys (and of the values) of one token in one layer.
    pub fn kv_dim(&self) -> u64 {
        self.n_kv_heads * self.head_dim
    }

    /// Number of sliding-window layers.
    pub fn sliding_layers(&self) -> u64 {
        self.layer_sliding.iter().filter(|&&s| s).count() as u64
    }

    /// Number of layers attending over the whole context.
    pub fn global_layers(&self) -> u64 {
        self.n_layers - self.sliding_layers()
    }

    /// Positions of KV layer `l` attends over per sequence at context `ctx`.
    pub fn layer_kv_tokens(&self, l: usize, ctx: u64) -> u64 {
        match (self.layer_sliding.get(l), self.sliding_window) {
            (Some(true), Some(w)) => ctx.min(w),
            _ => ctx,
        }
    }

    /// Most KV tokens any layer keeps per sequence at context `ctx` (the
    /// span the engine widens for attention).
    pub fn max_visible_tokens(&self, ctx: u64) -> u64 {
        (0..self.n_layers as usize)
            .map(|l| self.layer_kv_tokens(l, ctx))
            .max()
            .unwrap_or(0)
    }

    /// Whether this is an encoder (BERT): `spindle embed` runs it a pass of
    /// whole texts at a time; it keeps no KV cache and does not decode.
    pub fn is_encoder(&self) -> bool {
        matches!(&self.family, Family::Other(name) if name == "bert")
    }

    /// KV bytes of one token in one layer: K and V rows; none for an
    /// encoder, which keeps no KV cache (every KV figure follows from this).
    pub fn kv_layer_row_bytes(&self, kv: KvType) -> u64 {
        if self.is_encoder() {
            return 0;
        }
        2u64.saturating_mul(kv.row_bytes(self.kv_dim()))
    }

    /// KV bytes of one token, all layers as full attention:
    /// 2 (K and V) x layers x KV heads x head size x bytes per element.
    pub fn kv_bytes_per_token(&self, kv: KvType) -> u64 {
        self.n_layers.saturating_mul(self.kv_layer_row_bytes(kv))
    }

    /// Token slots layer `l` takes per sequence in the engine's block pool
    /// at context `ctx`: whole blocks of [`KV_BLOCK`] tokens; for a sliding
    /// layer, the blocks its window spans wherever it starts, with the
    /// block being written.
    pub fn layer_pool_tokens(&self, l: usize, ctx: u64) -> u64 {
        let all = ctx.div_ceil(KV_BLOCK).max(1);
        let blocks = match (self.layer_sliding.get(l), self.sliding_window) {
            (Some(true), Some(w)) => all.min(w.div_ceil(KV_BLOCK) + 1),
            _ => all,
        };
        blocks.saturating_mul(KV_BLOCK)
    }

    /// KV bytes one sequence holds at context `ctx` in the block pool,
    /// sliding layers keeping only their window.
    pub fn kv_bytes_per_seq(&self, ctx: u64, kv: KvType) -> u64 {
        let row = self.kv_layer_row_bytes(kv);
        let tokens: u64 = (0..self.n_layers as usize)
            .map(|l| self.layer_pool_tokens(l, ctx))
            .fold(0u64, u64::saturating_add);
        row.saturating_mul(tokens)
    }

    /// KV bytes decoding one token at context `ctx` reads: every layer's
    /// visible positions.
    pub fn kv_read_bytes_per_seq(&self, ctx: u64, kv: KvType) -> u64 {
        let row = self.kv_layer_row_bytes(kv);
        let tokens: u64 = (0..self.n_layers as usize)
            .map(|l| self.layer_kv_tokens(l, ctx))
            .fold(0u64, u64::saturating_add);
        row.saturating_mul(tokens)
    }

    /// KV bytes of `batch` sequences at context `ctx`, windows honoured.
    pub fn kv_bytes(&self, ctx: u64, batch: u64, kv: KvType) -> u64 {
        self.kv_bytes_per_seq(ctx, kv).saturating_mul(batch)
    }

    /// Tokens of full-attention KV a block pool of `budget` bytes holds for
    /// `max_seqs` sequences of up to `ctx` tokens, after the sliding layers'
    /// windows (which every sequence holds at once) are set aside; whole
    /// blocks, at most what every sequence at `ctx` needs. A model without
    /// full-attention layers needs none: `ctx`. `None` when the windows
    /// alone do not fit.
    pub fn kv_pool_tokens(&self, budget: u64, max_seqs: u64, ctx: u64, kv: KvType) -> Option<u64> {
        let row = 2u64.saturating_mul(kv.row_bytes(self.kv_dim()));
        let slides = |l: usize| self.layer_sliding[l] && self.sliding_window.is_some();
        let (sliding, global): (Vec<usize>, Vec<usize>) =
            (0..self.n_layers as usize).partition(|&l| slides(l));
        let windows: u64 = sliding
            .iter()
            .map(|&l| self.layer_pool_tokens(l, ctx))
            .fold(0u64, u64::saturating_add);
        let left = budget.checked_sub(windows.saturating_mul(row).saturating_mul(max_seqs))?;
        if global.is_empty() {
            return Some(ctx);
        }
        let tokens = left / row.saturating_mul(global.len() as u64) / KV_BLOCK * KV_BLOCK;
        let most = ctx.div_ceil(KV_BLOCK) * KV_BLOCK * max_seqs;
        Some(tokens.min(most))
    }

    /// The longest context (up to the model's) whose KV cache for `batch`
    /// sequences fits in `budget` bytes; 0 when not even one token does.
    pub fn max_ctx_for_kv(&self, budget: u64, batch: u64, kv: KvType) -> u64 {
        crate::memory::largest(self.context_length, |ctx| {
            self.kv_bytes(ctx, batch, kv) <= budget
        })
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}
