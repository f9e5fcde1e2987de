//! `spindle perplexity`: llama.cpp's protocol, so the numbers compare.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use spindle_engine::score::perplexity;

use crate::options::{tokenizer, ModelArgs};

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Tokens per chunk; the second half of each chunk is scored.
    #[arg(short = 'c', long = "chunk", default_value_t = 512)]
    pub chunk: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: PerplexityArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let loaded = args.model.load()?;
    let tok = tokenizer(&loaded)?;
    let ids = tok.encode(&text, tok.add_bos_default(), false)?;
    let mut kv = args.model.kv_cache(&loaded, Some(args.chunk))?;
    let t0 = std::time::Instant::now();
    let json = args.json;
    let result = perplexity(
        &loaded.model,
        &mut kv,
        &ids,
        args.chunk,
        tok.bos_id(),
        |c, n, ppl| {
            if !json {
                eprintln!("chunk {c}/{n}: running perplexity {ppl:.4}");
            }
        },
    )?;
    if json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!(
            "perplexity {:.4} over {} chunks of {} ({} tokens scored) in {:.1}s",
            result.perplexity,
            result.chunks,
            args.chunk,
            result.tokens_scored,
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
