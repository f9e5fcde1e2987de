//! Rotary position embeddings.

/// How the rotated pairs are laid out in a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(x[2i], x[2i+1])`: GGUF Llama, whose Q/K rows were permuted at conversion.
    Interleaved,
    /// Pairs `(x[i], x[i + d/2])`: Hugging Face `rotate_half`, Qwen, Gemma (GGUF "NEOX").
    Neox,
}

/// Inverse frequencies of one layer: `1 / (base^(2i/d) * factor_i)` for the
/// rotated dimensions, computed once at load.
#[derive(Debug, Clone)]
pub struct RopeTable {
    pub style: RopeStyle,
    pub inv_freq: Vec<f32>,
}

impl RopeTable {
    /// `rot_dims` rotated dimensions (usually the head size), with optional
    /// per-pair frequency divisors (Llama 3 scaling) and a linear position scale.
    pub fn new(
        style: RopeStyle,
        base: f32,
        rot_dims: usize,
        freq_factors: Option<&[f32]>,
        linear_scale: f32,
    ) -> Self {
        let half = rot_dims / 2;
        let inv_freq = (0..half)
            .map(|i| {
                // Same expression as the reference: base ** (2i/d) in float32.
                let f = 1.0f32 / base.powf((2 * i) as f32 / rot_dims as f32);
                let div = freq_factors
                    .and_then(|ff| ff.get(i))
                    .copied()
                    .unwrap_or(1.0);
                f / div / linear_scale
            })
            .collect();
        RopeTable { style, inv_freq }
    }

    /// Rotates every head of `x` (`n_heads * head_dim` values) for position `pos`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        self.apply_all(&mut [x], head_dim, pos);
    }

    /// Rotates every head of every slice (a row's queries and keys) for
    /// position `pos`, computing the angles once.
    pub fn apply_all(&self, xs: &mut [&mut [f32]], head_dim: usize, pos: usize) {
        let half = self.inv_freq.len();
        let mut cs = [(0.0f32, 0.0f32); 512];
        for (i, c) in cs.iter_mut().take(half).enumerate() {
            let theta = pos as f32 * self.inv_freq[i];
            *c = (theta.cos(), theta.sin());
        }
        for x in xs.iter_mut() {
            for head in x.chunks_exact_mut(head_dim) {
                for (i, &(cos, sin)) in cs.iter().take(half).enumerate() {
                    let (a, b) = match self.style {
                        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                        RopeStyle::Neox => (i, i + half),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * cos - x1 * sin;
                    head[b] = x1 * cos + x0 * sin;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_preserves_norm_and_matches_formula() {
        let t = RopeTable::new(RopeStyle::Neox, 10000.0, 4, None, 1.0);
        let mut x = [1.0f32, 2.0, 3.0, 4.0];
        t.apply(&mut x, 4, 3);
        // pair (0,2) rotates by 3 rad, pair (1,3) by 3 * 10000^-0.5
        let (c0, s0) = (3.0f32.cos(), 3.0f32.sin());
        assert!((x[0] - (1.0 * c0 - 3.0 * s0)).abs() < 1e-6);
        assert!((x[2] - (3.0 * c0 + 1.0 * s0)).abs() < 1e-6);
        let n: f32 = x.iter().map(|v| v * v).sum();
        assert!((n - 30.0).abs() < 1e-4);
        let ti = RopeTable::new(RopeStyle::Interleaved, 10000.0, 4, None, 1.0);
        let mut y = [1.0f32, 3.0, 2.0, 4.0];
        ti.apply(&mut y, 4, 3);
        assert!((y[0] - x[0]).abs() < 1e-6 && (y[1] - x[2]).abs() < 1e-6);
        assert!((y[2] - x[1]).abs() < 1e-6 && (y[3] - x[3]).abs() < 1e-6);
    }
}
