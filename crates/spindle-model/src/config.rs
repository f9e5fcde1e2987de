//! Hyper-parameters of a model, read from GGUF metadata or `config.json`.

use spindle_formats::{GgufFile, HfConfig};
use spindle_kernels::rope::RopeStyle;

use crate::arch::{ArchTraits, Family};
use crate::error::ModelError;

/// How rotary frequencies are stretched for long contexts.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// Llama 3.x: per-frequency divisors from wavelength bands.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_context: f32,
    },
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub arch: ArchTraits,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    pub rope_style: RopeStyle,
    pub rope_scaling: RopeScaling,
    /// Sliding-window length, for the layers that slide.
    pub sliding_window: Option<usize>,
    /// Per layer: whether it uses the sliding window.
    pub layer_sliding: Vec<bool>,
    /// Multiplier of attention scores.
    pub attn_scale: f32,
    pub attn_softcap: Option<f32>,
    pub final_softcap: Option<f32>,
}

impl ModelConfig {
    pub fn family(&self) -> Family {
        self.arch.family
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// The rope base of a layer.
    pub fn layer_rope_base(&self, layer: usize) -> f32 {
        match self.arch.local_rope_base {
            Some(local) if self.layer_sliding[layer] => local,
            _ => self.rope_base,
        }
    }

    /// From GGUF metadata (`{arch}.*` keys as llama.cpp writes them).
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self, ModelError> {
        let arch = gguf
            .architecture()
            .ok_or_else(|| ModelError::MissingMetadata("general.architecture".into()))?
            .to_string();
        let family = Family::from_name(&arch)
            .ok_or_else(|| ModelError::UnsupportedArchitecture(arch.clone()))?;
        let traits = family.traits();
        let key = |k: &str| format!("{arch}.{k}");
        let req = |k: &str| -> Result<usize, ModelError> {
            gguf.get_u64(&key(k))
                .map(|v| v as usize)
                .ok_or_else(|| ModelError::MissingMetadata(key(k)))
        };
        let n_layers = req("block_count")?;
        let n_embd = req("embedding_length")?;
        let n_head = req("attention.head_count")?;
        let n_ff = ff_length(gguf, &key("feed_forward_length"))?;
        let n_head_kv = gguf
            .get_u64(&key("attention.head_count_kv"))
            .map_or(n_head, |v| v as usize);
        let head_dim = gguf
            .get_u64(&key("attention.key_length"))
            .map_or(n_embd / n_head.max(1), |v| v as usize);
        let vocab_size = gguf
            .tensor("token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .map(|v| v as usize)
            .ok_or_else(|| ModelError::MissingTensor {
                name: "token_embd.weight".into(),
                arch: arch.clone(),
            })?;
        let f = |k: &str| gguf.get_f64(&key(k)).map(|v| v as f32);
        let sliding_window = gguf
            .get_u64(&key("attention.sliding_window"))
            .map(|v| v as usize);
        let rope_scaling = match gguf.get_str(&key("rope.scaling.type")) {
            Some("linear") => RopeScaling::Linear {
                factor: f("rope.scaling.factor").unwrap_or(1.0),
            },
            // Llama 3 scaling is baked into the `rope_freqs.weight` tensor by the converter.
            _ => RopeScaling::None,
        };
        let mut traits = traits;
        if let Some(base) = f("rope.freq_base_swa") {
            traits.local_rope_base = Some(base);
        }
        if family == Family::Mistral || family == Family::Llama {
            // llama.cpp runs Llama and Mistral GGUFs with full attention.
            traits.sliding = crate::arch::SlidingPattern::None;
        }
        let layer_sliding = (0..n_layers)
            .map(|l| sliding_window.is_some() && traits.sliding.is_sliding(l))
            .collect();
        let attn_scale = f("attention.scale").unwrap_or(1.0 / (head_dim as f32).sqrt());
        Ok(ModelConfig {
            arch: traits,
            n_layers,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            vocab_size,
            context_length: gguf
                .get_u64(&key("context_length"))
                .map_or(4096, |v| v as usize),
            rms_eps: f("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
            rope_base: f("rope.freq_base").unwrap_or(10_000.0),
            // GGUF Llama q/k rows are permuted at conversion so pairs are adjacent.
            rope_style: if family == Family::Llama || family == Family::Mistral {
                RopeStyle::Interleaved
            } else {
                RopeStyle::Neox
            },
            rope_scaling,
            sliding_window,
            layer_sliding,
            attn_scale,
            attn_softcap: f("attn_logit_softcapping").filter(|&c| c > 0.0),
            final_softcap: f("final_logit_softcapping").filter(|&c| c > 0.0),
        })
    }

    /// From a Hugging Face `config.json`.
    pub fn from_hf(config: &HfConfig) -> Result<Self, ModelError> {
        let cfg = config.text_config();
        let model_type = cfg
            .get_str("model_type")
            .ok_or_else(|| ModelError::MissingMetadata("model_type".into()))?
            .to_string();
        let family = Family::from_name(&model_type)
            .ok_or_else(|| ModelError::UnsupportedArchitecture(model_type.clone()))?;
        let mut traits = family.traits();
        let req = |k: &str| {
            cfg.get_usize(k)
                .ok_or_else(|| ModelError::MissingMetadata(k.into()))
        };
        let n_layers = req("num_hidden_layers")?;
        let n_embd = req("hidden_size")?;
        let n_head = req("num_attention_heads")?;
        let head_dim = cfg.get_usize("head_dim").unwrap_or(n_embd / n_head.max(1));
        let f = |k: &str| cfg.get_f64(k).map(|v| v as f32);

        // Rope parameters: transformers 5 nests them under `rope_parameters`
        // (per layer type for Gemma 3); older configs use flat keys.
        let rope_params = cfg.get("rope_parameters").cloned();
        let full_params = rope_params
            .as_ref()
            .and_then(|p| p.get("full_attention").cloned().or_else(|| Some(p.clone())));
        let local_params = rope_params
            .as_ref()
            .and_then(|p| p.get("sliding_attention").cloned());
        let num = |v: &Option<serde_json::Value>, k: &str| {
            v.as_ref()
                .and_then(|p| p.get(k))
                .and_then(|x| x.as_f64())
                .map(|x| x as f32)
        };
        let rope_base = num(&full_params, "rope_theta")
            .or_else(|| f("rope_theta"))
            .unwrap_or(10_000.0);
        if let Some(local) = num(&local_params, "rope_theta").or_else(|| f("rope_local_base_freq"))
        {
            traits.local_rope_base = Some(local);
        }
        let scaling_obj = full_params
            .clone()
            .filter(|p| p.get("rope_type").is_some())
            .or_else(|| cfg.get("rope_scaling").cloned())
            .filter(|v| !v.is_null());
        let rope_scaling = match scaling_obj {
            Some(s) => {
                let kind = s
                    .get("rope_type")
                    .or_else(|| s.get("type"))
                    .and_then(|v| v.as_str())
                    .unwrap_or("default");
                let g = |k: &str, d: f32| s.get(k).and_then(|v| v.as_f64()).map_or(d, |v| v as f32);
                match kind {
                    "linear" => RopeScaling::Linear {
                        factor: g("factor", 1.0),
                    },
                    "llama3" => RopeScaling::Llama3 {
                        factor: g("factor", 8.0),
                        low_freq_factor: g("low_freq_factor", 1.0),
                        high_freq_factor: g("high_freq_factor", 4.0),
                        original_context: g("original_max_position_embeddings", 8192.0),
                    },
                    _ => RopeScaling::None,
                }
            }
            None => RopeScaling::None,
        };

        let use_sliding = cfg
            .get_bool("use_sliding_window")
            .unwrap_or(family != Family::Qwen2 && family != Family::Qwen3);
        let sliding_window = cfg.get_usize("sliding_window").filter(|_| use_sliding);
        let layer_sliding: Vec<bool> = match cfg.get("layer_types").and_then(|v| v.as_array()) {
            Some(types) if types.len() == n_layers => types
                .iter()
                .map(|t| sliding_window.is_some() && t.as_str() == Some("sliding_attention"))
                .collect(),
            _ => (0..n_layers)
                .map(|l| sliding_window.is_some() && traits.sliding.is_sliding(l))
                .collect(),
        };
        if family == Family::Qwen2 || family == Family::Llama {
            traits.qkv_bias = cfg
                .get_bool("attention_bias")
                .unwrap_or(family == Family::Qwen2);
        }
        let attn_scale = match f("query_pre_attn_scalar") {
            Some(s) if matches!(family, Family::Gemma2 | Family::Gemma3) => 1.0 / s.sqrt(),
            _ => 1.0 / (head_dim as f32).sqrt(),
        };
        Ok(ModelConfig {
            arch: traits,
            n_layers,
            n_embd,
            n_ff: req("intermediate_size")?,
            n_head,
            n_head_kv: cfg.get_usize("num_key_value_heads").unwrap_or(n_head),
            head_dim,
            vocab_size: req("vocab_size")?,
            context_length: cfg.get_usize("max_position_embeddings").unwrap_or(4096),
            rms_eps: f("rms_norm_eps").unwrap_or(1e-6),
            rope_base,
            rope_style: RopeStyle::Neox,
            rope_scaling,
            sliding_window,
            layer_sliding,
            attn_scale,
            attn_softcap: f("attn_logit_softcapping").filter(|&c| c > 0.0),
            final_softcap: f("final_logit_softcapping").filter(|&c| c > 0.0),
        })
    }

    /// Per-pair frequency divisors for Llama 3 scaling (the reference's formula).
    pub fn llama3_freq_factors(&self) -> Option<Vec<f32>> {
        let RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_context,
        } = self.rope_scaling
        else {
            return None;
        };
        let d = self.head_dim;
        let low_wavelen = original_context / low_freq_factor;
        let high_wavelen = original_context / high_freq_factor;
        Some(
            (0..d / 2)
                .map(|i| {
                    let inv = 1.0f32 / self.rope_base.powf((2 * i) as f32 / d as f32);
                    let wavelen = 2.0 * std::f32::consts::PI / inv;
                    let scaled = if wavelen < high_wavelen {
                        inv
                    } else if wavelen > low_wavelen {
                        inv / factor
                    } else {
                        let smooth = (original_context / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * inv / factor + smooth * inv
                    };
                    inv / scaled
                })
                .collect(),
        )
    }
}

/// `feed_forward_length` is a scalar, or an array with one value per layer
/// (all equal in the models Spindle runs).
fn ff_length(gguf: &GgufFile, key: &str) -> Result<usize, ModelError> {
    let v = gguf
        .get(key)
        .ok_or_else(|| ModelError::MissingMetadata(key.into()))?;
    if let Some(n) = v.as_u64() {
        return Ok(n as usize);
    }
    v.as_array()
        .and_then(|a| a.first())
        .and_then(|x| x.as_u64())
        .map(|n| n as usize)
        .ok_or_else(|| ModelError::MissingMetadata(key.into()))
}
