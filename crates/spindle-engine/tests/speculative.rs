//! Speculative decoding is lossless: for many prompts and seeds, greedy and
//! at temperature 0.8 with top-p 0.9, it emits exactly plain decoding's
//! tokens, leaves the same KV cache bit for bit, and stops where plain
//! decoding stops, also inside an accepted run.

mod common;
use common::tiny;

use spindle_engine::speculative::{
    generate_speculative_on, Draft, Drafter, NgramDrafter, TreeBudget,
};
use spindle_engine::{generate_on, EngineError, GenerateOutput, GenerateRequest, SamplerConfig};
use spindle_model::{KvCache, LoadedModel};

fn greedy() -> SamplerConfig {
    SamplerConfig::default()
}

fn request(prompt: &[u32], n: usize, sampler: SamplerConfig) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens: n,
        sampler,
        stop_ids: Vec::new(),
        constraint: None,
    }
}

/// Plain decoding; the cache keeps the sequence.
fn plain(m: &LoadedModel, req: &GenerateRequest) -> (GenerateOutput, KvCache) {
    let mut kv = m.model.new_kv_cache(m.model.default_kv_type(), 256, 1);
    let seq = kv.add_sequence().unwrap();
    let out = generate_on(&m.model, &mut kv, seq, req, &mut |_| true).unwrap();
    (out, kv)
}

fn speculative(
    m: &LoadedModel,
    req: &GenerateRequest,
    drafter: &mut dyn Drafter,
    policy: &mut TreeBudget,
) -> (GenerateOutput, KvCache) {
    let mut kv = m.model.new_kv_cache(m.model.default_kv_type(), 256, 1);
    let seq = kv.add_sequence().unwrap();
    let out = generate_speculative_on(&m.model, &mut kv, seq, req, drafter, policy, &mut |_| true)
        .unwrap();
    (out, kv)
}

/// The committed K/V of sequence 0, every layer, as the bits of the values
/// a pass reads (f16 widens to f32 exactly; Q8_0 as dequantized).
fn kv_bits(kv: &KvCache) -> (usize, Vec<Vec<u32>>) {
    let layers = (0..kv.layout().windows.len())
        .flat_map(|l| {
            let (k, v) = kv.committed_kv(0, l).expect("sequence 0 is open");
            [k, v]
        })
        .map(|x| x.iter().map(|x| x.to_bits()).collect())
        .collect();
    (kv.seq_len(0), layers)
}

/// Proposes `n` random tokens in a few branches, each claimed certain: the
/// verifier must reject what the model would not have produced.
struct Random {
    state: u64,
    vocab: u32,
}

impl Drafter for Random {
    fn name(&self) -> &str {
        "random"
    }

    fn propose(
        &mut self,
        _: &[u32],
        max_len: usize,
        _: &SamplerConfig,
    ) -> Result<Vec<Draft>, EngineError> {
        let mut next = || {
            self.state ^= self.state << 13;
            self.state ^= self.state >> 7;
            self.state ^= self.state << 17;
            (self.state % self.vocab as u64) as u32
        };
        Ok((0..3)
            .map(|_| Draft::uniform((0..max_len).map(|_| next()).collect(), 1.0))
            .collect())
    }
}

/// Proposes the true continuation (from a plain run), so whole runs are
/// accepted, plus a wrong branch beside it.
struct Oracle {
    full: Vec<u32>,
}

impl Drafter for Oracle {
    fn name(&self) -> &str {
        "oracle"
    }

    fn propose(
        &mut self,
        history: &[u32],
        max_len: usize,
        _: &SamplerConfig,
    ) -> Result<Vec<Draft>, EngineError> {
        if !self.full.starts_with(history) {
            return Ok(Vec::new());
        }
        let rest = &self.full[history.len()..];
        let good = rest[..rest.len().min(max_len)].to_vec();
        let mut bad = good.clone();
        if let Some(t) = bad.first_mut() {
            *t = t.wrapping_add(1) % 200;
        }
        Ok(vec![Draft::uniform(good, 0.99), Draft::uniform(bad, 0.5)])
    }
}

/// Prompts with some repetition (so n-gram drafts exist) and without.
fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![5, 17, 33, 5, 17, 33, 5, 17],
        (0..20).map(|i| (i * 37 + 11) % 250).collect(),
        vec![9, 9, 9, 9],
        vec![101, 7, 64, 101, 7, 64, 2, 101, 7],
    ]
}

