//! SentencePiece vocabularies (`tokenizer.ggml.model = "llama"`) as a
//! Hugging Face BPE model.
//!
//! The file has tokens and scores but no merges. As transformers' GGUF
//! converter does, every way to cut a token into two tokens of the vocabulary
//! becomes a merge, ranked by the token's score, best first, which is the
//! order llama.cpp's SentencePiece tokenizer merges in (files whose scores
//! are placeholders: by position, [`placeholder_ranks`]). Gemma files are
//! special in two ways (transformers' `gemma_tokenizer`): runs of spaces are
//! stored as real spaces and are respelled with `▁`, and merges are ranked by
//! position in the vocabulary instead of by score.

use std::collections::HashMap;

use serde_json::json;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::{AddedToken, ModelWrapper};

use super::gguf::token_type;
use super::{backend, Added, GgufVocab, Parts, PieceKind, TokenizerError};

/// Which of transformers' SentencePiece shapes a file has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// Gemma: `' '` becomes `▁` in a normalizer, no prefix space.
    Gemma,
    /// Phi-3: the prefix space comes from a normalizer.
    Phi3,
    /// Llama 2, Mistral: a space before every text segment (as llama.cpp
    /// puts one) when `add_space_prefix` (default true).
    Llama { add_prefix: bool },
}

