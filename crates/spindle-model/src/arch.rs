//! Architectures as data: what differs between the families Spindle runs.
//! The forward pass reads these fields; it has no per-family branches.

use spindle_kernels::activation::Activation;

/// A model family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma2,
    Gemma3,
}

/// Which layers use sliding-window attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlidingPattern {
    /// Every layer attends to the whole context (unless a window is configured for all).
    None,
    /// Every layer uses the window when one is configured (Mistral).
    All,
    /// Even layers slide, odd layers are global (Gemma 2).
    EvenLayers,
    /// Layer `i` is global when `(i + 1) % n == 0`, else sliding (Gemma 3: n = 6).
    GlobalEvery(usize),
}

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
    pub sliding: SlidingPattern,
    /// Base of the rotary frequencies on sliding layers, when it differs (Gemma 3).
    pub local_rope_base: Option<f32>,
    /// Whether the output head is the embedding matrix unless a separate one is present.
    pub tied_by_default: bool,
}

impl Family {
    /// The family for a GGUF `general.architecture` or a Hugging Face `model_type`.
    pub fn from_name(name: &str) -> Option<Family> {
        Some(match name {
            "llama" => Family::Llama,
            "mistral" => Family::Mistral,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "gemma2" => Family::Gemma2,
            "gemma3" | "gemma3_text" => Family::Gemma3,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Gemma2 => "gemma2",
            Family::Gemma3 => "gemma3",
        }
    }

    pub fn traits(self) -> ArchTraits {
        let base = ArchTraits {
            family: self,
            activation: Activation::Silu,
            qk_norm: false,
            qkv_bias: false,
            sandwich_norms: false,
            embed_scale: false,
            hf_norm_offset: 0.0,
            sliding: SlidingPattern::None,
            local_rope_base: None,
            tied_by_default: false,
        };
        let gemma = ArchTraits {
            activation: Activation::GeluTanh,
            sandwich_norms: true,
            embed_scale: true,
            hf_norm_offset: 1.0,
            tied_by_default: true,
            ..base
        };
        match self {
            Family::Llama => base,
            Family::Mistral => ArchTraits {
                sliding: SlidingPattern::All,
                ..base
            },
            Family::Qwen2 => ArchTraits {
                qkv_bias: true,
                ..base
            },
            Family::Qwen3 => ArchTraits {
                qk_norm: true,
                ..base
            },
            Family::Gemma2 => ArchTraits {
                sliding: SlidingPattern::EvenLayers,
                ..gemma
            },
            Family::Gemma3 => ArchTraits {
                qk_norm: true,
                sliding: SlidingPattern::GlobalEvery(6),
                local_rope_base: Some(10_000.0),
                ..gemma
            },
        }
    }
}

impl SlidingPattern {
    pub fn is_sliding(self, layer: usize) -> bool {
        match self {
            SlidingPattern::None => false,
            SlidingPattern::All => true,
            SlidingPattern::EvenLayers => layer.is_multiple_of(2),
            SlidingPattern::GlobalEvery(n) => !(layer + 1).is_multiple_of(n),
        }
    }
}
