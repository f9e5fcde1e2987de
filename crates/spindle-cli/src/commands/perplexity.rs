//! `spindle perplexity`: llama.cpp's protocol, so the numbers compare.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use spindle_engine::score::perplexity;

use crate::options::{read_text_arg, tokenizer, ModelArgs};

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
    let text = read_text_arg("-f", &args.file)?;
    let loaded = args.model.load()?;
    let tok = tokenizer(&loaded)?;
    let ids = tok.encode(&text, tok.add_bos_default(), false)?;
    let mut kv = args.model.kv_cache(&loaded, Some(args.chunk))?;
    let t0 = std::time::Instant::now();
    let json = args.json;
    // On a terminal, one bar over the chunks instead of a line per chunk.
    let bar = (!json && std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new((ids.len() / args.chunk.max(1)) as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "chunk {pos}/{len} [{bar:30}] {per_sec} {msg} (eta {eta})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar
    });
    let result = perplexity(
        &loaded.model,
        &mut kv,
        &ids,
        args.chunk,
        tok.bos_id(),
        |c, n, ppl| match &bar {
            Some(bar) => {
                bar.set_position(c as u64);
                bar.set_message(format!("running perplexity {ppl:.4}"));
            }
            None if !json => eprintln!("chunk {c}/{n}: running perplexity {ppl:.4}"),
            None => {}
        },
    );
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let result = result?;
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
