//! Suffix drafting (SuffixDecoding, arXiv 2411.04975): the longest suffix
//! of the text so far is looked up in a suffix trie of the request's own
//! text and in the tries of earlier requests' outputs
//! ([`super::traffic_cache`]); what followed it there, weighed by how
//! often, is proposed as a branching tree whose size grows with the length
//! of the match.

use std::sync::{Arc, Mutex};

use super::drafter::{Draft, Drafter, Source};
use super::suffix_trie::{Growth, SuffixTrie};
use super::traffic_cache::TrafficCache;
use crate::error::EngineError;
use crate::sampler::SamplerConfig;

/// Longest substring the request's trie keeps (match and draft together).
const DEPTH: usize = 40;
/// Longest suffix matched: the rest of the depth is left for the draft.
const MAX_MATCH: usize = 24;
/// Nodes proposed per matched token (a longer match is more specific).
const NODES_PER_MATCH_TOKEN: f32 = 4.0;
/// Paths less likely than this (by counts) are not proposed.
const MIN_PROB: f32 = 0.02;

/// Drafts from suffix tries: the request's own and, when there is a
/// traffic cache, its tenant's earlier outputs.
pub struct SuffixDrafter {
    /// The request's prompt and output so far, when the request's own text
    /// is drafted from.
    own: Option<SuffixTrie>,
    /// The tokens `own` holds (to notice a history that is not an
    /// extension of the last one: a new request in the same slot).
    seen: Vec<u32>,
    traffic: Option<Arc<Mutex<TrafficCache>>>,
    tenant: String,
}

impl SuffixDrafter {
    /// `own`: draft from the request's own text; `traffic`: and from
    /// earlier outputs.
    pub fn new(own: bool, traffic: Option<Arc<Mutex<TrafficCache>>>) -> SuffixDrafter {
        SuffixDrafter {
            own: own.then(|| SuffixTrie::new(DEPTH)),
            seen: Vec::new(),
            traffic,
            tenant: String::new(),
        }
    }

    /// Brings the request's trie up to `history`.
    fn follow(&mut self, history: &[u32]) {
        let Some(trie) = &mut self.own else {
            return;
        };
        if !history.starts_with(&self.seen) {
            trie.clear();
            self.seen.clear();
        }
        for &t in &history[self.seen.len()..] {
            trie.append(t);
        }
        self.seen.extend_from_slice(&history[self.seen.len()..]);
    }
}

impl Drafter for SuffixDrafter {
    fn name(&self) -> &str {
        "suffix"
    }

    fn propose(
        &mut self,
        history: &[u32],
        max_len: usize,
        _sampler: &SamplerConfig,
    ) -> Result<Vec<Draft>, EngineError> {
        self.follow(history);
        if max_len == 0 || history.is_empty() {
            return Ok(Vec::new());
        }
        let growth = Growth {
            max_nodes: 4 * max_len,
            max_depth: max_len,
            nodes_per_match_token: NODES_PER_MATCH_TOKEN,
            min_prob: MIN_PROB,
        };
        let mut drafts = Vec::new();
        if let Some(trie) = &self.own {
            if let Some(m) = trie.longest_match(history, MAX_MATCH.min(DEPTH - max_len)) {
                drafts.extend(trie.grow(m, growth, Source::Request));
            }
        }
        if let Some(traffic) = &self.traffic {
            let mut cache = traffic.lock().unwrap_or_else(|e| e.into_inner());
            let depth = cache.config().depth;
            let max_match = MAX_MATCH.min(depth.saturating_sub(max_len + 1)).max(1);
            drafts.extend(cache.propose(&self.tenant, history, max_match, growth));
        }
        Ok(drafts)
    }

    fn begin(&mut self, tenant: &str) {
        self.tenant = tenant.to_string();
        if let Some(trie) = &mut self.own {
            trie.clear();
        }
        self.seen.clear();
    }

    fn end(&mut self, history: &[u32], prompt_len: usize) {
        if let Some(traffic) = &self.traffic {
            let mut cache = traffic.lock().unwrap_or_else(|e| e.into_inner());
            cache.add(&self.tenant, history, prompt_len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::traffic_cache::TrafficConfig;
    use super::*;

    #[test]
    fn drafts_come_from_the_request_and_from_earlier_outputs() {
        let cache = Arc::new(Mutex::new(TrafficCache::new(TrafficConfig::default())));
        let mut d = SuffixDrafter::new(true, Some(cache.clone()));
        d.begin("a");
        // The request repeats "5 6 7 8": drafted from its own text.
        let h = [5, 6, 7, 8, 1, 5, 6];
        let drafts = d.propose(&h, 4, &SamplerConfig::default()).unwrap();
        assert_eq!(drafts.len(), 1);
        assert_eq!(drafts[0].tokens, vec![7, 8, 1, 5]);
        assert_eq!(drafts[0].source, Source::Request);
        // It ends with output [7, 9, 9]; the next request of the same
        // tenant gets it as a draft after "6".
        d.end(&[5, 6, 7, 9, 9], 2);
        let mut e = SuffixDrafter::new(true, Some(cache.clone()));
        e.begin("a");
        let drafts = e.propose(&[3, 6], 4, &SamplerConfig::default()).unwrap();
        let traffic: Vec<_> = drafts
            .iter()
            .filter(|d| d.source == Source::Traffic)
            .collect();
        assert_eq!(traffic.len(), 1);
        assert_eq!(traffic[0].tokens, vec![7, 9, 9]);
        // Another tenant does not.
        e.begin("b");
        assert!(e
            .propose(&[3, 6], 4, &SamplerConfig::default())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_new_history_starts_a_new_trie() {
        let mut d = SuffixDrafter::new(true, None);
        assert_eq!(
            d.propose(&[1, 2, 3, 1], 2, &SamplerConfig::default())
                .unwrap()[0]
                .tokens,
            vec![2, 3]
        );
        // Not an extension of [1, 2, 3, 1]: the old text must not draft.
        assert!(d
            .propose(&[4, 1], 2, &SamplerConfig::default())
            .unwrap()
            .is_empty());
        assert_eq!(
            d.propose(&[4, 1, 4], 2, &SamplerConfig::default()).unwrap()[0].tokens,
            vec![1, 4]
        );
    }
}
