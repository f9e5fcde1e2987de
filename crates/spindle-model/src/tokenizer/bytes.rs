//! Input that is not valid UTF-8 (a Latin-1 file, a truncated download),
//! tokenized as llama.cpp tokenizes the same bytes, so `spindle tokenize`
//! and `llama-tokenize` agree on them too.
//!
//! llama.cpp has two rules, by vocabulary:
//!
//! * Byte-level BPE (Llama 3, Qwen, gpt-oss, DeepSeek) and the others: the
//!   text is decoded to code points first, and every byte that does not
//!   start a well-formed sequence becomes U+FFFD on its own
//!   ([`llama_cpp_lossy`]).
//! * SentencePiece (Llama 2, Mistral, Gemma): the text is cut into symbols by
//!   the length its lead byte announces, and a symbol that is no character
//!   (a stray byte, a sequence cut short, a lead byte with the bytes it
//!   swallowed) becomes its bytes' `<0xNN>` tokens, merging with nothing.
//!   Here each such symbol is replaced by a private-use character that no
//!   vocabulary piece holds (so it too falls back to byte tokens and merges
//!   with nothing), the text is encoded as usual, and the placeholder's byte
//!   tokens are swapped for the symbol's.
//!
//! As llama.cpp, spaces are written `▁` before the cut (a stray byte
//! before a space swallows the bytes of its `▁`), and added tokens' texts
//! are taken out first (a symbol never runs into one).
//!
//! Not matched: llama.cpp decodes overlong forms and encoded surrogates as
//! code points, which Rust strings cannot hold (they become U+FFFD here).

use super::{PieceKind, Tokenizer, TokenizerError};

/// `bytes` with every byte that does not begin a well-formed UTF-8 sequence
/// replaced by U+FFFD, advancing one byte (llama.cpp's
/// `unicode_cpts_from_utf8`, where `String::from_utf8_lossy` would replace a
/// whole cut-short sequence by one U+FFFD).
pub(crate) fn llama_cpp_lossy(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() + 8);
    let mut o = 0;
    while o < bytes.len() {
        let len = match bytes[o] {
            b if b & 0x80 == 0 => 1,
            b if b & 0x40 == 0 => 0,
            b if b & 0x20 == 0 => 2,
            b if b & 0x10 == 0 => 3,
            b if b & 0x08 == 0 => 4,
            _ => 0,
        };
        let whole = len > 0
            && o + len <= bytes.len()
            && bytes[o + 1..o + len].iter().all(|&c| c & 0xC0 == 0x80);
        if whole {
            if let Ok(s) = std::str::from_utf8(&bytes[o..o + len]) {
                out.push_str(s);
                o += len;
                continue;
            }
        }
        out.push('\u{FFFD}');
        o += 1;
    }
    out
}

/// SentencePiece symbols of `bytes` as llama.cpp cuts them: each starts
/// where the previous ended and is as long as its lead byte says, within
/// what is left before the next added token's text (`added(o)`: the length
/// of the one at `o`, which llama.cpp takes out first and which comes back
/// whole). `Ok` for text, `Err` for bytes that are no character.
fn spm_symbols<'a>(
    bytes: &'a [u8],
    added: &dyn Fn(usize) -> Option<usize>,
) -> Vec<Result<&'a str, &'a [u8]>> {
    const LEN_BY_HIGH_NIBBLE: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    let mut out = Vec::new();
    let mut o = 0;
    while o < bytes.len() {
        let mut len = match added(o) {
            Some(n) => n,
            None => {
                let len = LEN_BY_HIGH_NIBBLE[(bytes[o] >> 4) as usize].min(bytes.len() - o);
                (1..len).find(|&k| added(o + k).is_some()).unwrap_or(len)
            }
        };
        len = len.min(bytes.len() - o);
        let sym = &bytes[o..o + len];
        out.push(std::str::from_utf8(sym).map_err(|_| sym));
        o += len;
    }
    out
}

/// The texts of the added tokens `encode` matches whole (the special ones
/// only when it parses special-token text), by first byte.
fn added_texts(
    pipeline: &super::Pipeline,
    parse_special: bool,
) -> std::collections::HashMap<u8, Vec<Vec<u8>>> {
    let mut by_first: std::collections::HashMap<u8, Vec<Vec<u8>>> = Default::default();
    for t in pipeline.get_added_tokens_decoder().into_values() {
        if (parse_special || !t.special) && !t.content.is_empty() {
            let b = t.content.into_bytes();
            by_first.entry(b[0]).or_default().push(b);
        }
    }
    for texts in by_first.values_mut() {
        // The longest match first.
        texts.sort_by_key(|t| std::cmp::Reverse(t.len()));
    }
    by_first
}

