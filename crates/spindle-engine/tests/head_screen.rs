//! The screened output head on the real model: at every row of a long
//! generation, the token chosen from the screen's bounds and a few exact
//! logits is the token chosen from every logit, greedy and sampled, on
//! every ISA path; and a bound tightened below the sound one chooses
//! differently somewhere, so the check can fail.

mod common;
use common::real_model;

use spindle_engine::sampler::{choose_bounded, sample, SamplerConfig};
use spindle_engine::{generate, GenerateRequest};
use spindle_kernels::simd::available_isas;
use spindle_model::{Batch, Hidden, KvType, Model};

/// Hidden states of every row of the prompt and a greedy continuation.
fn hidden_of_a_generation(model: &Model, prompt: &[u32], n: usize) -> (Hidden, Vec<u32>) {
    let mut kv = model.new_kv_cache(KvType::F16, prompt.len() + n + 1, 1);
    let req = GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens: n,
        sampler: SamplerConfig::default(),
        stop_ids: Vec::new(),
        constraint: None,
    };
    let out = generate(model, &mut kv, &req, |_| true).unwrap();
    let mut all = prompt.to_vec();
    all.extend(&out.tokens);
    let seq = kv.add_sequence().unwrap();
    let mut b = Batch::new();
    b.push_chain(seq, 0, &all, |_| true);
    (model.forward_hidden(&b, &mut kv).unwrap(), all)
}

/// The real model, and the hidden states and tokens of a 120-token greedy
/// generation after a short prompt (`None` without the model).
fn a_generation() -> Option<(Model, Hidden, Vec<u32>)> {
    let path = real_model()?;
    let lm = spindle_model::load(&path, 2).unwrap();
    let tok = lm.tokenizer.as_ref().unwrap();
    let prompt = tok
        .encode("The history of the bicycle begins", true, false)
        .unwrap();
    let (hidden, tokens) = hidden_of_a_generation(&lm.model, &prompt, 120);
    Some((lm.model, hidden, tokens))
}

/// Rows (every `step`-th) where the screened choice differs from the full
/// head's, over greedy and three sampled settings.
fn mismatches(model: &Model, hidden: &Hidden, tokens: &[u32], step: usize) -> usize {
    let settings: Vec<SamplerConfig> = [0.0f32, 0.8, 0.8, 1.5]
        .iter()
        .enumerate()
        .map(|(i, &t)| SamplerConfig {
            temperature: t,
            seed: 11 + i as u64,
            ..SamplerConfig::default()
        })
        .collect();
    let mut wrong = 0;
    let rows: Vec<usize> = (0..tokens.len()).step_by(step).collect();
    let all = model.logits(hidden, &rows).unwrap();
    for &row in &rows {
        let full = all.row(row).unwrap();
        let bounds = model
            .head_bounds(hidden, &[row])
            .unwrap()
            .expect("screened");
        for cfg in &settings {
            let want = sample(cfg, full, &tokens[..=row], row + 1);
            let mut exact = |ids: &[u32]| model.logits_of(hidden, row, ids);
            let got =
                choose_bounded(cfg, &bounds.ub, bounds.likeliest[0], row + 1, &mut exact).unwrap();
            // The exact logits are the full head's, bit for bit.
            let some: Vec<u32> = (0..full.len() as u32).step_by(9973).collect();
            let exact_some = model.logits_of(hidden, row, &some).unwrap();
            for (&t, &l) in some.iter().zip(&exact_some) {
                assert_eq!(
                    l.to_bits(),
                    full[t as usize].to_bits(),
                    "token {t} row {row}"
                );
            }
            if got.is_some_and(|g| g != want) {
                wrong += 1;
            }
        }
    }
    wrong
}

#[test]
fn the_screened_head_chooses_what_the_full_head_chooses() {
    let Some((mut model, hidden, tokens)) = a_generation() else {
        return;
    };
    // Every row on this machine's own path; every seventh on the others
    // (the scalar path takes a tenth of a second a row).
    let best = spindle_kernels::simd::detected_isa();
    for isa in available_isas() {
        model.set_isa(isa).unwrap();
        let step = if isa == best { 1 } else { 7 };
        assert_eq!(mismatches(&model, &hidden, &tokens, step), 0, "{isa:?}");
    }
    // The bound is what makes it exact: with a twentieth of the slack the
    // screen prunes tokens that win.
    model.set_head_screen_slack(0.05).unwrap();
    assert!(
        mismatches(&model, &hidden, &tokens, 1) > 0,
        "a bound a twentieth as wide chose the same tokens everywhere"
    );
}

