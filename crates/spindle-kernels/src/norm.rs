//! RMS normalisation (decoders) and layer normalisation (encoders).

/// `out = x / sqrt(mean(x^2) + eps) * weight`, one row.
///
/// The sum of squares is taken in f64 (lane by lane, [`lanes_sum`]), so the
/// result depends only on the row (batch-invariant) and stays close to a
/// float32 reference.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert_eq!(x.len(), weight.len());
    debug_assert_eq!(x.len(), out.len());
    let inv = inv_rms(x, eps);
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = (v * inv) * w;
    }
}

/// In-place variant of [`rms_norm`].
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    debug_assert_eq!(x.len(), weight.len());
    let inv = inv_rms(x, eps);
    for (v, &w) in x.iter_mut().zip(weight) {
        *v = (*v * inv) * w;
    }
}

fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let ss = lanes_sum(x, |v| v * v);
    let mean = ss / x.len().max(1) as f64;
    (1.0 / (mean + eps as f64).sqrt()) as f32
}

/// `sum f(x[k])` in f64, element `k` in lane `k % 8`, the lanes then added
/// in a fixed order: the result depends only on the row, and the 8 chains
/// run side by side (one chain of f64 adds in index order made the norms of
/// a 16-row pass ~5% of it, docs/PERF.md §50).
fn lanes_sum(x: &[f32], f: impl Fn(f64) -> f64) -> f64 {
    let mut l = [0.0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for chunk in &mut chunks {
        for (a, &v) in l.iter_mut().zip(chunk) {
            *a += f(v as f64);
        }
    }
    for (a, &v) in l.iter_mut().zip(chunks.remainder()) {
        *a += f(v as f64);
    }
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// `x = (x - mean) / sqrt(var + eps) * weight + bias`, one row, in place
/// (BERT's LayerNorm). Mean and variance are summed in f64, element `k` in
/// lane `k % 8`, the lanes then added in a fixed order: the result depends
/// only on the row, and the sums vectorise.
pub fn layer_norm_inplace(x: &mut [f32], weight: &[f32], bias: &[f32], eps: f32) {
    debug_assert_eq!(x.len(), weight.len());
    debug_assert_eq!(x.len(), bias.len());
    let n = x.len().max(1) as f64;
    let mean = lanes_sum(x, |v| v) / n;
    let var = lanes_sum(x, |v| (v - mean) * (v - mean)) / n;
    let inv = 1.0 / (var + eps as f64).sqrt();
    for ((v, &w), &b) in x.iter_mut().zip(weight).zip(bias) {
        *v = ((*v as f64 - mean) * inv) as f32 * w + b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_norm_matches_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let w = [1.0f32, 0.5, 2.0, -1.0];
        let b = [0.1f32, 0.0, -0.2, 0.3];
        let mut y = x;
        layer_norm_inplace(&mut y, &w, &b, 1e-12);
        let mean = (1.0 - 2.0 + 3.0 + 0.5) / 4.0f64;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / 4.0;
        for i in 0..4 {
            let want = (x[i] as f64 - mean) / var.sqrt() * w[i] as f64 + b[i] as f64;
            assert!((y[i] as f64 - want).abs() < 1e-6, "{i}: {} vs {want}", y[i]);
        }
    }

    #[test]
    fn matches_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let w = [1.0f32, 0.5, 2.0, -1.0];
        let mut out = [0.0f32; 4];
        rms_norm(&x, &w, 1e-6, &mut out);
        let ms = (1.0 + 4.0 + 9.0 + 0.25) / 4.0f64;
        let inv = 1.0 / (ms + 1e-6).sqrt();
        for i in 0..4 {
            let want = (x[i] as f64 * inv * w[i] as f64) as f32;
            assert!((out[i] - want).abs() < 1e-6, "{i}: {} vs {want}", out[i]);
        }
        let mut y = x;
        rms_norm_inplace(&mut y, &w, 1e-6);
        assert_eq!(y, out);
    }
}
