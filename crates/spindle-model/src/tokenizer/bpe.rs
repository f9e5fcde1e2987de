//! Byte-level BPE vocabularies (`tokenizer.ggml.model = "gpt2"`).
//!
//! Tokens are spelled in GPT-2's byte alphabet (`Ġ` for a space), merges come
//! from the file, and `tokenizer.ggml.pre` names the regex that splits text
//! before the merges, as in transformers' GGUF converter. An unknown `pre`
//! falls back to GPT-2's own regex with a warning (the text still round-trips,
//! the ids may differ from the reference tokenizer's).

use std::collections::HashMap;
use std::sync::OnceLock;

use serde_json::json;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::{AddedToken, ModelWrapper};

use super::gguf::token_type;
use super::{backend, Added, GgufVocab, Parts, PieceKind, TokenizerError};

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// DeepSeek-V3 splits in three passes: digit groups, then runs of CJK
/// ideographs and kana, then words and punctuation.
const DEEPSEEK3_SPLITS: &[&str] = &[
    r"\p{N}{1,3}",
    "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

/// The split regexes of a `tokenizer.ggml.pre` name, applied one after the
/// other; `None` for GPT-2's own (built into the `ByteLevel` pre-tokenizer).
fn split_regex(pre: &str) -> Result<Option<&'static [&'static str]>, ()> {
    Ok(Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "dbrx" | "smaug-bpe" => &[LLAMA3_SPLIT],
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "megrez" => &[QWEN2_SPLIT],
        "qwen35" => &[QWEN35_SPLIT],
        "tekken" => &[TEKKEN_SPLIT],
        "gpt-4o" | "llama4" | "minimax-m2" => &[GPT4O_SPLIT],
        // llama.cpp gives these one pre-tokenizer type; DeepSeek-V3's own
        // tokenizer is told apart from its successors by a hash, so a
        // converter can name it after any of them.
        "deepseek-v3" | "joyai-llm" | "hunyuan-dense" => DEEPSEEK3_SPLITS,
        "gpt-2" | "gpt2" | "default" | "" => return Ok(None),
        _ => return Err(()),
    }))
}

/// Pre-tokenizers whose reference tokenizer looks a whole pre-token up in the
/// vocabulary before merging (Llama 3's `ignore_merges`, as llama.cpp does).
fn ignores_merges(pre: &str) -> bool {
    matches!(pre, "llama3" | "llama-v3" | "llama-bpe")
}

