//! Incremental detokenization of generated ids.

use super::{PieceKind, Tokenizer};

/// Turns generated ids into text as they come.
///
/// [`StreamDecoder::push`] returns the text completed by one more id, and only
/// whole UTF-8 characters: the bytes of a character split over several
/// byte-fallback tokens (`<0xE6><0x97><0xA5>`) are held until it is complete.
/// The leading space a SentencePiece encoder added (`add_dummy_prefix`) is
/// dropped once, at the start of the stream, as [`Tokenizer::decode`] does.
/// Special tokens give no text. The pushed pieces, then [`StreamDecoder::flush`],
/// add up to exactly what `decode` gives for the same ids.
#[derive(Debug, Clone)]
pub struct StreamDecoder {
    tokenizer: Tokenizer,
    /// Bytes not yet returned: the start of an unfinished character.
    pending: Vec<u8>,
    /// No byte has been seen yet (for the SentencePiece leading space).
    at_start: bool,
    /// For tokenizers decoded through the `tokenizer.json` decoder: the ids
    /// since the last returned text, and how much of their text was returned.
    window: Vec<u32>,
}

impl StreamDecoder {
    pub(crate) fn new(tokenizer: Tokenizer) -> StreamDecoder {
        StreamDecoder {
            tokenizer,
            pending: Vec::new(),
            at_start: true,
            window: Vec::new(),
        }
    }

    /// Adds one id; returns the text it completes, if any. Ids outside the
    /// vocabulary (a model's padding rows) and special tokens give nothing.
    pub fn push(&mut self, id: u32) -> Option<String> {
        if self.tokenizer.is_special(id) {
            return None;
        }
        let kind = self.tokenizer.kind();
        if kind == PieceKind::Other {
            return self.push_windowed(id);
        }
        let piece = self.tokenizer.token_bytes(id)?;
        let mut piece = piece;
        if self.at_start && !piece.is_empty() {
            self.at_start = false;
            if let PieceKind::SentencePiece {
                strip_first_space: true,
            } = kind
            {
                piece = piece.strip_prefix(b" ").unwrap_or(piece);
            }
        }
        self.pending.extend_from_slice(piece);
        self.take_complete()
    }

    /// Returns whatever is held back (an unfinished character, as U+FFFD) and
    /// starts over. Call at the end of a generation.
    pub fn flush(&mut self) -> Option<String> {
        self.at_start = true;
        if !self.window.is_empty() {
            let text = self.tokenizer.backend_decode(&self.window);
            self.window.clear();
            let done = std::mem::take(&mut self.pending);
            let rest = text.get(done.len()..).unwrap_or("");
            return (!rest.is_empty()).then(|| rest.to_string());
        }
        if self.pending.is_empty() {
            return None;
        }
        let bytes = std::mem::take(&mut self.pending);
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The text of the whole UTF-8 characters at the front of `pending`;
    /// invalid bytes become U+FFFD, an unfinished character at the end stays.
    fn take_complete(&mut self) -> Option<String> {
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    // The prefix up to `valid` was just checked to be UTF-8.
                    out.push_str(&String::from_utf8_lossy(&self.pending[start..valid]));
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            start = valid + n;
                        }
                        None => {
                            start = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        (!out.is_empty()).then_some(out)
    }

    /// Decoders other than SentencePiece and byte-level: decode the ids since
    /// the last whole character together and return what is new. `pending`
    /// holds the bytes of the window's text already returned.
    fn push_windowed(&mut self, id: u32) -> Option<String> {
        if id as usize >= self.tokenizer.vocab_size() {
            return None;
        }
        self.window.push(id);
        let text = self.tokenizer.backend_decode(&self.window);
        if text.ends_with('\u{FFFD}') {
            return None;
        }
        let done = self.pending.len();
        let new = text.get(done..).map(str::to_string).unwrap_or_default();
        // Keep the last id as context for the next piece (spacing rules).
        let last = self.window.len() - 1;
        self.window.drain(..last);
        self.pending = self.tokenizer.backend_decode(&self.window).into_bytes();
        (!new.is_empty()).then_some(new)
    }
}
