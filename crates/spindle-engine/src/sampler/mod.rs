//! Token sampling as a pure function of (settings, seed, position, logits,
//! history).
//!
//! Randomness comes from a counter-based generator keyed by the seed, the
//! absolute position and the token id, and a token is chosen by Gumbel-max:
//! `argmax(logit/T + g)`, which samples exactly from the softmax over the
//! candidates left by the filters. Because nothing depends on how many passes
//! or which batch produced the logits, speculative and batched decoding can
//! reproduce plain decoding token for token at any temperature.

use std::collections::HashMap;

mod gumbel;
mod pieces;

pub use gumbel::gumbel_noise;
use gumbel::{draw, gumbel_argmax, gumbel_argmax_dense, gumbel_of, key, variate_reaching};
#[cfg(test)]
use gumbel::{gumbel, unskipped, unskipped_portable, MAX_U, SMALL_U};
pub use pieces::{PieceChoice, PieceChooser};

/// Sampling settings. The defaults are plain greedy decoding.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// 0 (or less) means greedy.
    pub temperature: f32,
    /// Keep the `k` most likely tokens (0: off).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `p` (1: off).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0: off).
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recent tokens (1: off).
    pub repetition_penalty: f32,
    /// Subtracted from logits of tokens present in the recent history.
    pub presence_penalty: f32,
    /// Subtracted once per occurrence in the recent history.
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Whether sampling draws from every token (no top-k, top-p or min-p
    /// cut): then the token drawn from a subset is the one drawn from all
    /// whenever that one is in the subset (the same Gumbel noise per token).
    pub fn filters_nothing(&self) -> bool {
        self.top_k == 0 && self.top_p >= 1.0 && self.min_p <= 0.0
    }

    /// Whether the chosen token can be found from bounds on the logits and
    /// a few exact ones ([`choose_bounded`]): greedy or an uncut draw, and
    /// no penalties (which would need every logit of the recent tokens).
    pub fn chooses_from_bounds(&self) -> bool {
        !self.has_penalties() && (self.is_greedy() || self.filters_nothing())
    }

    fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }
}

/// Chooses the token at absolute `position` from `logits`, given the tokens
/// before it (`history`, for the penalties).
pub fn sample(cfg: &SamplerConfig, logits: &[f32], history: &[u32], position: usize) -> u32 {
    let logits = &*penalised(cfg, logits, history);
    if cfg.is_greedy() {
        return argmax(logits);
    }
    let inv_t = 1.0 / cfg.temperature as f64;
    if cfg.filters_nothing() {
        return gumbel_argmax_dense(logits, inv_t, cfg.seed, position as u64);
    }
    let candidates = filter(cfg, logits);
    gumbel_argmax(candidates.into_iter(), inv_t, cfg.seed, position as u64)
}

/// `logits` after the repetition, presence and frequency penalties of
/// `cfg` over the recent `history` (borrowed when there are none).
fn penalised<'a>(
    cfg: &SamplerConfig,
    logits: &'a [f32],
    history: &[u32],
) -> std::borrow::Cow<'a, [f32]> {
    if !cfg.has_penalties() {
        return logits.into();
    }
    let mut owned = logits.to_vec();
    apply_penalties(cfg, &mut owned, history);
    owned.into()
}

/// How far below the best score (in nats) a token's share of a
/// [`coupled_choice`] stops counting: e^-16 each.
const SHARE_CUTOFF: f64 = 16.0;

/// A token a drafter proposes, with its confidence that the target picks it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Proposal {
    pub token: u32,
    /// In 0..=1.
    pub confidence: f32,
}

