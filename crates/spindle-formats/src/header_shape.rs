//! The shape of a model as its header states it: architecture, dimensions,
//! context, and which layers attend over a sliding window, read from GGUF
//! metadata or a Hugging Face `config.json`.
//!
//! The planner and the model both build on [`HeaderShape`], so they cannot
//! disagree on a fact of the header. Parsing only: nothing here knows how
//! the layers are computed.

use std::fmt;

use crate::error::FormatError;
use crate::gguf::GgufFile;
use crate::safetensors_dir::HfConfig;

/// Tokens per block of the engine's KV pool. The model allocates its cache
/// in blocks of this size and the planner sizes that cache with it.
pub const KV_BLOCK_TOKENS: usize = 16;

/// Context length taken when a header states none (the engine's default).
pub const DEFAULT_CONTEXT_LENGTH: usize = 4096;

/// Gemma 3's global-layer period when a config does not set
/// `sliding_window_pattern` (transformers' default; llama.cpp's fixed value).
pub const GEMMA3_GLOBAL_EVERY: usize = 6;

/// A model family Spindle knows by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArchFamily {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma2,
    Gemma3,
    /// Qwen 3 with a mixture of experts in every layer.
    Qwen3Moe,
    /// Mistral's mixture of experts: GGUF writes it as `llama` with expert
    /// tensors, config.json as `mixtral`.
    Mixtral,
    /// Phi-3: fused q/k/v and gate/up projections.
    Phi3,
    /// OpenAI's gpt-oss: experts, attention sinks, alternating sliding
    /// and full layers.
    GptOss,
}

impl ArchFamily {
    /// The family of a GGUF `general.architecture` or a Hugging Face
    /// `model_type`; `None` for names Spindle does not know.
    pub fn from_name(name: &str) -> Option<ArchFamily> {
        Some(match name {
            "llama" => ArchFamily::Llama,
            "mistral" => ArchFamily::Mistral,
            "qwen2" => ArchFamily::Qwen2,
            "qwen3" => ArchFamily::Qwen3,
            "gemma2" => ArchFamily::Gemma2,
            "gemma3" | "gemma3_text" => ArchFamily::Gemma3,
            "qwen3moe" | "qwen3_moe" => ArchFamily::Qwen3Moe,
            "mixtral" => ArchFamily::Mixtral,
            "phi3" => ArchFamily::Phi3,
            "gpt-oss" | "gpt_oss" => ArchFamily::GptOss,
            _ => return None,
        })
    }

    /// The GGUF architecture name.
    pub fn name(self) -> &'static str {
        match self {
            ArchFamily::Llama => "llama",
            ArchFamily::Mistral => "mistral",
            ArchFamily::Qwen2 => "qwen2",
            ArchFamily::Qwen3 => "qwen3",
            ArchFamily::Gemma2 => "gemma2",
            ArchFamily::Gemma3 => "gemma3",
            ArchFamily::Qwen3Moe => "qwen3moe",
            // GGUF has no name of its own for it: `llama` with expert tensors.
            ArchFamily::Mixtral => "mixtral",
            ArchFamily::Phi3 => "phi3",
            ArchFamily::GptOss => "gpt-oss",
        }
    }
}

/// Which kind of header a fact was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderSource {
    /// GGUF metadata (`{arch}.*` keys as llama.cpp writes them).
    Gguf,
    /// A Hugging Face `config.json`.
    HfConfig,
}

impl fmt::Display for HeaderSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HeaderSource::Gguf => "the GGUF metadata",
            HeaderSource::HfConfig => "config.json",
        })
    }
}

/// The architecture a header names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderArch {
    /// As written: `general.architecture` or `model_type`.
    pub name: String,
    /// The family, when Spindle knows the name.
    pub family: Option<ArchFamily>,
}

impl HeaderArch {
    /// From `general.architecture`.
    pub fn from_gguf(gguf: &GgufFile) -> Result<HeaderArch, FormatError> {
        let name = gguf
            .architecture()
            .ok_or_else(|| missing("general.architecture", HeaderSource::Gguf, "a string"))?;
        Ok(HeaderArch::named(name))
    }

    /// From `model_type`, under `text_config` for multimodal configs.
    pub fn from_hf(config: &HfConfig) -> Result<HeaderArch, FormatError> {
        HeaderArch::from_text_config(&config.text_config())
    }

