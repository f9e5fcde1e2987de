//! Options shared by subcommands, and opening the model they name.

use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};
use clap::Args;
use spindle_engine::SamplerConfig;
use spindle_model::tokenizer::Tokenizer;
use spindle_model::{KvCache, LoadedModel};

use crate::home;

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A .gguf file or a Hugging Face model directory (default: Gemma 3 270M, pulled on first use).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Compute threads (default: the number of physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Context length in tokens (default: the model's).
    #[arg(long = "ctx")]
    pub ctx: Option<usize>,
}

impl ModelArgs {
    pub fn threads(&self) -> usize {
        self.threads
            .unwrap_or_else(spindle_kernels::cpu::physical_cores)
            .max(1)
    }

    /// The model file: `-m`, or the default model, pulled when absent.
    pub fn resolve(&self) -> Result<PathBuf> {
        if let Some(m) = &self.model {
            return Ok(m.clone());
        }
        let path = home::default_model_path();
        if !path.exists() {
            eprintln!(
                "The default model is not in {} yet; pulling it first.",
                home::models_dir().display()
            );
            crate::commands::pull::pull_default(false)?;
        }
        Ok(path)
    }

    pub fn load(&self) -> Result<LoadedModel> {
        let path = self.resolve()?;
        spindle_model::load(&path, self.threads())
            .with_context(|| format!("cannot load {}", path.display()))
    }
}

impl ModelArgs {
    /// Only the tokenizer of the model (no weights are read).
    pub fn load_tokenizer(&self) -> Result<Tokenizer> {
        let path = self.resolve()?;
        let (tok, err) = spindle_model::load_tokenizer(&path)
            .with_context(|| format!("cannot load {}", path.display()))?;
        tok.ok_or_else(|| match err {
            Some(e) => anyhow!("the model's tokenizer cannot be built: {e}"),
            None => anyhow!("the model file has no tokenizer"),
        })
    }
}

/// A KV cache for `loaded` of `--ctx` tokens (or the model's context).
pub fn kv_cache(loaded: &LoadedModel, ctx: Option<usize>) -> KvCache {
    let model = &loaded.model;
    let ctx = ctx.unwrap_or(model.config.context_length).max(1);
    model.new_kv_cache(model.default_kv_type(), ctx, 1)
}

/// The tokenizer, or an error saying why the model has none.
pub fn tokenizer(loaded: &LoadedModel) -> Result<&Tokenizer> {
    loaded
        .tokenizer
        .as_ref()
        .ok_or_else(|| match &loaded.tokenizer_error {
            Some(e) => anyhow!("the model's tokenizer cannot be built: {e}"),
            None => {
                anyhow!("the model file has no tokenizer: pass token ids (--ids) instead of text")
            }
        })
}

#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    /// Keep the K most likely tokens (0: off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling threshold (1: off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens below this fraction of the best token's probability (0: off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalty on recently seen tokens (1: off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (default: from the clock; printed in the statistics).
    #[arg(long = "seed")]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn config(&self) -> Result<SamplerConfig> {
        let bad = |what: &str| Err(anyhow!("{what}"));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad("--temp must be a number >= 0");
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return bad("--top-p must be between 0 and 1");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("--min-p must be between 0 and 1");
        }
        if !self.repeat_penalty.is_finite() || self.repeat_penalty <= 0.0 {
            return bad("--repeat-penalty must be > 0");
        }
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        Ok(SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: 64,
            seed,
        })
    }
}

/// Parses "2,818,1234" or "[2, 818]" into ids.
pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<u32>()
                .map_err(|_| anyhow!("'{p}' is not a token id: give ids like 2,818,1234"))
        })
        .collect()
}

/// Text from `-p` or `-f`.
pub fn prompt_text(prompt: &Option<String>, file: &Option<PathBuf>) -> Result<String> {
    match (prompt, file) {
        (Some(p), None) => Ok(p.clone()),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("cannot read prompt file {}", f.display())),
        (Some(_), Some(_)) => Err(anyhow!("give either -p or -f, not both")),
        (None, None) => Err(anyhow!("no prompt: give -p TEXT or -f FILE")),
    }
}