/// `bytes` with every space written as `▁` (SentencePiece's escape).
fn escape_spaces(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 16);
    for &b in bytes {
        if b == b' ' {
            out.extend_from_slice("\u{2581}".as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}

impl Tokenizer {
    /// [`Tokenizer::encode`] for bytes that may not be UTF-8, as llama.cpp
    /// tokenizes them (see the module's notes). Valid UTF-8 is exactly
    /// [`Tokenizer::encode`].
    pub fn encode_bytes(
        &self,
        bytes: &[u8],
        add_bos: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        if let Ok(text) = std::str::from_utf8(bytes) {
            return self.encode(text, add_bos, parse_special);
        }
        if !matches!(self.kind(), PieceKind::SentencePiece { .. }) {
            return self.encode(&llama_cpp_lossy(bytes), add_bos, parse_special);
        }
        // llama.cpp writes spaces as `▁` before it cuts symbols (a stray
        // byte before a space swallows the `▁`'s bytes), and takes out the
        // added tokens' texts first.
        let escaped = escape_spaces(bytes);
        let texts = added_texts(&self.inner.parse, parse_special);
        let added = |o: usize| {
            let rest = &escaped[o..];
            texts
                .get(rest.first()?)?
                .iter()
                .find(|t| rest.starts_with(t))
                .map(Vec::len)
        };
        let symbols = spm_symbols(&escaped, &added);
        let placeholder = self
            .placeholder(&symbols)
            .ok_or(TokenizerError::NoByteTokens)?;
        let mut text = String::with_capacity(bytes.len() + 8);
        let mut cut = Vec::new();
        for s in &symbols {
            match s {
                Ok(c) => text.push_str(c),
                Err(b) => {
                    text.push(placeholder.ch);
                    cut.push(*b);
                }
            }
        }
        let ids = self.encode(&text, add_bos, parse_special)?;
        // Each placeholder came out as its byte tokens, in order.
        let mut out = Vec::with_capacity(ids.len() + bytes.len());
        let (mut i, mut next) = (0, cut.iter());
        while i < ids.len() {
            if ids[i..].starts_with(&placeholder.ids) {
                let b = next.next().ok_or(TokenizerError::NoByteTokens)?;
                for &byte in *b {
                    out.push(self.byte_id(byte).ok_or(TokenizerError::NoByteTokens)?);
                }
                i += placeholder.ids.len();
            } else {
                out.push(ids[i]);
                i += 1;
            }
        }
        if next.next().is_some() {
            return Err(TokenizerError::NoByteTokens);
        }
        Ok(out)
    }

    /// The `<0xNN>` token of `byte`.
    fn byte_id(&self, byte: u8) -> Option<u32> {
        self.token_to_id(&format!("<0x{byte:02X}>"))
    }

    /// A private-use character absent from the text's characters and from
    /// every vocabulary piece, with the byte tokens it falls back to.
    fn placeholder(&self, symbols: &[Result<&str, &[u8]>]) -> Option<Placeholder> {
        const FROM: char = '\u{E000}';
        const TO: char = '\u{E0FF}';
        let mut used = std::collections::HashSet::new();
        let mut note = |t: &str| used.extend(t.chars().filter(|c| (FROM..=TO).contains(c)));
        symbols.iter().filter_map(|s| s.ok()).for_each(&mut note);
        for id in 0..self.vocab_size() as u32 {
            note(&self.id_to_token(id).unwrap_or_default());
        }
        let ch = (FROM..=TO).find(|ch| !used.contains(ch))?;
        let mut buf = [0u8; 4];
        let ids = ch
            .encode_utf8(&mut buf)
            .bytes()
            .map(|b| self.byte_id(b))
            .collect::<Option<Vec<u32>>>()?;
        Some(Placeholder { ch, ids })
    }
}

struct Placeholder {
    ch: char,
    /// Its byte tokens.
    ids: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lossy_replaces_each_byte_of_a_broken_sequence() {
        // A three-byte sequence cut short: two replacements, not one.
        assert_eq!(llama_cpp_lossy(b"a\xe2\x82"), "a\u{FFFD}\u{FFFD}");
        assert_eq!(String::from_utf8_lossy(b"a\xe2\x82"), "a\u{FFFD}");
        assert_eq!(llama_cpp_lossy(b"caf\xe9!"), "caf\u{FFFD}!");
        assert_eq!(llama_cpp_lossy("é€😀".as_bytes()), "é€😀");
        assert_eq!(llama_cpp_lossy(b"\xff\x80"), "\u{FFFD}\u{FFFD}");
    }

    #[test]
    fn spm_symbols_swallow_what_their_lead_byte_announces() {
        let none = |_: usize| None;
        let s = spm_symbols(b"a\xc3(b\xffxyz!", &none);
        assert_eq!(
            s,
            vec![
                Ok("a"),
                Err(&b"\xc3("[..]),
                Ok("b"),
                Err(&b"\xffxyz"[..]),
                Ok("!"),
            ]
        );
        assert_eq!(spm_symbols(b"\xe2\x82", &none), vec![Err(&b"\xe2\x82"[..])]);
        // An added token's text is cut out first: the stray byte before it
        // stands alone.
        let bos_at_1 = |o: usize| (o == 1).then_some(3);
        assert_eq!(
            spm_symbols(b"\xff<s>\xfe", &bos_at_1),
            vec![Err(&b"\xff"[..]), Ok("<s>"), Err(&b"\xfe"[..])]
        );
    }
}
