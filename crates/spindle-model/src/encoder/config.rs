//! An encoder's shape and how its outputs become one vector: from a Hugging
//! Face directory (`config.json`, sentence-transformers' `modules.json`,
//! `1_Pooling/config.json`, `sentence_bert_config.json`) or from a GGUF
//! written by llama.cpp's converter (`bert.*` keys).

use std::path::Path;

use serde_json::Value;
use spindle_formats::{GgufFile, HfConfig};

use crate::error::ModelError;

/// How the rows of a text become its vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of every row (sentence-transformers' `pooling_mode_mean_tokens`).
    Mean,
    /// The first row (`[CLS]`).
    Cls,
    /// The last row (decoder embedders).
    Last,
}

impl Pooling {
    /// `mean`, `cls` or `last`.
    pub fn parse(name: &str) -> Option<Pooling> {
        match name {
            "mean" => Some(Pooling::Mean),
            "cls" => Some(Pooling::Cls),
            "last" => Some(Pooling::Last),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

/// A BERT encoder's hyperparameters and its pooling.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderConfig {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub ffn: usize,
    pub vocab: usize,
    /// Rows of the position table: the longest input the model can read.
    pub max_positions: usize,
    /// The longest input the model was trained or is configured for
    /// (sentence-transformers' `max_seq_length`; else `max_positions`).
    pub max_tokens: usize,
    pub type_vocab: usize,
    pub eps: f32,
    pub pooling: Pooling,
    /// Whether pooled vectors are scaled to unit length.
    pub normalize: bool,
    /// A cross-encoder's labels: the model scores text pairs through its
    /// pooler and classifier instead of giving vectors.
    pub classifier_labels: Option<usize>,
}

impl EncoderConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// From a Hugging Face directory's `config.json` and the
    /// sentence-transformers files beside it.
    pub fn from_hf(dir: &Path, cfg: &HfConfig) -> Result<EncoderConfig, ModelError> {
        let need = |key: &str| {
            cfg.get_usize(key)
                .ok_or_else(|| ModelError::MissingMetadata(format!("config.json: {key}")))
        };
        match cfg.get_str("hidden_act").unwrap_or("gelu") {
            "gelu" => {}
            other => {
                return Err(ModelError::Unsupported(format!(
                    "encoder activation '{other}': Spindle's BERT runs hidden_act = \"gelu\""
                )))
            }
        }
        if let Some(kind) = cfg.get_str("position_embedding_type") {
            if kind != "absolute" {
                return Err(ModelError::Unsupported(format!(
                    "position_embedding_type '{kind}': Spindle's BERT runs absolute positions"
                )));
            }
        }
        let max_positions = need("max_position_embeddings")?;
        let modules = read_json(&dir.join("modules.json"));
        let mut pooling = None;
        let mut normalize = false;
        if let Some(Value::Array(list)) = &modules {
            for m in list {
                let kind = m.get("type").and_then(Value::as_str).unwrap_or("");
                let path = m.get("path").and_then(Value::as_str).unwrap_or("");
                if kind.ends_with(".Pooling") {
                    pooling =
                        read_json(&dir.join(path).join("config.json")).and_then(|p| st_pooling(&p));
                } else if kind.ends_with(".Normalize") {
                    normalize = true;
                }
            }
        }
        let classifier = cfg
            .get("architectures")
            .and_then(Value::as_array)
            .is_some_and(|a| {
                a.iter()
                    .any(|v| v.as_str() == Some("BertForSequenceClassification"))
            });
        let classifier_labels = classifier.then(|| {
            cfg.get("id2label")
                .and_then(Value::as_object)
                .map_or(1, |m| m.len().max(1))
        });
        let max_tokens = read_json(&dir.join("sentence_bert_config.json"))
            .and_then(|v| v.get("max_seq_length").and_then(Value::as_u64))
            .map_or(max_positions, |n| (n as usize).min(max_positions));
        let c = EncoderConfig {
            hidden: need("hidden_size")?,
            layers: need("num_hidden_layers")?,
            heads: need("num_attention_heads")?,
            ffn: need("intermediate_size")?,
            vocab: need("vocab_size")?,
            max_positions,
            max_tokens,
            type_vocab: cfg.get_usize("type_vocab_size").unwrap_or(2),
            eps: cfg.get_f64("layer_norm_eps").unwrap_or(1e-12) as f32,
            // Without sentence-transformers' files: the first token, as
            // BERT's own pooler and classifiers read it.
            pooling: pooling.unwrap_or(Pooling::Cls),
            normalize,
            classifier_labels,
        };
        c.check()
    }

    /// From a GGUF's `bert.*` keys (llama.cpp's converter).
    pub fn from_gguf(g: &GgufFile) -> Result<EncoderConfig, ModelError> {
        let arch = g.architecture().unwrap_or("?");
        let need = |key: &str| {
            let full = format!("{arch}.{key}");
            g.get_u64(&full)
                .map(|v| v as usize)
                .ok_or(ModelError::MissingMetadata(full))
        };
        let hidden = need("embedding_length")?;
        let max_positions = need("context_length")?;
        // llama.cpp's pooling_type: 0 none, 1 mean, 2 cls, 3 last, 4 rank.
        let pooling = match g.get_u64(&format!("{arch}.pooling_type")) {
            Some(2) | Some(4) => Pooling::Cls,
            Some(3) => Pooling::Last,
            _ => Pooling::Mean,
        };
        let vocab = g
            .get_array("tokenizer.ggml.tokens")
            .map(<[_]>::len)
            .ok_or_else(|| ModelError::MissingMetadata("tokenizer.ggml.tokens".into()))?;
        let c = EncoderConfig {
            hidden,
            layers: need("block_count")?,
            heads: need("attention.head_count")?,
            ffn: need("feed_forward_length")?,
            vocab,
            max_positions,
            max_tokens: max_positions,
            type_vocab: g
                .tensor("token_types.weight")
                .map_or(0, |t| t.dims.get(1).copied().unwrap_or(1) as usize),
            eps: g
                .get_f64(&format!("{arch}.attention.layer_norm_epsilon"))
                .unwrap_or(1e-12) as f32,
            pooling,
            // llama.cpp's embedding tools normalise by default
            // (`--embd-normalize 2`).
            normalize: true,
            // A reranker as llama.cpp's converter writes one: the pooler as
            // `cls`, the classifier as `cls.output` (rows = labels).
            classifier_labels: g
                .tensor("cls.output.weight")
                .map(|t| t.dims.get(1).copied().unwrap_or(1).max(1) as usize),
        };
        c.check()
    }

    fn check(self) -> Result<EncoderConfig, ModelError> {
        if self.heads == 0 || self.hidden == 0 || !self.hidden.is_multiple_of(self.heads) {
            return Err(ModelError::Unsupported(format!(
                "an encoder of width {} with {} heads: the width must be a multiple of the heads",
                self.hidden, self.heads
            )));
        }
        Ok(self)
    }
}

fn read_json(path: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

/// sentence-transformers' `1_Pooling/config.json`.
fn st_pooling(p: &Value) -> Option<Pooling> {
    let on = |key: &str| p.get(key).and_then(Value::as_bool).unwrap_or(false);
    if on("pooling_mode_mean_tokens") {
        Some(Pooling::Mean)
    } else if on("pooling_mode_cls_token") {
        Some(Pooling::Cls)
    } else if on("pooling_mode_lasttoken") {
        Some(Pooling::Last)
    } else {
        None
    }
}
