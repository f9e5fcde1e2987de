//! The one-pass rule of DESIGN.md: a row attends to its sequence's committed
//! KV plus its ancestors in the batch, so every row of a token tree gets
//! bit-identical logits to running its own path alone.

mod common_tiny;
use common_tiny::*;

use spindle_model::{Batch, KvCache, LoadedModel, Row, SeqId};

/// Commits `prompt` to a new sequence.
fn committed(m: &LoadedModel, cache: &mut KvCache, prompt: &[u32]) -> SeqId {
    let seq = cache.add_sequence().unwrap();
    let mut b = Batch::new();
    let rows = b.push_chain(seq, 0, prompt, |_| false);
    m.model.forward(&b, cache).unwrap();
    cache.commit(seq, &rows.collect::<Vec<_>>()).unwrap();
    seq
}

/// Logits of the last token of `path` run as a chain after the committed prompt.
fn alone(m: &LoadedModel, prompt: &[u32], path: &[u32]) -> Vec<f32> {
    let mut cache = kv(m, 256);
    let seq = committed(m, &mut cache, prompt);
    let mut b = Batch::new();
    b.push_chain(seq, prompt.len(), path, |i| i + 1 == path.len());
    m.model
        .forward(&b, &mut cache)
        .unwrap()
        .row(path.len() - 1)
        .unwrap()
        .to_vec()
}

#[test]
fn tree_rows_equal_their_paths_alone_bit_for_bit() {
    // gemma3 has sliding layers (window 8 in the fixture) and a global one;
    // qwen2 has biases; llama uses interleaved rope in its GGUF; qwen3moe
    // and mixtral route each row to its own experts.
    for arch in [
        "gemma3", "qwen2", "llama", "qwen3moe", "mixtral", "phi3", "gpt-oss",
    ] {
        for (kind, path) in sources(arch) {
            let m = load(&path, 2);
            let prompt: Vec<u32> = (0..11).map(|i| (i * 37 + 5) % 200).collect();
            // A tree:      a - b - c
            //               \   \- d - e
            //                \- f
            let toks = [7u32, 8, 9, 10, 11, 12];
            let mut cache = kv(&m, 256);
            let seq = committed(&m, &mut cache, &prompt);
            // A second sequence in the same batch must not disturb the tree.
            let other = committed(&m, &mut cache, &[3, 4, 5]);
            let p = prompt.len();
            let mut b = Batch::new();
            let a = b.push(Row {
                token: toks[0],
                pos: p,
                seq,
                parent: None,
                logits: true,
            });
            b.push(Row {
                token: 99,
                pos: 3,
                seq: other,
                parent: None,
                logits: true,
            });
            let rb = b.push(Row {
                token: toks[1],
                pos: p + 1,
                seq,
                parent: Some(a),
                logits: true,
            });
            let c = b.push(Row {
                token: toks[2],
                pos: p + 2,
                seq,
                parent: Some(rb),
                logits: true,
            });
            let d = b.push(Row {
                token: toks[3],
                pos: p + 2,
                seq,
                parent: Some(rb),
                logits: true,
            });
            let e = b.push(Row {
                token: toks[4],
                pos: p + 3,
                seq,
                parent: Some(d),
                logits: true,
            });
            let f = b.push(Row {
                token: toks[5],
                pos: p + 1,
                seq,
                parent: Some(a),
                logits: true,
            });
            let out = m.model.forward(&b, &mut cache).unwrap();
            let cases: [(usize, Vec<u32>); 6] = [
                (a, vec![toks[0]]),
                (rb, vec![toks[0], toks[1]]),
                (c, vec![toks[0], toks[1], toks[2]]),
                (d, vec![toks[0], toks[1], toks[3]]),
                (e, vec![toks[0], toks[1], toks[3], toks[4]]),
                (f, vec![toks[0], toks[5]]),
            ];
            for (row, path) in cases {
                let want = alone(&m, &prompt, &path);
                assert!(
                    out.row(row).unwrap() == want.as_slice(),
                    "{arch} {kind}: tree row {row} differs from its path {path:?} alone"
                );
            }

            // Committing the accepted path a-b-d-e leaves the same KV (and so the
            // same next logits) as decoding those tokens one pass at a time.
            cache.commit(seq, &[a, rb, d, e]).unwrap();
            let mut next = Batch::new();
            next.push(Row {
                token: 42,
                pos: p + 4,
                seq,
                parent: None,
                logits: true,
            });
            let after_tree = m
                .model
                .forward(&next, &mut cache)
                .unwrap()
                .row(0)
                .unwrap()
                .to_vec();

            let mut plain = kv(&m, 256);
            let s2 = committed(&m, &mut plain, &prompt);
            for (i, &t) in [toks[0], toks[1], toks[3], toks[4]].iter().enumerate() {
                let mut one = Batch::new();
                one.push(Row {
                    token: t,
                    pos: p + i,
                    seq: s2,
                    parent: None,
                    logits: false,
                });
                m.model.forward(&one, &mut plain).unwrap();
                plain.commit(s2, &[0]).unwrap();
            }
            let mut next2 = Batch::new();
            next2.push(Row {
                token: 42,
                pos: p + 4,
                seq: s2,
                parent: None,
                logits: true,
            });
            let after_plain = m
                .model
                .forward(&next2, &mut plain)
                .unwrap()
                .row(0)
                .unwrap()
                .to_vec();
            assert!(
                after_tree == after_plain,
                "{arch} {kind}: KV after committing a tree path differs from plain decoding"
            );
        }
    }
}

