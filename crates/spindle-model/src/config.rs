//! Hyper-parameters of a model, read from GGUF metadata or `config.json`:
//! the shape (family, dimensions, sliding layers) from the formats'
//! [`HeaderShape`], which the planner builds on too; the rest (rope, norms,
//! softcaps) here.

use spindle_formats::{FormatError, GgufFile, HeaderArch, HeaderShape, HfConfig};
use spindle_kernels::rope::RopeStyle;

use crate::arch::{ArchTraits, Family};
use crate::error::ModelError;
use crate::weights::TensorSource;

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
    /// Phi-3's LongRoPE: per-pair frequency divisors, `short` while the
    /// run's context is within `original_context`, `long` past it (as
    /// llama.cpp chooses, by the context the cache holds), and attention
    /// scores scaled by `attn_factor` squared (transformers multiplies cos
    /// and sin, so q and k, by it).
    LongRope {
        short: Vec<f32>,
        long: Vec<f32>,
        original_context: usize,
        attn_factor: f32,
    },
    /// YaRN: frequencies below the `beta_slow` band are interpolated by
    /// `factor`, those above `beta_fast` kept, a linear ramp between (whose
    /// ends are whole dimensions when `truncate`), and q and k scaled by
    /// `attn_factor` (`0.1 ln(factor) + 1` by default).
    Yarn {
        factor: f32,
        original_context: f32,
        beta_fast: f32,
        beta_slow: f32,
        truncate: bool,
        attn_factor: f32,
    },
}

/// A layer's mixture of experts: how a token picks its experts and weighs
/// their outputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    pub n_experts: usize,
    /// Experts each token uses (top-k).
    pub n_used: usize,
    /// Hidden width of one expert.
    pub n_ff: usize,
    pub routing: Routing,
    pub activation: ExpertActivation,
}

/// The gated activation inside each expert.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertActivation {
    /// `silu(gate) * up`, as the dense blocks.
    Silu,
    /// gpt-oss: `g = min(gate, limit)`, `u = clamp(up, -limit, limit)`,
    /// `g * sigmoid(alpha * g) * (u + 1)`.
    ClampedSwiglu { alpha: f32, limit: f32 },
}

/// How router logits become the weights of the chosen experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// Softmax over every expert, the top k kept; with `renormalize` the
    /// kept weights are divided by their sum (Mixtral, Qwen3-MoE with
    /// `norm_topk_prob`).
    SoftmaxTopK { renormalize: bool },
    /// The top k router logits, then a softmax over those k (gpt-oss).
    TopKSoftmax,
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
    /// The experts of every layer, for mixture-of-experts models.
    pub moe: Option<MoeConfig>,
}

impl ModelConfig {
    pub fn family(&self) -> Family {
        self.arch.family
    }

