//! A Hugging Face model directory: `tokenizer.json`, and when present
//! `tokenizer_config.json` (BOS/EOS tokens, `add_bos_token`, `chat_template`),
//! `chat_template.jinja`, `config.json` (`model_type`, fallback BOS/EOS ids)
//! and `generation_config.json` (further EOS ids, which become stop ids).

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde_json::Value;

use super::{Added, Parts, PieceKind, TokenizerError};

fn read(path: &Path) -> Result<String, TokenizerError> {
    // Reading a FIFO would block for ever; a symlink loop gets its own
    // message. A missing file is left to read_to_string's error, as before.
    match spindle_formats::file_kind::require_file(path, "a tokenizer file") {
        Err(spindle_formats::FormatError::Io { .. }) | Ok(_) => {}
        Err(e) => return Err(e.into()),
    }
    std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// An optional JSON file: `None` when absent.
fn read_json(path: PathBuf) -> Result<Option<Value>, TokenizerError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = read(&path)?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TokenizerError::Parse {
            path,
            message: e.to_string(),
        })
}

/// A special token of `tokenizer_config.json`: a string, or an added-token
/// object with `content`.
fn token_text(v: Option<&Value>) -> Option<&str> {
    match v? {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content")?.as_str(),
        _ => None,
    }
}

/// Token ids of a `config.json` / `generation_config.json` field: one id or a list.
fn ids_of(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .into_iter()
            .collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().and_then(|i| u32::try_from(i).ok()))
            .collect(),
        _ => Vec::new(),
    }
}

pub(crate) fn build(dir: &Path) -> Result<Parts, TokenizerError> {
    let path = dir.join("tokenizer.json");
    let text = read(&path)?;
    let parse_err = |message: String| TokenizerError::Parse {
        path: path.clone(),
        message,
    };
    let json: Value = serde_json::from_str(&text).map_err(|e| parse_err(e.to_string()))?;
    let tok = tokenizers::Tokenizer::from_str(&text).map_err(|e| parse_err(e.to_string()))?;

    let config = read_json(dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
    let model_config = read_json(dir.join("config.json"))?.unwrap_or(Value::Null);
    let generation = read_json(dir.join("generation_config.json"))?.unwrap_or(Value::Null);

    let lookup = |text: Option<&str>| text.and_then(|t| tok.token_to_id(t));
    let bos = lookup(token_text(config.get("bos_token")))
        .or_else(|| ids_of(model_config.get("bos_token_id")).first().copied());
    let eos = lookup(token_text(config.get("eos_token")))
        .or_else(|| ids_of(model_config.get("eos_token_id")).first().copied());
    let mut extra_stops = ids_of(model_config.get("eos_token_id"));
    extra_stops.extend(ids_of(generation.get("eos_token_id")));

    let bos_text = bos.and_then(|id| tok.id_to_token(id));
    let add_bos = config
        .get("add_bos_token")
        .and_then(Value::as_bool)
        .unwrap_or_else(|| post_processor_adds(json.get("post_processor"), bos_text.as_deref()));
    let add_eos = config
        .get("add_eos_token")
        .and_then(Value::as_bool)
        .unwrap_or(false);

    // `chat_template.jinja` first: transformers lets it replace the one in
    // `tokenizer_config.json` (a model updated by a new file keeps the old
    // field).
    let jinja = dir.join("chat_template.jinja");
    let chat_template = if jinja.is_file() {
        Some(read(&jinja)?)
    } else {
        match template_of(config.get("chat_template")) {
            Some(t) => Some(t),
            None => read_json(dir.join("chat_template.json"))?
                .and_then(|v| template_of(v.get("chat_template"))),
        }
    };

    let family = model_config
        .get("model_type")
        .and_then(Value::as_str)
        .map(str::to_string);

    Ok(Parts {
        model: tok.get_model().clone(),
        normalizer: tok.get_normalizer().cloned(),
        pre_tokenizer: tok.get_pre_tokenizer().cloned(),
        decoder: tok.get_decoder().cloned(),
        added: Added::Vocabulary(Box::new(tok.get_added_vocabulary().clone())),
        kind: piece_kind(json.get("decoder")),
        bos,
        eos,
        extra_stops,
        add_bos,
        add_eos,
        chat_template,
        family,
    })
}

/// `chat_template` of a config: a string, or a list of `{name, template}`
/// (the one named `default`, else the first).
fn template_of(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => {
            let named = |name: &str| {
                list.iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some(name))
            };
            named("default")
                .or_else(|| list.first())
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_string)
        }
        _ => None,
    }
}