    fn from_text_config(cfg: &HfConfig) -> Result<HeaderArch, FormatError> {
        let name = cfg
            .model_type()
            .ok_or_else(|| missing("model_type", HeaderSource::HfConfig, "a string"))?;
        Ok(HeaderArch::named(name))
    }

    fn named(name: &str) -> HeaderArch {
        HeaderArch {
            name: name.to_string(),
            family: ArchFamily::from_name(name),
        }
    }
}

/// The hyper-parameters of a model as its header states them, with the
/// defaults a header may leave out filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderShape {
    pub source: HeaderSource,
    pub arch: HeaderArch,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_heads: usize,
    /// `n_heads` when the header does not say (no grouped-query attention).
    pub n_kv_heads: usize,
    /// `n_embd / n_heads` when the header does not say.
    pub head_dim: usize,
    pub n_ff: usize,
    /// From the token embedding's rows, `tokenizer.ggml.tokens` or a
    /// `vocab_size` key (GGUF, in that order); from `vocab_size`, else
    /// transformers' default for the family (config.json). `None` when
    /// the header gives no way to tell.
    pub vocab_size: Option<usize>,
    /// The stated context, else transformers' default for the family
    /// (config.json), else [`DEFAULT_CONTEXT_LENGTH`].
    pub context_length: usize,
    /// Window of the sliding layers; `None` when no layer slides.
    pub sliding_window: Option<usize>,
    /// Per layer: whether it attends over the window only.
    pub layer_sliding: Vec<bool>,
    /// Whether the output head is the token embedding, where the header
    /// tells: GGUF by having no `output.weight`, config.json by
    /// `tie_word_embeddings` or the family's default.
    pub tied_embeddings: Option<bool>,
    /// The mixture of experts of every layer's feed-forward block, for
    /// models that have one (then `n_ff` is the dense width the header
    /// states, unused by the layers).
    pub experts: Option<ExpertShape>,
}

/// How many experts a layer has, how many a token uses, and their width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertShape {
    pub n_experts: usize,
    /// Experts each token is routed to (top-k).
    pub n_used: usize,
    /// Hidden width of one expert's feed-forward block.
    pub n_ff: usize,
}

impl ExpertShape {
    fn checked(
        n_experts: usize,
        n_used: usize,
        n_ff: usize,
        used_key: &str,
        origin: HeaderSource,
    ) -> Result<ExpertShape, FormatError> {
        if n_used == 0 || n_used > n_experts {
            return Err(bad(
                used_key,
                origin,
                &format!(
                    "it is {n_used}, but a token must use between 1 and all {n_experts} experts"
                ),
            ));
        }
        Ok(ExpertShape {
            n_experts,
            n_used,
            n_ff,
        })
    }
}

/// Which layers of a family slide when it has a window and no explicit
/// per-layer list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pattern {
    /// No layer.
    Full,
    /// Every layer.
    All,
    /// Even layers slide, odd layers are global.
    EvenLayers,
    /// Layer `l` is global when `(l + 1) % n == 0`, else sliding.
    GlobalEvery(usize),
}

impl Pattern {
    fn slides(self, l: usize) -> bool {
        match self {
            Pattern::Full => false,
            Pattern::All => true,
            Pattern::EvenLayers => l.is_multiple_of(2),
            Pattern::GlobalEvery(n) => !(l + 1).is_multiple_of(n),
        }
    }
}

/// The one place that decides which layers of a family slide.
///
/// Gemma 2 and gpt-oss slide their even layers and Gemma 3 all but every
/// `global_every`-th, as transformers and llama.cpp run them. llama.cpp
/// runs Llama, Mistral and other GGUFs with full attention, so a GGUF
/// window of those is unused. In config.json, transformers' Mistral slides
/// every layer, and so is a window of an unknown family taken; Llama has no
/// window, and Qwen's (`max_window_layers`) is honoured only through an
/// explicit `layer_types` list.
fn family_pattern(
    family: Option<ArchFamily>,
    source: HeaderSource,
    global_every: usize,
) -> Pattern {
    use ArchFamily::*;
    match (family, source) {
        (Some(Gemma2 | GptOss), _) => Pattern::EvenLayers,
        (Some(Gemma3), _) => Pattern::GlobalEvery(global_every),
        (_, HeaderSource::Gguf) => Pattern::Full,
        (Some(Mistral) | None, HeaderSource::HfConfig) => Pattern::All,
        // transformers slides every layer of these when the config has a
        // window (llama.cpp's Phi-3 ignores it: "Phi SWA is disabled").
        (Some(Mixtral | Phi3), HeaderSource::HfConfig) => Pattern::All,
        (Some(Llama | Qwen2 | Qwen3 | Qwen3Moe), HeaderSource::HfConfig) => Pattern::Full,
    }
}

