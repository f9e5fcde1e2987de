//! The model's vocabulary as llguidance sees it: every token's bytes in a
//! trie (special tokens behind toktrie's marker byte, so a grammar can
//! never produce them by accident), and tokenization through Spindle's own
//! tokenizer.

use std::sync::Arc;

use spindle_model::tokenizer::Tokenizer;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// A [`TokenizerEnv`] over a Spindle [`Tokenizer`].
pub struct SpindleTokEnv {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl SpindleTokEnv {
    /// The environment of `tokenizer`, as the shared handle llguidance takes.
    pub fn new_env(tokenizer: &Tokenizer) -> TokEnv {
        let n = tokenizer.vocab_size();
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id).unwrap_or_default();
                if tokenizer.is_special(id) || bytes.is_empty() {
                    // Special (and unused) tokens are spelled by name behind
                    // the marker, as llguidance expects.
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend(tokenizer.id_to_token(id).unwrap_or_default().into_bytes());
                    w
                } else {
                    bytes.to_vec()
                }
            })
            .collect();
        let eos = tokenizer.eos_id().unwrap_or(0);
        let mut info = TokRxInfo::new(n as u32, eos);
        info.tok_bos = tokenizer.bos_id();
        let env = SpindleTokEnv {
            trie: TokTrie::from(&info, &words),
            tokenizer: tokenizer.clone(),
        };
        Arc::new(env)
    }
}

impl TokenizerEnv for SpindleTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Text the grammar itself holds (a schema's keys, a literal): no
        // BOS, special tokens as plain text.
        match std::str::from_utf8(s) {
            Ok(text) => self
                .tokenizer
                .encode(text, false, false)
                .unwrap_or_default(),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}
