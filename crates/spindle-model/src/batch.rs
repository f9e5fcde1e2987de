//! The one pass: a batch of rows, each a token at a position of a sequence,
//! optionally following another row of the same batch (DESIGN.md, "The one pass").

/// Identifies a sequence in the KV cache.
pub type SeqId = usize;

/// One row of a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub token: u32,
    /// Absolute position: the sequence's committed length for a root row,
    /// the parent's position plus one otherwise.
    pub pos: usize,
    pub seq: SeqId,
    /// An earlier row of this batch that this row follows, or `None` when the
    /// row follows the sequence's committed context directly.
    pub parent: Option<usize>,
    /// Whether the pass returns logits for this row.
    pub logits: bool,
}

/// Rows run through the model in one pass.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub rows: Vec<Row>,
}

impl Batch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a row and returns its index.
    pub fn push(&mut self, row: Row) -> usize {
        self.rows.push(row);
        self.rows.len() - 1
    }

    /// A chain of tokens following the committed context of `seq` (at
    /// position `start`): each row's parent is the row before. `logits`
    /// selects which rows return logits, by index within the chain.
    pub fn push_chain(
        &mut self,
        seq: SeqId,
        start: usize,
        tokens: &[u32],
        logits: impl Fn(usize) -> bool,
    ) -> std::ops::Range<usize> {
        let first = self.rows.len();
        for (i, &token) in tokens.iter().enumerate() {
            let parent = if i == 0 { None } else { Some(first + i - 1) };
            self.rows.push(Row {
                token,
                pos: start + i,
                seq,
                parent,
                logits: logits(i),
            });
        }
        first..self.rows.len()
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The rows a row follows, root first, ending with the row itself.
    pub fn path(&self, row: usize) -> Vec<usize> {
        let mut path = vec![row];
        let mut r = row;
        while let Some(p) = self.rows[r].parent {
            path.push(p);
            r = p;
        }
        path.reverse();
        path
    }
}
