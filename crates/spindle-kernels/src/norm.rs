//! RMS normalisation.

/// `out = x / sqrt(mean(x^2) + eps) * weight`, one row.
///
/// The sum of squares is taken in f64 in index order, so the result depends
/// only on the row (batch-invariant) and stays close to a float32 reference.
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
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let mean = ss / x.len().max(1) as f64;
    (1.0 / (mean + eps as f64).sqrt()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

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