/// The two tokens a drafter should propose at `position` from its own
/// `logits`, coupled to the target's noise: ranked by the score [`sample`]
/// draws with (`logit/T + g`, keyed by the same seed, position and token,
/// after the same penalties and filters), so that the first is exactly
/// the token `sample` chooses from these logits. A target whose logits are
/// close picks the same token far more often than it picks an argmax draft
/// (Gumbel coupling: at least (1-TV)/(1+TV) of the time). Each confidence
/// is the token's share of `exp(score)` over every candidate, the chance it
/// stays on top if the scores moved by fresh Gumbel noise; greedy, that is
/// the plain softmax probability of the argmax. Sampling settings only
/// (greedy drafters rank by logit); `None` when no candidate is finite.
pub fn coupled_choice(
    cfg: &SamplerConfig,
    logits: &[f32],
    history: &[u32],
    position: usize,
) -> Option<(Proposal, Option<Proposal>)> {
    debug_assert!(!cfg.is_greedy());
    let logits = &*penalised(cfg, logits, history);
    let inv_t = 1.0 / cfg.temperature as f64;
    let candidates: Vec<(u32, f32)> = if cfg.filters_nothing() {
        logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect()
    } else {
        filter(cfg, logits)
    };
    let keyed = key(cfg.seed, position as u64);
    let score = |logit: f32, id: u32| logit as f64 * inv_t + gumbel_of(draw(keyed, id as u64));
    let (top_id, top_logit) = candidates
        .iter()
        .copied()
        .reduce(|a, b| if b.1 > a.1 { b } else { a })?;
    // The most likely candidate's score bounds the best from below: a
    // token whose score cannot come within the cutoff of it neither wins
    // nor counts, and is skipped on its logit or draw alone, as in
    // `gumbel_argmax` (the same arithmetic, so the same winner).
    let floor = score(top_logit, top_id) - SHARE_CUTOFF;
    if !floor.is_finite() {
        return None;
    }
    let mut scored = Vec::new();
    for &(id, logit) in &candidates {
        let x = logit as f64 * inv_t;
        if let Some(g) = variate_reaching(keyed, id, x, floor) {
            if !(x + g).is_nan() {
                scored.push((x + g, id));
            }
        }
    }
    let better = |a: (f64, u32), b: (f64, u32)| a.0 > b.0 || (a.0 == b.0 && a.1 < b.1);
    let mut best = (f64::NEG_INFINITY, top_id);
    let mut second: Option<(f64, u32)> = None;
    for &s in &scored {
        if better(s, best) {
            second = Some(best).filter(|b| b.0 > f64::NEG_INFINITY);
            best = s;
        } else if second.is_none_or(|r| better(s, r)) {
            second = Some(s);
        }
    }
    let total: f64 = scored.iter().map(|s| (s.0 - best.0).exp()).sum();
    let share = |s: f64| ((s - best.0).exp() / total) as f32;
    Some((
        Proposal {
            token: best.1,
            confidence: share(best.0),
        },
        second.map(|s| Proposal {
            token: s.1,
            confidence: share(s.0),
        }),
    ))
}

/// The exact logits of some tokens, in the order asked.
pub type ExactLogits<'a, E> = dyn FnMut(&[u32]) -> Result<Vec<f32>, E> + 'a;

/// Most candidates [`choose_bounded`] computes exactly before it gives up
/// (the full head is cheaper past a tenth or so of a large vocabulary).
pub const MAX_BOUNDED_CANDIDATES: usize = 8192;