#[test]
fn invalid_batches_are_errors() {
    let (_, path) = sources("llama")[1].clone();
    let m = load(&path, 1);
    let mut cache = kv(&m, 8);
    let seq = cache.add_sequence().unwrap();
    let bad = |rows: Vec<Row>, cache: &mut KvCache| {
        let b = Batch { rows };
        m.model.forward(&b, cache).is_err()
    };
    let r = |token, pos, parent| Row {
        token,
        pos,
        seq,
        parent,
        logits: true,
    };
    assert!(bad(vec![r(1, 1, None)], &mut cache), "wrong root position");
    assert!(
        bad(vec![r(1, 0, None), r(2, 2, Some(0))], &mut cache),
        "wrong child position"
    );
    assert!(
        bad(vec![r(1, 0, Some(1)), r(2, 1, None)], &mut cache),
        "parent after child"
    );
    assert!(
        bad(vec![r(1_000_000, 0, None)], &mut cache),
        "token outside vocabulary"
    );
    assert!(
        bad(
            vec![Row {
                seq: 77,
                ..r(1, 0, None)
            }],
            &mut cache
        ),
        "unknown sequence"
    );
    let long: Vec<u32> = (0..9).collect();
    let mut b = Batch::new();
    b.push_chain(seq, 0, &long, |_| false);
    assert!(m.model.forward(&b, &mut cache).is_err(), "past the context");
    // A good batch still works afterwards.
    assert!(!bad(vec![r(1, 0, None)], &mut cache));
}

#[test]
fn every_isa_gives_the_same_logits_bit_for_bit() {
    if let Some(note) = spindle_kernels::simd::untested_isas_note() {
        eprintln!("{note}");
    }
    for arch in ["gemma3", "qwen3", "qwen3moe", "gpt-oss"] {
        let (_, path) = sources(arch)[1].clone();
        let mut m = load(&path, 2);
        let ids: Vec<u32> = (0..23).map(|i| (i * 13 + 1) % 250).collect();
        let want = prefill_logits(&m, &ids);
        for isa in spindle_kernels::simd::available_isas() {
            m.model.set_isa(isa).unwrap();
            assert!(
                prefill_logits(&m, &ids) == want,
                "{arch}: {isa} differs from the detected path"
            );
        }
    }
}

/// Sliding-window layers keep only the blocks their window (8 tokens in the
/// gemma3 fixture) still sees and give the rest back as the sequence grows:
/// decoding 40 tokens one by one gives every position the bits of one
/// prefill pass over the whole chain, where nothing was given back.
#[test]
fn sliding_window_blocks_are_given_back_without_changing_logits() {
    for (kind, path) in sources("gemma3") {
        let m = load(&path, 2);
        let ids: Vec<u32> = (0..40).map(|i| (i * 29 + 3) % 250).collect();
        let want = prefill_logits(&m, &ids);
        let mut cache = kv(&m, 64);
        let window = m
            .model
            .config
            .sliding_window
            .expect("gemma3 fixture slides");
        let layout = cache.layout().clone();
        assert_eq!(
            layout.seq_blocks(Some(window)),
            2,
            "a window of 8 spans two blocks at most"
        );
        let seq = cache.add_sequence().unwrap();
        for (i, &t) in ids.iter().enumerate() {
            let mut b = Batch::new();
            b.push_chain(seq, i, &[t], |_| true);
            let got = m.model.forward(&b, &mut cache).unwrap();
            assert!(
                got.row(0).unwrap() == want[i].as_slice(),
                "{kind}: position {i} differs from the prefill"
            );
            cache.commit(seq, &[0]).unwrap();
            // Full layers hold every block so far, sliding ones at most two.
            let full = (i + 1).div_ceil(16);
            let used = cache.block_usage().in_use;
            assert!(
                used > full && used <= full + 2,
                "{kind}: {used} blocks in use at length {}",
                i + 1
            );
        }
        assert_eq!(cache.block_usage().in_use, 3 + 1);
        // Rolling back by one token is possible; past what the window still
        // holds is an error, not a wrong answer.
        cache.truncate(seq, 39).unwrap();
        assert!(cache.truncate(seq, 20).is_err());
    }
}

