//! Architectures as data: what differs between the families Spindle runs.
//! The forward pass reads these fields; it has no per-family branches.
//! Which layers slide is a fact of the header, read by the formats'
//! `HeaderShape` into `ModelConfig::layer_sliding`.

use spindle_kernels::activation::Activation;

/// A model family: the formats' own list, so the header reader and the
/// decoder cannot know different families.
pub use spindle_formats::ArchFamily as Family;

/// The data that configures the one decoder for a family.
#[derive(Debug, Clone, Copy)]
pub struct ArchTraits {
    pub family: Family,
    pub activation: Activation,
    /// RMS norm on each query and key head before rope (Qwen 3, Gemma 3).
    pub qk_norm: bool,
    /// Biases on the q, k and v projections (Qwen 2).
    pub qkv_bias: bool,
    /// Norms after attention and after the feed-forward block, before the residual add (Gemma 2/3).
    pub sandwich_norms: bool,
    /// Embeddings multiplied by `sqrt(n_embd)` (Gemma).
    pub embed_scale: bool,
    /// Hugging Face stores Gemma's norm weights as `w - 1` and multiplies by `1 + w`;
    /// GGUF stores `w` itself. Added to every norm weight read from safetensors.
    pub hf_norm_offset: f32,
    /// Base of the rotary frequencies on sliding layers, when it differs (Gemma 3).
    pub local_rope_base: Option<f32>,
}

impl ArchTraits {
    /// What configures the decoder for `family`.
    pub fn of(family: Family) -> ArchTraits {
        let base = ArchTraits {
            family,
            activation: Activation::Silu,
            qk_norm: false,
            qkv_bias: false,
            sandwich_norms: false,
            embed_scale: false,
            hf_norm_offset: 0.0,
            local_rope_base: None,
        };
        let gemma = ArchTraits {
            activation: Activation::GeluTanh,
            sandwich_norms: true,
            embed_scale: true,
            hf_norm_offset: 1.0,
            ..base
        };
        match family {
            Family::Llama | Family::Mistral | Family::Mixtral | Family::Phi3 | Family::GptOss => {
                base
            }
            Family::Qwen2 => ArchTraits {
                qkv_bias: true,
                ..base
            },
            Family::Qwen3 | Family::Qwen3Moe => ArchTraits {
                qk_norm: true,
                ..base
            },
            Family::Gemma2 => gemma,
            Family::Gemma3 => ArchTraits {
                qk_norm: true,
                local_rope_base: Some(10_000.0),
                ..gemma
            },
        }
    }
}
