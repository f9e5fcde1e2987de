//! `spindle embed`: one vector per text, as JSON lines.
//!
//! Texts come from the arguments (one each), from `-f FILE` (one per line;
//! `-` for standard input) or, with neither, from standard input. Each line
//! out is `{"index": i, "tokens": n, "embedding": [...]}`; a summary (texts,
//! tokens, time, texts/s, tokens/s, threads, ISA) goes to stderr.

use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use spindle_engine::embed::{EmbedInput, EmbedOptions, Embedder};
use spindle_formats::GgmlType;
use spindle_model::encoder::{load_encoder, EncoderOptions, Pooling};

use crate::home;
use crate::options::check_path_exists;

/// Which encoder, and how it runs (shared with `serve --embedding-model`).
#[derive(Args, Debug, Clone)]
pub struct EncoderArgs {
    /// Convert the encoder's float matrices at load: q8_0 (about 4x faster
    /// passes on VNNI machines; vectors within about 1e-3 of the float
    /// model's in cosine).
    #[arg(long = "embed-quantize", value_name = "TYPE")]
    pub quantize: Option<String>,
    /// Rows per encoder pass (texts are packed without padding).
    #[arg(long = "embed-batch-tokens", default_value_t = spindle_engine::embed::DEFAULT_MAX_BATCH_TOKENS)]
    pub batch_tokens: usize,
}

impl EncoderArgs {
    /// Loads the encoder at `path` (or the default embedding model, pulled
    /// on first use).
    pub fn load(&self, path: &Option<PathBuf>, threads: usize) -> Result<Embedder> {
        // The flags are checked before anything is pulled or loaded.
        let quantize = match self.quantize.as_deref() {
            None | Some("none") => None,
            Some("q8_0") => Some(GgmlType::Q8_0),
            Some(other) => bail!("--embed-quantize {other}: encoders convert to q8_0 (or none)"),
        };
        if self.batch_tokens == 0 {
            bail!("--embed-batch-tokens must be at least 1");
        }
        let path = match path {
            Some(p) => {
                check_path_exists("the embedding model", p)?;
                p.clone()
            }
            None => {
                let dir = home::models_dir().join(home::DEFAULT_EMBEDDING_DIR);
                if matches!(dir.try_exists(), Ok(false)) {
                    eprintln!(
                        "The default embedding model is not in {} yet; pulling it first.",
                        home::models_dir().display()
                    );
                    crate::commands::pull_embedding::pull_embedding(false)?;
                }
                dir
            }
        };
        let loaded = load_encoder(&path, threads, EncoderOptions { quantize })
            .with_context(|| format!("cannot load the embedding model {}", path.display()))?;
        let mut e = Embedder::new(loaded.encoder, loaded.tokenizer, loaded.name);
        e.max_batch_tokens = self.batch_tokens;
        Ok(e)
    }
}

#[derive(Args, Debug)]
pub struct EmbedArgs {
    /// An encoder: a BERT GGUF or Hugging Face directory (default:
    /// all-MiniLM-L6-v2, pulled on first use).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Compute threads (default: the number of physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub encoder: EncoderArgs,
    /// Read texts from this file, one per line (`-`: standard input).
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        conflicts_with = "texts"
    )]
    pub file: Option<PathBuf>,
    /// Pool the rows this way instead of the model's own: mean, cls or last.
    #[arg(long = "pooling")]
    pub pooling: Option<String>,
    /// Leave vectors at their length (default: the model's rule; unit length
    /// for sentence-transformers models with a Normalize step and for GGUFs).
    #[arg(long = "no-normalize")]
    pub no_normalize: bool,
    /// Cut texts over the model's limit instead of refusing them.
    #[arg(long = "truncate")]
    pub truncate: bool,
    /// Texts to embed, one per argument.
    pub texts: Vec<String>,
}

