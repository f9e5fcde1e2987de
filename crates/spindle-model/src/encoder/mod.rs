//! Encoder models (BERT): texts in, one vector per text (embeddings) or one
//! score per text pair (cross-encoders), from safetensors or GGUF.
//!
//! The decoder's `Model` runs causal rows against a KV cache; an encoder
//! reads each text whole, every row seeing every other row of its text, and
//! keeps nothing between passes. It shares the decoder's int8 kernels for
//! quantized weights and multiplies float ones with its own packed kernel
//! (`float_panels`); both give a row the same bits whatever shares its pass.

mod config;
mod pass;
mod pooling;
mod tokenizer;
mod weights;

use std::path::Path;

use spindle_formats::{GgmlType, GgufFile, SafetensorsModel};
use spindle_kernels::simd::{detected_isa, Isa};
use spindle_kernels::ThreadPool;

pub use config::{EncoderConfig, Pooling};
pub use pass::{EncoderInput, EncoderRows};
pub use pooling::{normalize, pool};
pub use tokenizer::{EncodedText, EncoderTokenizer};
pub use weights::{EncoderSource, EncoderWeights};

use crate::error::ModelError;

pub struct Encoder {
    pub config: EncoderConfig,
    pub weights: EncoderWeights,
    pool: ThreadPool,
    isa: Isa,
}

/// An encoder with its tokenizer, as found on disk.
pub struct LoadedEncoder {
    pub encoder: Encoder,
    pub tokenizer: EncoderTokenizer,
    pub name: String,
}

/// How to load an encoder.
#[derive(Debug, Clone, Copy, Default)]
pub struct EncoderOptions {
    /// Convert the layer matrices to this type at load (`Q8_0`: about 4x
    /// faster passes than f32, vectors within about 1e-3 of the float
    /// model's in cosine).
    pub quantize: Option<GgmlType>,
}

/// Whether the model at `path` is an encoder: a GGUF whose architecture is
/// `bert`, or a directory whose `config.json` says `model_type: bert`.
pub fn is_encoder(path: &Path) -> bool {
    if path.is_dir() {
        return spindle_formats::HfConfig::load(&path.join("config.json"))
            .ok()
            .is_some_and(|c| c.model_type() == Some("bert"));
    }
    GgufFile::open_header_only(path)
        .ok()
        .is_some_and(|g| g.architecture() == Some("bert"))
}

impl Encoder {
    pub fn new(config: EncoderConfig, weights: EncoderWeights, n_threads: usize) -> Encoder {
        Encoder {
            config,
            weights,
            pool: ThreadPool::new(n_threads),
            isa: detected_isa(),
        }
    }

    /// Runs every later pass on `isa` (tests compare the paths).
    pub fn set_isa(&mut self, isa: Isa) -> Result<(), ModelError> {
        if !isa.is_available() {
            return Err(ModelError::Unsupported(format!("ISA {isa} on this CPU")));
        }
        self.isa = isa;
        Ok(())
    }

    /// One vector per input, pooled and normalised as the model's
    /// configuration says, all in one pass.
    pub fn embed(&self, inputs: &[EncoderInput<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.embed_with(inputs, self.config.pooling, self.config.normalize)
    }

    /// [`Encoder::embed`] with another pooling or normalisation.
    pub fn embed_with(
        &self,
        inputs: &[EncoderInput<'_>],
        pooling: Pooling,
        normalized: bool,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let rows = self.hidden_states(inputs)?;
        Ok(rows
            .spans
            .iter()
            .map(|span| {
                let mut v = pool(&rows.hidden, span.clone(), self.config.hidden, pooling);
                if normalized {
                    normalize(&mut v);
                }
                v
            })
            .collect())
    }

    /// A cross-encoder's raw scores (one per label) for each input, a
    /// query and document pair: BERT's pooler over `[CLS]`, then the
    /// classifier.
    pub fn classify(&self, inputs: &[EncoderInput<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        let Some(head) = &self.weights.classifier else {
            return Err(ModelError::Unsupported(
                "this model has no classifier head: it scores pairs by embedding similarity".into(),
            ));
        };
        let rows = self.hidden_states(inputs)?;
        let h = self.config.hidden;
        let n = rows.spans.len();
        let mut cls = Vec::with_capacity(n * h);
        for span in &rows.spans {
            cls.extend_from_slice(&rows.hidden[span.start * h..(span.start + 1) * h]);
        }
        let pooled = match &head.pooler {
            Some((w, b)) => {
                let mut pooled = vec![0.0f32; n * h];
                self.linear(w, b, &cls, n, &mut pooled)?;
                for v in &mut pooled {
                    *v = v.tanh();
                }
                pooled
            }
            None => cls,
        };
        let labels = head.out.rows();
        let mut out = vec![0.0f32; n * labels];
        self.linear(&head.out, &head.out_bias, &pooled, n, &mut out)?;
        Ok(out.chunks_exact(labels).map(<[f32]>::to_vec).collect())
    }
}

/// Loads the encoder at `path` (a `bert` GGUF or a Hugging Face BERT
/// directory) with `n_threads` compute threads.
pub fn load_encoder(
    path: &Path,
    n_threads: usize,
    options: EncoderOptions,
) -> Result<LoadedEncoder, ModelError> {
    if !path.exists() {
        return Err(ModelError::Open {
            path: path.display().to_string(),
            reason: "no such file or directory".into(),
        });
    }
    let file_name = || {
        path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    };
    if path.is_dir() {
        let st = SafetensorsModel::open(path)?;
        if st.config().model_type() != Some("bert") {
            return Err(ModelError::UnsupportedArchitecture(format!(
                "{} (as an encoder: Spindle's encoders are BERT models)",
                st.config().model_type().unwrap_or("?")
            )));
        }
        let config = EncoderConfig::from_hf(path, st.config())?;
        let weights =
            EncoderWeights::load(&EncoderSource::Safetensors(&st), &config, options.quantize)?;
        let tokenizer = EncoderTokenizer::from_hf_dir(path)?;
        return Ok(LoadedEncoder {
            encoder: Encoder::new(config, weights, n_threads),
            tokenizer,
            name: file_name(),
        });
    }
    let g = GgufFile::open(path)?;
    if g.architecture() != Some("bert") {
        return Err(ModelError::UnsupportedArchitecture(format!(
            "{} (as an encoder: Spindle's encoders are BERT models)",
            g.architecture().unwrap_or("?")
        )));
    }
    let config = EncoderConfig::from_gguf(&g)?;
    let weights = EncoderWeights::load(&EncoderSource::Gguf(&g), &config, options.quantize)?;
    let tokenizer = EncoderTokenizer::from_gguf(&g)?;
    Ok(LoadedEncoder {
        encoder: Encoder::new(config, weights, n_threads),
        tokenizer,
        name: g
            .get_str("general.name")
            .map_or_else(file_name, str::to_string),
    })
}
