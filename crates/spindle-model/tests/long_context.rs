//! Attention over contexts of several chunks (`attention::CHUNK` positions
//! each): results stay bit-identical however the work is split (prompt
//! passes, thread count, batch, token tree, ISA path), on models with
//! sliding-window and global layers, grouped-query heads, and f16, f32 and
//! q8_0 KV caches.

mod common_tiny;
use common_tiny::*;

use spindle_kernels::attention::CHUNK;
use spindle_model::{Batch, KvCache, KvType, LoadedModel, Row, SeqId};

/// A context that spans three chunks, ending inside the third.
const LEN: usize = 2 * CHUNK + 90;

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + salt * 11 + 5) % 250)
        .collect()
}

fn cache(m: &LoadedModel, ty: KvType) -> KvCache {
    m.model.new_kv_cache(ty, LEN + 64, 12)
}

/// Commits `ids` to a new sequence in passes of the given sizes, and returns
/// it with the logits of every row of every pass, in position order.
fn prefill(
    m: &LoadedModel,
    kv: &mut KvCache,
    ids: &[u32],
    passes: &[usize],
) -> (SeqId, Vec<Vec<f32>>) {
    assert_eq!(passes.iter().sum::<usize>(), ids.len());
    let seq = kv.add_sequence().unwrap();
    let mut logits = Vec::new();
    let mut at = 0;
    for &n in passes {
        let mut b = Batch::new();
        let rows = b.push_chain(seq, at, &ids[at..at + n], |_| true);
        let out = m.model.forward(&b, kv).unwrap();
        logits.extend((0..n).map(|i| out.row(i).unwrap().to_vec()));
        kv.commit(seq, &rows.collect::<Vec<_>>()).unwrap();
        at += n;
    }
    (seq, logits)
}

/// The KV types each fixture runs with: its default, and q8_0 and f16 where
/// its rows allow.
fn kv_types(m: &LoadedModel) -> Vec<KvType> {
    let mut types = vec![m.model.default_kv_type()];
    for ty in [KvType::F16, KvType::Q8_0] {
        if ty.supports(m.model.config.kv_dim()) && !types.contains(&ty) {
            types.push(ty);
        }
    }
    types
}

/// gemma3: sliding layers (window 8) and a global one, one KV head;
/// llama: two KV heads for four query heads.
const ARCHS_LONG: [&str; 2] = ["gemma3", "llama"];

#[test]
fn a_long_prompt_split_into_passes_gives_the_bits_of_one_pass() {
    for arch in ARCHS_LONG {
        let (_, path) = sources(arch)[1].clone();
        let m = load(&path, 2);
        for ty in kv_types(&m) {
            let ids = tokens(LEN, 1);
            let (_, one) = prefill(&m, &mut cache(&m, ty), &ids, &[LEN]);
            // Pass edges on and beside chunk edges, a one-row pass, and a
            // last pass of one tile (with one KV head, too few tiles for
            // the threads: its chunks are split out as a decode's are).
            for passes in [
                vec![CHUNK, CHUNK, LEN - 2 * CHUNK],
                vec![100, CHUNK + 1, 1, LEN - CHUNK - 102],
                vec![LEN - 20, 20],
            ] {
                let (_, split) = prefill(&m, &mut cache(&m, ty), &ids, &passes);
                for (pos, (a, b)) in one.iter().zip(&split).enumerate() {
                    assert!(
                        a == b,
                        "{arch} {} KV, passes {passes:?}: position {pos} differs",
                        ty.name()
                    );
                }
            }
        }
    }
}

#[test]
fn thread_count_batch_and_isa_do_not_change_a_row_after_a_long_context() {
    if let Some(note) = spindle_kernels::simd::untested_isas_note() {
        eprintln!("{note}");
    }
    for arch in ARCHS_LONG {
        let (_, path) = sources(arch)[1].clone();
        let ids = tokens(LEN, 2);
        let next = 77u32;
        // Logits of `next` after the long context, decoded with `threads`
        // threads, alone or beside `others` one-row sequences.
        let decode = |m: &LoadedModel, ty: KvType, others: usize| -> Vec<f32> {
            let mut kv = cache(m, ty);
            let (seq, _) = prefill(m, &mut kv, &ids, &[LEN]);
            let mut b = Batch::new();
            let mut side = Vec::new();
            for o in 0..others {
                let (s, _) = prefill(m, &mut kv, &tokens(3 + o, 3), &[3 + o]);
                side.push((s, 3 + o));
            }
            // The row of interest sits in the middle of the batch.
            for &(s, len) in &side[..others / 2] {
                b.push_chain(s, len, &[5], |_| true);
            }
            let at = b.push(Row {
                token: next,
                pos: LEN,
                seq,
                parent: None,
                logits: true,
            });
            for &(s, len) in &side[others / 2..] {
                b.push_chain(s, len, &[5], |_| true);
            }
            m.model
                .forward(&b, &mut kv)
                .unwrap()
                .row(at)
                .unwrap()
                .to_vec()
        };
        let base = load(&path, 2);
        for ty in kv_types(&base) {
            let want = decode(&base, ty, 0);
            for threads in [1, 3] {
                let m = load(&path, threads);
                assert!(
                    decode(&m, ty, 0) == want,
                    "{arch} {}: {threads} threads differ",
                    ty.name()
                );
            }
            // Nine rows at two threads make enough tiles that every tile
            // folds its own chunks; one row alone has its chunks split out.
            assert!(
                decode(&base, ty, 9) == want,
                "{arch} {}: the batch changed the row",
                ty.name()
            );
            for isa in spindle_kernels::simd::available_isas() {
                let mut m = load(&path, 2);
                m.model.set_isa(isa).unwrap();
                assert!(
                    decode(&m, ty, 0) == want,
                    "{arch} {}: {isa} differs",
                    ty.name()
                );
            }
        }
    }
}