pub(crate) fn build(v: GgufVocab) -> Result<Parts, TokenizerError> {
    let arch = v.architecture.as_deref().unwrap_or("");
    let shape = if arch.starts_with("gemma") {
        Shape::Gemma
    } else if arch == "phi3" {
        Shape::Phi3
    } else {
        Shape::Llama {
            add_prefix: v.add_space_prefix.unwrap_or(true),
        }
    };

    let tokens: Vec<String> = if shape == Shape::Gemma {
        v.tokens.iter().map(|t| respell_spaces(t)).collect()
    } else {
        v.tokens.clone()
    };
    let scores: Vec<f64> = if shape == Shape::Gemma {
        gemma_ranks(&tokens)
    } else {
        let s = v.scores.as_ref().ok_or_else(|| {
            TokenizerError::Metadata(
                "a SentencePiece vocabulary needs tokenizer.ggml.scores, which the file lacks"
                    .into(),
            )
        })?;
        let scores: Vec<f64> = s.iter().map(|&x| f64::from(x)).collect();
        if scores.windows(2).all(|w| w[0] == w[1]) {
            placeholder_ranks(&tokens)
        } else {
            scores
        }
    };

    let mut vocab: HashMap<String, u32> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert(t.clone(), i as u32);
    }
    let merges = generate_merges(&tokens, &scores, &vocab);

    let unk = v
        .token(v.unk_id)
        .map(str::to_string)
        .or_else(|| vocab.contains_key("<unk>").then(|| "<unk>".to_string()));
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab.into_iter().collect::<Vocab>(), merges)
        .fuse_unk(true)
        .byte_fallback(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk);
    }
    let model = builder.build().map_err(backend)?;

    let (normalizer, pre_tokenizer, decoder) = match shape {
        Shape::Gemma => (
            Some(json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"})),
            Some(json!({"type": "Split", "pattern": {"String": " "},
                        "behavior": "MergedWithPrevious", "invert": false})),
            sp_decoder(false),
        ),
        // llama.cpp puts a space before every text segment, whether or not
        // it starts with one (Metaspace's "first" would not before a space).
        Shape::Phi3 | Shape::Llama { add_prefix: true } => (
            Some(json!({"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "\u{2581}"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}]})),
            None,
            sp_decoder(true),
        ),
        Shape::Llama { add_prefix: false } => (
            Some(json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"})),
            None,
            sp_decoder(false),
        ),
    };
    let strip_first_space = match shape {
        Shape::Gemma => false,
        Shape::Phi3 => true,
        Shape::Llama { add_prefix } => add_prefix,
    };

    // Control and unknown tokens are special; user-defined ones are added
    // tokens matched whole but not special. Like transformers, a user-defined
    // token is added only under its (respelled) vocabulary spelling when that
    // spelling is unchanged, so the space runs stay ordinary merges.
    let mut added = Vec::new();
    for (i, (orig, spelled)) in v.tokens.iter().zip(&tokens).enumerate() {
        match v.token_type(i) {
            token_type::CONTROL | token_type::UNKNOWN => {
                added.push(AddedToken::from(spelled.clone(), true).normalized(false))
            }
            token_type::USER_DEFINED if orig == spelled => {
                added.push(AddedToken::from(spelled.clone(), false).normalized(false))
            }
            _ => {}
        }
    }

    Ok(Parts {
        model: ModelWrapper::BPE(model),
        normalizer: normalizer
            .map(serde_json::from_value)
            .transpose()
            .map_err(backend)?,
        pre_tokenizer: pre_tokenizer
            .map(serde_json::from_value)
            .transpose()
            .map_err(backend)?,
        decoder: Some(serde_json::from_value(decoder).map_err(backend)?),
        added: Added::Tokens(added),
        kind: PieceKind::SentencePiece { strip_first_space },
        bos: v.bos_id,
        eos: v.eos_id,
        extra_stops: v.extra_stops(),
        add_bos: v.add_bos.unwrap_or(true),
        add_eos: v.add_eos.unwrap_or(false),
        family: v.family(),
        chat_template: v.chat_template,
    })
}

fn sp_decoder(strip: bool) -> serde_json::Value {
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if strip {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    json!({"type": "Sequence", "decoders": decoders})
}

/// Gemma stores a run of spaces as real spaces; the model looks it up as `▁▁`.
/// Transformers' rule: a token containing a space and only whitespace becomes
/// that many `▁`.
fn respell_spaces(t: &str) -> String {
    if t.contains(' ') && t.chars().all(py_isspace) {
        "\u{2581}".repeat(t.chars().count())
    } else {
        t.to_string()
    }
}

/// Gemma's merge ranking: by position in the vocabulary (transformers'
/// `gemma_tokenizer`), except that runs of `▁` merge before everything,
/// longest first, as the model's own `tokenizer.json` (and llama.cpp, from
/// the file's scores) has them: 33 spaces are a run of 31 and one of 2, not
/// two halves.
fn gemma_ranks(tokens: &[String]) -> Vec<f64> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| match space_run(t) {
            Some(n) => n as f64,
            None => -(i as f64),
        })
        .collect()
}

/// The length of `t` if it is two or more `▁` and nothing else.
fn space_run(t: &str) -> Option<usize> {
    let n = t.chars().count();
    (n > 1 && t.chars().all(|c| c == '\u{2581}')).then_some(n)
}

/// Scores for a vocabulary whose file has placeholders (a converter that had
/// only `tokenizer.json` writes -1000 for every piece): SentencePiece lists
/// pieces best first, so vocabulary order is the order the lost scores
/// gave, except for the runs of `▁` that Llama 2 and Mistral carry with a
/// score below every other piece (they merge last, as the `tokenizers`
/// library's own merges for these files have them).
fn placeholder_ranks(tokens: &[String]) -> Vec<f64> {
    let n = tokens.len() as f64;
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| -(i as f64) - if space_run(t).is_some() { n } else { 0.0 })
        .collect()
}

/// Python's `str.isspace` (what `str.strip()` removes).
fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Transformers' `generate_merges(vocab, vocab_scores)`: for each token (in
/// vocabulary order), each cut into two tokens of the vocabulary, ordered by
/// the ids of the two halves; then everything sorted by score, then length of
/// the left half, then of the right half, all descending, ties keeping that
/// order.
fn generate_merges(
    tokens: &[String],
    scores: &[f64],
    vocab: &HashMap<String, u32>,
) -> Vec<(String, String)> {
    struct Candidate {
        score: f64,
        len_l: usize,
        len_r: usize,
        left: u32,
        right: u32,
    }
    let mut seen = std::collections::HashSet::with_capacity(tokens.len());
    let mut all: Vec<Candidate> = Vec::new();
    let mut local: Vec<Candidate> = Vec::new();
    for token in tokens {
        // A token listed twice counts once, with its last id (Python dicts).
        if !seen.insert(token.as_str()) {
            continue;
        }
        let Some(&id) = vocab.get(token) else {
            continue;
        };
        let score = scores[id as usize];
        let total = token.chars().count();
        local.clear();
        for (n_left, (cut, _)) in token.char_indices().skip(1).enumerate() {
            let (l, r) = token.split_at(cut);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                local.push(Candidate {
                    score,
                    len_l: n_left + 1,
                    len_r: total - n_left - 1,
                    left: li,
                    right: ri,
                });
            }
        }
        local.sort_by_key(|c| (c.left, c.right));
        all.append(&mut local);
    }
    all.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(b.len_l.cmp(&a.len_l))
            .then(b.len_r.cmp(&a.len_r))
    });
    all.into_iter()
        .map(|c| {
            (
                tokens[c.left as usize].clone(),
                tokens[c.right as usize].clone(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_rank_by_score_then_left_length() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let scores = [0.0, 0.0, 0.0, -1.0, -2.0, -0.5];
        let merges = generate_merges(&tokens, &scores, &vocab);
        let got: Vec<(&str, &str)> = merges
            .iter()
            .map(|(l, r)| (l.as_str(), r.as_str()))
            .collect();
        assert_eq!(
            got,
            [("ab", "c"), ("a", "bc"), ("a", "b"), ("b", "c")],
            "abc (-0.5) first, longer left half first; then ab, then bc"
        );
    }

    #[test]
    fn placeholder_scores_rank_by_position_with_space_runs_last() {
        let tokens: Vec<String> = ["\u{2581}", "\u{2581}\u{2581}", "\u{2581}t", "in"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let r = placeholder_ranks(&tokens);
        assert!(r[0] > r[2] && r[2] > r[3], "vocabulary order: {r:?}");
        assert!(
            r[1] < r[3],
            "a run of spaces merges after every other piece: {r:?}"
        );
    }

    #[test]
    fn respells_gemma_space_runs() {
        assert_eq!(respell_spaces("   "), "\u{2581}\u{2581}\u{2581}");
        assert_eq!(respell_spaces(" \n"), "\u{2581}\u{2581}");
        assert_eq!(respell_spaces("\n\n"), "\n\n");
        assert_eq!(respell_spaces(" a"), " a");
    }
}
