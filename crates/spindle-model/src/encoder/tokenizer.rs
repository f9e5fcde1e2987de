//! An encoder's tokenizer: BERT's WordPiece through the `tokenizers`
//! library, from the directory's `tokenizer.json` or rebuilt from a GGUF's
//! vocabulary (llama.cpp's `bert` tokenizer model).

use std::path::Path;

use serde_json::{json, Map, Value};
use spindle_formats::GgufFile;

use crate::tokenizer::{backend, TokenizerError};

/// A text (or a pair of texts) as the encoder reads it: ids with `[CLS]` and
/// `[SEP]` added, and the segment of each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedText {
    pub ids: Vec<u32>,
    pub type_ids: Vec<u32>,
}

pub struct EncoderTokenizer {
    inner: tokenizers::Tokenizer,
}

/// llama.cpp's token type for control tokens (`[CLS]`, `[SEP]`, ...).
const CONTROL: i64 = 3;

impl EncoderTokenizer {
    /// `dir/tokenizer.json`, with its padding and truncation turned off
    /// (the engine batches without padding and refuses or truncates
    /// over-long texts itself).
    pub fn from_hf_dir(dir: &Path) -> Result<EncoderTokenizer, TokenizerError> {
        let path = dir.join("tokenizer.json");
        let mut inner =
            tokenizers::Tokenizer::from_file(&path).map_err(|e| TokenizerError::Parse {
                path: path.clone(),
                message: e.to_string(),
            })?;
        inner.with_padding(None);
        inner.with_truncation(None).map_err(backend)?;
        Ok(EncoderTokenizer { inner })
    }

    /// The WordPiece tokenizer a `bert` GGUF describes. llama.cpp's converter
    /// writes its "phantom space" vocabulary: a word-start piece carries a
    /// leading U+2581, a continuation piece has lost its `##`, control
    /// tokens are as they were. This undoes it and builds BERT's pipeline
    /// (normalizer, pre-tokenizer, `[CLS] text [SEP]`).
    pub fn from_gguf(g: &GgufFile) -> Result<EncoderTokenizer, TokenizerError> {
        let meta = |k: &str| TokenizerError::Metadata(format!("{k} is missing or not a list"));
        let model = g.get_str("tokenizer.ggml.model").unwrap_or("");
        if model != "bert" {
            return Err(TokenizerError::UnsupportedModel(model.into()));
        }
        let tokens = g
            .get_array("tokenizer.ggml.tokens")
            .ok_or_else(|| meta("tokenizer.ggml.tokens"))?;
        let types = g.get_array("tokenizer.ggml.token_type");
        let mut vocab = Map::new();
        for (id, t) in tokens.iter().enumerate() {
            let text = t.as_str().ok_or_else(|| meta("tokenizer.ggml.tokens"))?;
            let control = types
                .and_then(|ty| ty.get(id))
                .and_then(|v| v.as_i64())
                .is_some_and(|v| v == CONTROL);
            let piece = if control {
                text.to_string()
            } else if let Some(word) = text.strip_prefix('\u{2581}') {
                word.to_string()
            } else {
                format!("##{text}")
            };
            vocab.insert(piece, json!(id));
        }
        let token = |key: &str, fallback: &str| -> Result<(String, u32), TokenizerError> {
            let id = g.get_u64(key).unwrap_or(u64::MAX);
            let text = tokens
                .get(id as usize)
                .and_then(|t| t.as_str())
                .unwrap_or(fallback)
                .to_string();
            let id = u32::try_from(id)
                .map_err(|_| TokenizerError::Metadata(format!("{key} is missing")))?;
            Ok((text, id))
        };
        let (cls, cls_id) = token("tokenizer.ggml.bos_token_id", "[CLS]")?;
        let (sep, sep_id) = token("tokenizer.ggml.seperator_token_id", "[SEP]")
            .or_else(|_| token("tokenizer.ggml.eos_token_id", "[SEP]"))?;
        let (unk, _) = token("tokenizer.ggml.unknown_token_id", "[UNK]")?;
        let lowercase = g
            .get_bool("tokenizer.ggml.normalizer.lowercase")
            .unwrap_or(true);
        let spec = json!({
            "version": "1.0",
            "normalizer": {
                "type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                "strip_accents": Value::Null, "lowercase": lowercase
            },
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "post_processor": {"type": "BertProcessing", "sep": [sep, sep_id], "cls": [cls, cls_id]},
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
            "model": {
                "type": "WordPiece", "unk_token": unk, "continuing_subword_prefix": "##",
                "max_input_chars_per_word": 100, "vocab": vocab
            }
        });
        let inner: tokenizers::Tokenizer = spec.to_string().parse().map_err(backend)?;
        Ok(EncoderTokenizer { inner })
    }

    /// `[CLS] text [SEP]`.
    pub fn encode(&self, text: &str) -> Result<EncodedText, TokenizerError> {
        let e = self.inner.encode(text, true).map_err(backend)?;
        Ok(EncodedText {
            ids: e.get_ids().to_vec(),
            type_ids: e.get_type_ids().to_vec(),
        })
    }

    /// `[CLS] first [SEP] second [SEP]`, the second text in segment 1 (a
    /// cross-encoder's query and document).
    pub fn encode_pair(&self, first: &str, second: &str) -> Result<EncodedText, TokenizerError> {
        let e = self.inner.encode((first, second), true).map_err(backend)?;
        Ok(EncodedText {
            ids: e.get_ids().to_vec(),
            type_ids: e.get_type_ids().to_vec(),
        })
    }
}
