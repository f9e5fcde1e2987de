//! Prompt-lookup drafting: the longest suffix of the text so far that also
//! occurred earlier predicts that what followed it then follows it again.
//! Free to run, and strong wherever text repeats (code edits, quoting,
//! extraction, and the loops small models fall into).

use std::collections::HashMap;

use super::drafter::{Draft, Drafter, Source};
use crate::error::EngineError;
use crate::sampler::SamplerConfig;

/// Drafts continuations of earlier occurrences of the current suffix.
#[derive(Debug, Clone)]
pub struct NgramDrafter {
    /// Longest suffix matched (tokens).
    pub max_ngram: usize,
    /// Shortest suffix matched; shorter matches are too often chance.
    pub min_ngram: usize,
    /// Most distinct continuations returned.
    pub max_candidates: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter {
            max_ngram: 4,
            min_ngram: 1,
            max_candidates: 4,
        }
    }
}

impl NgramDrafter {
    /// Acceptance estimate of a continuation found after a match of `n`
    /// tokens, before any evidence from agreeing occurrences: longer
    /// matches are more specific.
    fn prior(n: usize) -> f32 {
        match n {
            0 | 1 => 0.3,
            2 => 0.45,
            3 => 0.55,
            _ => 0.65,
        }
    }
}

impl Drafter for NgramDrafter {
    fn name(&self) -> &str {
        "ngram"
    }

    fn propose(
        &mut self,
        history: &[u32],
        max_len: usize,
        _sampler: &SamplerConfig,
    ) -> Result<Vec<Draft>, EngineError> {
        let len = history.len();
        if max_len == 0 || len < 2 {
            return Ok(Vec::new());
        }
        for n in (self.min_ngram.max(1)..=self.max_ngram.min(len - 1)).rev() {
            let suffix = &history[len - n..];
            // Earlier occurrences, most recent first, each with what followed.
            let starts: Vec<usize> = (0..len - n)
                .rev()
                .filter(|&i| &history[i..i + n] == suffix)
                .collect();
            if starts.is_empty() {
                continue;
            }
            // How often each next token followed the suffix: agreement
            // between occurrences raises confidence in the first token.
            let mut next_counts: HashMap<u32, usize> = HashMap::new();
            for &i in &starts {
                *next_counts.entry(history[i + n]).or_default() += 1;
            }
            let prior = Self::prior(n);
            let mut drafts: Vec<Draft> = Vec::new();
            for &i in &starts {
                // What followed, read on into the drafted tokens themselves
                // where it reaches the end (a loop continues as a loop).
                let from = i + n;
                let mut tokens: Vec<u32> = Vec::with_capacity(max_len);
                for k in from..from + max_len {
                    tokens.push(if k < len { history[k] } else { tokens[k - len] });
                }
                if drafts.iter().any(|d| d.tokens.starts_with(&tokens)) {
                    continue;
                }
                let share = next_counts[&tokens[0]] as f32 / starts.len() as f32;
                let first = (prior + (1.0 - prior) * share * 0.5).min(0.95);
                let mut probs = vec![prior; tokens.len()];
                probs[0] = first;
                drafts.push(Draft {
                    tokens,
                    probs,
                    source: Source::Ngram,
                });
                if drafts.len() >= self.max_candidates {
                    break;
                }
            }
            return Ok(drafts);
        }
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continues_the_last_occurrence_of_the_longest_suffix() {
        let mut d = NgramDrafter::default();
        // "1 2 3 4 9 ... 1 2 3" -> "4 9 8"; the later "2 3 7" matches a
        // shorter suffix only.
        let h = [1, 2, 3, 4, 9, 8, 2, 3, 7, 5, 1, 2, 3];
        let drafts = d.propose(&h, 3, &SamplerConfig::default()).unwrap();
        assert_eq!(drafts[0].tokens, vec![4, 9, 8]);
        // A loop drafts on past the end of the text: "7 1 2 | 7 1" -> "2 7 1 2".
        let drafts = d
            .propose(&[7, 1, 2, 7, 1], 4, &SamplerConfig::default())
            .unwrap();
        assert_eq!(drafts[0].tokens, vec![2, 7, 1, 2]);
        assert_eq!(drafts.len(), 1, "one occurrence of the 3-token suffix");
    }

    #[test]
    fn distinct_continuations_most_recent_first() {
        let mut d = NgramDrafter::default();
        // Only the 2-token suffix "5 6" occurred before: at 3 (then "2 5")
        // and at 0 (then "1 5").
        let h = [5, 6, 1, 5, 6, 2, 5, 6];
        let drafts = d.propose(&h, 2, &SamplerConfig::default()).unwrap();
        let conts: Vec<_> = drafts.iter().map(|d| d.tokens.clone()).collect();
        assert_eq!(conts, vec![vec![2, 5], vec![1, 5]], "most recent first");
        for dr in &drafts {
            assert_eq!(dr.tokens.len(), dr.probs.len());
            assert!(dr.probs.iter().all(|&p| p > 0.0 && p <= 1.0));
        }
    }

    #[test]
    fn nothing_to_draft() {
        let mut d = NgramDrafter::default();
        assert!(d
            .propose(&[], 4, &SamplerConfig::default())
            .unwrap()
            .is_empty());
        assert!(d
            .propose(&[1], 4, &SamplerConfig::default())
            .unwrap()
            .is_empty());
        assert!(d
            .propose(&[1, 2, 3, 4], 4, &SamplerConfig::default())
            .unwrap()
            .is_empty());
        assert!(d
            .propose(&[1, 1, 1], 0, &SamplerConfig::default())
            .unwrap()
            .is_empty());
    }
}
