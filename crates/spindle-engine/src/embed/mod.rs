//! Embeddings and pair scores from an encoder, batched across requests.
//!
//! [`Embedder`] turns inputs (texts or token ids) into checked token lists
//! and runs them through the encoder in passes of at most
//! `max_batch_tokens` rows, packed without padding. [`spawn_embedder`] puts
//! one on its own thread behind an [`EmbedHandle`]: every job waiting when
//! a pass starts joins it (continuous batching: a request of one short
//! text does not wait behind a long one for a pass of its own), and each
//! job gets its own results back. A text's vector is the same whatever it
//! shares a pass with (`spindle_model::encoder`).

mod decoder;
mod service;

use spindle_model::encoder::{EncodedText, Encoder, EncoderInput, EncoderTokenizer, Pooling};

pub use decoder::embed_with_decoder;
pub use service::{spawn_embedder, EmbedHandle, EmbedJob, EmbedMetrics, JobKind};

use crate::error::{ErrorKind, RequestError};

/// One input of an embedding request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmbedInput {
    Text(String),
    /// Token ids as the client tokenized them (`[CLS]`/`[SEP]` included, as
    /// the model expects them).
    Ids(Vec<u32>),
}

/// What a request may change.
#[derive(Debug, Clone, Copy, Default)]
pub struct EmbedOptions {
    /// Cut over-long inputs to the model's limit instead of refusing them.
    pub truncate: bool,
}

/// Rows per pass unless configured: passes of 2048 rows keep their
/// buffers (5-9 MiB for a BERT of width 384) in cache; 8192 measured 11%
/// slower (docs/PERF.md §41).
pub const DEFAULT_MAX_BATCH_TOKENS: usize = 2048;

/// An encoder, its tokenizer and how it batches.
pub struct Embedder {
    pub encoder: Encoder,
    pub tokenizer: EncoderTokenizer,
    pub name: String,
    pub max_batch_tokens: usize,
}

impl Embedder {
    pub fn new(encoder: Encoder, tokenizer: EncoderTokenizer, name: String) -> Embedder {
        Embedder {
            encoder,
            tokenizer,
            name,
            max_batch_tokens: DEFAULT_MAX_BATCH_TOKENS,
        }
    }

    /// The vector width.
    pub fn dimensions(&self) -> usize {
        self.encoder.config.hidden
    }

    /// The longest input, in tokens.
    pub fn max_tokens(&self) -> usize {
        self.encoder.config.max_tokens
    }

    pub fn pooling(&self) -> Pooling {
        self.encoder.config.pooling
    }

    /// Whether the model scores pairs itself (a cross-encoder).
    pub fn is_cross_encoder(&self) -> bool {
        self.encoder.weights.classifier.is_some()
    }

