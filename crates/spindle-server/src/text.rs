//! Generated ids to text as they arrive, cut at the first stop string.
//! Text that could still turn out to be the start of a stop string is held
//! back, so a client never sees part of a stop string.

use spindle_model::tokenizer::{StreamDecoder, Tokenizer};

pub struct TextStream {
    decoder: StreamDecoder,
    stops: Vec<String>,
    /// Everything decoded so far (cut at a stop string once one is found).
    text: String,
    /// Bytes of `text` already handed out.
    sent: usize,
    stopped: bool,
}

impl TextStream {
    pub fn new(tokenizer: &Tokenizer, stops: Vec<String>) -> TextStream {
        TextStream {
            decoder: tokenizer.stream_decoder(),
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            text: String::new(),
            sent: 0,
            stopped: false,
        }
    }

    /// Whether a stop string was found; nothing more comes out after it.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Adds one generated id; returns the text that can be sent now.
    pub fn push(&mut self, id: u32) -> String {
        if self.stopped {
            return String::new();
        }
        if let Some(t) = self.decoder.push(id) {
            self.text.push_str(&t);
        }
        self.release(false)
    }

    /// The rest, at the end of generation.
    pub fn finish(&mut self) -> String {
        if !self.stopped {
            if let Some(t) = self.decoder.flush() {
                self.text.push_str(&t);
            }
        }
        self.release(true)
    }

    fn release(&mut self, at_end: bool) -> String {
        if !self.stopped {
            // A stop string may end in the new text and start a little before it.
            let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
            let mut from = self.sent.saturating_sub(longest);
            while !self.text.is_char_boundary(from) {
                from -= 1;
            }
            let found = self
                .stops
                .iter()
                .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i))
                .min();
            if let Some(at) = found {
                self.text.truncate(at);
                self.stopped = true;
            }
        }
        let end = if self.stopped || at_end {
            self.text.len()
        } else {
            self.text.len() - self.held_back()
        };
        let out = self.text[self.sent..end].to_string();
        self.sent = end;
        out
    }

    /// Length of the longest end of the text that begins some stop string.
    fn held_back(&self) -> usize {
        let mut hold = 0;
        for s in &self.stops {
            for (k, _) in s.char_indices().skip(1) {
                if k > hold && self.text.ends_with(&s[..k]) {
                    hold = k;
                }
            }
        }
        hold.min(self.text.len() - self.sent)
    }
}