/// Whether a `tokenizer.json` post-processor puts `bos` first.
fn post_processor_adds(pp: Option<&Value>, bos: Option<&str>) -> bool {
    let (Some(pp), Some(bos)) = (pp, bos) else {
        return false;
    };
    match pp.get("type").and_then(Value::as_str) {
        Some("TemplateProcessing") => {
            pp.get("single")
                .and_then(|s| s.get(0))
                .and_then(|first| first.get("SpecialToken"))
                .and_then(|t| t.get("id"))
                .and_then(Value::as_str)
                == Some(bos)
        }
        Some("Sequence") => pp
            .get("processors")
            .and_then(Value::as_array)
            .is_some_and(|ps| ps.iter().any(|p| post_processor_adds(Some(p), Some(bos)))),
        _ => false,
    }
}

/// How to turn tokens into bytes, from the `tokenizer.json` decoder.
fn piece_kind(decoder: Option<&Value>) -> PieceKind {
    let Some(d) = decoder else {
        return PieceKind::Other;
    };
    let kind = |d: &Value| {
        d.get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let parts: Vec<&Value> = match kind(d).as_str() {
        "Sequence" => d
            .get("decoders")
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
        _ => vec![d],
    };
    let names: Vec<String> = parts.iter().map(|p| kind(p)).collect();
    let has = |n: &str| names.iter().any(|x| x == n);
    if has("ByteLevel") && names.len() == 1 {
        return PieceKind::ByteLevel;
    }
    if has("Metaspace") {
        let strip = parts
            .iter()
            .find(|p| kind(p) == "Metaspace")
            .map(|p| match p.get("prepend_scheme").and_then(Value::as_str) {
                Some(scheme) => scheme != "never",
                None => p
                    .get("add_prefix_space")
                    .and_then(Value::as_bool)
                    .unwrap_or(true),
            })
            .unwrap_or(true);
        return PieceKind::SentencePiece {
            strip_first_space: strip,
        };
    }
    let replaces_metaspace = parts.iter().any(|p| {
        kind(p) == "Replace"
            && p.get("pattern")
                .and_then(|x| x.get("String"))
                .and_then(Value::as_str)
                == Some("\u{2581}")
            && p.get("content").and_then(Value::as_str) == Some(" ")
    });
    let known = names
        .iter()
        .all(|n| matches!(n.as_str(), "Replace" | "ByteFallback" | "Fuse" | "Strip"));
    if replaces_metaspace && known {
        let strip = parts.iter().any(|p| {
            kind(p) == "Strip"
                && p.get("content").and_then(Value::as_str) == Some(" ")
                && p.get("start").and_then(Value::as_u64).unwrap_or(0) >= 1
        });
        return PieceKind::SentencePiece {
            strip_first_space: strip,
        };
    }
    PieceKind::Other
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn decoder_kinds() {
        assert_eq!(
            piece_kind(Some(&json!({"type": "ByteLevel"}))),
            PieceKind::ByteLevel
        );
        let gemma = json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]});
        assert_eq!(
            piece_kind(Some(&gemma)),
            PieceKind::SentencePiece {
                strip_first_space: false
            }
        );
        let llama = json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]});
        assert_eq!(
            piece_kind(Some(&llama)),
            PieceKind::SentencePiece {
                strip_first_space: true
            }
        );
        assert_eq!(
            piece_kind(Some(&json!({"type": "WordPiece", "prefix": "##"}))),
            PieceKind::Other
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_tokenizer_json_is_refused_promptly() {
        let dir = tempfile::tempdir().unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(dir.path().join("tokenizer.json"))
            .status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo failed");
        let (tx, rx) = std::sync::mpsc::channel();
        let d = dir.path().to_path_buf();
        // On its own thread, so that a regression fails instead of hanging.
        std::thread::spawn(move || {
            let _ = tx.send(build(&d).err().map(|e| e.to_string()));
        });
        let e = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("reading a FIFO blocked")
            .expect("a FIFO must be refused");
        assert!(e.contains("tokenizer.json is a FIFO (named pipe)"), "{e}");
    }
}