/// The token [`sample`] would choose from the full logits, found from upper
/// bounds `ub` on every logit (as the head computes them) and the exact
/// logits `exact(ids)` of only the tokens whose bound can still win;
/// `likeliest` is a guess at the winner whose exact logit starts the
/// search. `None` when more than [`MAX_BOUNDED_CANDIDATES`] tokens remain
/// (then sample from the full logits). Only for settings where
/// [`SamplerConfig::chooses_from_bounds`].
///
/// Greedy: every token whose logit reaches the guess's is a candidate, so
/// the largest logit (lowest id on a tie) is among them. Sampling: the
/// guess's score `logit/T + g` bounds the best from below; a token whose
/// bound plus its own variate stays below it cannot win (the variates are
/// the ones `sample` draws, keyed by seed, position and token).
pub fn choose_bounded<E>(
    cfg: &SamplerConfig,
    ub: &[f32],
    likeliest: u32,
    position: usize,
    exact: &mut ExactLogits<'_, E>,
) -> Result<Option<u32>, E> {
    debug_assert!(cfg.chooses_from_bounds());
    let first = exact(&[likeliest])?[0];
    let mut candidates = Vec::new();
    if cfg.is_greedy() {
        for (i, &u) in ub.iter().enumerate() {
            if u >= first {
                candidates.push(i as u32);
                if candidates.len() > MAX_BOUNDED_CANDIDATES {
                    return Ok(None);
                }
            }
        }
        let logits = exact(&candidates)?;
        let mut best = (f32::NEG_INFINITY, likeliest);
        for (&id, &l) in candidates.iter().zip(&logits) {
            if l > best.0 || (l == best.0 && id < best.1) {
                best = (l, id);
            }
        }
        return Ok(Some(best.1));
    }
    let inv_t = 1.0 / cfg.temperature as f64;
    let keyed = key(cfg.seed, position as u64);
    let score = |logit: f32, id: u32| logit as f64 * inv_t + gumbel_of(draw(keyed, id as u64));
    let bound = score(first, likeliest);
    for (i, &u) in ub.iter().enumerate() {
        // The pruned Gumbel-max's test, on the token's upper bound.
        let x = u as f64 * inv_t;
        match variate_reaching(keyed, i as u32, x, bound) {
            Some(g) if x + g < bound => continue,
            None => continue,
            Some(_) => {}
        }
        candidates.push(i as u32);
        if candidates.len() > MAX_BOUNDED_CANDIDATES {
            return Ok(None);
        }
    }
    let logits = exact(&candidates)?;
    let mut best = (f64::NEG_INFINITY, likeliest);
    for (&id, &l) in candidates.iter().zip(&logits) {
        let s = score(l, id);
        if s > best.0 || (s == best.0 && id < best.1) {
            best = (s, id);
        }
    }
    Ok(Some(best.1))
}

