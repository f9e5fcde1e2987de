//! The token [`super::sample`] chooses, from logits that arrive in pieces:
//! the output head's work items (`Model::logits_visiting`), on any thread
//! and in any order. Each piece gives its best candidate; candidates merge
//! into the row's choice, the same token bit for bit, without the row's
//! logits ever being stored whole.
//!
//! Greedy: the largest logit, the lowest id on a tie, a NaN never chosen
//! (except that a NaN first logit is never replaced by [`super::argmax`]'s
//! scan). Sampling with no cut and no penalty: the largest `logit/T + g`,
//! the lowest id on a tie; a piece skips the variates that cannot reach its
//! own best score, as [`super::gumbel_argmax_dense`] does against the
//! row's.

use super::gumbel::{gumbel_argmax_from, key, score_bound, unskipped};
use super::{first_of, largest, SamplerConfig};

thread_local! {
    /// The tokens of a piece that may reach its best score.
    static LEFT: std::cell::RefCell<Vec<(u32, f32)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// How one row's pieces are judged: its temperature and its key (seed and
/// position) when it samples.
#[derive(Debug, Clone, Copy)]
pub struct PieceChooser {
    /// `(1/T, key)`; `None`: greedy.
    sampling: Option<(f64, u64)>,
}

/// The best token of the pieces of one row seen so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct PieceChoice {
    /// The largest logit that is not NaN, and its token.
    top: Option<(f32, u32)>,
    /// Token 0's logit is NaN.
    first_nan: bool,
    /// Sampling: the largest score above minus infinity, and its token.
    best: Option<(f64, u32)>,
}

impl PieceChooser {
    /// The chooser of the token at absolute `position` under `cfg`, which
    /// must choose from bounds ([`SamplerConfig::chooses_from_bounds`]:
    /// greedy or an uncut draw, no penalties).
    pub fn new(cfg: &SamplerConfig, position: usize) -> PieceChooser {
        debug_assert!(cfg.chooses_from_bounds());
        let sampling = (!cfg.is_greedy())
            .then(|| (1.0 / cfg.temperature as f64, key(cfg.seed, position as u64)));
        PieceChooser { sampling }
    }

    /// The best candidate of the logits of tokens `first..first +
    /// logits.len()`.
    pub fn piece(&self, first: usize, logits: &[f32]) -> PieceChoice {
        let first_nan = first == 0 && logits.first().is_some_and(|v| v.is_nan());
        let top = top_of(logits).map(|(v, i)| (v, (first + i) as u32));
        let mut choice = PieceChoice {
            top,
            first_nan,
            best: None,
        };
        let (Some((inv_t, keyed)), Some((v, id))) = (self.sampling, top) else {
            return choice;
        };
        // The piece's most likely token's score bounds its best from below:
        // only the tokens that can reach it pay their variates.
        let bound = score_bound(keyed, (id, v), inv_t);
        // The survivors' list is the thread's own, reused: pieces are
        // judged on the pool's threads, a fresh list each time would be
        // allocations in every worker's arena, pass after pass.
        let id = LEFT.with(|left| {
            let mut left = left.borrow_mut();
            unskipped(logits, first as u32, keyed, inv_t, bound, &mut left);
            gumbel_argmax_from(left.iter().copied(), id, keyed, bound, inv_t)
        });
        let logit = logits[id as usize - first];
        let score = score_bound(keyed, (id, logit), inv_t);
        if score > f64::NEG_INFINITY {
            choice.best = Some((score, id));
        }
        choice
    }
}

impl PieceChoice {
    /// The best of two sets of pieces of one row.
    pub fn merge(self, other: PieceChoice) -> PieceChoice {
        PieceChoice {
            top: larger(self.top, other.top),
            first_nan: self.first_nan || other.first_nan,
            best: larger(self.best, other.best),
        }
    }