    /// Experts a token reads in each layer (0 for a dense model).
    pub fn experts_per_token(&self) -> usize {
        self.moe.map_or(0, |m| m.n_used)
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
        known_family(HeaderArch::from_gguf(gguf))?;
        let h = HeaderShape::from_gguf(gguf).map_err(header_error)?;
        // The shape knows the family better than the name: `llama` with
        // experts is Mixtral.
        let family = known_family(Ok(h.arch.clone()))?;
        let arch = h.arch.name.as_str();
        let key = |k: &str| format!("{arch}.{k}");
        // The forward pass computes over the embedding's rows.
        let vocab_size = h
            .vocab_size
            .filter(|_| gguf.tensor("token_embd.weight").is_some())
            .ok_or_else(|| ModelError::MissingTensor {
                name: "token_embd.weight".into(),
                arch: arch.to_string(),
            })?;
        let f = |k: &str| gguf.get_f64(&key(k)).map(|v| v as f32);
        // gpt-oss is YaRN-scaled; a converter that wrote the factor but not
        // the type still means it.
        let scaling_type =
            gguf.get_str(&key("rope.scaling.type"))
                .or((family == Family::GptOss
                    && f("rope.scaling.factor").is_some_and(|x| x > 1.0))
                .then_some("yarn"));
        let rope_scaling = match scaling_type {
            Some("linear") => RopeScaling::Linear {
                factor: f("rope.scaling.factor").unwrap_or(1.0),
            },
            Some("yarn") => {
                let factor = f("rope.scaling.factor").unwrap_or(1.0);
                RopeScaling::Yarn {
                    factor,
                    original_context: f("rope.scaling.original_context_length")
                        .unwrap_or(h.context_length as f32),
                    beta_fast: f("rope.scaling.yarn_beta_fast").unwrap_or(32.0),
                    beta_slow: f("rope.scaling.yarn_beta_slow").unwrap_or(1.0),
                    // gpt-oss's own config (and OpenAI's reference) ramps
                    // between fractional dimensions; GGUF has no key for it.
                    truncate: family != Family::GptOss,
                    attn_factor: yarn_default_attn_factor(factor),
                }
            }
            // Llama 3 scaling is baked into the `rope_freqs.weight` tensor by the converter.
            _ => RopeScaling::None,
        };
        // Phi-3's converter writes LongRoPE as two factor tensors.
        let factors = TensorSource::Gguf(gguf);
        let rope_scaling = match (
            factors.vector_opt("rope_factors_short.weight", h.head_dim / 2, 0.0)?,
            factors.vector_opt("rope_factors_long.weight", h.head_dim / 2, 0.0)?,
        ) {
            (Some(short), Some(long)) => RopeScaling::LongRope {
                short,
                long,
                original_context: gguf
                    .get_u64(&key("rope.scaling.original_context_length"))
                    .map_or(h.context_length, |v| v as usize),
                attn_factor: f("rope.scaling.attn_factor").unwrap_or(1.0),
            },
            _ => rope_scaling,
        };
        if let Some(dims) = gguf.get_u64(&key("rope.dimension_count")) {
            if dims as usize != h.head_dim {
                return Err(ModelError::Unsupported(format!(
                    "{} rotates {dims} of each head's {} dimensions (partial rotary \
                     embeddings), which Spindle does not run yet",
                    key("rope.dimension_count"),
                    h.head_dim
                )));
            }
        }
        let mut traits = ArchTraits::of(family);
        if let Some(base) = f("rope.freq_base_swa") {
            traits.local_rope_base = Some(base);
        }
        let attn_scale = f("attention.scale").unwrap_or(1.0 / (h.head_dim as f32).sqrt())
            * long_rope_score_scale(&rope_scaling);
        let reads = Reads {
            rms_eps: f("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
            rope_base: f("rope.freq_base").unwrap_or(10_000.0),
            // GGUF Llama q/k rows are permuted at conversion so pairs are
            // adjacent; Phi-3's are not (llama.cpp runs it NEOX).
            rope_style: if matches!(family, Family::Llama | Family::Mistral | Family::Mixtral) {
                RopeStyle::Interleaved
            } else {
                RopeStyle::Neox
            },
            rope_scaling,
            attn_scale,
            attn_softcap: f("attn_logit_softcapping").filter(|&c| c > 0.0),
            final_softcap: f("final_logit_softcapping").filter(|&c| c > 0.0),
            // llama.cpp renormalizes the kept weights of both Mixtral and
            // Qwen3-MoE unless the file says otherwise.
            renormalize: gguf
                .get(&key("expert_weights_norm"))
                .and_then(|v| v.as_bool())
                .unwrap_or(true),
            gpt_oss: (family == Family::GptOss).then_some(ExpertActivation::ClampedSwiglu {
                alpha: 1.702,
                limit: f("swiglu_clamp").unwrap_or(7.0),
            }),
        };
        Ok(ModelConfig::shaped(h, traits, vocab_size, reads))
    }

    /// From a Hugging Face `config.json`.
    pub fn from_hf(config: &HfConfig) -> Result<Self, ModelError> {
        let family = known_family(HeaderArch::from_hf(config))?;
        let h = HeaderShape::from_hf(config).map_err(header_error)?;
        let vocab_size = h
            .vocab_size
            .ok_or_else(|| ModelError::MissingMetadata("vocab_size".into()))?;
        let cfg = config.text_config();
        let mut traits = ArchTraits::of(family);
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
                    "longrope" | "su" => long_rope_from_hf(&s, &cfg, h.head_dim, h.context_length)?,
                    "yarn" => {
                        let factor = g("factor", 1.0);
                        RopeScaling::Yarn {
                            factor,
                            original_context: s
                                .get("original_max_position_embeddings")
                                .and_then(|v| v.as_f64())
                                .map_or(h.context_length as f32, |v| v as f32),
                            beta_fast: g("beta_fast", 32.0),
                            beta_slow: g("beta_slow", 1.0),
                            truncate: s.get("truncate").and_then(|v| v.as_bool()).unwrap_or(true),
                            attn_factor: s
                                .get("attention_factor")
                                .and_then(|v| v.as_f64())
                                .map_or(yarn_default_attn_factor(factor), |v| v as f32),
                        }
                    }
                    _ => RopeScaling::None,
                }
            }
            None => RopeScaling::None,
        };

        if family == Family::Qwen2 || family == Family::Llama {
            traits.qkv_bias = cfg
                .get_bool("attention_bias")
                .unwrap_or(family == Family::Qwen2);
        }
        if let Some(p) = cfg
            .get_f64("partial_rotary_factor")
            .or_else(|| num(&full_params, "partial_rotary_factor").map(f64::from))
            .filter(|&p| p != 1.0)
        {
            return Err(ModelError::Unsupported(format!(
                "partial_rotary_factor is {p}: partial rotary embeddings are not run yet"
            )));
        }
        let attn_scale = match f("query_pre_attn_scalar") {
            Some(s) if matches!(family, Family::Gemma2 | Family::Gemma3) => 1.0 / s.sqrt(),
            _ => 1.0 / (h.head_dim as f32).sqrt(),
        } * long_rope_score_scale(&rope_scaling);
        let reads = Reads {
            rms_eps: f("rms_norm_eps").unwrap_or(1e-6),
            rope_base,
            rope_style: RopeStyle::Neox,
            rope_scaling,
            attn_scale,
            attn_softcap: f("attn_logit_softcapping").filter(|&c| c > 0.0),
            final_softcap: f("final_logit_softcapping").filter(|&c| c > 0.0),
            // Mixtral always renormalizes; Qwen3-MoE when `norm_topk_prob`
            // says so (transformers' default: no).
            renormalize: family == Family::Mixtral
                || cfg.get_bool("norm_topk_prob").unwrap_or(false),
            gpt_oss: (family == Family::GptOss).then(|| ExpertActivation::ClampedSwiglu {
                alpha: f("swiglu_alpha").unwrap_or(1.702),
                limit: f("swiglu_limit").unwrap_or(7.0),
            }),
        };
        Ok(ModelConfig::shaped(h, traits, vocab_size, reads))
    }

    /// The config of a model whose shape is `h` (dimensions, context,
    /// sliding layers: the header facts both file formats share) and whose
    /// other hyper-parameters each reader took from its own keys.
    fn shaped(h: HeaderShape, arch: ArchTraits, vocab_size: usize, r: Reads) -> ModelConfig {
        ModelConfig {
            arch,
            n_layers: h.n_layers,
            n_embd: h.n_embd,
            n_ff: h.n_ff,
            n_head: h.n_heads,
            n_head_kv: h.n_kv_heads,
            head_dim: h.head_dim,
            vocab_size,
            context_length: h.context_length,
            rms_eps: r.rms_eps,
            rope_base: r.rope_base,
            rope_style: r.rope_style,
            rope_scaling: r.rope_scaling,
            sliding_window: h.sliding_window,
            layer_sliding: h.layer_sliding,
            attn_scale: r.attn_scale,
            attn_softcap: r.attn_softcap,
            final_softcap: r.final_softcap,
            moe: h.experts.map(|x| MoeConfig {
                n_experts: x.n_experts,
                n_used: x.n_used,
                n_ff: x.n_ff,
                routing: match r.gpt_oss {
                    Some(_) => Routing::TopKSoftmax,
                    None => Routing::SoftmaxTopK {
                        renormalize: r.renormalize,
                    },
                },
                activation: r.gpt_oss.unwrap_or(ExpertActivation::Silu),
            }),
        }
    }

    /// Per-pair frequency divisors for YaRN: pair `i` runs at
    /// `inv_i x ((1 - e_i) / factor + e_i)`, `e_i` one above the fast band
    /// and zero below the slow one, a linear ramp between.
    pub fn yarn_freq_factors(&self) -> Option<Vec<f32>> {
        let RopeScaling::Yarn {
            factor,
            original_context,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } = self.rope_scaling
        else {
            return None;
        };
        let d = self.head_dim as f32;
        let base = self.rope_base;
        // The dimension whose wavelength turns `rotations` times over the
        // original context.
        let dim_of = |rotations: f32| {
            d * (original_context / (rotations * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let (mut low, mut high) = (dim_of(beta_fast), dim_of(beta_slow));
        if truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, high) = (low.max(0.0), high.min(d - 1.0));
        let span = if high == low { 0.001 } else { high - low };
        Some(
            (0..self.head_dim / 2)
                .map(|i| {
                    let ramp = ((i as f32 - low) / span).clamp(0.0, 1.0);
                    let extrapolate = 1.0 - ramp;
                    1.0 / ((1.0 - extrapolate) / factor + extrapolate)
                })
                .collect(),
        )
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

/// The attention factor of LongRoPE or YaRN, squared: it scales both q
/// and k.
fn long_rope_score_scale(scaling: &RopeScaling) -> f32 {
    match scaling {
        RopeScaling::LongRope { attn_factor, .. } | RopeScaling::Yarn { attn_factor, .. } => {
            attn_factor * attn_factor
        }
        _ => 1.0,
    }
}

/// YaRN's default attention factor, `0.1 ln(factor) + 1` (1 when not
/// stretched).
fn yarn_default_attn_factor(factor: f32) -> f32 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * factor.ln() + 1.0
    }
}

/// LongRoPE from a `rope_parameters` / `rope_scaling` object, with
/// transformers' default attention factor
/// `sqrt(1 + ln(factor) / ln(original))`, `factor = context / original`.
fn long_rope_from_hf(
    s: &serde_json::Value,
    cfg: &HfConfig,
    head_dim: usize,
    context: usize,
) -> Result<RopeScaling, ModelError> {
    let factors = |k: &str| -> Result<Vec<f32>, ModelError> {
        let v: Option<Vec<f32>> = s
            .get(k)
            .and_then(|v| v.as_array())
            .and_then(|a| a.iter().map(|x| x.as_f64().map(|x| x as f32)).collect());
        match v {
            Some(v) if v.len() == head_dim / 2 => Ok(v),
            _ => Err(ModelError::MissingMetadata(format!(
                "rope {k}: a list of {} numbers (half the head size)",
                head_dim / 2
            ))),
        }
    };
    let original = s
        .get("original_max_position_embeddings")
        .and_then(|v| v.as_u64())
        .or_else(|| {
            cfg.get_usize("original_max_position_embeddings")
                .map(|v| v as u64)
        })
        .map_or(context, |v| v as usize)
        .max(1);
    let factor = s
        .get("factor")
        .and_then(|v| v.as_f64())
        .unwrap_or(context as f64 / original as f64);
    let attn_factor = s
        .get("attention_factor")
        .and_then(|v| v.as_f64())
        .unwrap_or(if factor <= 1.0 {
            1.0
        } else {
            (1.0 + factor.ln() / (original as f64).ln()).sqrt()
        });
    Ok(RopeScaling::LongRope {
        short: factors("short_factor")?,
        long: factors("long_factor")?,
        original_context: original,
        attn_factor: attn_factor as f32,
    })
}

/// What GGUF metadata and `config.json` spell differently, each read by
/// its own reader.
struct Reads {
    rms_eps: f32,
    rope_base: f32,
    rope_style: RopeStyle,
    rope_scaling: RopeScaling,
    attn_scale: f32,
    attn_softcap: Option<f32>,
    final_softcap: Option<f32>,
    renormalize: bool,
    /// gpt-oss's expert activation, which also means top-k-then-softmax
    /// routing.
    gpt_oss: Option<ExpertActivation>,
}

/// The family of a header's architecture, or the typed refusal of one
/// Spindle does not run (before any other key is read).
fn known_family(arch: Result<HeaderArch, FormatError>) -> Result<Family, ModelError> {
    let arch = arch.map_err(header_error)?;
    match arch.family {
        None => Err(ModelError::UnsupportedArchitecture(arch.name)),
        Some(f) => Ok(f),
    }
}

/// A key the header lacks is missing metadata; anything else a format error.
fn header_error(e: FormatError) -> ModelError {
    match e {
        FormatError::MissingHeaderKey { key, .. } => ModelError::MissingMetadata(key),
        e => ModelError::Format(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gemma3(layers: usize) -> serde_json::Value {
        json!({
            "model_type": "gemma3_text",
            "num_hidden_layers": layers,
            "hidden_size": 64,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "intermediate_size": 128,
            "vocab_size": 100,
            "sliding_window": 16,
            "rope_theta": 1_000_000.0,
            "rope_local_base_freq": 10_000.0
        })
    }

    fn from_hf(v: serde_json::Value) -> Result<ModelConfig, ModelError> {
        ModelConfig::from_hf(&HfConfig::from_value(v))
    }

    #[test]
    fn gemma3_sliding_window_pattern_is_honoured() {
        // transformers: layer i slides when (i + 1) % 2 != 0, so 0 and 2.
        let mut c = gemma3(4);
        c["sliding_window_pattern"] = json!(2);
        let cfg = from_hf(c).unwrap();
        assert_eq!(cfg.layer_sliding, vec![true, false, true, false]);
        assert_eq!(cfg.sliding_window, Some(16));
        assert_eq!(cfg.layer_rope_base(0), 10_000.0);
        assert_eq!(cfg.layer_rope_base(1), 1_000_000.0);
        // Without it, every sixth layer is global.
        let cfg = from_hf(gemma3(6)).unwrap();
        assert_eq!(cfg.layer_sliding, vec![true, true, true, true, true, false]);
    }

    #[test]
    fn unsupported_architecture_is_refused_before_other_keys() {
        let err = from_hf(json!({"model_type": "mamba"})).unwrap_err();
        assert!(
            matches!(&err, ModelError::UnsupportedArchitecture(a) if a == "mamba"),
            "{err}"
        );
        let err = from_hf(json!({"num_hidden_layers": 2})).unwrap_err();
        assert!(
            matches!(&err, ModelError::MissingMetadata(k) if k == "model_type"),
            "{err}"
        );
        let mut c = gemma3(2);
        c.as_object_mut().unwrap().remove("num_hidden_layers");
        let err = from_hf(c).unwrap_err();
        assert!(
            matches!(&err, ModelError::MissingMetadata(k) if k == "num_hidden_layers"),
            "{err}"
        );
    }
}