pub(crate) fn build(v: GgufVocab) -> Result<Parts, TokenizerError> {
    let merges_src = v.merges.as_ref().ok_or_else(|| {
        TokenizerError::Metadata(
            "a byte-level BPE vocabulary needs tokenizer.ggml.merges, which the file lacks".into(),
        )
    })?;
    let pre = v.pre.as_deref().unwrap_or("default");
    let split = split_regex(pre).unwrap_or_else(|()| {
        tracing::warn!(
            "tokenizer.ggml.pre = {pre:?} is not known; splitting text with GPT-2's regex, \
             token ids may differ from the model's reference tokenizer"
        );
        None
    });

    // Tokens the file spells outside the byte alphabet are respelled into it
    // (transformers does the same), except control and user-defined tokens,
    // which are matched in the text as they are written.
    let alphabet = char_bytes();
    let tokens: Vec<String> = v
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let literal = matches!(
                v.token_type(i),
                token_type::CONTROL | token_type::USER_DEFINED | token_type::UNKNOWN
            );
            if literal || t.chars().all(|c| alphabet.contains_key(&c)) {
                t.clone()
            } else {
                t.bytes().map(|b| BYTE_CHARS[b as usize]).collect()
            }
        })
        .collect();
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let mut merges = Vec::with_capacity(merges_src.len());
    for m in merges_src {
        let (l, r) = m.split_once(' ').ok_or_else(|| {
            TokenizerError::Metadata(format!(
                "tokenizer.ggml.merges has {m:?}, not two tokens separated by a space"
            ))
        })?;
        merges.push((l.to_string(), r.to_string()));
    }
    let model = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(ignores_merges(pre))
        .build()
        .map_err(backend)?;

    let pre_tokenizer = match split {
        Some(regexes) => {
            let mut steps: Vec<_> = regexes
                .iter()
                .map(|r| json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false}))
                .collect();
            steps.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}));
            json!({"type": "Sequence", "pretokenizers": steps})
        }
        None => {
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})
        }
    };
    let decoder = json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true});

    let mut added = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        match v.token_type(i) {
            token_type::CONTROL | token_type::UNKNOWN => {
                added.push(AddedToken::from(t.clone(), true).normalized(false))
            }
            token_type::USER_DEFINED => {
                added.push(AddedToken::from(t.clone(), false).normalized(false))
            }
            _ => {}
        }
    }

    Ok(Parts {
        model: ModelWrapper::BPE(model),
        normalizer: None,
        pre_tokenizer: Some(serde_json::from_value(pre_tokenizer).map_err(backend)?),
        decoder: Some(serde_json::from_value(decoder).map_err(backend)?),
        added: Added::Tokens(added),
        kind: PieceKind::ByteLevel,
        bos: v.bos_id,
        eos: v.eos_id,
        extra_stops: v.extra_stops(),
        // Llama 3 prompts start with <|begin_of_text|>; most other byte-level
        // vocabularies (Qwen) use no BOS.
        add_bos: v.add_bos.unwrap_or(ignores_merges(pre)),
        add_eos: v.add_eos.unwrap_or(false),
        family: v.family(),
        chat_template: v.chat_template,
    })
}

/// GPT-2's byte alphabet: the character standing for each byte.
static BYTE_CHARS: [char; 256] = {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0;
    while b < 256 {
        let printable = (b >= b'!' as usize && b <= b'~' as usize)
            || (b >= 0xA1 && b <= 0xAC)
            || (b >= 0xAE && b <= 0xFF);
        out[b] = if printable {
            match char::from_u32(b as u32) {
                Some(c) => c,
                None => '\0',
            }
        } else {
            let c = match char::from_u32(256 + n) {
                Some(c) => c,
                None => '\0',
            };
            n += 1;
            c
        };
        b += 1;
    }
    out
};

/// The byte each character of GPT-2's byte alphabet stands for.
fn char_bytes() -> &'static HashMap<char, u8> {
    static MAP: OnceLock<HashMap<char, u8>> = OnceLock::new();
    MAP.get_or_init(|| {
        BYTE_CHARS
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect()
    })
}

/// The bytes of a byte-level token, as the `ByteLevel` decoder gives them: a
/// token wholly in the byte alphabet maps character by character, any other
/// (an added token such as `<｜User｜>`) is its own UTF-8.
pub(crate) fn byte_level_decode(text: &str) -> Vec<u8> {
    let map = char_bytes();
    text.chars()
        .map(|c| map.get(&c).copied())
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| text.as_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_is_gpt2s() {
        assert_eq!(BYTE_CHARS[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_CHARS[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_CHARS[b'a' as usize], 'a');
        assert_eq!(byte_level_decode("Ġworld"), b" world");
        assert_eq!(byte_level_decode("<|im_end|>"), b"<|im_end|>");
        assert_eq!(char_bytes().len(), 256);
    }

    #[test]
    fn known_pre_tokenizers() {
        assert_eq!(split_regex("llama-bpe"), Ok(Some(&[LLAMA3_SPLIT][..])));
        assert_eq!(split_regex("qwen2"), Ok(Some(&[QWEN2_SPLIT][..])));
        assert_eq!(
            split_regex("deepseek-v3").map(|s| s.map(<[_]>::len)),
            Ok(Some(3))
        );
        assert_eq!(split_regex("gpt-2"), Ok(None));
        assert_eq!(split_regex("something-new"), Err(()));
    }
}