/// The cache's sequence slots are fixed: one more than it was made for is an
/// error, and a removed sequence frees its slot.
#[test]
fn sequence_slots_are_fixed_and_reused() {
    let (_, path) = sources("llama")[1].clone();
    let m = load(&path, 1);
    let mut cache = m.model.new_kv_cache(m.model.default_kv_type(), 16, 2);
    let a = cache.add_sequence().unwrap();
    let _b = cache.add_sequence().unwrap();
    assert!(matches!(
        cache.add_sequence(),
        Err(spindle_model::ModelError::NoFreeSequence { max: 2 })
    ));
    cache.remove_sequence(a);
    let c = cache.add_sequence().unwrap();
    assert_eq!(cache.seq_len(c), 0);
    // Keys and values, one block of 16 tokens per layer and sequence.
    let row = cache.kv_type().row_bytes(cache.kv_dim());
    let want = 2 * 16 * m.model.config.n_layers * row * 2;
    assert_eq!(cache.layout().bytes(), want);
    assert_eq!(cache.block_usage().total, 2);
}

/// A model restricted to some of its layers shares the weights: with every
/// layer kept it is the same model bit for bit; with fewer it differs (and
/// stays finite); bad layer lists are errors.
#[test]
fn layer_subsets_share_weights() {
    let (_, path) = sources("gemma3")[1].clone();
    let m = load(&path, 1);
    let n = m.model.config.n_layers;
    let ids: Vec<u32> = (0..12).map(|i| (i * 7 + 3) % 200).collect();
    let logits = |model: &spindle_model::Model| {
        let mut cache = model.new_kv_cache(model.default_kv_type(), 64, 1);
        let seq = cache.add_sequence().unwrap();
        let mut b = Batch::new();
        b.push_chain(seq, 0, &ids, |i| i + 1 == ids.len());
        model
            .forward(&b, &mut cache)
            .unwrap()
            .row(ids.len() - 1)
            .unwrap()
            .to_vec()
    };
    let want = logits(&m.model);
    let all: Vec<usize> = (0..n).collect();
    assert!(logits(&m.model.with_layers(&all, 1).unwrap()) == want);
    let fewer = m.model.with_layers(&[0, n - 1], 1).unwrap();
    assert_eq!(fewer.config.n_layers, 2);
    let got = logits(&fewer);
    assert!(got != want && got.iter().all(|v| v.is_finite()));
    assert!(m.model.with_layers(&[], 1).is_err());
    assert!(m.model.with_layers(&[1, 0], 1).is_err());
    assert!(m.model.with_layers(&[n], 1).is_err());
}

/// The output head run later over any subset of a pass's rows, in any
/// order, gives each row the bits `forward` gives it; rows that did not ask
/// for logits are refused.
#[test]
fn logits_of_any_row_subset_equal_the_whole_pass() {
    for arch in ["gemma3", "qwen2", "llama", "mixtral"] {
        for (_, path) in sources(arch) {
            let m = load(&path, 2);
            let ids: Vec<u32> = (0..9).map(|i| (i * 13 + 1) % 200).collect();
            let batch_and_cache = || {
                let mut cache = m.model.new_kv_cache(m.model.default_kv_type(), 64, 1);
                let seq = cache.add_sequence().unwrap();
                let mut b = Batch::new();
                b.push_chain(seq, 0, &ids, |i| i != 4);
                (b, cache)
            };
            let (b, mut cache) = batch_and_cache();
            let whole = m.model.forward(&b, &mut cache).unwrap();
            let (b, mut cache) = batch_and_cache();
            let hidden = m.model.forward_hidden(&b, &mut cache).unwrap();
            for subset in [
                vec![8],
                vec![0, 1, 2],
                vec![7, 3, 5],
                vec![0, 1, 2, 3, 5, 6, 7, 8],
            ] {
                let part = m.model.logits(&hidden, &subset).unwrap();
                for &r in &subset {
                    assert!(
                        part.row(r).unwrap() == whole.row(r).unwrap(),
                        "{arch} row {r} of {subset:?}"
                    );
                }
            }
            assert!(m.model.logits(&hidden, &[4]).is_err());
        }
    }
}

