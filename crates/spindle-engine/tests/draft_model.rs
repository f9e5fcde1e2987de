//! The draft-model drafter on the tiny reference models: a model drafting
//! for itself proposes exactly what plain greedy decoding produces, and the
//! incremental cache sync (catch-up, rollback, reset) gives bit for bit what
//! a fresh drafter gives for the same history.

use std::path::{Path, PathBuf};

use spindle_engine::sampler::sample;
use spindle_engine::speculative::{Draft, DraftModelDrafter, Drafter, Source};
use spindle_engine::SamplerConfig;
use spindle_model::{Batch, Model, Row};

const ARCHS: [&str; 3] = ["gemma3", "llama", "qwen3moe"];
const CTX: usize = 1024;

fn fixture(arch: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../spindle-model/tests/fixtures/tiny")
        .join(arch)
        .join("model.gguf")
}

fn load(arch: &str) -> Model {
    let path = fixture(arch);
    spindle_model::load(&path, 1)
        .unwrap_or_else(|e| panic!("load {}: {e}", path.display()))
        .model
}

fn drafter(arch: &str, min_prob: f32) -> DraftModelDrafter {
    DraftModelDrafter::new(load(arch), CTX)
        .expect("drafter")
        .with_min_prob(min_prob)
}

/// `n` pseudo-random tokens of a vocabulary of `vocab`.
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// Plain greedy decoding of `model` after `history`, one token per pass
/// (the history too), on a fresh cache: the next `n` tokens.
fn greedy(model: &Model, history: &[u32], n: usize) -> Vec<u32> {
    decode(model, history, n, &SamplerConfig::default())
}

/// Plain decoding of `model` after `history` under `cfg`: each token is
/// the sampler's at its absolute position.
fn decode(model: &Model, history: &[u32], n: usize, cfg: &SamplerConfig) -> Vec<u32> {
    let mut kv = model.new_kv_cache(model.default_kv_type(), CTX, 1);
    let seq = kv.add_sequence().unwrap();
    let run = |token: u32, kv: &mut spindle_model::KvCache| {
        let mut batch = Batch::new();
        batch.push(Row {
            token,
            pos: kv.seq_len(seq),
            seq,
            parent: None,
            logits: true,
        });
        let logits = model.forward(&batch, kv).expect("forward");
        kv.commit(seq, &[0]).unwrap();
        logits.row(0).unwrap().to_vec()
    };
    let mut logits = Vec::new();
    for &t in history {
        logits = run(t, &mut kv);
    }
    let mut out = Vec::new();
    let mut seen = history.to_vec();
    while out.len() < n {
        let t = sample(cfg, &logits, &seen, seen.len());
        out.push(t);
        seen.push(t);
        if out.len() < n {
            logits = run(t, &mut kv);
        }
    }
    out
}

fn check_probs(drafts: &[Draft], min_prob: f32) {
    for d in drafts {
        assert_eq!(d.tokens.len(), d.probs.len());
        for (i, &p) in d.probs.iter().enumerate() {
            assert!(p.is_finite() && p > 0.0 && p <= 1.0, "prob {p}");
            if i > 0 {
                assert!(
                    p >= min_prob,
                    "prob {p} under {min_prob} after the first token"
                );
            }
        }
    }
    if let [first, second] = drafts {
        assert_eq!(second.tokens.len(), 1, "the runner-up is one token");
        assert_ne!(second.tokens[0], first.tokens[0]);
        assert!(second.probs[0] <= first.probs[0] && second.probs[0] >= min_prob);
    }
    assert!(drafts.len() <= 2);
}

/// Drafting for itself, the model proposes what it decodes greedily. The
/// history then takes some drafted tokens and a token of the target's own,
/// half the time another than the draft's (as sampling would): the drafter
/// rolls back up to 11 tokens past a sliding window of 8 (gemma3), which
/// only the rollback slots allow.
#[test]
fn draft_model_of_itself_drafts_plain_greedy_decoding() {
    const ACCEPT: [usize; 10] = [0, 3, 11, 1, 6, 12, 2, 0, 5, 9];
    for arch in ARCHS {
        let target = load(arch);
        let vocab = target.config.vocab_size;
        let mut d = drafter(arch, 0.0);
        d.check_vocab(vocab).unwrap();
        let mut history = tokens(20, vocab, 1);
        for (step, &a) in ACCEPT.iter().enumerate() {
            let drafts = d.propose(&history, 12, &SamplerConfig::default()).unwrap();
            check_probs(&drafts, 0.0);
            let want = greedy(&target, &history, 13);
            assert_eq!(
                drafts[0].tokens,
                want[..12],
                "{arch} step {step}: history of {}",
                history.len()
            );
            history.extend_from_slice(&want[..a]);
            let own = if step % 2 == 0 {
                want[a]
            } else {
                (want[a] + 1 + step as u32) % vocab as u32
            };
            history.push(own);
        }
        let stats = d.stats();
        assert_eq!(
            stats.resets, 0,
            "{arch}: every rollback fits the rollback slots"
        );
        assert!(
            stats.rows < 20 + ACCEPT.iter().sum::<usize>() + 12 * ACCEPT.len(),
            "{arch}: the cache is synced incrementally ({stats:?})"
        );
    }
}

