//! Writing into a sequence's blocks: committing the rows a pass keeps
//! (copying a shared block first, giving back what left a window), padding,
//! and rolling back.

use super::*;

impl KvCache {
    /// Appends rows of the last pass to their sequence, in order. Each row
    /// must be at the sequence's next position.
    pub fn commit(&mut self, seq: SeqId, rows: &[usize]) -> Result<(), ModelError> {
        let kv_dim = self.layout.kv_dim;
        for &r in rows {
            let Some(&(rseq, pos, token)) = self.scratch.rows.get(r) else {
                return Err(ModelError::InvalidBatch(format!(
                    "row {r} is not in the last pass"
                )));
            };
            let len = self.seq_mut(seq)?.len;
            if rseq != seq || pos != len {
                return Err(ModelError::InvalidBatch(format!(
                    "row {r} (sequence {rseq}, position {pos}) cannot follow sequence {seq} at length {len}"
                )));
            }
            let scratch = std::mem::take(&mut self.scratch.layers);
            let row = r * kv_dim..(r + 1) * kv_dim;
            let done = self.append(seq, token, |l, dst, at| {
                dst.k.copy_from(at, &scratch[l].k, row.clone());
                dst.v.copy_from(at, &scratch[l].v, row.clone());
            });
            self.scratch.layers = scratch;
            done?;
        }
        Ok(())
    }

    /// Commits `n` positions of zero keys and values to a sequence, without a
    /// pass: benchmarks and memory measurements use it to reach a long
    /// context quickly (what a pass costs does not depend on the values).
    pub fn pad_with_zeros(&mut self, seq: SeqId, n: usize) -> Result<(), ModelError> {
        let zeros = vec![0.0f32; self.layout.kv_dim];
        for _ in 0..n {
            // No token can be u32::MAX, so these blocks match no prompt.
            self.append(seq, u32::MAX, |_, dst, at| {
                dst.k.write(at, &zeros);
                dst.v.write(at, &zeros);
            })?;
        }
        Ok(())
    }

    /// Writes `token`'s keys and values at the end of `seq` (an existing
    /// sequence): `write(layer, storage, element offset)` for every layer.
    fn append(
        &mut self,
        seq: SeqId,
        token: u32,
        mut write: impl FnMut(usize, &mut KvPair, usize),
    ) -> Result<(), ModelError> {
        let kv_dim = self.layout.kv_dim;
        let pos = self.seq_mut(seq)?.len;
        self.make_writable(seq, pos)?;
        let tables = &self.seqs[seq].as_ref().expect("checked").tables;
        for (l, dst) in self.layers.iter_mut().enumerate() {
            let b = tables[self.layer_group[l]][pos / BLOCK].expect("made writable");
            write(l, dst, (b * BLOCK + pos % BLOCK) * kv_dim);
        }
        self.appended(seq, token);
        Ok(())
    }

    /// Makes sure every group has a block of its own where `seq` writes
    /// position `pos`: a new block at a block boundary, a copy of a shared
    /// block, and a block leaving the prefix cache when it will change.
    fn make_writable(&mut self, seq: SeqId, pos: usize) -> Result<(), ModelError> {
        let max_len = self.layout.max_len;
        if pos >= max_len {
            return Err(ModelError::ContextFull {
                seq,
                len: pos + 1,
                ctx: max_len,
            });
        }
        let kv_dim = self.layout.kv_dim;
        let idx = pos / BLOCK;
        let s = self.seqs[seq].as_mut().expect("checked by the caller");
        for (g, group) in self.groups.iter_mut().enumerate() {
            let table = &mut s.tables[g];
            let out_of_blocks = |group: &Group| ModelError::OutOfBlocks {
                blocks: group.pool.capacity(),
                tokens: group.pool.capacity() * BLOCK,
            };
            if idx == table.len() {
                let b = group.pool.allocate().ok_or_else(|| out_of_blocks(group))?;
                table.push(Some(b));
                continue;
            }
            match table[idx] {
                Some(b) if group.pool.shared(b) => {
                    let copy = group.pool.allocate().ok_or_else(|| out_of_blocks(group))?;
                    let rows = pos % BLOCK * kv_dim;
                    for &l in &group.layers {
                        let kv = &mut self.layers[l];
                        let from = b * BLOCK * kv_dim..b * BLOCK * kv_dim + rows;
                        kv.k.copy_within(from.clone(), copy * BLOCK * kv_dim);
                        kv.v.copy_within(from, copy * BLOCK * kv_dim);
                    }
                    group.pool.release(b);
                    table[idx] = Some(copy);
                }
                Some(b) => group.pool.unregister(b),
                None => {
                    return Err(ModelError::InvalidBatch(format!(
                        "sequence {seq} cannot write position {pos}: its window has moved past it"
                    )))
                }
            }
        }
        Ok(())
    }