    /// Tokenizes and checks `inputs` (`param` names the request field for
    /// errors): none empty, none over the limit unless truncated, ids in
    /// the vocabulary.
    pub fn prepare(
        &self,
        inputs: &[EmbedInput],
        options: EmbedOptions,
        param: &'static str,
    ) -> Result<Vec<EncodedText>, RequestError> {
        if inputs.is_empty() {
            return Err(RequestError::invalid(
                param,
                format!("'{param}' is empty: give at least one input"),
            ));
        }
        let vocab = self.encoder.config.vocab;
        inputs
            .iter()
            .enumerate()
            .map(|(i, input)| {
                let encoded = match input {
                    EmbedInput::Text(t) if t.is_empty() => {
                        return Err(RequestError::invalid(param, format!("input {i} is an empty string")))
                    }
                    EmbedInput::Text(t) => self
                        .tokenizer
                        .encode(t)
                        .map_err(|e| RequestError::invalid(param, format!("input {i}: {e}")))?,
                    EmbedInput::Ids(ids) => {
                        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                            return Err(RequestError::invalid(
                                param,
                                format!("input {i} holds token id {bad}, past the vocabulary of {vocab}"),
                            ));
                        }
                        EncodedText {
                            type_ids: vec![0; ids.len()],
                            ids: ids.clone(),
                        }
                    }
                };
                self.fit(encoded, i, options, param)
            })
            .collect()
    }

    /// Query and document pairs, for a cross-encoder.
    pub fn prepare_pairs(
        &self,
        query: &str,
        documents: &[String],
        options: EmbedOptions,
    ) -> Result<Vec<EncodedText>, RequestError> {
        documents
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let e = self.tokenizer.encode_pair(query, d).map_err(|e| {
                    RequestError::invalid("documents", format!("document {i}: {e}"))
                })?;
                self.fit(e, i, options, "documents")
            })
            .collect()
    }

    fn fit(
        &self,
        mut e: EncodedText,
        index: usize,
        options: EmbedOptions,
        param: &'static str,
    ) -> Result<EncodedText, RequestError> {
        let max = self.max_tokens();
        if e.ids.is_empty() {
            return Err(RequestError::invalid(
                param,
                format!("input {index} has no tokens"),
            ));
        }
        if e.ids.len() > max {
            if !options.truncate {
                return Err(RequestError {
                    param: Some(param),
                    ..RequestError::new(
                        ErrorKind::TooLong,
                        format!(
                            "input {index} is {} tokens, over the model's limit of {max}: shorten it, or ask for truncation (\"truncate\": true)",
                            e.ids.len()
                        ),
                    )
                });
            }
            // Keep the closing separator, as the tokenizer's own truncation does.
            let last = *e.ids.last().expect("not empty");
            let last_type = *e.type_ids.last().expect("one per id");
            e.ids.truncate(max - 1);
            e.type_ids.truncate(max - 1);
            e.ids.push(last);
            e.type_ids.push(last_type);
        }
        Ok(e)
    }

    /// Vectors of `texts`, in passes of at most `max_batch_tokens` rows.
    pub fn embed(&self, texts: &[EncodedText]) -> Result<Vec<Vec<f32>>, RequestError> {
        self.in_passes(texts, |inputs| self.encoder.embed(inputs))
    }

    /// [`Embedder::embed`] with another pooling or normalisation.
    pub fn embed_with(
        &self,
        texts: &[EncodedText],
        pooling: Pooling,
        normalized: bool,
    ) -> Result<Vec<Vec<f32>>, RequestError> {
        self.in_passes(texts, |inputs| {
            self.encoder.embed_with(inputs, pooling, normalized)
        })
    }

    /// A cross-encoder's first score for each pair.
    pub fn score_pairs(&self, pairs: &[EncodedText]) -> Result<Vec<f32>, RequestError> {
        let scores = self.in_passes(pairs, |inputs| self.encoder.classify(inputs))?;
        Ok(scores.into_iter().map(|s| s[0]).collect())
    }

    /// How `texts` are cut into passes: consecutive runs of at most
    /// `max_batch_tokens` rows (a longer text alone).
    pub fn pass_ranges(&self, texts: &[EncodedText]) -> Vec<std::ops::Range<usize>> {
        let mut ranges = Vec::new();
        let mut start = 0;
        while start < texts.len() {
            let mut rows = 0;
            let mut end = start;
            while end < texts.len()
                && (end == start || rows + texts[end].ids.len() <= self.max_batch_tokens)
            {
                rows += texts[end].ids.len();
                end += 1;
            }
            ranges.push(start..end);
            start = end;
        }
        ranges
    }

    fn in_passes(
        &self,
        texts: &[EncodedText],
        run: impl Fn(&[EncoderInput<'_>]) -> Result<Vec<Vec<f32>>, spindle_model::ModelError>,
    ) -> Result<Vec<Vec<f32>>, RequestError> {
        let mut out = Vec::with_capacity(texts.len());
        for range in self.pass_ranges(texts) {
            let inputs: Vec<EncoderInput<'_>> = texts[range]
                .iter()
                .map(|t| EncoderInput {
                    ids: &t.ids,
                    type_ids: Some(&t.type_ids),
                })
                .collect();
            out.extend(run(&inputs).map_err(|e| RequestError::internal(e.to_string()))?);
        }
        Ok(out)
    }
}
