//! Options shared by subcommands, and opening the model they name.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use spindle_engine::SamplerConfig;
use spindle_kernels::quant::q8_act::ActRounding;
use spindle_model::tokenizer::Tokenizer;
use spindle_model::{KvCache, KvType, LoadedModel, Model};
use spindle_plan::{Device, EngineProfile, KvType as PlanKv, ModelShape, PlanRequest};

use crate::home;

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A .gguf file or a Hugging Face model directory (default: Gemma 3 270M, pulled on first use).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Compute threads (default: the number of physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Context length in tokens (default: the model's, or the longest that
    /// fits in memory).
    #[arg(long = "ctx", value_parser = parse_ctx)]
    pub ctx: Option<usize>,
    /// Memory granted to the KV cache, e.g. 512MiB or 2G (default: what the
    /// context needs). Without --ctx, the context is the longest that fits.
    #[arg(long = "kv-memory", value_parser = parse_size)]
    pub kv_memory: Option<u64>,
    /// Element type of the KV cache: f16, q8_0 (about half the memory, a
    /// little less exact) or f32 (default: f16, f32 for float32 models).
    #[arg(long = "kv-type")]
    pub kv_type: Option<String>,
    /// Before loading, dequantize every weight and stop at the first NaN or
    /// infinity, naming its tensor and block (loading itself checks norms,
    /// biases and block scales only).
    #[arg(long = "check-weights")]
    pub check_weights: bool,
    /// How activations are rounded to int8 for quantized weights: block32
    /// (one scale per 32 values, the most exact; default) or ggml (one per
    /// 256 for K-quants and i-quants, as llama.cpp does: for comparing the
    /// two engines number for number).
    #[arg(long = "act-rounding", default_value = "block32")]
    pub act_rounding: ActRounding,
}

impl ModelArgs {
    pub fn threads(&self) -> usize {
        self.threads
            .unwrap_or_else(spindle_kernels::cpu::physical_cores)
            .max(1)
    }

    /// The model file: `-m`, or the default model, pulled when absent.
    pub fn resolve(&self) -> Result<PathBuf> {
        resolve_model(&self.model)
    }

    /// Loads the model, after checking from its headers alone that the
    /// requested context fits (this machine's memory, and `--kv-memory`).
    pub fn load(&self) -> Result<LoadedModel> {
        let path = self.resolve()?;
        if self.ctx.is_some() || self.kv_memory.is_some() {
            self.planned_ctx(&path, None)?;
        }
        if self.check_weights {
            let start = std::time::Instant::now();
            let c = spindle_model::check_weights(&path)
                .with_context(|| format!("the weights of {} are not sound", path.display()))?;
            eprintln!(
                "checked every weight: {} tensors, {} values ({}) in {:.1} s, all finite",
                c.tensors,
                c.values,
                spindle_plan::human_bytes(c.bytes),
                start.elapsed().as_secs_f64()
            );
        }
        let mut loaded = spindle_model::load(&path, self.threads())
            .with_context(|| format!("cannot load {}", path.display()))?;
        loaded.model.set_act_rounding(self.act_rounding);
        Ok(loaded)
    }

    /// The context to size the KV cache for: `--ctx`, else `default`, else
    /// the longest that `--kv-memory` holds, else the model's own, cut to
    /// what fits in memory. A requested context that does not fit is an
    /// error showing the plan.
    pub fn planned_ctx(&self, path: &Path, default: Option<usize>) -> Result<usize> {
        self.planned_ctx_for(path, default, 1)
    }

    /// [`ModelArgs::planned_ctx`] for `batch` sequences of that context
    /// each (the server's sequence slots).
    pub fn planned_ctx_for(
        &self,
        path: &Path,
        default: Option<usize>,
        batch: u64,
    ) -> Result<usize> {
        let shape = ModelShape::from_path(path)
            .with_context(|| format!("cannot plan {}", path.display()))?;
        let device = Device::cpu()?;
        let profile = EngineProfile::cpu_with_threads(self.threads() as u64);
        let kv = self.plan_kv_type()?;
        let plan_for = |ctx: u64| {
            spindle_plan::plan(
                &shape,
                &PlanRequest::new(ctx.max(1), batch, kv, device.clone()),
                &profile,
            )
        };
        let kv_fits = |ctx: u64| {
            self.kv_memory
                .is_none_or(|m| shape.kv_bytes(ctx, batch, kv) <= m)
        };
        let requested = self.ctx.or(default);
        let ctx = match (requested, self.kv_memory) {
            (Some(c), _) => c as u64,
            (None, Some(budget)) => shape.max_ctx_for_kv(budget, batch, kv),
            (None, None) => {
                let p = plan_for(shape.context_length);
                if p.fits {
                    shape.context_length
                } else {
                    p.max_ctx
                }
            }
        };
        let plan = plan_for(ctx);
        if ctx == 0 || !kv_fits(ctx) {
            bail!(
                "the KV cache of a {ctx}-token context needs {} but --kv-memory grants {}: \
                 lower --ctx or raise --kv-memory\n\n{}",
                spindle_plan::human_bytes(shape.kv_bytes(ctx.max(1), batch, kv)),
                spindle_plan::human_bytes(self.kv_memory.unwrap_or(0)),
                plan.render_table()
            );
        }
        if !plan.fits {
            bail!(
                "a {ctx}-token context needs {} in all, more than this machine's {}: \
                 the longest that fits is {} tokens (--ctx {})\n\n{}",
                spindle_plan::human_bytes(plan.total_bytes),
                spindle_plan::human_bytes(plan.device.memory_bytes),
                plan.max_ctx,
                plan.max_ctx,
                plan.render_table()
            );
        }
        Ok(ctx as usize)
    }

    /// Why [`ModelArgs::planned_ctx`] chose `ctx` (no default given), in
    /// words, for `chat` to say at start.
    pub fn ctx_reason(&self, ctx: usize) -> String {
        if self.ctx.is_some() {
            return "set by --ctx".to_string();
        }
        if self.kv_memory.is_some() {
            return "the longest that --kv-memory holds".to_string();
        }
        let own = self
            .resolve()
            .ok()
            .and_then(|p| ModelShape::from_path(&p).ok())
            .map(|s| s.context_length);
        match own {
            Some(own) if own as usize == ctx => "the model's own context".to_string(),
            Some(own) => format!(
                "the longest that fits in memory; the model's own is {own} (set --ctx or --kv-memory)"
            ),
            None => "the longest that fits".to_string(),
        }
    }

    /// The KV element type: `--kv-type`, else the model's default.
    pub fn kv_type(&self, model: &Model) -> Result<KvType> {
        let ty = match self.kv_type.as_deref() {
            None => model.default_kv_type(),
            Some(s) => KvType::parse(s)
                .ok_or_else(|| anyhow!("--kv-type '{s}' is not one of f16, q8_0, f32"))?,
        };
        check_kv_type(model, ty)?;
        Ok(ty)
    }

    /// The KV type the planner plans with.
    pub fn plan_kv_type(&self) -> Result<PlanKv> {
        let s = self.kv_type.as_deref().unwrap_or("f16");
        PlanKv::parse(s).map_err(|_| anyhow!("--kv-type '{s}' is not one of f16, q8_0, f32"))
    }

    /// A KV cache for `loaded`, sized by [`ModelArgs::planned_ctx`].
    pub fn kv_cache(&self, loaded: &LoadedModel, default: Option<usize>) -> Result<KvCache> {
        let model = &loaded.model;
        let ty = self.kv_type(model)?;
        let path = self.resolve()?;
        let ctx = self.planned_ctx(&path, default)?;
        Ok(model.new_kv_cache(ty, ctx, 1))
    }
}

/// Only the model to open, for commands that read its tokenizer alone
/// (`tokenize`, `detokenize`): the threads, context and KV flags of
/// [`ModelArgs`] would do nothing there.
#[derive(Args, Debug, Clone)]
pub struct ModelPathArgs {
    /// A .gguf file or a Hugging Face model directory (default: Gemma 3 270M, pulled on first use).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
}

impl ModelPathArgs {
    /// Only the tokenizer of the model (no weights are read).
    pub fn load_tokenizer(&self) -> Result<Tokenizer> {
        let path = resolve_model(&self.model)?;
        let (tok, err) = spindle_model::load_tokenizer(&path)
            .with_context(|| format!("cannot load {}", path.display()))?;
        tok.ok_or_else(|| match err {
            Some(e) => anyhow!("the model's tokenizer cannot be built: {e}"),
            None => anyhow!("the model file has no tokenizer"),
        })
    }
}

/// `-m PATH`, checked to exist (so the error names the flag), or the
/// default model, pulled when absent.
fn resolve_model(model: &Option<PathBuf>) -> Result<PathBuf> {
    if let Some(m) = model {
        check_path_exists("-m", m)?;
        return Ok(m.clone());
    }
    let path = home::default_model_path();
    // Only when certainly absent: a broken link there (a loop, say) is
    // reported by the load rather than pulled over.
    if matches!(path.try_exists(), Ok(false)) {
        eprintln!(
            "The default model is not in {} yet; pulling it first.",
            home::models_dir().display()
        );
        crate::commands::pull::pull_default(false)?;
    }
    Ok(path)
}

/// Errors naming `flag` when `path` certainly does not exist (neither it
/// nor a link by that name); anything odder (a link loop, a FIFO) is left
/// to the loader, which names the problem.
pub fn check_path_exists(flag: &str, path: &Path) -> Result<()> {
    if std::fs::symlink_metadata(path).is_err() && matches!(path.try_exists(), Ok(false)) {
        bail!("{flag} {}: no such file or directory", path.display());
    }
    Ok(())
}

/// Warns about each flag that was given but does nothing for `command`
/// (they are hidden from its help, and still accepted so that scripts
/// passing them keep working).
pub fn warn_ignored(command: &str, given: &[(bool, &str)]) {
    for (_, flag) in given.iter().filter(|(g, _)| *g) {
        eprintln!("warning: {flag} does nothing for `spindle {command}`; ignored");
    }
}

/// `--ctx`: a positive token count.
fn parse_ctx(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("the context must be at least 1 token".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("'{s}' is not a token count")),
    }
}