#[test]
fn tree_rows_after_a_long_context_equal_their_paths_alone() {
    for arch in ARCHS_LONG {
        let (_, path) = sources(arch)[1].clone();
        let m = load(&path, 2);
        // The context ends two positions before a chunk edge, so the tree's
        // paths cross it.
        let ids = tokens(2 * CHUNK - 2, 4);
        let ctx = ids.len();
        let alone = |path: &[u32]| -> Vec<f32> {
            let mut kv = cache(&m, m.model.default_kv_type());
            let (seq, _) = prefill(&m, &mut kv, &ids, &[ctx]);
            let mut b = Batch::new();
            b.push_chain(seq, ctx, path, |i| i + 1 == path.len());
            let out = m.model.forward(&b, &mut kv).unwrap();
            out.row(path.len() - 1).unwrap().to_vec()
        };
        // a - b - c - d, and a - e - f beside it.
        let mut kv = cache(&m, m.model.default_kv_type());
        let (seq, _) = prefill(&m, &mut kv, &ids, &[ctx]);
        let mut b = Batch::new();
        let chain = b.push_chain(seq, ctx, &[10, 11, 12, 13], |_| true);
        let e = b.push(Row {
            token: 14,
            pos: ctx + 1,
            seq,
            parent: Some(chain.start),
            logits: true,
        });
        let f = b.push(Row {
            token: 15,
            pos: ctx + 2,
            seq,
            parent: Some(e),
            logits: true,
        });
        let out = m.model.forward(&b, &mut kv).unwrap();
        assert!(
            out.row(chain.end - 1).unwrap() == alone(&[10, 11, 12, 13]).as_slice(),
            "{arch}: the chain's last row differs from its path alone"
        );
        assert!(
            out.row(f).unwrap() == alone(&[10, 14, 15]).as_slice(),
            "{arch}: the branch's row differs from its path alone"
        );
    }
}

#[test]
fn trees_of_two_sequences_after_long_contexts_equal_their_paths_alone() {
    // Two sequences, each with a tree of two branches: enough rows and
    // tasks that every task folds its own chunks, and each tree's chunks
    // before its context's end are computed once for both branches.
    for arch in ARCHS_LONG {
        let (_, path) = sources(arch)[1].clone();
        let m = load(&path, 2);
        let contexts = [tokens(2 * CHUNK - 2, 5), tokens(CHUNK + 40, 6)];
        let alone = |ids: &[u32], path: &[u32]| -> Vec<f32> {
            let mut kv = cache(&m, m.model.default_kv_type());
            let (seq, _) = prefill(&m, &mut kv, ids, &[ids.len()]);
            let mut b = Batch::new();
            b.push_chain(seq, ids.len(), path, |i| i + 1 == path.len());
            let out = m.model.forward(&b, &mut kv).unwrap();
            out.row(path.len() - 1).unwrap().to_vec()
        };
        let mut kv = cache(&m, m.model.default_kv_type());
        let seqs: Vec<_> = contexts
            .iter()
            .map(|ids| prefill(&m, &mut kv, ids, &[ids.len()]).0)
            .collect();
        let mut b = Batch::new();
        let mut checks = Vec::new();
        for (ids, &seq) in contexts.iter().zip(&seqs) {
            let ctx = ids.len();
            // a b c d e, and a f g h beside it.
            let chain = b.push_chain(seq, ctx, &[20, 21, 22, 23, 24], |_| true);
            let mut parent = chain.start;
            for (k, token) in [25u32, 26, 27].into_iter().enumerate() {
                parent = b.push(Row {
                    token,
                    pos: ctx + 1 + k,
                    seq,
                    parent: Some(parent),
                    logits: true,
                });
            }
            checks.push((ids, chain.end - 1, vec![20, 21, 22, 23, 24]));
            checks.push((ids, parent, vec![20, 25, 26, 27]));
        }
        let out = m.model.forward(&b, &mut kv).unwrap();
        for (ids, row, path) in checks {
            assert!(
                out.row(row).unwrap() == alone(ids, &path).as_slice(),
                "{arch}: the row of path {path:?} after {} tokens differs from the path alone",
                ids.len()
            );
        }
    }
}
