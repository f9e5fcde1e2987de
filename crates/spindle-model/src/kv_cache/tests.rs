//! The block pool through the cache's own API: values come back from the
//! blocks they were written to, prefixes are shared and copied on write,
//! sliding windows give blocks back, and a full pool is an error that
//! `fits` predicts.

use super::*;

const KV_DIM: usize = 4;

/// Two layers: full attention, and a sliding window of 20.
fn cache(max_len: usize, max_seqs: usize, pool_tokens: Option<usize>) -> KvCache {
    KvCache::new(KvLayout {
        ty: KvType::F32,
        kv_dim: KV_DIM,
        windows: vec![None, Some(20)],
        max_len,
        max_seqs,
        rollback: 0,
        pool_tokens,
    })
}

/// The key (value: its negation) a pass writes for `token` at `pos` in
/// layer `l`: exact in f32, and different for every input.
fn key(l: usize, pos: usize, token: u32, j: usize) -> f32 {
    (l * 100_000 + pos * 10 + j) as f32 + token as f32 * 0.5
}

/// Runs a fake pass of `tokens` after `seq`'s end and commits all of it.
fn append(kv: &mut KvCache, seq: SeqId, tokens: &[u32]) -> Result<(), ModelError> {
    let start = kv.seq_len(seq);
    let rows: Vec<(SeqId, usize, u32)> = tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| (seq, start + i, t))
        .collect();
    for (l, layer) in kv.scratch.layers.iter_mut().enumerate() {
        let k: Vec<f32> = rows
            .iter()
            .flat_map(|&(_, pos, t)| (0..KV_DIM).map(move |j| key(l, pos, t, j)))
            .collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        layer.k.resize(k.len());
        layer.v.resize(v.len());
        layer.k.write(0, &k);
        layer.v.write(0, &v);
    }
    kv.scratch.rows = rows;
    kv.commit(seq, &(0..tokens.len()).collect::<Vec<_>>())
}

/// What layer `l` must hold for `tokens` from position `from` on.
fn expected(l: usize, tokens: &[u32], from: usize) -> Vec<f32> {
    (from..tokens.len())
        .flat_map(|pos| (0..KV_DIM).map(move |j| key(l, pos, tokens[pos], j)))
        .collect()
}

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7 + salt) % 50).collect()
}

#[test]
fn values_come_back_in_order_across_blocks_and_windows_move_on() {
    let mut kv = cache(100, 2, None);
    let seq = kv.add_sequence().unwrap();
    let t = tokens(50, 1);
    for chunk in t.chunks(7) {
        append(&mut kv, seq, chunk).unwrap();
        let len = kv.seq_len(seq);
        let (k, v) = kv.committed_kv(seq, 0).unwrap();
        assert_eq!(k, expected(0, &t[..len], 0));
        assert_eq!(v, k.iter().map(|x| -x).collect::<Vec<_>>());
        // The sliding layer: the next position sees back 19 tokens.
        let (k, _) = kv.committed_kv(seq, 1).unwrap();
        assert_eq!(k, expected(1, &t[..len], (len + 1).saturating_sub(20)));
    }
    // 4 blocks of full attention; the window spans at most 3 blocks.
    let u = kv.block_usage();
    assert_eq!(u.in_use, 4 + 3, "positions 31..50 lie in blocks 1..3");
    assert_eq!(kv.layout().seq_blocks(Some(20)), 3);
    assert_eq!(u.total, 2 * 7 + 2 * 3);
    assert_eq!(kv.bytes_used(), 7 * kv.layout().block_bytes());
}

#[test]
fn a_prompt_that_starts_with_cached_blocks_shares_them() {
    let mut kv = cache(100, 3, None);
    let a = kv.add_sequence().unwrap();
    let t = tokens(40, 2);
    append(&mut kv, a, &t).unwrap();
    let held = kv.block_usage().in_use;

    // Two full blocks match; at least one token is left to run.
    let mut prompt = t.clone();
    prompt.extend([9, 9, 9]);
    let (b, cached) = kv.add_sequence_with_prefix(&prompt).unwrap();
    assert_eq!((cached, kv.seq_len(b)), (32, 32));
    // Shared, not copied: only the sliding layer's first block, which a
    // had given back (cached), is held again, for b's window 13..32.
    assert_eq!(kv.block_usage().in_use, held + 1);
    assert_eq!(kv.committed_kv(b, 0).unwrap().0, expected(0, &t[..32], 0));
    assert_eq!(kv.committed_kv(b, 1).unwrap().0, expected(1, &t[..32], 13));
    // Exactly 32 tokens: one must still run, so only one block is used.
    let (c, cached) = kv.add_sequence_with_prefix(&t[..32]).unwrap();
    assert_eq!(cached, 16);
    kv.remove_sequence(c);

    // A different first block shares nothing, even with equal later ones.
    let mut other = t.clone();
    other[3] += 1;
    let (d, cached) = kv.add_sequence_with_prefix(&other).unwrap();
    assert_eq!(cached, 0);
    kv.remove_sequence(d);

    // Finished sequences leave their full blocks in the prefix cache.
    kv.remove_sequence(a);
    kv.remove_sequence(b);
    assert_eq!(kv.block_usage().in_use, 0);
    let (e, cached) = kv.add_sequence_with_prefix(&prompt).unwrap();
    assert_eq!(cached, 32);
    append(&mut kv, e, &prompt[32..]).unwrap();
    assert_eq!(kv.committed_kv(e, 0).unwrap().0, expected(0, &prompt, 0));
}

