//! The shape of a model: the hyper-parameters memory and speed depend on,
//! read from GGUF metadata or `config.json` the way `spindle-model` reads
//! them (`config.rs`, `arch.rs`), so the plan describes the model the engine
//! will actually run.

use std::path::Path;

use serde::{Deserialize, Serialize};
use spindle_formats::{GgufFile, HfConfig, MetaValue};

use crate::error::PlanError;
use crate::plan::KvType;
use crate::source::{self, WeightStats};

/// Tokens per block of the engine's KV pool (spindle-model's `BLOCK`).
pub const KV_BLOCK: u64 = 16;

/// A model family, as far as the plan cares (which layers slide, whether
/// the head is tied by default).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma2,
    Gemma3,
    /// An architecture Spindle does not run; planned as a plain decoder.
    Other(String),
}

impl Family {
    /// From a GGUF `general.architecture` or a Hugging Face `model_type`.
    pub fn from_name(name: &str) -> Family {
        match name {
            "llama" => Family::Llama,
            "mistral" => Family::Mistral,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "gemma2" => Family::Gemma2,
            "gemma3" | "gemma3_text" => Family::Gemma3,
            other => Family::Other(other.to_string()),
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Gemma2 => "gemma2",
            Family::Gemma3 => "gemma3",
            Family::Other(name) => name,
        }
    }

    /// Whether layer `l` slides when the model has a window and no explicit
    /// per-layer list. `global_every` is Gemma 3's period (6 unless the
    /// config says otherwise).
    fn is_sliding(&self, l: usize, global_every: usize) -> bool {
        match self {
            Family::Gemma2 => l.is_multiple_of(2),
            Family::Gemma3 => !(l + 1).is_multiple_of(global_every.max(1)),
            // Mistral v0.1 (and unknown families that set a window): all layers.
            Family::Mistral | Family::Other(_) => true,
            Family::Llama | Family::Qwen2 | Family::Qwen3 => false,
        }
    }

    fn tied_by_default(&self) -> bool {
        matches!(self, Family::Gemma2 | Family::Gemma3)
    }

    /// Values transformers fills in when a config leaves them out (the
    /// published Gemma 3 multimodal configs do): vocabulary and context.
    fn config_defaults(&self) -> (Option<u64>, u64) {
        match self {
            Family::Gemma3 => (Some(262_208), 131_072),
            // The engine's default context when a config has none.
            _ => (None, 4096),
        }
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
    pub weights: WeightStats,
}

impl ModelShape {
    /// A `.gguf` file (header-only copies work) or a Hugging Face directory
    /// (`config.json` and safetensors files, of which only headers are read).
    /// A path to a `.safetensors` file plans its directory.
    pub fn from_path(path: &Path) -> Result<ModelShape, PlanError> {
        let meta = std::fs::metadata(path).map_err(|e| PlanError::io(path, e))?;
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
        // Multimodal configs keep the language model under `text_config`.
        let cfg = config.text_config();
        let missing = |key: &str| PlanError::Config {
            what: format!("key '{key}'"),
            source_name: "config.json".into(),
            reason: "it is missing or not a non-negative integer; the config is incomplete or \
                     for a model that is not a decoder-only language model"
                .into(),
        };
        let get = |key: &str| cfg.get_usize(key).map(|v| v as u64);
        let req = |key: &str| get(key).ok_or_else(|| missing(key));
        let model_type = cfg.model_type().ok_or_else(|| PlanError::Config {
            what: "key 'model_type'".into(),
            source_name: "config.json".into(),
            reason: "it is missing; the config is incomplete".into(),
        })?;
        let family = Family::from_name(model_type);
        let n_layers = req("num_hidden_layers")?;
        let n_embd = req("hidden_size")?;
        let n_heads = nonzero(
            req("num_attention_heads")?,
            "num_attention_heads",
            "config.json",
        )?;
        // `head_dim` may be null (Mistral), meaning hidden / heads.
        let head_dim = get("head_dim").unwrap_or(n_embd / n_heads);
        let (default_vocab, default_context) = family.config_defaults();
        let vocab_size = get("vocab_size")
            .or(vocab_hint)
            .or(default_vocab)
            .ok_or_else(|| missing("vocab_size"))?;

        // Qwen configs carry a window they do not use unless asked.
        let qwen = matches!(family, Family::Qwen2 | Family::Qwen3);
        let use_sliding = cfg.get_bool("use_sliding_window").unwrap_or(!qwen);
        let sliding_window = get("sliding_window").filter(|_| use_sliding);
        let global_every = get("sliding_window_pattern").unwrap_or(6) as usize;
        let layer_types = cfg
            .get("layer_types")
            .and_then(|v| v.as_array())
            .filter(|t| t.len() as u64 == n_layers);
        let layer_sliding = (0..n_layers as usize)
            .map(|l| {
                sliding_window.is_some()
                    && match layer_types {
                        Some(types) => types[l].as_str() == Some("sliding_attention"),
                        None => family.is_sliding(l, global_every),
                    }
            })
            .collect();

        let tied_embeddings = cfg
            .get_bool("tie_word_embeddings")
            .or_else(|| config.get_bool("tie_word_embeddings"))
            .unwrap_or(family.tied_by_default());
        let shape = ModelShape {
            name: name.to_string(),
            n_layers,
            n_embd,
            n_heads,
            n_kv_heads: get("num_key_value_heads").unwrap_or(n_heads),
            head_dim,
            n_ff: req("intermediate_size")?,
            vocab_size,
            context_length: get("max_position_embeddings").unwrap_or(default_context),
            sliding_window,
            layer_sliding,
            tied_embeddings,
            family,
            weights: WeightStats::empty(),
        };
        Ok(shape.without_unused_window())
    }

