//! `spindle score`: the log-probability of every next token, in one pass.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use spindle_engine::score::{score_positions, top_k, PositionScore};

use crate::options::{parse_ids, prompt_text, tokenizer, ModelArgs};
use crate::progress::LazyBar;

#[derive(Args, Debug)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Token ids instead of text: "2,818,1234".
    #[arg(long)]
    pub ids: Option<String>,
    /// Alternatives listed per position, most likely first (text and JSON).
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ScoreArgs) -> Result<()> {
    let loaded = args.model.load()?;
    let ids = match &args.ids {
        Some(s) if args.prompt.is_none() && args.file.is_none() => parse_ids(s)?,
        Some(_) => bail!("give one of -p, -f or --ids"),
        None => {
            let text = prompt_text(&args.prompt, &args.file)?;
            let tok = tokenizer(&loaded)?;
            tok.encode(&text, tok.add_bos_default(), false)?
        }
    };
    let mut kv = args.model.kv_cache(&loaded, Some(ids.len().max(1)))?;
    // The engine's `score`, with a progress bar over the positions (shown
    // on a terminal once scoring has run a second).
    let mut bar = LazyBar::new(ids.len(), "scoring");
    let mut positions = Vec::with_capacity(ids.len().saturating_sub(1));
    score_positions(&loaded.model, &mut kv, &ids, 0, |i, lp| {
        let id = ids[i + 1];
        positions.push(PositionScore {
            id,
            logprob: lp[id as usize],
            top: top_k(lp, args.top),
        });
        bar.set(i + 2);
    })?;
    bar.finish();
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&json!({ "tokens": ids, "positions": positions }))?
        );
        return Ok(());
    }
    let piece = |id: u32| {
        loaded
            .tokenizer
            .as_ref()
            .and_then(|t| t.token_to_piece(id))
            .unwrap_or_else(|| id.to_string())
    };
    let mut nll = 0.0;
    for (i, p) in positions.iter().enumerate() {
        nll -= p.logprob;
        // The --top alternatives, most likely first.
        let top: Vec<String> = p
            .top
            .iter()
            .map(|t| format!("{:?} {:.3}", piece(t.id), t.logprob))
            .collect();
        println!(
            "{:>5} {:>24} {:>9.3}   top: {}",
            i + 1,
            format!("{:?}", piece(p.id)),
            p.logprob,
            top.join(" | ")
        );
    }
    if !positions.is_empty() {
        println!(
            "mean logprob {:.4}, perplexity {:.4}",
            -nll / positions.len() as f64,
            (nll / positions.len() as f64).exp()
        );
    }
    Ok(())
}