/// The largest value of `logits` that is not NaN (minus infinity when
/// there is none), from 16 running lane maxima.
#[inline]
fn largest(logits: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = logits.chunks_exact(16);
    for chunk in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(chunk) {
            *l = if v > *l { v } else { *l };
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &v in lanes.iter().chain(chunks.remainder()) {
        if v > max {
            max = v;
        }
    }
    max
}

/// The most likely token; the lowest id wins a tie.
pub fn argmax(logits: &[f32]) -> u32 {
    // The token a left-to-right scan keeping the first strictly larger
    // value finds (a NaN never wins, a NaN first is never replaced), from
    // a 16-lane maximum and a search for its first occurrence: the scan
    // itself runs one comparison at a time over the whole vocabulary.
    let Some(&first) = logits.first() else {
        return 0;
    };
    if first.is_nan() {
        return 0;
    }
    first_of(logits, largest(logits)).unwrap_or(0) as u32
}

/// The first index of `value` in `logits`, 16 values a step.
#[inline]
fn first_of(logits: &[f32], value: f32) -> Option<usize> {
    for (c, chunk) in logits.chunks(16).enumerate() {
        if chunk.iter().fold(false, |any, &v| any | (v == value)) {
            return chunk.iter().position(|&v| v == value).map(|j| 16 * c + j);
        }
    }
    None
}

fn apply_penalties(cfg: &SamplerConfig, logits: &mut [f32], history: &[u32]) {
    let recent = &history[history.len().saturating_sub(cfg.penalty_last_n)..];
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in recent {
        *counts.entry(t).or_default() += 1;
    }
    for (&t, &c) in &counts {
        let Some(l) = logits.get_mut(t as usize) else {
            continue;
        };
        if cfg.repetition_penalty != 1.0 {
            *l = if *l > 0.0 {
                *l / cfg.repetition_penalty
            } else {
                *l * cfg.repetition_penalty
            };
        }
        *l -= cfg.presence_penalty + cfg.frequency_penalty * c as f32;
    }
}

/// Candidates `(id, logit)` left by top-k, top-p and min-p (in that order,
/// as Hugging Face applies them).
fn filter(cfg: &SamplerConfig, logits: &[f32]) -> Vec<(u32, f32)> {
    let mut cands: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l))
        .collect();
    let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if cfg.top_k > 0 && cfg.top_k < cands.len() {
        cands.select_nth_unstable_by(cfg.top_k - 1, by_logit);
        cands.truncate(cfg.top_k);
    }
    let needs_order = cfg.top_p < 1.0 || cfg.min_p > 0.0;
    if !needs_order {
        return cands;
    }
    // Probabilities at temperature T over the current candidates.
    let inv_t = 1.0 / cfg.temperature as f64;
    let max = cands.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = cands
        .iter()
        .map(|c| ((c.1 as f64 - max) * inv_t).exp())
        .sum();
    if cfg.top_p < 1.0 {
        // Sort only the head of the distribution when it already reaches top_p.
        let head = 1024.min(cands.len());
        if head < cands.len() {
            cands.select_nth_unstable_by(head - 1, by_logit);
        }
        cands[..head].sort_by(by_logit);
        let mut cum = 0.0;
        let mut keep = None;
        for (i, c) in cands[..head].iter().enumerate() {
            cum += ((c.1 as f64 - max) * inv_t).exp() / z;
            if cum >= cfg.top_p as f64 {
                keep = Some(i + 1);
                break;
            }
        }
        match keep {
            Some(k) => cands.truncate(k),
            None => {
                cands.sort_by(by_logit);
                let mut cum = 0.0;
                let k = cands
                    .iter()
                    .position(|c| {
                        cum += ((c.1 as f64 - max) * inv_t).exp() / z;
                        cum >= cfg.top_p as f64
                    })
                    .map_or(cands.len(), |i| i + 1);
                cands.truncate(k);
            }
        }
    }
    // min-p is relative to the most likely token, so renormalising does not move it.
    if cfg.min_p > 0.0 {
        // p_i >= min_p * p_max  <=>  (l_i - max)/T >= ln(min_p)
        let cut = (cfg.min_p as f64).ln();
        cands.retain(|c| (c.1 as f64 - max) * inv_t >= cut);
    }
    cands
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The full Gumbel-max loop, every variate computed: the reference the
    /// pruned [`gumbel_argmax`] must match.
    fn full_loop(cands: &[(u32, f32)], inv_t: f64, seed: u64, position: u64) -> u32 {
        let mut best = (f64::NEG_INFINITY, cands.first().map_or(0, |c| c.0));
        for &(id, logit) in cands {
            let score = logit as f64 * inv_t + gumbel(seed, position, id as u64);
            if score > best.0 || (score == best.0 && id < best.1) {
                best = (score, id);
            }
        }
        best.1
    }

    #[test]
    fn pruned_gumbel_max_chooses_what_the_full_loop_chooses() {
        let mut next = uniform_floats(0x2545_f491_4f6c_dd1du64);
        for trial in 0..400u64 {
            // Flat, peaked and tied logit sets, at low and high temperature.
            let n = [2usize, 50, 5000][trial as usize % 3];
            let spread = [0.5f32, 8.0, 30.0][(trial / 3) as usize % 3];
            let mut cands: Vec<(u32, f32)> =
                (0..n).map(|i| (i as u32 * 3, next() * spread)).collect();
            if trial % 7 == 0 {
                // Two candidates share the largest logit.
                let top = cands.iter().map(|c| c.1).fold(f32::MIN, f32::max);
                cands[n / 2].1 = top;
            }
            let inv_t = 1.0 / [0.1f64, 0.8, 1.5, 5.0][(trial / 9) as usize % 4];
            let (seed, pos) = (trial * 31 + 5, trial * 7);
            let want = full_loop(&cands, inv_t, seed, pos);
            let got = gumbel_argmax(cands.iter().copied(), inv_t, seed, pos);
            assert_eq!(
                got, want,
                "trial {trial}: n {n} spread {spread} 1/T {inv_t}"
            );
        }
        // The bound on the variates below SMALL_U holds.
        assert!(gumbel_of(SMALL_U) < 5.0 + 1e-9 && gumbel_of(SMALL_U) > 5.0 - 1e-9);
        assert!(gumbel_of(MAX_U) > 36.0);
    }

    #[test]
    fn unskipped_keeps_the_tokens_variate_reaching_keeps() {
        let mut next = uniform_floats(0x0dd_ba11_cafe_f00du64);
        for trial in 0..60u64 {
            let n = [7usize, 8, 9, 1000, 4103][trial as usize % 5];
            let spread = [0.5f32, 8.0, 30.0][(trial / 5) as usize % 3];
            let mut l: Vec<f32> = (0..n).map(|_| next() * spread).collect();
            if trial % 4 == 0 {
                l[n / 2] = f32::NAN;
            }
            let inv_t = 1.0 / [0.3f64, 0.8, 2.0][(trial / 15) as usize % 3];
            let keyed = key(trial * 17 + 1, trial);
            let floor = l.iter().copied().fold(f32::MIN, f32::max) as f64 * inv_t + 2.0;
            let want: Vec<(u32, f32)> = l
                .iter()
                .enumerate()
                .filter(|&(i, &v)| {
                    variate_reaching(keyed, i as u32, v as f64 * inv_t, floor).is_some()
                })
                .map(|(i, &v)| (i as u32, v))
                .collect();
            let bits =
                |v: &[(u32, f32)]| v.iter().map(|&(i, x)| (i, x.to_bits())).collect::<Vec<_>>();
            assert_eq!(
                bits(&{
                    let mut v = Vec::new();
                    unskipped(&l, 0, keyed, inv_t, floor, &mut v);
                    v
                }),
                bits(&want),
                "trial {trial}"
            );
            assert_eq!(
                bits(&{
                    let mut v = Vec::new();
                    unskipped_portable(&l, 0, keyed, inv_t, floor, &mut v);
                    v
                }),
                bits(&want),
                "trial {trial}"
            );
        }
    }

    /// A xorshift stream of floats in [0, 1) from `seed`.
    fn uniform_floats(seed: u64) -> impl FnMut() -> f32 {
        let mut x = seed;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32
        }
    }

    /// The left-to-right scan [`argmax`] must agree with.
    fn scan_argmax(logits: &[f32]) -> u32 {
        let mut best = 0usize;
        for (i, &v) in logits.iter().enumerate() {
            if v > logits[best] {
                best = i;
            }
        }
        best as u32
    }

    #[test]
    fn argmax_and_dense_gumbel_max_choose_what_the_plain_loops_choose() {
        let mut next = uniform_floats(0x51_7cc1_b727_220au64);
        for trial in 0..300u64 {
            // Lengths around the 16-lane chunks, flat to peaked logits,
            // ties, signed zeros, NaN and minus infinity.
            let n = [1usize, 15, 16, 17, 100, 4099][trial as usize % 6];
            let spread = [0.5f32, 8.0, 30.0][(trial / 6) as usize % 3];
            let mut l: Vec<f32> = (0..n).map(|_| next() * spread - spread / 2.0).collect();
            match trial % 5 {
                0 => {
                    let top = l.iter().copied().fold(f32::MIN, f32::max);
                    l[n / 2] = top;
                    l[n - 1] = top;
                }
                1 => {
                    l.iter_mut().step_by(3).for_each(|v| *v = f32::NEG_INFINITY);
                    l[n / 2] = f32::NAN;
                }
                2 => l
                    .iter_mut()
                    .for_each(|v| *v = if *v < 0.0 { -0.0 } else { 0.0 }),
                3 if n > 1 => l[0] = f32::NAN,
                _ => {}
            }
            assert_eq!(argmax(&l), scan_argmax(&l), "trial {trial}: argmax, n {n}");
            let inv_t = 1.0 / [0.1f64, 0.8, 1.5, 5.0][(trial / 18) as usize % 4];
            let (seed, pos) = (trial * 131 + 9, trial * 3);
            let all = l.iter().enumerate().map(|(i, &v)| (i as u32, v));
            assert_eq!(
                gumbel_argmax_dense(&l, inv_t, seed, pos),
                gumbel_argmax(all, inv_t, seed, pos),
                "trial {trial}: gumbel, n {n} spread {spread} 1/T {inv_t}"
            );
        }
    }

    #[test]
    fn choosing_from_bounds_gives_the_token_sample_gives() {
        let mut next = uniform_floats(0x9e37_79b9_7f4a_7c15u64);
        for trial in 0..300u64 {
            let n = [40usize, 3000][trial as usize % 2];
            let mut logits: Vec<f32> = (0..n).map(|_| 12.0 * next() - 6.0).collect();
            if trial % 5 == 0 {
                // A tie at the top: the lowest id must win.
                let top = logits.iter().copied().fold(f32::MIN, f32::max);
                logits[n / 3] = top;
            }
            // Bounds at or above each logit by a random slack; the guess
            // is any token.
            let ub: Vec<f32> = logits.iter().map(|&l| l + 3.0 * next()).collect();
            let guess = (trial as usize * 7919 % n) as u32;
            let t = [0.0f32, 0.7, 1.5][(trial / 2) as usize % 3];
            let cfg = SamplerConfig {
                temperature: t,
                seed: trial,
                ..Default::default()
            };
            let mut asked = 0;
            let mut exact = |ids: &[u32]| -> Result<Vec<f32>, ()> {
                asked += ids.len();
                Ok(ids.iter().map(|&i| logits[i as usize]).collect())
            };
            let got = choose_bounded(&cfg, &ub, guess, trial as usize, &mut exact).unwrap();
            assert_eq!(
                got,
                Some(sample(&cfg, &logits, &[], trial as usize)),
                "trial {trial}, T {t}"
            );
            assert!(asked <= n + 1);
        }
        // Bounds below the logits are wrong, and then so can the token be:
        // the winner's bound under the guess's logit hides it.
        let logits = [1.0f32, 5.0, 4.0];
        let ub = [1.0f32, 3.0, 4.0];
        let mut exact = |ids: &[u32]| -> Result<Vec<f32>, ()> {
            Ok(ids.iter().map(|&i| logits[i as usize]).collect())
        };
        let cfg = SamplerConfig::default();
        assert_eq!(
            choose_bounded(&cfg, &ub, 2, 0, &mut exact).unwrap(),
            Some(2)
        );
        assert_eq!(sample(&cfg, &logits, &[], 0), 1);
    }

    fn hot(n: usize, peaks: &[(usize, f32)]) -> Vec<f32> {
        let mut l = vec![-10.0f32; n];
        for &(i, v) in peaks {
            l[i] = v;
        }
        l
    }

    #[test]
    fn greedy_is_argmax_with_lowest_tie() {
        let l = hot(10, &[(3, 5.0), (7, 5.0)]);
        assert_eq!(sample(&SamplerConfig::default(), &l, &[], 0), 3);
    }

    #[test]
    fn same_key_same_token_and_frequencies_follow_softmax() {
        let l = vec![0.0f32, (2.0f32).ln(), (3.0f32).ln(), (4.0f32).ln()];
        let cfg = SamplerConfig {
            temperature: 1.0,
            seed: 42,
            ..Default::default()
        };
        let mut counts = [0usize; 4];
        let n = 40_000;
        for pos in 0..n {
            let t = sample(&cfg, &l, &[], pos);
            assert_eq!(t, sample(&cfg, &l, &[], pos), "not a pure function");
            counts[t as usize] += 1;
        }
        for (i, &c) in counts.iter().enumerate() {
            let want = (i + 1) as f64 / 10.0;
            let got = c as f64 / n as f64;
            assert!((got - want).abs() < 0.01, "token {i}: {got} vs {want}");
        }
    }

    #[test]
    fn filters_limit_the_candidates() {
        let l = vec![3.0f32, 2.9, 1.0, 0.0, -1.0];
        let top_k = SamplerConfig {
            temperature: 1.0,
            top_k: 2,
            ..Default::default()
        };
        // p = [0.474, 0.429, 0.064, ...]: top-p 0.45 keeps only the first token.
        let top_p = SamplerConfig {
            temperature: 1.0,
            top_p: 0.45,
            ..Default::default()
        };
        let min_p = SamplerConfig {
            temperature: 1.0,
            min_p: 0.5,
            ..Default::default()
        };
        for pos in 0..2000 {
            assert!(
                sample(
                    &SamplerConfig {
                        seed: pos as u64,
                        ..top_k.clone()
                    },
                    &l,
                    &[],
                    pos
                ) < 2
            );
            assert_eq!(
                sample(
                    &SamplerConfig {
                        seed: pos as u64,
                        ..top_p.clone()
                    },
                    &l,
                    &[],
                    pos
                ),
                0
            );
            assert!(
                sample(
                    &SamplerConfig {
                        seed: pos as u64,
                        ..min_p.clone()
                    },
                    &l,
                    &[],
                    pos
                ) < 2
            );
        }
    }

    #[test]
    fn penalties_change_the_choice() {
        let l = vec![2.0f32, 1.5, 0.0];
        let rep = SamplerConfig {
            repetition_penalty: 2.0,
            ..Default::default()
        };
        assert_eq!(sample(&rep, &l, &[0], 1), 1);
        let freq = SamplerConfig {
            frequency_penalty: 0.3,
            ..Default::default()
        };
        assert_eq!(sample(&freq, &l, &[0], 1), 0);
        assert_eq!(sample(&freq, &l, &[0, 0], 2), 1);
        let pres = SamplerConfig {
            presence_penalty: 0.6,
            ..Default::default()
        };
        assert_eq!(sample(&pres, &l, &[0, 0, 0], 3), 1);
    }

    /// The coupled proposals are the best two tokens by every score
    /// computed in full, the first being `sample`'s token, with shares of
    /// the full softmax over those scores: under every kind of setting.
    #[test]
    fn coupled_choice_ranks_by_the_samplers_own_scores() {
        let mut x = 7u64;
        let logits: Vec<f32> = (0..3000)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 12.0 - 6.0
            })
            .collect();
        let history = [5u32, 9, 5, 2999];
        let base = SamplerConfig {
            temperature: 0.8,
            seed: 3,
            ..Default::default()
        };
        let settings = [
            base.clone(),
            SamplerConfig {
                temperature: 0.3,
                ..base.clone()
            },
            SamplerConfig {
                temperature: 1.5,
                top_k: 40,
                ..base.clone()
            },
            SamplerConfig {
                top_p: 0.9,
                ..base.clone()
            },
            SamplerConfig {
                min_p: 0.05,
                ..base.clone()
            },
            SamplerConfig {
                repetition_penalty: 1.3,
                presence_penalty: 0.4,
                ..base.clone()
            },
        ];
        for cfg in &settings {
            let mut penalised = logits.clone();
            apply_penalties(cfg, &mut penalised, &history);
            let cands = if cfg.filters_nothing() {
                penalised
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| (i as u32, l))
                    .collect()
            } else {
                filter(cfg, &penalised)
            };
            let inv_t = 1.0 / cfg.temperature as f64;
            for position in 0..150 {
                let mut all: Vec<(f64, u32)> = cands
                    .iter()
                    .map(|&(id, l)| (l as f64 * inv_t + gumbel(cfg.seed, position, id as u64), id))
                    .collect();
                all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                let total: f64 = all.iter().map(|s| (s.0 - all[0].0).exp()).sum();
                let (first, second) =
                    coupled_choice(cfg, &logits, &history, position as usize).unwrap();
                assert_eq!(
                    first.token,
                    sample(cfg, &logits, &history, position as usize)
                );
                assert_eq!(first.token, all[0].1);
                assert!((first.confidence as f64 - 1.0 / total).abs() < 1e-5);
                let second = second.unwrap();
                assert_eq!(second.token, all[1].1, "{cfg:?} at {position}");
                let want = (all[1].0 - all[0].0).exp() / total;
                assert!((second.confidence as f64 - want).abs() < 1e-5);
                assert!(second.confidence <= first.confidence);
            }
        }
        let one = SamplerConfig { top_k: 1, ..base };
        let (first, second) = coupled_choice(&one, &logits, &[], 0).unwrap();
        assert_eq!((first.confidence, second), (1.0, None));
    }
}