    /// From a GGUF header (`{arch}.*` keys as llama.cpp writes them).
    pub fn from_gguf(gguf: &GgufFile, file_name: &str) -> Result<ModelShape, PlanError> {
        let src = "the GGUF metadata";
        let arch = gguf
            .architecture()
            .ok_or_else(|| PlanError::Config {
                what: "key 'general.architecture'".into(),
                source_name: src.into(),
                reason: "it is missing: re-convert the model with a current llama.cpp".into(),
            })?
            .to_string();
        let family = Family::from_name(&arch);
        let key = |k: &str| format!("{arch}.{k}");
        // Some converters write per-layer arrays; the models Spindle runs
        // have one value throughout, so the first is taken.
        let get = |k: &str| gguf.get(&key(k)).and_then(scalar_or_first);
        let req = |k: &str| {
            get(k).ok_or_else(|| PlanError::Config {
                what: format!("key '{}'", key(k)),
                source_name: src.into(),
                reason: "it is missing or not a non-negative integer: re-convert the model with \
                         a current llama.cpp"
                    .into(),
            })
        };
        let n_layers = req("block_count")?;
        let n_embd = req("embedding_length")?;
        let n_heads = nonzero(
            req("attention.head_count")?,
            &key("attention.head_count"),
            src,
        )?;
        let embd = gguf.tensor("token_embd.weight");
        let vocab_size = embd
            .and_then(|t| t.dims.get(1).copied())
            .or_else(|| {
                gguf.get_array("tokenizer.ggml.tokens")
                    .map(|a| a.len() as u64)
            })
            .or_else(|| get("vocab_size"))
            .ok_or_else(|| PlanError::Config {
                what: "the vocabulary size".into(),
                source_name: src.into(),
                reason: "the file has no token_embd.weight tensor, tokenizer.ggml.tokens or \
                         vocab_size key: it is incomplete"
                    .into(),
            })?;
        let sliding_window = get("attention.sliding_window");
        // The engine runs Llama and Mistral GGUFs with full attention, as
        // llama.cpp does; only the Gemmas slide.
        let slides = matches!(family, Family::Gemma2 | Family::Gemma3);
        let layer_sliding = (0..n_layers as usize)
            .map(|l| slides && sliding_window.is_some() && family.is_sliding(l, 6))
            .collect();
        let name = gguf
            .get_str("general.name")
            .map_or_else(|| file_name.to_string(), str::to_string);
        let shape = ModelShape {
            name,
            n_layers,
            n_embd,
            n_heads,
            n_kv_heads: get("attention.head_count_kv").unwrap_or(n_heads),
            head_dim: get("attention.key_length").unwrap_or(n_embd / n_heads),
            n_ff: req("feed_forward_length")?,
            vocab_size,
            context_length: get("context_length").unwrap_or(4096),
            sliding_window,
            layer_sliding,
            tied_embeddings: gguf.tensor("output.weight").is_none(),
            family,
            weights: source::gguf_weights(gguf),
        };
        Ok(shape.without_unused_window())
    }

    /// Drops a window no layer uses, so reports do not show one.
    fn without_unused_window(mut self) -> ModelShape {
        if !self.layer_sliding.iter().any(|&s| s) {
            self.sliding_window = None;
        }
        self
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

    /// KV bytes of one token, all layers as full attention:
    /// 2 (K and V) x layers x KV heads x head size x bytes per element.
    pub fn kv_bytes_per_token(&self, kv: KvType) -> u64 {
        2u64.saturating_mul(self.n_layers)
            .saturating_mul(kv.row_bytes(self.kv_dim()))
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
        let row = 2u64.saturating_mul(kv.row_bytes(self.kv_dim()));
        let tokens: u64 = (0..self.n_layers as usize)
            .map(|l| self.layer_pool_tokens(l, ctx))
            .fold(0u64, u64::saturating_add);
        row.saturating_mul(tokens)
    }

    /// KV bytes decoding one token at context `ctx` reads: every layer's
    /// visible positions.
    pub fn kv_read_bytes_per_seq(&self, ctx: u64, kv: KvType) -> u64 {
        let row = 2u64.saturating_mul(kv.row_bytes(self.kv_dim()));
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

fn scalar_or_first(v: &MetaValue) -> Option<u64> {
    v.as_u64().or_else(|| v.as_array()?.first()?.as_u64())
}

fn nonzero(v: u64, key: &str, source_name: &str) -> Result<u64, PlanError> {
    if v == 0 {
        return Err(PlanError::Config {
            what: format!("key '{key}'"),
            source_name: source_name.into(),
            reason: "it is 0: the file is corrupt".into(),
        });
    }
    Ok(v)
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}
