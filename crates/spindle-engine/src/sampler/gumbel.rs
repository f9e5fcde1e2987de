//! Keyed Gumbel noise and the Gumbel-max choice over it: a counter-based
//! generator keyed by (seed, position, token), and `argmax(logit/T + g)`
//! computed without most of the variates, the same token bit for bit.

use super::argmax;

/// Draws above this are rare (1 - `SMALL_U` of them: 0.7%), and below it
/// a variate is at most ~5.
pub(super) const SMALL_U: f64 = 0.993_284_702_067_841_8;
/// The largest draw [`draw`] makes.
pub(super) const MAX_U: f64 = unit(u64::MAX >> 11);

/// The part of the generator's key shared by every token at one position.
pub(super) fn key(seed: u64, position: u64) -> u64 {
    mix(mix(seed ^ 0x9E37_79B9_7F4A_7C15) ^ position)
}

/// The odd constant a token id is multiplied by before the hash.
const TOKEN_MUL: u64 = 0xD6E8_FEB8_6659_FD93;

/// A uniform draw in (0, 1) keyed by (seed, position, token).
pub(super) fn draw(key: u64, token: u64) -> f64 {
    unit(draw_bits(key, token))
}

/// The 53 random bits of [`draw`].
fn draw_bits(key: u64, token: u64) -> u64 {
    mix(key ^ token.wrapping_mul(TOKEN_MUL)) >> 11
}

/// 53 random bits -> u in (0, 1).
const fn unit(bits: u64) -> f64 {
    (bits as f64 + 0.5) / (1u64 << 53) as f64
}

/// The standard Gumbel variate of draw `u`.
pub(super) fn gumbel_of(u: f64) -> f64 {
    -(-u.ln()).ln()
}

/// A standard Gumbel variate keyed by (seed, position, token).
#[cfg(test)]
pub(super) fn gumbel(seed: u64, position: u64, token: u64) -> f64 {
    gumbel_noise(seed, position as usize, token as u32)
}

/// SplitMix64 finaliser: a bijective, well-mixed hash of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The standard Gumbel variate [`super::sample`] adds to `token`'s scaled logit at
/// `position` under `seed`: count-based drafters rank their candidates by
/// it too.
pub fn gumbel_noise(seed: u64, position: usize, token: u32) -> f64 {
    gumbel_of(draw(key(seed, position as u64), token as u64))
}

/// The Gumbel variate of `id` at `keyed`, unless its scaled logit `x`
/// plus any variate it could have stays below `floor`: skipped on the
/// logit alone (against the largest variate there is) or on its uniform
/// draw (below [`SMALL_U`] the variate is at most that of `SMALL_U`).
/// The variate is non-decreasing in the draw, so only tokens whose score
/// is strictly below `floor` are skipped.
pub(super) fn variate_reaching(keyed: u64, id: u32, x: f64, floor: f64) -> Option<f64> {
    let u = draw(keyed, id as u64);
    (!skipped(x, u, floor)).then(|| gumbel_of(u))
}

/// Whether a token of scaled logit `x` and draw `u` cannot reach `floor`:
/// on the logit alone, against the largest variate there is, or on a draw
/// at most [`SMALL_U`], whose variate is at most `SMALL_U`'s. (No
/// short-circuit, so that 8 of them compile to vector operations.)
#[inline(always)]
fn skipped(x: f64, u: f64, floor: f64) -> bool {
    (x + gumbel_of(MAX_U) < floor) | ((u <= SMALL_U) & (x + gumbel_of(SMALL_U) < floor))
}