/// Tokens chosen while the head computes the logits (each work item's
/// piece judged on its thread, `LazyLogits::compute_choosing`), against
/// `sample` over the full head's logits, at `rows`; the rows of `keep`
/// keep every logit in the same call, which must be the full head's bits.
fn piece_mismatches(
    model: &Model,
    hidden: &Hidden,
    batch: &Batch,
    rows: &[usize],
    keep: &[usize],
    cfg: &SamplerConfig,
) -> usize {
    use spindle_engine::speculative::verify::LazyLogits;
    let all = model.logits(hidden, rows).unwrap();
    let mut lazy = LazyLogits::new(hidden.clone(), batch);
    let choose: Vec<(usize, &SamplerConfig)> = rows
        .iter()
        .filter(|r| !keep.contains(r))
        .map(|&r| (r, cfg))
        .collect();
    lazy.compute_choosing(model, keep, &choose).unwrap();
    for &r in keep {
        let kept: Vec<u32> = lazy.get(r).unwrap().iter().map(|v| v.to_bits()).collect();
        let full: Vec<u32> = all.row(r).unwrap().iter().map(|v| v.to_bits()).collect();
        assert!(kept == full, "kept row {r} differs from the full head");
    }
    choose
        .iter()
        .filter(|&&(r, _)| {
            let want = sample(cfg, all.row(r).unwrap(), &[], r + 1);
            lazy.chosen_token(r, cfg, r + 1) != Some(want)
        })
        .count()
}

#[test]
fn tokens_chosen_as_the_head_computes_them_are_the_full_heads() {
    let Some((mut model, hidden, tokens)) = a_generation() else {
        return;
    };
    let mut batch = Batch::new();
    let mut kv = model.new_kv_cache(KvType::F16, tokens.len(), 1);
    let seq = kv.add_sequence().unwrap();
    batch.push_chain(seq, 0, &tokens, |_| true);
    let settings: Vec<SamplerConfig> = [0.0f32, 0.8, 1.5]
        .iter()
        .enumerate()
        .map(|(i, &t)| SamplerConfig {
            temperature: t,
            seed: 21 + i as u64,
            ..SamplerConfig::default()
        })
        .collect();
    let best = spindle_kernels::simd::detected_isa();
    for isa in available_isas() {
        model.set_isa(isa).unwrap();
        // Every row in calls of up to 24 (as verification passes have
        // them) on this machine's own path; every seventh on the others.
        let step = if isa == best { 1 } else { 7 };
        let rows: Vec<usize> = (0..tokens.len()).step_by(step).collect();
        for cfg in &settings {
            for call in rows.chunks(24) {
                let keep: Vec<usize> = call.iter().copied().skip(1).step_by(5).collect();
                let wrong = piece_mismatches(&model, &hidden, &batch, call, &keep, cfg);
                assert_eq!(wrong, 0, "{isa:?} T {} rows {call:?}", cfg.temperature);
            }
        }
    }
    // The comparison can fail: the tokens drawn under another seed differ.
    model.set_isa(best).unwrap();
    let rows: Vec<usize> = (0..tokens.len()).collect();
    let other = SamplerConfig {
        seed: 99,
        ..settings[1].clone()
    };
    let mut lazy = spindle_engine::speculative::verify::LazyLogits::new(hidden.clone(), &batch);
    let choose: Vec<(usize, &SamplerConfig)> = rows.iter().map(|&r| (r, &other)).collect();
    lazy.compute_choosing(&model, &[], &choose).unwrap();
    let all = model.logits(&hidden, &rows).unwrap();
    let differ = rows
        .iter()
        .filter(|&&r| {
            lazy.chosen_token(r, &other, r + 1)
                != Some(sample(&settings[1], all.row(r).unwrap(), &[], r + 1))
        })
        .count();
    assert!(differ > 0, "another seed drew the same token at every row");
}