pub fn run(args: EmbedArgs) -> Result<()> {
    let texts = read_texts(&args)?;
    if texts.is_empty() {
        bail!("no texts: give them as arguments, with -f FILE, or on standard input");
    }
    let threads = args
        .threads
        .unwrap_or_else(spindle_kernels::cpu::physical_cores)
        .max(1);
    if let Some(m) = &args.model {
        check_path_exists("-m", m)?;
        if !spindle_model::encoder::is_encoder(m) {
            return run_decoder(&args, m, texts, threads);
        }
    }
    let embedder = args.encoder.load(&args.model, threads)?;
    let pooling = match args.pooling.as_deref() {
        None => embedder.pooling(),
        Some(p) => {
            Pooling::parse(p).with_context(|| format!("--pooling {p}: give mean, cls or last"))?
        }
    };
    let normalize = embedder.encoder.config.normalize && !args.no_normalize;
    let inputs: Vec<EmbedInput> = texts.into_iter().map(EmbedInput::Text).collect();
    let options = EmbedOptions {
        truncate: args.truncate,
    };
    // Timed from the raw texts: tokenizing is part of the work.
    let started = Instant::now();
    let encoded = embedder
        .prepare(&inputs, options, "input")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let vectors = embedder
        .embed_with(&encoded, pooling, normalize)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let secs = started.elapsed().as_secs_f64();
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut tokens = 0;
    for (index, (t, v)) in encoded.iter().zip(vectors).enumerate() {
        let line = serde_json::json!({"index": index, "tokens": t.ids.len(), "embedding": v});
        writeln!(out, "{line}")?;
        tokens += t.ids.len();
    }
    out.flush()?;
    eprintln!(
        "embedded {} texts ({tokens} tokens) in {secs:.3} s: {:.1} texts/s, {:.0} tokens/s; {} ({}), {threads} threads, ISA {}, weights {}",
        encoded.len(),
        encoded.len() as f64 / secs,
        tokens as f64 / secs,
        embedder.name,
        pooling.name(),
        spindle_kernels::simd::detected_isa(),
        embedder.encoder.weights.layers[0].up.ty(),
    );
    Ok(())
}

/// A decoder as the embedder: its final normed hidden states pooled (mean
/// unless `--pooling` says otherwise), unit length unless `--no-normalize`.
fn run_decoder(
    args: &EmbedArgs,
    path: &std::path::Path,
    texts: Vec<String>,
    threads: usize,
) -> Result<()> {
    let pooling = match args.pooling.as_deref() {
        None => Pooling::Mean,
        Some(p) => {
            Pooling::parse(p).with_context(|| format!("--pooling {p}: give mean, cls or last"))?
        }
    };
    let loaded = spindle_model::load(path, threads)
        .with_context(|| format!("cannot load {}", path.display()))?;
    let tok = crate::options::tokenizer(&loaded)?;
    let started = Instant::now();
    let mut ids = Vec::with_capacity(texts.len());
    for t in &texts {
        ids.push(tok.encode(t, tok.add_bos_default(), false)?);
    }
    let longest = ids.iter().map(Vec::len).max().unwrap_or(1).max(1);
    let ctx = loaded.model.config.context_length.max(1);
    if longest > ctx {
        bail!("a text has {longest} tokens, over the model's context of {ctx}: shorten it");
    }
    let layout = loaded
        .model
        .kv_layout(spindle_model::KvType::F16, longest, 64);
    let mut kv = spindle_model::KvCache::new(layout);
    let vectors = spindle_engine::embed::embed_with_decoder(
        &loaded.model,
        &mut kv,
        &ids,
        pooling,
        !args.no_normalize,
        args.encoder.batch_tokens.max(longest),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let secs = started.elapsed().as_secs_f64();
    let mut out = BufWriter::new(std::io::stdout().lock());
    let tokens: usize = ids.iter().map(Vec::len).sum();
    for (index, (t, v)) in ids.iter().zip(vectors).enumerate() {
        writeln!(
            out,
            "{}",
            serde_json::json!({"index": index, "tokens": t.len(), "embedding": v})
        )?;
    }
    out.flush()?;
    eprintln!(
        "embedded {} texts ({tokens} tokens) in {secs:.3} s with the decoder {} ({} pooling), {threads} threads",
        ids.len(),
        loaded.name,
        pooling.name()
    );
    Ok(())
}

fn read_texts(args: &EmbedArgs) -> Result<Vec<String>> {
    if !args.texts.is_empty() {
        return Ok(args.texts.clone());
    }
    let lines: Box<dyn BufRead> = match &args.file {
        Some(f) if f.as_os_str() != "-" => Box::new(std::io::BufReader::new(
            std::fs::File::open(f).with_context(|| format!("-f {}", f.display()))?,
        )),
        _ => Box::new(std::io::stdin().lock()),
    };
    let mut texts = Vec::new();
    for line in lines.lines() {
        let line = line.context("reading the texts")?;
        if !line.is_empty() {
            texts.push(line);
        }
    }
    Ok(texts)
}