/// `argmax(logit/T + g)` over `candidates` (the lowest id wins a tie),
/// without computing most of the Gumbel variates.
///
/// Every variate costs two logarithms, and over a 262k-token vocabulary
/// those dominated sampling. The score of the most likely candidate is a
/// lower bound `b` on the best; a candidate whose score cannot reach `b`
/// is skipped on its logit alone (against the largest variate there is),
/// or on its uniform draw (a hash, no logarithm): below [`SMALL_U`] its
/// variate is at most that of `SMALL_U`. The variate is non-decreasing in
/// the draw and rounding keeps that order, so only candidates that
/// compare strictly below `b` are skipped: the token is the one the full
/// loop would choose, bit for bit.
pub(super) fn gumbel_argmax(
    candidates: impl Iterator<Item = (u32, f32)> + Clone,
    inv_t: f64,
    seed: u64,
    position: u64,
) -> u32 {
    let Some(top) = candidates
        .clone()
        .reduce(|a, b| if b.1 > a.1 { b } else { a })
    else {
        return 0;
    };
    let keyed = key(seed, position);
    let bound = score_bound(keyed, top, inv_t);
    gumbel_argmax_from(candidates, top.0, keyed, bound, inv_t)
}

/// [`gumbel_argmax`] over every token of `logits`, the same token bit for
/// bit, with the most likely token found by [`argmax`]'s 16-lane scan
/// (the first largest logit, as the reduce finds it) rather than a reduce
/// over (id, logit) pairs.
pub(super) fn gumbel_argmax_dense(logits: &[f32], inv_t: f64, seed: u64, position: u64) -> u32 {
    if logits.is_empty() {
        return 0;
    }
    let top_id = argmax(logits);
    let keyed = key(seed, position);
    let bound = score_bound(keyed, (top_id, logits[top_id as usize]), inv_t);
    // The tokens the pruned loop would skip are dropped beforehand, 8 at a
    // time.
    let mut left = Vec::new();
    unskipped(logits, 0, keyed, inv_t, bound, &mut left);
    gumbel_argmax_from(left.into_iter(), top_id, keyed, bound, inv_t)
}

/// The tokens of `logits` (token `first + i` at `i`, with their logits)
/// that [`variate_reaching`] does not skip against `floor`, into `out`
/// (cleared first): the same tests, on 8 tokens at a time (their hashes
/// and draws in vector registers where the CPU has 64-bit vector
/// multiplies).
pub(super) fn unskipped(
    logits: &[f32],
    first: u32,
    keyed: u64,
    inv_t: f64,
    floor: f64,
    out: &mut Vec<(u32, f32)>,
) {
    out.clear();
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512dq")
        && std::arch::is_x86_feature_detected!("avx512vl")
    {
        // SAFETY: the features are checked just above.
        return unsafe { unskipped_avx512(logits, first, keyed, inv_t, floor, out) };
    }
    unskipped_portable(logits, first, keyed, inv_t, floor, out)
}

/// [`unskipped`] compiled for AVX-512 (the same operations).
///
/// # Safety
/// AVX-512 F, DQ and VL available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512dq,avx512vl")]
unsafe fn unskipped_avx512(
    logits: &[f32],
    first: u32,
    keyed: u64,
    inv_t: f64,
    floor: f64,
    out: &mut Vec<(u32, f32)>,
) {
    unskipped_portable(logits, first, keyed, inv_t, floor, out)
}

#[inline(always)]
pub(super) fn unskipped_portable(
    logits: &[f32],
    first: u32,
    keyed: u64,
    inv_t: f64,
    floor: f64,
    out: &mut Vec<(u32, f32)>,
) {
    let mut chunks = logits.chunks_exact(8);
    let mut base = first;
    for chunk in &mut chunks {
        // Straight-line passes over the 8 lanes, which the compiler turns
        // into vector operations.
        let mut u = [0f64; 8];
        for (j, u) in u.iter_mut().enumerate() {
            *u = draw(keyed, (base + j as u32) as u64);
        }
        let mut keep = [false; 8];
        for (j, k) in keep.iter_mut().enumerate() {
            *k = !skipped(chunk[j] as f64 * inv_t, u[j], floor);
        }
        if keep.iter().fold(false, |any, &k| any | k) {
            for (j, &k) in keep.iter().enumerate() {
                if k {
                    out.push((base + j as u32, chunk[j]));
                }
            }
        }
        base += 8;
    }
    for (j, &logit) in chunks.remainder().iter().enumerate() {
        let id = base + j as u32;
        if !skipped(logit as f64 * inv_t, draw(keyed, id as u64), floor) {
            out.push((id, logit));
        }
    }
}

