//! The log of a softmax's normaliser over a whole vocabulary row, fast:
//! scoring reads a few log-probabilities from rows of 262k logits, and
//! `f64::exp` on each of them costs more than the output head's row.

/// `ln(sum(exp(x)))`, with `exp` as a branch-free f32 polynomial (relative
/// error below 3e-7, so the result is within about 3e-7 of the exact one)
/// that the compiler vectorises, summed in f64 per chunk. `-inf` for an
/// empty row.
pub fn log_sum_exp(x: &[f32]) -> f64 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max as f64;
    }
    let mut total = 0.0f64;
    let mut buf = [0.0f32; 64];
    for chunk in x.chunks(64) {
        let e = &mut buf[..chunk.len()];
        for (o, &v) in e.iter_mut().zip(chunk) {
            *o = exp_nonpositive(v - max);
        }
        total += e.iter().sum::<f32>() as f64;
    }
    max as f64 + total.ln()
}

/// `x = n ln 2 + r` with `|r| <= ln2/2` (`x` in [-87, 88.7]): `n` and
/// `p(r) = exp(r)`. Plain operations only (no fused multiply-add, no
/// libm), so that the compiler's vectorised copies of a loop over it give
/// the scalar bits (attention's softmax and the activations rely on that).
#[inline(always)]
fn reduced(x: f32) -> (i32, f32) {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that `n * LN2_HI` is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5 * 2^23 rounds to an integer (ties to even), held in the
    // low mantissa bits: no float-to-int conversion is needed.
    const MAGIC: f32 = 12_582_912.0;
    let t = x * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // Taylor to degree 7 about 0: truncation below 1e-8 on |r| <= 0.347,
    // the rest is f32 rounding.
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // `t`'s bits are MAGIC's plus n.
    (t.to_bits().wrapping_sub(MAGIC.to_bits()) as i32, p)
}

/// `2^n` for `n` in [-126, 127], from the exponent bits.
#[inline(always)]
fn pow2(n: i32) -> f32 {
    f32::from_bits(((n + 127) as u32) << 23)
}

/// `exp(x)` for `x <= 0`: `2^n * p(r)` ([`reduced`]). Below -87 the result
/// is `exp(-87)` (about 1.6e-38).
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    let (n, p) = reduced(x.max(-87.0));
    p * pow2(n)
}

/// `exp(x)` for any `x`: [`reduced`]'s polynomial, with `2^n` split in two
/// factors so that `n` may reach 128; infinity above 88.7, `exp(-87)` below
/// -87.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    let big = x > 88.7;
    let (n, p) = reduced(x.clamp(-87.0, 88.7));
    // n in [-126, 128]: 2^n as 2^h * 2^(n - h), h = n / 2 rounded down.
    let h = n >> 1;
    let y = p * pow2(h) * pow2(n - h);
    if big {
        f32::INFINITY
    } else {
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(x: &[f32]) -> f64 {
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        max + x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln()
    }

    #[test]
    fn exp_is_within_3e_7_relative() {
        for i in 0..87_000 {
            let x = -(i as f32) * 1e-3;
            let (got, want) = (exp_nonpositive(x) as f64, (x as f64).exp());
            assert!(((got - want) / want).abs() < 3e-7, "{x}: {got} vs {want}");
        }
        assert_eq!(exp_nonpositive(-1000.0), exp_nonpositive(-87.0));
        assert!(exp_nonpositive(-87.0) > 0.0 && exp_nonpositive(-87.0) < 2e-38);
    }

    #[test]
    fn exp_f32_is_within_4e_7_relative() {
        for i in -86_999..88_700 {
            let x = i as f32 * 1e-3;
            let (got, want) = (exp_f32(x) as f64, (x as f64).exp());
            assert!(((got - want) / want).abs() < 4e-7, "{x}: {got} vs {want}");
        }
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(-1000.0) > 0.0 && exp_f32(-1000.0) < 2e-38);
    }

    #[test]
    fn log_sum_exp_matches_f64_on_vocabulary_sized_rows() {
        let mut state = 0x1234_5678u32;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state as f32 / u32::MAX as f32) * 40.0 - 25.0
        };
        for n in [1, 7, 64, 65, 262_144] {
            let x: Vec<f32> = (0..n).map(|_| next()).collect();
            let (got, want) = (log_sum_exp(&x), exact(&x));
            assert!((got - want).abs() < 1e-6, "{n}: {got} vs {want}");
        }
        assert_eq!(log_sum_exp(&[]), f64::NEG_INFINITY);
        assert_eq!(log_sum_exp(&[3.0, f32::NEG_INFINITY]), 3.0);
    }
}