    /// The chosen token, once every piece of the row is merged.
    pub fn token(&self) -> u32 {
        if let Some((_, id)) = self.best {
            return id;
        }
        // Greedy, or a draw where every score is minus infinity or NaN
        // (then the pruned Gumbel-max keeps the argmax it started from).
        match (self.first_nan, self.top) {
            (true, _) | (_, None) => 0,
            (false, Some((_, id))) => id,
        }
    }
}

/// The larger value, the lower token on a tie.
fn larger<T: PartialOrd + Copy>(a: Option<(T, u32)>, b: Option<(T, u32)>) -> Option<(T, u32)> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if y.0 > x.0 || (y.0 == x.0 && y.1 < x.1) {
            y
        } else {
            x
        }),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The largest value of `logits` that is not NaN and its first index.
fn top_of(logits: &[f32]) -> Option<(f32, usize)> {
    let max = largest(logits);
    // Minus infinity is the maximum also when every value is NaN.
    first_of(logits, max).map(|i| (max, i))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::sample;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// The row's choice from pieces cut at `cuts`, merged in a shuffled
    /// order.
    fn from_pieces(c: &PieceChooser, logits: &[f32], cuts: &[usize], rng: &mut StdRng) -> u32 {
        let mut bounds = vec![0];
        bounds.extend(cuts.iter().copied().filter(|&x| x > 0 && x < logits.len()));
        bounds.push(logits.len());
        bounds.sort_unstable();
        bounds.dedup();
        let mut pieces: Vec<PieceChoice> = bounds
            .windows(2)
            .map(|w| c.piece(w[0], &logits[w[0]..w[1]]))
            .collect();
        for i in (1..pieces.len()).rev() {
            pieces.swap(i, rng.random_range(0..=i));
        }
        pieces
            .into_iter()
            .fold(PieceChoice::default(), PieceChoice::merge)
            .token()
    }

    #[test]
    fn pieces_choose_what_sample_chooses() {
        let mut rng = StdRng::seed_from_u64(5);
        let configs = [
            SamplerConfig::default(),
            SamplerConfig {
                temperature: 0.8,
                seed: 11,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                temperature: 1.7,
                seed: 3,
                ..SamplerConfig::default()
            },
        ];
        for trial in 0..400 {
            let n = rng.random_range(1..3000);
            // Logits of a few scales, with ties (coarse values), and now and
            // then NaN or infinite values (a NaN first, all minus infinity).
            let scale = [0.5f32, 4.0, 30.0][trial % 3];
            let mut logits: Vec<f32> = (0..n)
                .map(|_| (rng.random::<f32>() * scale * 8.0).round() / 8.0)
                .collect();
            match trial % 10 {
                1 => logits[rng.random_range(0..n)] = f32::NAN,
                2 => logits[0] = f32::NAN,
                3 => logits.iter_mut().for_each(|v| *v = f32::NEG_INFINITY),
                4 => logits[rng.random_range(0..n)] = f32::INFINITY,
                5 => logits.iter_mut().step_by(3).for_each(|v| *v = f32::NAN),
                _ => {}
            }
            let cuts: Vec<usize> = (0..rng.random_range(0..12))
                .map(|_| rng.random_range(0..n))
                .collect();
            for cfg in &configs {
                let position = rng.random_range(0..5000);
                let want = sample(cfg, &logits, &[], position);
                let got = from_pieces(&PieceChooser::new(cfg, position), &logits, &cuts, &mut rng);
                assert_eq!(
                    got, want,
                    "trial {trial}, T {}, {n} logits, cuts {cuts:?}",
                    cfg.temperature
                );
            }
        }
    }

    #[test]
    fn a_piece_that_misses_its_best_token_changes_the_choice() {
        // The check above can fail: dropping the piece that holds the
        // argmax gives another token.
        let mut logits = vec![0.0f32; 64];
        logits[40] = 9.0;
        let c = PieceChooser::new(&SamplerConfig::default(), 0);
        let all = c.piece(0, &logits[..32]).merge(c.piece(32, &logits[32..]));
        assert_eq!(all.token(), 40);
        assert_ne!(c.piece(0, &logits[..32]).token(), 40);
    }
}
