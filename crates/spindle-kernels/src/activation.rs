//! Gated activations of the feed-forward block.
//!
//! The exponential is [`crate::softmax::exp_f32`], a polynomial in plain
//! operations, and [`gated`] is compiled per ISA ([`compiled_per_isa`]) so
//! that the compiler vectorises it: every path gives the same bits, where libm's `expf` would keep the loop
//! scalar (a 512-row prompt of Gemma 3 270M takes 19 M of them).

use crate::simd::compiled_per_isa;
use crate::softmax::exp_f32;

/// The activation applied to the gate projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (Llama, Mistral, Qwen).
    Silu,
    /// GELU with the tanh approximation (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
}

impl Activation {
    #[inline(always)]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Silu => x / (1.0 + exp_f32(-x)),
            Activation::GeluTanh => {
                // 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)): one exp instead of a
                // tanh, same value to a few ulp (and exactly 0 or x at the extremes).
                const SQRT_2_OVER_PI: f32 = 0.797_884_6;
                let u = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
                x / (1.0 + exp_f32(-2.0 * u))
            }
        }
    }
}

compiled_per_isa! {
    /// `gate[i] = act(gate[i]) * up[i]`, in place; the same bits on every ISA.
    pub fn gated(act: Activation, gate: &mut [f32], up: &[f32]) = gated_body;
}

#[inline(always)]
fn gated_body(act: Activation, gate: &mut [f32], up: &[f32]) {
    debug_assert_eq!(gate.len(), up.len());
    match act {
        // One loop per activation, so that each vectorises.
        Activation::Silu => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = Activation::Silu.apply(*g) * u;
            }
        }
        Activation::GeluTanh => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = Activation::GeluTanh.apply(*g) * u;
            }
        }
    }
}

compiled_per_isa! {
    /// `x[i] = gelu(x[i])` with the exact (erf) GELU, in place: BERT's
    /// `hidden_act = "gelu"`. The same bits on every ISA.
    pub fn gelu_erf(x: &mut [f32]) = gelu_erf_body;
}

#[inline(always)]
fn gelu_erf_body(x: &mut [f32]) {
    for v in x {
        *v = gelu_erf_one(*v);
    }
}

/// `0.5 x (1 + erf(x / sqrt 2))`, through `erfc(z) = t exp(-z^2 + P(t))`,
/// `t = 1 / (1 + z/2)` (the Chebyshev fit of Numerical Recipes' `erfcc`:
/// relative error below 1.2e-7 for every z), in plain operations so that
/// it vectorises.
#[inline(always)]
#[allow(clippy::excessive_precision)] // the published coefficients, as published
fn gelu_erf_one(x: f32) -> f32 {
    let z = (x * std::f32::consts::FRAC_1_SQRT_2).abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    // erfc(|z|), then Φ(x) = erfc(-x/√2) / 2 by the sign of x.
    let erfc = t * exp_f32(-z * z + p);
    let cdf = if x >= 0.0 {
        1.0 - 0.5 * erfc
    } else {
        0.5 * erfc
    };
    x * cdf
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
    use crate::simd::Isa;

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
    fn every_path_gives_the_scalar_bits() {
        let x: Vec<f32> = (0..4099).map(|i| (i as f32 - 2049.0) * 0.037).collect();
        let up: Vec<f32> = (0..4099).map(|i| 1.0 + i as f32 * 1e-3).collect();
        for act in [Activation::Silu, Activation::GeluTanh] {
            let mut want = x.clone();
            gated(Isa::Scalar, act, &mut want, &up);
            for isa in crate::simd::available_isas() {
                let mut got = x.clone();
                gated(isa, act, &mut got, &up);
                assert_eq!(got, want, "{act:?} on {isa}");
            }
        }
    }

    #[test]
    fn gelu_erf_matches_f64_and_every_path() {
        // erf in f64 by its series (|z| < 3) or asymptotic tail: enough
        // digits to judge an f32.
        fn erf64(z: f64) -> f64 {
            if z.abs() > 3.0 {
                let mut term = 1.0;
                let mut sum = 1.0;
                for k in 1..12 {
                    term *= -((2 * k - 1) as f64) / (2.0 * z * z);
                    sum += term;
                }
                return z.signum()
                    * (1.0 - (-z * z).exp() / (z.abs() * std::f64::consts::PI.sqrt()) * sum);
            }
            let mut term = z;
            let mut sum = z;
            for n in 1..200 {
                term *= -z * z / n as f64;
                sum += term / (2 * n + 1) as f64;
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        }
        let x: Vec<f32> = (-1200..1200).map(|i| i as f32 * 0.01).collect();
        for &v in &x {
            let want = 0.5 * v as f64 * (1.0 + erf64(v as f64 / 2f64.sqrt()));
            let got = gelu_erf_one(v) as f64;
            assert!(
                (got - want).abs() <= 2e-7 * v.abs().max(1e-2) as f64,
                "x {v}: {got} vs {want}"
            );
        }
        // PyTorch: gelu(1.0) = 0.8413447, gelu(-1.0) = -0.1586553.
        assert!((gelu_erf_one(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((gelu_erf_one(-1.0) + 0.158_655_3).abs() < 1e-6);
        let mut want = x.clone();
        gelu_erf(Isa::Scalar, &mut want);
        for isa in crate::simd::available_isas() {
            let mut got = x.clone();
            gelu_erf(isa, &mut got);
            assert_eq!(got, want, "{isa}");
        }
    }

    #[test]
    fn silu_matches_f64() {
        for i in -2000..2000 {
            let x = i as f32 * 0.05;
            let want = x as f64 / (1.0 + (-(x as f64)).exp());
            let got = Activation::Silu.apply(x) as f64;
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1e-3),
                "x {x}: {got} vs {want}"
            );
        }
        assert_eq!(Activation::Silu.apply(-200.0), 0.0);
        assert_eq!(Activation::Silu.apply(200.0), 200.0);
    }

    #[test]
    fn known_values() {
        // silu(1) = 1 / (1 + e^-1)
        assert!((Activation::Silu.apply(1.0) - 0.731_058_6).abs() < 1e-6);
        // PyTorch gelu(approximate="tanh")(1.0) = 0.8411920071
        assert!((Activation::GeluTanh.apply(1.0) - 0.841_192).abs() < 1e-6);
        assert!((Activation::GeluTanh.apply(-3.0) - (-0.003_637_392)).abs() < 1e-6);
        let mut g = [1.0f32, -1.0];
        gated(Isa::Scalar, Activation::Silu, &mut g, &[2.0, 3.0]);
        assert!((g[0] - 1.462_117_2).abs() < 1e-6);
        let mut c = [100.0f32, -1.0];
        soft_cap(&mut c, 30.0);
        assert!((c[0] - 29.923_739).abs() < 1e-4);
    }
}