/// A q8_0 KV cache: every row of a tree still gets the bits of its own path
/// run alone (rows of the pass are read back as stored), and the logits stay
/// close to those of the f32 cache of these float models.
#[test]
fn q8_0_kv_keeps_the_one_pass_rule_and_stays_close() {
    use spindle_model::KvType;
    for arch in ["llama", "qwen2"] {
        let (_, path) = sources(arch)[1].clone();
        let m = load(&path, 2);
        assert!(KvType::Q8_0.supports(m.model.config.kv_dim()));
        let prompt: Vec<u32> = (0..13).map(|i| (i * 41 + 7) % 200).collect();
        let path_toks = [5u32, 6, 7];
        let run = |ty: KvType, tree: bool| -> Vec<f32> {
            let mut cache = m.model.new_kv_cache(ty, 64, 2);
            let seq = cache.add_sequence().unwrap();
            let mut b = Batch::new();
            let rows = b.push_chain(seq, 0, &prompt, |_| false);
            m.model.forward(&b, &mut cache).unwrap();
            cache.commit(seq, &rows.collect::<Vec<_>>()).unwrap();
            let mut b = Batch::new();
            let p = prompt.len();
            if tree {
                // A sibling branch beside the path.
                b.push(Row {
                    token: 99,
                    pos: p,
                    seq,
                    parent: None,
                    logits: true,
                });
            }
            let r = b.push_chain(seq, p, &path_toks, |_| true);
            let last = r.end - 1;
            if tree {
                b.push(Row {
                    token: 98,
                    pos: p + 1,
                    seq,
                    parent: Some(r.start),
                    logits: true,
                });
            }
            m.model
                .forward(&b, &mut cache)
                .unwrap()
                .row(last)
                .unwrap()
                .to_vec()
        };
        let alone = run(KvType::Q8_0, false);
        assert!(run(KvType::Q8_0, true) == alone, "{arch}: tree row differs");
        let exact = run(KvType::F32, false);
        let worst = alone
            .iter()
            .zip(&exact)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        let scale = exact.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(
            worst < 0.05 * scale.max(1.0),
            "{arch}: q8_0 KV off by {worst}"
        );
        assert!(
            alone != exact,
            "{arch}: q8_0 rounding should show somewhere"
        );
    }
}

/// A root row placed before the end of the committed context branches from
/// there: it and its descendants see only the first `pos` committed
/// positions (a content-free prompt beside the real one, in one pass), bit
/// for bit what that prefix alone gives, while rows after the whole context
/// in the same pass are unchanged.
#[test]
fn a_branch_from_an_earlier_position_sees_only_that_prefix() {
    for arch in ["gemma3", "llama", "qwen3moe"] {
        let (_, path) = sources(arch)[1].clone();
        let m = load(&path, 2);
        let prompt: Vec<u32> = (0..11).map(|i| (i * 37 + 5) % 200).collect();
        let branch = [7u32, 8, 9];
        let mut cache = kv(&m, 256);
        let seq = committed(&m, &mut cache, &prompt);
        let mut b = Batch::new();
        b.push_chain(seq, prompt.len(), &[4, 5], |i| i == 1);
        b.push_chain(seq, 3, &branch, |i| i == 2);
        let logits = m.model.forward(&b, &mut cache).unwrap();
        assert_eq!(
            logits.row(4).unwrap(),
            &alone(&m, &prompt[..3], &branch)[..],
            "{arch}: the branch"
        );
        assert_eq!(
            logits.row(1).unwrap(),
            &alone(&m, &prompt, &[4, 5])[..],
            "{arch}: the rows after the whole context"
        );
        // From position 0: nothing committed is seen.
        let mut b = Batch::new();
        b.push_chain(seq, 0, &branch, |i| i == 2);
        let from_zero = m.model.forward(&b, &mut cache).unwrap();
        assert_eq!(
            from_zero.row(2).unwrap(),
            &alone(&m, &[], &branch)[..],
            "{arch}"
        );
    }
    // A long context whose sliding layers dropped early blocks: a branch
    // from the start is an error, not a panic (or, if kept, exact).
    let (_, path) = sources("gemma3")[1].clone();
    let m = load(&path, 1);
    let prompt: Vec<u32> = (0..200).map(|i| (i * 13 + 1) % 200).collect();
    let mut cache = kv(&m, 256);
    let seq = committed(&m, &mut cache, &prompt);
    let mut b = Batch::new();
    b.push_chain(seq, 2, &[7, 8], |i| i == 1);
    match m.model.forward(&b, &mut cache) {
        Ok(l) => assert_eq!(l.row(1).unwrap(), &alone(&m, &prompt[..2], &[7, 8])[..]),
        Err(e) => assert!(e.to_string().contains("no longer keeps"), "{e}"),
    }
}
