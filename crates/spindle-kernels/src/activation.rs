//! Gated activations of the feed-forward block.

/// The activation applied to the gate projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (Llama, Mistral, Qwen).
    Silu,
    /// GELU with the tanh approximation (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
}

impl Activation {
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Silu => x / (1.0 + (-x).exp()),
            Activation::GeluTanh => {
                const SQRT_2_OVER_PI: f32 = 0.797_884_6;
                0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
            }
        }
    }
}

/// `gate[i] = act(gate[i]) * up[i]`, in place.
pub fn gated(act: Activation, gate: &mut [f32], up: &[f32]) {
    debug_assert_eq!(gate.len(), up.len());
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = act.apply(*g) * u;
    }
}

/// `x = tanh(x / cap) * cap`: Gemma 2's soft-capping of logits and scores.
pub fn soft_cap(x: &mut [f32], cap: f32) {
    for v in x {
        *v = (*v / cap).tanh() * cap;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // silu(1) = 1 / (1 + e^-1)
        assert!((Activation::Silu.apply(1.0) - 0.731_058_6).abs() < 1e-6);
        // PyTorch gelu(approximate="tanh")(1.0) = 0.8411920071
        assert!((Activation::GeluTanh.apply(1.0) - 0.841_192).abs() < 1e-6);
        assert!((Activation::GeluTanh.apply(-3.0) - (-0.003_637_392)).abs() < 1e-6);
        let mut g = [1.0f32, -1.0];
        gated(Activation::Silu, &mut g, &[2.0, 3.0]);
        assert!((g[0] - 1.462_117_2).abs() < 1e-6);
        let mut c = [100.0f32, -1.0];
        soft_cap(&mut c, 30.0);
        assert!((c[0] - 29.923_739).abs() < 1e-4);
    }
}
