//! From a text's rows to its vector.

use std::ops::Range;

use super::config::Pooling;

/// The vector of the text whose rows are `span` of `hidden` (rows of
/// `width`). Sums are taken in f64 in row order.
pub fn pool(hidden: &[f32], span: Range<usize>, width: usize, pooling: Pooling) -> Vec<f32> {
    let row = |r: usize| &hidden[r * width..(r + 1) * width];
    match pooling {
        Pooling::Cls => row(span.start).to_vec(),
        Pooling::Last => row(span.end - 1).to_vec(),
        Pooling::Mean => {
            let mut sum = vec![0.0f64; width];
            for r in span.clone() {
                for (s, &v) in sum.iter_mut().zip(row(r)) {
                    *s += v as f64;
                }
            }
            let n = span.len().max(1) as f64;
            sum.into_iter().map(|s| (s / n) as f32).collect()
        }
    }
}

/// Scales `v` to unit length (left as it is when all zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| (x as f64) * (x as f64))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        for x in v {
            *x = (*x as f64 / norm) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_and_normalizes() {
        let h = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(pool(&h, 0..3, 2, Pooling::Mean), vec![3.0, 4.0]);
        assert_eq!(pool(&h, 1..3, 2, Pooling::Cls), vec![3.0, 4.0]);
        assert_eq!(pool(&h, 0..2, 2, Pooling::Last), vec![3.0, 4.0]);
        let mut v = vec![3.0f32, 4.0];
        normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
    }
}