/// Sampling at temperature 0.8, a model drafting for itself proposes the
/// tokens plain sampling draws (the same noise at the same positions),
/// under each seed in turn on one drafter, with top-k too; its runner-up
/// is another token.
#[test]
fn draft_model_of_itself_drafts_plain_sampling() {
    for arch in ARCHS {
        let target = load(arch);
        let vocab = target.config.vocab_size;
        let mut d = drafter(arch, 0.0);
        let history = tokens(24, vocab, 3);
        for (seed, top_k) in [(1, 0), (2, 0), (1, 0), (3, 40)] {
            let cfg = SamplerConfig {
                temperature: 0.8,
                top_k,
                seed,
                ..Default::default()
            };
            let drafts = d.propose(&history, 10, &cfg).unwrap();
            check_probs(&drafts, 0.0);
            let want = decode(&target, &history, 10, &cfg);
            assert_eq!(drafts[0].tokens, want, "{arch} seed {seed} top-k {top_k}");
            assert_ne!(
                want,
                greedy(&target, &history, 10),
                "{arch}: sampling differs"
            );
        }
    }
}

/// Speculation at temperature 0.8 with the target drafting for itself:
/// the output is plain sampling's, and every drafted token on the
/// draft's own path is accepted, since the draft draws with the target's
/// noise (an argmax draft would be accepted only where the draw happens to
/// be the argmax).
#[test]
fn coupled_self_drafts_are_accepted_when_sampling() {
    use spindle_engine::speculative::{generate_speculative_on, TreeBudget};
    use spindle_engine::{generate_on, GenerateRequest};
    for arch in ARCHS {
        let target = load(arch);
        let vocab = target.config.vocab_size;
        let req = GenerateRequest {
            prompt: tokens(12, vocab, 21),
            max_tokens: 60,
            sampler: SamplerConfig {
                temperature: 0.8,
                seed: 9,
                ..Default::default()
            },
            stop_ids: Vec::new(),
            constraint: None,
        };
        let mut kv = target.new_kv_cache(target.default_kv_type(), CTX, 1);
        let seq = kv.add_sequence().unwrap();
        let plain = generate_on(&target, &mut kv, seq, &req, &mut |_| true).unwrap();
        let mut kv = target.new_kv_cache(target.default_kv_type(), CTX, 1);
        let seq = kv.add_sequence().unwrap();
        let mut d = drafter(arch, 0.0);
        let mut policy = TreeBudget::fixed(8);
        let out = generate_speculative_on(
            &target,
            &mut kv,
            seq,
            &req,
            &mut d,
            &mut policy,
            &mut |_| true,
        )
        .unwrap();
        assert_eq!(out.tokens, plain.tokens, "{arch}: lossless");
        let s = &out.stats;
        let (drafted, accepted) = s.by_source[Source::Model.index()];
        // Each pass verifies the 7-token chain and the runner-up: the
        // chain is taken whole (the last pass may stop inside it).
        assert!(drafted > 0, "{arch}");
        assert!(
            s.passes <= 60usize.div_ceil(8) + 1,
            "{arch}: {} passes for 60 tokens ({accepted}/{drafted} accepted)",
            s.passes
        );
    }
}

/// Histories in the order a speculative loop produces them, and some it
/// does not: each result equals a fresh drafter's for the same history.
#[test]
fn draft_model_incremental_sync_equals_a_fresh_drafter() {
    for arch in ARCHS {
        for min_prob in [0.0, 0.1] {
            let vocab = load(arch).config.vocab_size;
            let mut d = drafter(arch, min_prob);
            let mut check = |h: &[u32], what: &str| -> Vec<Draft> {
                let got = d.propose(h, 12, &SamplerConfig::default()).unwrap();
                let want = drafter(arch, min_prob)
                    .propose(h, 12, &SamplerConfig::default())
                    .unwrap();
                assert_eq!(got, want, "{arch} min_prob {min_prob}: {what}");
                check_probs(&got, min_prob);
                got
            };
            let h = tokens(30, vocab, 7);
            let d1 = check(&h, "first history");
            let t = &d1[0].tokens;

            // Two drafted tokens accepted, then a different one.
            let mut h2 = h.clone();
            h2.extend(t.iter().take(2));
            let other = t.get(2).map_or(5, |&x| (x + 1) % vocab as u32);
            h2.push(other);
            check(&h2, "two accepted and a different token");

            // Shorter than anything before (a rollback into the prompt).
            let h3 = h[..h.len() - 5].to_vec();
            let d3 = check(&h3, "shorter history");
            check(&h3, "the same history again");

            // The whole draft accepted, with a bonus token; then only a
            // prefix of the draft, ending on a drafted token.
            let mut h4 = h3.clone();
            h4.extend(&d3[0].tokens);
            h4.push(3);
            check(&h4, "whole draft accepted");
            let d4 = check(&h3, "back to the shorter history");
            let mut h5 = h3.clone();
            h5.extend(d4[0].tokens.iter().take(1 + d4[0].tokens.len() / 2));
            check(&h5, "a prefix of the draft");

            // A long history, then one that differs near its start: a
            // rollback past the slots (gemma3 re-prefills).
            let long = tokens(150, vocab, 11);
            check(&long, "a long history");
            let mut changed = long.clone();
            changed[3] = (changed[3] + 1) % vocab as u32;
            check(&changed, "the long history changed near its start");

            // Catch-up in more than one chunk of 512 rows.
            let longer = tokens(700, vocab, 13);
            check(&longer, "700 tokens");
            let mut longer2 = longer.clone();
            longer2.extend(tokens(600, vocab, 17).iter().take(CTX - 700 - 4));
            check(&longer2, "near the end of the context");

            let stats = d.stats();
            if arch == "gemma3" {
                assert!(stats.resets >= 1, "{arch}: {stats:?}");
            } else {
                assert_eq!(stats.resets, 0, "{arch}: no sliding window, {stats:?}");
            }
        }
    }
}

