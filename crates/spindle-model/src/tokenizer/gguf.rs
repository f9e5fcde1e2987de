//! The `tokenizer.*` metadata of a GGUF file, read into plain fields.

use spindle_formats::MetaValue;

use super::TokenizerError;

/// GGUF token types (llama.cpp's `llama_token_type`).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// The vocabulary part of a GGUF file's metadata. [`GgufVocab::from_metadata`]
/// reads it from any metadata lookup; tests can also fill it in directly.
#[derive(Debug, Clone, Default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `"llama"` or `"gpt2"`.
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer of a `gpt2` vocabulary.
    pub pre: Option<String>,
    /// `general.architecture`.
    pub architecture: Option<String>,
    /// `tokenizer.ggml.tokens`, in id order.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`, one per token.
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`, one per token (see [`token_type`]).
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`: `"left right"` pairs, best first.
    pub merges: Option<Vec<String>>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`: end of turn.
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.eom_token_id`: end of message (Llama 3.1 tool calls).
    pub eom_id: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece `add_dummy_prefix`).
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

impl GgufVocab {
    /// Reads the vocabulary from a metadata lookup such as
    /// `|key| gguf.get(key)`.
    pub fn from_metadata<'a>(
        get: impl Fn(&str) -> Option<&'a MetaValue>,
    ) -> Result<GgufVocab, TokenizerError> {
        let model = str_key(&get, "tokenizer.ggml.model")?
            .ok_or_else(|| missing("tokenizer.ggml.model"))?;
        let tokens = array_key(&get, "tokenizer.ggml.tokens")?
            .ok_or_else(|| missing("tokenizer.ggml.tokens"))?
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| wrong_type("tokenizer.ggml.tokens", "strings", v))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let n = tokens.len();
        let scores = array_key(&get, "tokenizer.ggml.scores")?
            .map(|a| {
                per_token(a, n, "tokenizer.ggml.scores")?;
                a.iter()
                    .map(|v| {
                        v.as_f64()
                            .map(|f| f as f32)
                            .ok_or_else(|| wrong_type("tokenizer.ggml.scores", "numbers", v))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        let token_types = array_key(&get, "tokenizer.ggml.token_type")?
            .map(|a| {
                per_token(a, n, "tokenizer.ggml.token_type")?;
                a.iter()
                    .map(|v| {
                        v.as_i64()
                            .and_then(|i| i32::try_from(i).ok())
                            .ok_or_else(|| wrong_type("tokenizer.ggml.token_type", "integers", v))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        let merges = array_key(&get, "tokenizer.ggml.merges")?
            .map(|a| {
                a.iter()
                    .map(|v| {
                        v.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| wrong_type("tokenizer.ggml.merges", "strings", v))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        let id = |key: &str| id_key(&get, key, n);
        let mut vocab = GgufVocab {
            model: model.to_string(),
            pre: str_key(&get, "tokenizer.ggml.pre")?.map(str::to_string),
            architecture: str_key(&get, "general.architecture")?.map(str::to_string),
            bos_id: id("tokenizer.ggml.bos_token_id")?,
            eos_id: id("tokenizer.ggml.eos_token_id")?,
            unk_id: id("tokenizer.ggml.unknown_token_id")?,
            pad_id: id("tokenizer.ggml.padding_token_id")?,
            eot_id: id("tokenizer.ggml.eot_token_id")?,
            eom_id: id("tokenizer.ggml.eom_token_id")?,
            add_bos: bool_key(&get, "tokenizer.ggml.add_bos_token")?,
            add_eos: bool_key(&get, "tokenizer.ggml.add_eos_token")?,
            add_space_prefix: bool_key(&get, "tokenizer.ggml.add_space_prefix")?,
            chat_template: str_key(&get, "tokenizer.chat_template")?.map(str::to_string),
            tokens,
            scores,
            token_types,
            merges,
        };
        vocab.retype_as_llama_cpp_does();
        Ok(vocab)
    }

    /// llama.cpp retypes some tokens by their text when it loads a
    /// vocabulary, and GGUF files are written for llama.cpp, so Spindle does
    /// the same: end-of-turn and end-of-generation tokens that a converter
    /// left `NORMAL` become `CONTROL` (Qwen's `</s>`), except `</s>` in
    /// vocabularies whose turns end otherwise. (llama.cpp also makes
    /// gpt-oss's harmony markers user-defined, which matches them in
    /// untrusted text; Spindle keeps them control tokens.)
    fn retype_as_llama_cpp_does(&mut self) {
        // llama.cpp's end-of-generation texts beyond Spindle's own stops.
        const MORE_END_OF_GENERATION: &[&str] = &[
            "<|flush|>",
            "<|calls|>",
            "<EOT>",
            "_<EOT>",
            "[EOT]",
            "[EOS]",
            "<end_of_utterance>",
            "<turn|>",
            "<|tool_response>",
            "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
            "[e~[",
        ];
        let ends_generation = |text: &str| {
            super::END_OF_TURN_TOKENS.contains(&text) || MORE_END_OF_GENERATION.contains(&text)
        };
        let Some(types) = self.token_types.as_mut() else {
            return;
        };
        let plain_s = self
            .tokens
            .iter()
            .any(|x| x == "<|tool_response>" || x == "<|plamo:eos|>");
        for (text, t) in self.tokens.iter().zip(types.iter_mut()) {
            if plain_s && text == "</s>" {
                *t = token_type::NORMAL;
            } else if ends_generation(text) && *t != token_type::UNUSED {
                *t = token_type::CONTROL;
            }
        }
    }

    /// The type of token `id` ([`token_type::NORMAL`] when the file has none).
    pub fn token_type(&self, id: usize) -> i32 {
        self.token_types
            .as_ref()
            .and_then(|t| t.get(id).copied())
            .unwrap_or(token_type::NORMAL)
    }

    /// The text of token `id`.
    pub fn token(&self, id: Option<u32>) -> Option<&str> {
        id.and_then(|i| self.tokens.get(i as usize))
            .map(String::as_str)
    }

    /// End-of-turn ids the file names besides EOS.
    pub(crate) fn extra_stops(&self) -> Vec<u32> {
        self.eot_id.into_iter().chain(self.eom_id).collect()
    }

    /// `tokenizer.ggml.pre` when it names something, else `general.architecture`.
    pub(crate) fn family(&self) -> Option<String> {
        self.pre
            .as_deref()
            .filter(|p| !p.is_empty() && *p != "default")
            .or(self.architecture.as_deref())
            .map(str::to_string)
    }
}

fn missing(key: &str) -> TokenizerError {
    TokenizerError::Metadata(format!(
        "the GGUF file has no {key}; it carries no tokenizer this crate can build"
    ))
}

fn wrong_type(key: &str, want: &str, got: &MetaValue) -> TokenizerError {
    TokenizerError::Metadata(format!(
        "{key} should hold {want}, found {}",
        got.type_name()
    ))
}

fn per_token(a: &[MetaValue], n: usize, key: &str) -> Result<(), TokenizerError> {
    if a.len() == n {
        Ok(())
    } else {
        Err(TokenizerError::Metadata(format!(
            "{key} has {} entries for {n} tokens",
            a.len()
        )))
    }
}

fn str_key<'a>(
    get: &impl Fn(&str) -> Option<&'a MetaValue>,
    key: &str,
) -> Result<Option<&'a str>, TokenizerError> {
    match get(key) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(Some)
            .ok_or_else(|| wrong_type(key, "a string", v)),
    }
}

fn array_key<'a>(
    get: &impl Fn(&str) -> Option<&'a MetaValue>,
    key: &str,
) -> Result<Option<&'a [MetaValue]>, TokenizerError> {
    match get(key) {
        None => Ok(None),
        Some(v) => v
            .as_array()
            .map(Some)
            .ok_or_else(|| wrong_type(key, "an array", v)),
    }
}

fn bool_key<'a>(
    get: &impl Fn(&str) -> Option<&'a MetaValue>,
    key: &str,
) -> Result<Option<bool>, TokenizerError> {
    match get(key) {
        None => Ok(None),
        Some(MetaValue::Bool(b)) => Ok(Some(*b)),
        Some(v) => v
            .as_u64()
            .map(|i| Some(i != 0))
            .ok_or_else(|| wrong_type(key, "a bool", v)),
    }
}

/// A token id key. An id past the vocabulary is dropped with a warning
/// rather than refused: some converters write placeholder ids.
fn id_key<'a>(
    get: &impl Fn(&str) -> Option<&'a MetaValue>,
    key: &str,
    n: usize,
) -> Result<Option<u32>, TokenizerError> {
    let Some(v) = get(key) else {
        return Ok(None);
    };
    let id = v.as_i64().ok_or_else(|| wrong_type(key, "an integer", v))?;
    match usize::try_from(id) {
        Ok(i) if i < n => Ok(Some(i as u32)),
        _ => {
            tracing::warn!("{key} = {id} is not a token of the {n}-token vocabulary; ignored");
            Ok(None)
        }
    }
}