/// Variates at which [`variate_bound`] has a step. A draw above
/// [`SMALL_U`] has a variate above ~5; it is below 8 nineteen times in
/// twenty and below 12 in all but 1 in 1,100, so most such tokens far
/// below the best score need no logarithm.
const BOUND_STEPS: [f64; 5] = [8.0, 12.0, 17.0, 23.0, 30.0];

/// An upper bound on the variate of a draw from its bits: the variate of
/// the largest bits of the first step at or above them (the variate is
/// non-decreasing in the bits), else that of [`MAX_U`].
fn variate_bound(bits: u64) -> f64 {
    static STEPS: std::sync::OnceLock<[(u64, f64); 6]> = std::sync::OnceLock::new();
    let steps = STEPS.get_or_init(|| {
        let mut steps = [(u64::MAX, gumbel_of(MAX_U)); 6];
        for (step, g) in steps.iter_mut().zip(BOUND_STEPS) {
            let b = last_bits_where(|u| gumbel_of(u) <= g);
            *step = (b, gumbel_of(unit(b)));
        }
        steps
    });
    for &(b, g) in steps {
        if bits <= b {
            return g;
        }
    }
    gumbel_of(MAX_U)
}

/// The largest 53-bit draw whose `unit` satisfies `holds`, for a test
/// that holds from 0 up to some draw and not after (bisection).
fn last_bits_where(holds: impl Fn(f64) -> bool) -> u64 {
    let (mut lo, mut hi) = (0u64, 1u64 << 53);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if holds(unit(mid)) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The score of the most likely candidate `(top_id, top_logit)`: a lower
/// bound on the best score.
pub(super) fn score_bound(keyed: u64, (top_id, top_logit): (u32, f32), inv_t: f64) -> f64 {
    top_logit as f64 * inv_t + gumbel_of(draw(keyed, top_id as u64))
}

/// The pruned loop of [`gumbel_argmax`], from its most likely candidate
/// `top_id` and that candidate's score `bound`.
pub(super) fn gumbel_argmax_from(
    candidates: impl Iterator<Item = (u32, f32)>,
    top_id: u32,
    keyed: u64,
    bound: f64,
    inv_t: f64,
) -> u32 {
    let mut best = (f64::NEG_INFINITY, top_id);
    for (id, logit) in candidates {
        let x = logit as f64 * inv_t;
        let bits = draw_bits(keyed, id as u64);
        let u = unit(bits);
        // The variate's two logarithms only where a bound from the draw's
        // bits does not already keep the score below `bound`.
        if skipped(x, u, bound) || x + variate_bound(bits) < bound {
            continue;
        }
        let score = x + gumbel_of(u);
        if score > best.0 || (score == best.0 && id < best.1) {
            best = (score, id);
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every draw's variate is at most its bound, at each step's edge (where
    /// the bound is the variate itself) and across the draws above
    /// `SMALL_U` that reach the bounded loop.
    #[test]
    fn the_variate_bound_holds_for_every_draw() {
        let top = 1u64 << 53;
        let small = last_bits_where(|u| u <= SMALL_U);
        let mut bits: Vec<u64> = Vec::new();
        for g in BOUND_STEPS {
            let b = last_bits_where(|u| gumbel_of(u) <= g);
            bits.extend([b - 1, b, b + 1]);
        }
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..100_000 {
            x = mix(x);
            // Spread over the draws above SMALL_U, densest near the top.
            let gap = (top - small) >> (x % 40);
            bits.push(top - 1 - (mix(x) % gap.max(1)));
        }
        for b in bits {
            let g = gumbel_of(unit(b));
            assert!(
                g <= variate_bound(b),
                "draw bits {b}: variate {g} above {}",
                variate_bound(b)
            );
        }
        // The steps bound something: a draw just above SMALL_U is bounded
        // by the first step, not the largest variate.
        assert!(variate_bound(small + 1) <= BOUND_STEPS[0]);
    }
}