/// Probabilities stay in (0, 1]; the default threshold cuts the tail.
#[test]
fn draft_model_probs_are_probabilities() {
    for arch in ARCHS {
        let vocab = load(arch).config.vocab_size;
        let mut d = DraftModelDrafter::new(load(arch), CTX).unwrap();
        let mut d0 = drafter(arch, 0.0);
        for seed in 0..8 {
            let h = tokens(5 + 9 * seed as usize, vocab, seed);
            let drafts = d.propose(&h, 16, &SamplerConfig::default()).unwrap();
            assert!(!drafts.is_empty());
            check_probs(&drafts, 0.1);
            let drafts0 = d0.propose(&h, 16, &SamplerConfig::default()).unwrap();
            check_probs(&drafts0, 0.0);
            assert_eq!(drafts0[0].tokens.len(), 16);
            // The thresholded draft is a prefix of the full one.
            let n = drafts[0].tokens.len();
            assert_eq!(
                drafts[0],
                Draft {
                    tokens: drafts0[0].tokens[..n].to_vec(),
                    probs: drafts0[0].probs[..n].to_vec(),
                    source: Source::Model,
                }
            );
        }
    }
}

/// Odd inputs give empty drafts or an error, never a panic.
#[test]
fn draft_model_edge_cases() {
    let arch = "llama";
    let vocab = load(arch).config.vocab_size;
    let ctx = 32;
    let mut d = DraftModelDrafter::new(load(arch), ctx)
        .unwrap()
        .with_min_prob(0.0);
    assert_eq!(d.name(), "draft");
    d.check_vocab(vocab).unwrap();
    let err = d.check_vocab(vocab + 1).unwrap_err().to_string();
    assert!(err.contains("vocabulary"), "{err}");

    assert!(d
        .propose(&[], 8, &SamplerConfig::default())
        .unwrap()
        .is_empty());
    assert!(d
        .propose(&[1, 2, 3], 0, &SamplerConfig::default())
        .unwrap()
        .is_empty());
    assert!(d
        .propose(&tokens(ctx + 1, vocab, 3), 8, &SamplerConfig::default())
        .unwrap()
        .is_empty());

    // A long request is clamped to the rollback allowance.
    let mut big = DraftModelDrafter::new(load(arch), 256)
        .unwrap()
        .with_min_prob(0.0);
    let drafts = big
        .propose(&[1, 2, 3], 1000, &SamplerConfig::default())
        .unwrap();
    assert_eq!(drafts[0].tokens.len(), 64);

    // The context bounds the draft: each token after the first needs the
    // one before it run inside the context.
    let h = tokens(ctx - 3, vocab, 5);
    assert_eq!(
        d.propose(&h, 12, &SamplerConfig::default()).unwrap()[0]
            .tokens
            .len(),
        4
    );
    let h = tokens(ctx, vocab, 5);
    assert_eq!(
        d.propose(&h, 12, &SamplerConfig::default()).unwrap()[0]
            .tokens
            .len(),
        1
    );

    // A token outside the vocabulary is an error; the drafter still works.
    assert!(d
        .propose(&[1, vocab as u32 + 7, 2], 4, &SamplerConfig::default())
        .is_err());
    assert!(d
        .propose(&[u32::MAX], 4, &SamplerConfig::default())
        .is_err());
    let h = tokens(10, vocab, 9);
    let got = d.propose(&h, 8, &SamplerConfig::default()).unwrap();
    let want = DraftModelDrafter::new(load(arch), ctx)
        .unwrap()
        .with_min_prob(0.0)
        .propose(&h, 8, &SamplerConfig::default())
        .unwrap();
    assert_eq!(got, want);
}