/// Errors unless `model` can store its KV as `ty`.
pub fn check_kv_type(model: &Model, ty: KvType) -> Result<()> {
    let kv_dim = model.config.kv_dim();
    if !ty.supports(kv_dim) {
        bail!("a q8_0 KV cache stores blocks of 32 values, and this model's KV rows have {kv_dim}: use --kv-type f16");
    }
    Ok(())
}

/// A size in bytes: a plain number, or with K/M/G/T (powers of 1024, also
/// written KiB, MiB, ...) or KB/MB/GB/TB (powers of 1000).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size: write e.g. 512MiB, 2G or 1500000000"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => {
            return Err(format!(
                "unknown size unit '{other}' in '{s}': use K, M, G, T (or KiB.., KB..)"
            ))
        }
    };
    Ok((value * scale) as u64)
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

/// The text of a file given with `flag`, `-` being standard input; a
/// failure names the flag.
pub fn read_text_arg(flag: &str, path: &Path) -> Result<String> {
    String::from_utf8(read_bytes_arg(flag, path)?).map_err(|e| {
        let source = if path == Path::new("-") {
            "standard input".to_string()
        } else {
            format!("{flag} {}", path.display())
        };
        anyhow!(
            "{source} is not UTF-8 text (byte {} is not): convert it to UTF-8 first",
            e.utf8_error().valid_up_to()
        )
    })
}

/// The bytes of `path` (`-`: standard input), UTF-8 or not: for
/// `spindle tokenize`, which tokenizes any bytes as llama.cpp does.
pub fn read_bytes_arg(flag: &str, path: &Path) -> Result<Vec<u8>> {
    if path == Path::new("-") {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut b)
            .context("cannot read standard input")?;
        return Ok(b);
    }
    check_path_exists(flag, path)?;
    std::fs::read(path).with_context(|| format!("{flag} {}: cannot read", path.display()))
}

/// Text from `-p` or `-f`.
pub fn prompt_text(prompt: &Option<String>, file: &Option<PathBuf>) -> Result<String> {
    match (prompt, file) {
        (Some(p), None) => Ok(p.clone()),
        (None, Some(f)) => read_text_arg("-f", f),
        (Some(_), Some(_)) => Err(anyhow!("give either -p or -f, not both")),
        (None, None) => Err(anyhow!("no prompt: give -p TEXT or -f FILE")),
    }
}
