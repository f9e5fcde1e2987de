//! A request in a sequence slot, and its phase.

use std::time::Instant;

use spindle_model::SeqId;

use super::request::Request;
use crate::constraint::Constraint;
use crate::speculative::draft_step::Speculation;

/// Where a running sequence is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// `history[fed..to]` still has to run through the model: the prompt,
    /// or after a preemption every token so far (`fed` of them are in the
    /// KV cache, many from the prefix cache). The last chunk's logits
    /// choose the next token.
    Prefilling { fed: usize, to: usize },
    /// The last token of `history` was emitted and waits to be run (with
    /// the tree drafted after it).
    Decoding,
    /// Its final event is sent; its slot is freed before the next pass.
    Finished,
}

/// A request in a sequence slot.
pub(super) struct Sequence {
    pub req: Request,
    pub seq: SeqId,
    pub arrived: Instant,
    /// Order of first admission: the latest admitted is preempted first.
    pub admitted: u64,
    /// Prompt and emitted tokens.
    pub history: Vec<u32>,
    /// Tokens emitted.
    pub generated: usize,
    pub phase: Phase,
    pub last_token_at: Option<Instant>,
    /// Its drafter and tree budget, when speculation is on (not for score
    /// requests).
    pub speculation: Option<Speculation>,
    /// Where its output is in its grammar, if it has one.
    pub constraint: Option<Constraint>,
}

impl Sequence {
    /// Tokens of the prompt chunk still to run (0 unless prefilling).
    pub fn prefill_left(&self) -> usize {
        match self.phase {
            Phase::Prefilling { fed, to } => to - fed,
            _ => 0,
        }
    }

    /// Whether its pending token runs in the next pass.
    pub fn is_decoding(&self) -> bool {
        self.phase == Phase::Decoding
    }

    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Finished
    }

    /// Tells its drafter the request is over: what it produced may draft
    /// later requests. Called once: when it finishes
    /// ([`super::step::finish`]) or, unfinished, when its client went away.
    pub fn end_drafts(&mut self) {
        if let Some(s) = &mut self.speculation {
            if self.generated > 0 {
                s.drafter.end(&self.history, self.req.prompt.len());
            }
        }
    }
}