    /// Records a token written at the end of `seq`: a block it fills joins
    /// the prefix cache, and sliding groups give back what their window no
    /// longer sees.
    fn appended(&mut self, seq: SeqId, token: u32) {
        let rollback = self.layout.rollback;
        let s = self.seqs[seq].as_mut().expect("checked by the caller");
        s.tokens.push(token);
        s.len += 1;
        if s.len.is_multiple_of(BLOCK) {
            let i = s.len / BLOCK - 1;
            s.hashes.truncate(i);
            let parent = s.hashes.last().copied().unwrap_or(ROOT_HASH);
            let key = BlockKey::new(parent, &s.tokens[i * BLOCK..]);
            s.hashes.push(key.chain_hash());
            for (group, table) in self.groups.iter_mut().zip(&s.tables) {
                if let Some(b) = table[i] {
                    group.pool.register(b, key);
                }
            }
        }
        for (g, group) in self.groups.iter_mut().enumerate() {
            let Some(w) = group.window else { continue };
            // The next position sees back to `len + 1 - w`; a rollback
            // moves that back by up to `rollback`.
            let keep_from = (s.len + 1).saturating_sub(w + rollback) / BLOCK;
            if keep_from <= s.released[g] {
                continue;
            }
            for b in s.tables[g][s.released[g]..keep_from].iter_mut() {
                if let Some(b) = b.take() {
                    group.pool.release(b);
                }
            }
            s.released[g] = keep_from;
        }
    }

    /// Rolls a sequence back to `len` tokens. A sliding-window layer keeps
    /// only its window, so a sequence can roll back only as far as its
    /// windows still hold what the following positions see.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), ModelError> {
        let s = self.seqs.get_mut(seq).and_then(Option::as_mut);
        let Some(s) = s else {
            return Err(ModelError::InvalidBatch(format!(
                "sequence {seq} does not exist"
            )));
        };
        if len >= s.len {
            return Ok(());
        }
        for (g, group) in self.groups.iter().enumerate() {
            if let Some(w) = group.window {
                // Position `len` sees back to `len + 1 - w`.
                let first = (len + 1).saturating_sub(w) / BLOCK;
                if first < s.released[g] {
                    return Err(ModelError::InvalidBatch(format!(
                        "cannot roll sequence {seq} back from {} to {len} tokens: a layer keeps only its window of {w}",
                        s.len
                    )));
                }
            }
        }
        let keep = len.div_ceil(BLOCK);
        for (group, table) in self.groups.iter_mut().zip(&mut s.tables) {
            for b in table.drain(keep.min(table.len())..).flatten() {
                group.pool.release(b);
            }
        }
        s.len = len;
        s.tokens.truncate(len);
        s.hashes.truncate(len / BLOCK);
        Ok(())
    }

    /// Blocks each group would have to hand out for `seq` to commit `n`
    /// more tokens (sliding groups net of what their window gives back
    /// meanwhile). 0 everywhere for an unknown sequence.
    pub(super) fn blocks_needed(&self, seq: SeqId, n: usize) -> Vec<usize> {
        let Some(s) = self.seq(seq) else {
            return vec![0; self.groups.len()];
        };
        let end = (s.len + n).min(self.layout.max_len).div_ceil(BLOCK);
        self.groups
            .iter()
            .enumerate()
            .map(|(g, group)| {
                let table = &s.tables[g];
                let copy = table
                    .get(s.len / BLOCK)
                    .copied()
                    .flatten()
                    .is_some_and(|b| s.len % BLOCK != 0 && group.pool.shared(b));
                let grown = end.max(table.len());
                let needed = match group.window {
                    None => grown - table.len(),
                    Some(_) => {
                        let held = table.iter().flatten().count();
                        let peak = (grown - s.released[g]).min(group.seq_blocks);
                        peak.saturating_sub(held)
                    }
                };
                needed + copy as usize
            })
            .collect()
    }
}