#[test]
fn writing_into_a_shared_block_copies_it_first() {
    let mut kv = cache(100, 2, None);
    let a = kv.add_sequence().unwrap();
    let t = tokens(40, 3);
    append(&mut kv, a, &t).unwrap();
    let (b, _) = kv.add_sequence_with_prefix(&t).unwrap();
    // b rolls back into the shared second block and writes other tokens.
    kv.truncate(b, 20).unwrap();
    let mut u = t[..20].to_vec();
    u.extend([44, 45, 46, 47, 48]);
    append(&mut kv, b, &u[20..]).unwrap();
    assert_eq!(kv.committed_kv(b, 0).unwrap().0, expected(0, &u, 0));
    assert_eq!(kv.committed_kv(a, 0).unwrap().0, expected(0, &t, 0));
    assert_eq!(kv.committed_kv(a, 1).unwrap().0, expected(1, &t, 21));
    // The changed block left the prefix cache; the untouched first did not.
    kv.remove_sequence(b);
    let (c, cached) = kv.add_sequence_with_prefix(&u).unwrap();
    assert_eq!(cached, 16);
    kv.remove_sequence(c);
    let (c, cached) = kv.add_sequence_with_prefix(&t).unwrap();
    assert_eq!(cached, 32, "a's second block is still its own");
    kv.remove_sequence(c);
}

#[test]
fn a_full_pool_is_an_error_that_fits_predicts() {
    // Two blocks of full attention for two sequences of up to 32 tokens.
    let mut kv = cache(32, 2, Some(32));
    let a = kv.add_sequence().unwrap();
    let b = kv.add_sequence().unwrap();
    assert!(kv.fits(&[(a, 20)]));
    append(&mut kv, a, &tokens(20, 4)).unwrap();
    assert!(kv.fits(&[(a, 12)]), "the rest of a's second block");
    assert!(!kv.fits(&[(b, 1)]));
    assert!(matches!(
        append(&mut kv, b, &[1]),
        Err(ModelError::OutOfBlocks { blocks: 2, .. })
    ));
    assert_eq!(kv.seq_len(b), 0, "nothing was committed");
    // a's full first block (in both layers) stays cached when a ends,
    // until b needs it.
    kv.remove_sequence(a);
    assert_eq!(kv.block_usage().cached_free, 2);
    assert!(kv.fits(&[(b, 32)]));
    append(&mut kv, b, &tokens(32, 5)).unwrap();
    assert_eq!(
        kv.committed_kv(b, 0).unwrap().0,
        expected(0, &tokens(32, 5), 0)
    );
    assert!(matches!(
        append(&mut kv, b, &[1]),
        Err(ModelError::ContextFull { .. })
    ));
}

#[test]
fn a_prefix_hit_needs_the_blocks_its_window_sees() {
    // Pool of one sequence: sliding blocks given back are reused at once.
    let mut kv = cache(100, 1, None);
    let a = kv.add_sequence().unwrap();
    let t = tokens(90, 6);
    append(&mut kv, a, &t).unwrap();
    kv.remove_sequence(a);
    // Every full-attention block is cached, but the sliding layer kept
    // only blocks 4 and 5 (positions 64..90, its window and the block
    // being written); blocks 2 and 3 were reused for them.
    let (b, cached) = kv.add_sequence_with_prefix(&t).unwrap();
    assert_eq!(cached, 80, "the window before position 80 is 61..80");
    assert_eq!(kv.committed_kv(b, 1).unwrap().0, expected(1, &t[..80], 61));
    kv.remove_sequence(b);
    let (_, cached) = kv.add_sequence_with_prefix(&t[..60]).unwrap();
    assert_eq!(cached, 0, "the window before 48 was given back");
}