/// Per-layer sliding flags, and the window only when some layer uses it.
fn sliding_layers(
    n_layers: usize,
    window: Option<usize>,
    listed: Option<Vec<bool>>,
    pattern: Pattern,
) -> (Option<usize>, Vec<bool>) {
    let window = window.filter(|&w| w > 0);
    let layer_sliding: Vec<bool> = match (window, listed) {
        (None, _) => vec![false; n_layers],
        (Some(_), Some(listed)) => listed,
        (Some(_), None) => (0..n_layers).map(|l| pattern.slides(l)).collect(),
    };
    let window = window.filter(|_| layer_sliding.contains(&true));
    (window, layer_sliding)
}

impl HeaderShape {
    /// From GGUF metadata. Per-layer arrays (which some converters write)
    /// give their first value: the models Spindle runs have one throughout.
    pub fn from_gguf(gguf: &GgufFile) -> Result<HeaderShape, FormatError> {
        let src = HeaderSource::Gguf;
        let arch = HeaderArch::from_gguf(gguf)?;
        let key = |k: &str| format!("{}.{k}", arch.name);
        let get = |k: &str| gguf_count(gguf, &key(k));
        let req = |k: &str| get(k).ok_or_else(|| missing(&key(k), src, "a non-negative integer"));
        let n_layers = req("block_count")?;
        let n_embd = req("embedding_length")?;
        let n_heads = nonzero(
            req("attention.head_count")?,
            &key("attention.head_count"),
            src,
        )?;
        let n_ff = req("feed_forward_length")?;
        let vocab_size = gguf
            .tensor("token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .and_then(|v| usize::try_from(v).ok())
            .or_else(|| gguf.get_array("tokenizer.ggml.tokens").map(<[_]>::len))
            .or_else(|| get("vocab_size"));
        let experts = match get("expert_count").filter(|&n| n > 0) {
            None => None,
            Some(n_experts) => {
                let used_key = key("expert_used_count");
                let n_used = get("expert_used_count")
                    .ok_or_else(|| missing(&used_key, src, "a non-negative integer"))?;
                let n_ff = get("expert_feed_forward_length").unwrap_or(n_ff);
                Some(ExpertShape::checked(
                    n_experts, n_used, n_ff, &used_key, src,
                )?)
            }
        };
        let family = match arch.family {
            Some(ArchFamily::Llama) if experts.is_some() => Some(ArchFamily::Mixtral),
            f => f,
        };
        let pattern = family_pattern(family, src, GEMMA3_GLOBAL_EVERY);
        let (sliding_window, layer_sliding) =
            sliding_layers(n_layers, get("attention.sliding_window"), None, pattern);
        Ok(HeaderShape {
            experts,
            source: src,
            n_layers,
            n_embd,
            n_heads,
            n_kv_heads: get("attention.head_count_kv").unwrap_or(n_heads),
            head_dim: get("attention.key_length").unwrap_or(n_embd / n_heads),
            n_ff,
            vocab_size,
            context_length: get("context_length").unwrap_or(DEFAULT_CONTEXT_LENGTH),
            sliding_window,
            layer_sliding,
            tied_embeddings: Some(gguf.tensor("output.weight").is_none()),
            arch: HeaderArch {
                family,
                ..arch.clone()
            },
        })
    }

    /// From a `config.json`; multimodal configs keep the language model
    /// under `text_config`, whose keys win over the top level's.
    pub fn from_hf(config: &HfConfig) -> Result<HeaderShape, FormatError> {
        let src = HeaderSource::HfConfig;
        let cfg = config.text_config();
        let arch = HeaderArch::from_text_config(&cfg)?;
        let family = arch.family;
        let get = |k: &str| cfg.get_usize(k);
        let req = |k: &str| get(k).ok_or_else(|| missing(k, src, "a non-negative integer"));
        let n_layers = req("num_hidden_layers")?;
        let n_embd = req("hidden_size")?;
        let n_heads = nonzero(req("num_attention_heads")?, "num_attention_heads", src)?;
        let n_ff = req("intermediate_size")?;
        let gemma3 = family == Some(ArchFamily::Gemma3);
        // transformers' defaults for keys the published Gemma 3 multimodal
        // configs leave out.
        let (default_vocab, default_context) = if gemma3 {
            (Some(262_208), 131_072)
        } else {
            (None, DEFAULT_CONTEXT_LENGTH)
        };

        // Qwen configs carry a window they do not use unless asked.
        let qwen = matches!(family, Some(ArchFamily::Qwen2 | ArchFamily::Qwen3));
        let use_sliding = cfg.get_bool("use_sliding_window").unwrap_or(!qwen);
        let window = get("sliding_window").filter(|_| use_sliding);
        let global_every = match cfg.get("sliding_window_pattern") {
            Some(v) if gemma3 && !v.is_null() => {
                let n = v.as_u64().and_then(|n| usize::try_from(n).ok());
                let n = n.ok_or_else(|| {
                    bad(
                        "sliding_window_pattern",
                        src,
                        "it is not a non-negative integer",
                    )
                })?;
                nonzero(n, "sliding_window_pattern", src)?
            }
            _ => GEMMA3_GLOBAL_EVERY,
        };
        let experts = match get("num_experts")
            .or_else(|| get("num_local_experts"))
            .filter(|&n| n > 0)
        {
            None => None,
            Some(n_experts) => {
                let n_used = req("num_experts_per_tok")?;
                let n_ff = get("moe_intermediate_size").unwrap_or(n_ff);
                Some(ExpertShape::checked(
                    n_experts,
                    n_used,
                    n_ff,
                    "num_experts_per_tok",
                    src,
                )?)
            }
        };
        let listed = layer_types(&cfg, n_layers);
        let pattern = family_pattern(family, src, global_every);
        let (sliding_window, layer_sliding) = sliding_layers(n_layers, window, listed, pattern);

        let tied_default = family.map(|f| matches!(f, ArchFamily::Gemma2 | ArchFamily::Gemma3));
        let tied_embeddings = cfg
            .get_bool("tie_word_embeddings")
            .or_else(|| config.get_bool("tie_word_embeddings"))
            .or(tied_default);
        Ok(HeaderShape {
            source: src,
            arch,
            n_layers,
            n_embd,
            n_heads,
            n_kv_heads: get("num_key_value_heads").unwrap_or(n_heads),
            // `head_dim` may be null (Mistral), meaning hidden / heads.
            head_dim: get("head_dim").unwrap_or(n_embd / n_heads),
            n_ff,
            vocab_size: get("vocab_size").or(default_vocab),
            context_length: get("max_position_embeddings").unwrap_or(default_context),
            sliding_window,
            layer_sliding,
            tied_embeddings,
            experts,
        })
    }

    /// The family, when Spindle knows the architecture.
    pub fn family(&self) -> Option<ArchFamily> {
        self.arch.family
    }
}

/// `layer_types` as per-layer sliding flags, when it lists every layer.
fn layer_types(cfg: &HfConfig, n_layers: usize) -> Option<Vec<bool>> {
    let types = cfg.get("layer_types")?.as_array()?;
    (types.len() == n_layers).then(|| {
        types
            .iter()
            .map(|t| t.as_str() == Some("sliding_attention"))
            .collect()
    })
}

/// A count: a non-negative integer, or the first of an array of them.
fn gguf_count(gguf: &GgufFile, key: &str) -> Option<usize> {
    let v = gguf.get(key)?;
    let n = v.as_u64().or_else(|| v.as_array()?.first()?.as_u64())?;
    usize::try_from(n).ok()
}

fn missing(key: &str, origin: HeaderSource, expected: &'static str) -> FormatError {
    FormatError::MissingHeaderKey {
        key: key.to_string(),
        origin,
        expected,
    }
}

fn bad(key: &str, origin: HeaderSource, reason: &str) -> FormatError {
    FormatError::BadHeaderValue {
        key: key.to_string(),
        origin,
        reason: reason.to_string(),
    }
}

fn nonzero(v: usize, key: &str, origin: HeaderSource) -> Result<usize, FormatError> {
    if v == 0 {
        return Err(bad(key, origin, "it is 0: the file is corrupt"));
    }
    Ok(v)
}