#[test]
fn ngram_speculation_equals_plain_decoding() {
    for arch in ["gemma3", "qwen2", "llama"] {
        let m = tiny(arch);
        let mut drafted = 0;
        let mut accepted = 0;
        for (pi, prompt) in prompts().iter().enumerate() {
            for sampler in [
                greedy(),
                common::nucleus(pi as u64),
                common::nucleus(1000 + pi as u64),
            ] {
                let req = request(prompt, 48, sampler.clone());
                let (want, want_kv) = plain(&m, &req);
                let policies = [
                    TreeBudget::new(16),
                    TreeBudget::fixed(4),
                    TreeBudget::fixed(16),
                    TreeBudget::fixed(64),
                ];
                for (k, mut policy) in policies.into_iter().enumerate() {
                    let (got, got_kv) =
                        speculative(&m, &req, &mut NgramDrafter::default(), &mut policy);
                    let what = format!("{arch} prompt {pi} {sampler:?} policy {k}");
                    assert_eq!(got.tokens, want.tokens, "{what}");
                    assert_eq!(got.finish, want.finish, "{what}");
                    assert!(kv_bits(&got_kv) == kv_bits(&want_kv), "{what}: KV differs");
                    // Fixed budgets draft the same whatever the timing.
                    if k > 0 {
                        drafted += got.stats.drafted;
                        accepted += got.stats.accepted;
                    }
                }
            }
        }
        // The comparison means something only if drafts were accepted.
        assert!(accepted > 50, "{arch}: {accepted} of {drafted} accepted");
    }
}

#[test]
fn rejected_and_branching_trees_change_nothing() {
    let m = tiny("gemma3");
    for (pi, prompt) in prompts().iter().enumerate() {
        for sampler in [greedy(), common::nucleus(7 + pi as u64)] {
            let req = request(prompt, 40, sampler);
            let (want, want_kv) = plain(&m, &req);
            let mut random = Random {
                state: 0x9E37_79B9_7F4A_7C15 ^ pi as u64,
                vocab: m.model.config.vocab_size as u32,
            };
            let (got, got_kv) = speculative(&m, &req, &mut random, &mut TreeBudget::new(64));
            assert_eq!(got.tokens, want.tokens, "random drafts, prompt {pi}");
            assert!(kv_bits(&got_kv) == kv_bits(&want_kv));

            let mut oracle = Oracle {
                full: [prompt.clone(), want.tokens.clone()].concat(),
            };
            let (got, got_kv) = speculative(&m, &req, &mut oracle, &mut TreeBudget::fixed(16));
            assert_eq!(got.tokens, want.tokens, "oracle drafts, prompt {pi}");
            assert!(kv_bits(&got_kv) == kv_bits(&want_kv));
            assert!(
                got.stats.tokens_per_pass() > 3.0,
                "an oracle is accepted in long runs: {:?}",
                got.stats
            );
        }
    }
}

/// A stop token, and the token limit, falling inside a run the drafter got
/// right: generation ends exactly where plain decoding ends.
#[test]
fn stops_inside_an_accepted_run() {
    let m = tiny("gemma3");
    let prompt = prompts()[1].clone();
    let (free, _) = plain(&m, &request(&prompt, 40, greedy()));
    // A token first emitted well inside the run becomes a stop token.
    let k = (10..free.tokens.len())
        .find(|&i| !free.tokens[..i].contains(&free.tokens[i]))
        .expect("a fresh token after position 10");
    let mut req = request(&prompt, 40, greedy());
    req.stop_ids = vec![free.tokens[k]];
    let (want, want_kv) = plain(&m, &req);
    assert_eq!(want.tokens.len(), k);
    let full = [prompt.clone(), free.tokens.clone()].concat();
    let (got, got_kv) = speculative(
        &m,
        &req,
        &mut Oracle { full: full.clone() },
        &mut TreeBudget::new(16),
    );
    assert_eq!(got.tokens, want.tokens);
    assert_eq!(got.finish, want.finish);
    assert!(kv_bits(&got_kv) == kv_bits(&want_kv));

    for n in [1, 2, 7, 13] {
        let req = request(&prompt, n, greedy());
        let (want, want_kv) = plain(&m, &req);
        let (got, got_kv) = speculative(
            &m,
            &req,
            &mut Oracle { full: full.clone() },
            &mut TreeBudget::new(16),
        );
        assert_eq!(got.tokens, want.tokens, "max_tokens {n}");
        assert_eq!(got.finish, want.finish);
        assert!(kv_bits(&got_kv) == kv_bits(&want_kv));
    }
}
