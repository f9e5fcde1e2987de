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
                // 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)): one exp instead of a
                // tanh, same value to a few ulp (and exactly 0 or x at the extremes).
                const SQRT_2_OVER_PI: f32 = 0.797_884_6;
                let u = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
                x / (1.0 + (-2.0 * u).exp())
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
    fn gelu_matches_the_tanh_form() {
        for i in -2000..2000 {
            let x = i as f32 * 0.01;
            let u = 0.797_884_6f64 * (x as f64 + 0.044_715 * (x as f64).powi(3));
            let want = 0.5 * x as f64 * (1.0 + u.tanh());
            let got = Activation::GeluTanh.apply(x) as f64;
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1e-3),
                "x {x}: {got} vs {want}"
            );
        }
        assert_eq!(Activation::GeluTanh.apply(-100.0), 0.0);
        assert_eq!(Activation::GeluTanh.apply(100.0), 100.0);
    }

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
