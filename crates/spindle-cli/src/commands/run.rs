//! `spindle run`: generate text from a prompt.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use serde_json::json;
use spindle_engine::{FinishReason, GenerateOutput, GenerateRequest};
use spindle_model::chat_template::{ChatMessage, ChatTemplate};
use spindle_model::tokenizer::Tokenizer;

use crate::grammar::GrammarArgs;
use crate::options::{prompt_text, tokenizer, ModelArgs, SamplingArgs};
use crate::progress::prefill_with_bar;
use crate::speculation::{generate_on_with, SpecArgs};
use spindle_engine::speculative::{Source, TreeBudget};

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt.
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    #[command(flatten)]
    pub grammar: GrammarArgs,
    /// Wrap the prompt in the model's chat template as a user turn.
    #[arg(long)]
    pub chat: bool,
    /// Print one JSON object at the end instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

/// Token ids of a prompt, through the chat template when asked.
pub fn prompt_ids(tok: &Tokenizer, text: &str, chat: bool) -> Result<Vec<u32>> {
    if !chat {
        return Ok(tok.encode(text, tok.add_bos_default(), false)?);
    }
    let messages = [ChatMessage::new("user", text.to_string())];
    encode_chat(tok, &messages)
}

/// Renders messages with the model's chat template and encodes them: the
/// template's control tokens parsed, the messages' own text kept as text
/// (no second BOS when the template wrote one).
pub fn encode_chat(tok: &Tokenizer, messages: &[ChatMessage]) -> Result<Vec<u32>> {
    let template = ChatTemplate::for_tokenizer(tok);
    let text = template.render(
        messages,
        true,
        &tok.bos_token().unwrap_or_default(),
        &tok.eos_token().unwrap_or_default(),
    )?;
    let texts: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
    Ok(tok.encode_chat_prompt_guarded(&text, &texts)?)
}

pub fn run(args: RunArgs) -> Result<()> {
    let text = prompt_text(&args.prompt, &args.file)?;
    let sampler = args.sampling.config()?;
    args.spec.mode()?;
    // A missing or malformed grammar file fails before the model loads.
    args.grammar.grammar()?;
    let loaded = args.model.load()?;
    let tok = tokenizer(&loaded)?;
    let prompt = prompt_ids(tok, &text, args.chat)?;
    let constraint = args.grammar.constraint(tok)?;
    let mut kv = args.model.kv_cache(&loaded, None)?;
    let req = GenerateRequest {
        prompt: prompt.clone(),
        max_tokens: args.n,
        sampler: sampler.clone(),
        stop_ids: tok.stop_ids(),
        constraint,
    };

    let mut drafter = args
        .spec
        .drafter(&loaded.model, kv.max_len(), args.model.threads())?;
    let mut decoder = tok.stream_decoder();
    let mut stdout = std::io::stdout().lock();
    let streaming = !args.json;
    // One sequence: a long prompt is first prefilled with a progress bar
    // (on a terminal), then the generation runs only its last token.
    let seq = kv.add_sequence()?;
    let mut policy = TreeBudget::new(args.spec.spec_budget);
    let prefilled = prefill_with_bar(&loaded.model, &mut kv, seq, &prompt)?;
    let result = generate_on_with(
        &loaded.model,
        &mut kv,
        seq,
        &req,
        drafter.as_mut().map(|d| (d, &mut policy)),
        &mut |id| {
            if streaming {
                if let Some(piece) = decoder.push(id) {
                    // A closed stdout (e.g. `| head`) stops generation quietly.
                    if stdout
                        .write_all(piece.as_bytes())
                        .and_then(|_| stdout.flush())
                        .is_err()
                    {
                        return false;
                    }
                }
            }
            true
        },
    );
    kv.remove_sequence(seq);
    let mut out = result?;
    prefilled.add_to(&mut out.stats);
    if streaming {
        if let Some(rest) = decoder.flush() {
            let _ = stdout.write_all(rest.as_bytes());
        }
        let _ = writeln!(stdout);
        print_stats(&out, loaded.model.n_threads(), sampler.seed, args.n);
        if context_full(&out, args.n) {
            // Say how big the context was, why, and how to make it bigger.
            eprintln!(
                "context: {} tokens ({})",
                kv.max_len(),
                args.model.ctx_reason(kv.max_len())
            );
        }
    } else {
        let text = tok.decode(&out.tokens)?;
        println!(
            "{}",
            serde_json::to_string(&result_json(
                &prompt,
                &out,
                &text,
                sampler.seed,
                kv.max_len(),
                args.n
            ))?
        );
    }
    Ok(())
}

pub fn result_json(
    prompt: &[u32],
    out: &GenerateOutput,
    text: &str,
    seed: u64,
    ctx: usize,
    max_tokens: usize,
) -> serde_json::Value {
    let s = &out.stats;
    let mut v = json!({
        "prompt_tokens": prompt,
        "tokens": out.tokens,
        "text": text,
        "finish_reason": out.finish.as_str(),
        "stats": {
            "prompt_tokens_per_s": s.prompt_tokens_per_s(),
            "gen_tokens_per_s": s.gen_tokens_per_s(),
            "passes": s.passes,
            "tokens_per_pass": s.tokens_per_pass(),
            "prompt_seconds": s.prompt_seconds,
            "gen_seconds": s.gen_seconds,
            "seed": seed,
            "ctx": ctx,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "acceptance_rate": s.acceptance_rate(),
            "by_source": by_source(s),
            "masks": s.masks,
            "mask_seconds": s.mask_seconds,
            "mask_waiting_seconds": s.mask_waiting_seconds,
        }
    });
    if context_full(out, max_tokens) {
        // "length" as OpenAI says it; the note tells the two limits apart.
        v["note"] = json!(format!(
            "the context ({ctx} tokens) was full before -n {max_tokens} tokens"
        ));
    }
    v
}

/// `{source: {"drafted", "accepted"}}` for each draft source that proposed
/// a node.
fn by_source(s: &spindle_engine::GenerateStats) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for src in Source::ALL {
        let (drafted, accepted) = s.by_source[src.index()];
        if drafted > 0 {
            m.insert(
                src.name().into(),
                json!({"drafted": drafted, "accepted": accepted}),
            );
        }
    }
    m.into()
}

/// Whether generation stopped at the end of the context rather than at
/// `max_tokens`.
pub fn context_full(out: &GenerateOutput, max_tokens: usize) -> bool {
    out.finish == FinishReason::Length && out.tokens.len() < max_tokens
}

pub fn print_stats(out: &GenerateOutput, threads: usize, seed: u64, max_tokens: usize) {
    let s = &out.stats;
    let spec = if s.drafted > 0 {
        format!(
            " | drafted {}, accepted {} ({:.0}%)",
            s.drafted,
            s.accepted,
            100.0 * s.acceptance_rate()
        )
    } else {
        String::new()
    };
    let masks = if s.masks > 0 {
        format!(
            " | grammar: {} masks, {:.2} ms each, {:.1} ms waited",
            s.masks,
            1e3 * s.mask_seconds / s.masks as f64,
            1e3 * s.mask_waiting_seconds
        )
    } else {
        String::new()
    };
    eprintln!(
        "prompt: {} tokens, {:.1} tokens/s | generation: {} tokens, {:.1} tokens/s | {} passes, {:.2} tokens/pass{}{} | {} threads, seed {}, finish: {}",
        s.prompt_tokens,
        s.prompt_tokens_per_s(),
        s.gen_tokens,
        s.gen_tokens_per_s(),
        s.passes,
        s.tokens_per_pass(),
        spec,
        masks,
        threads,
        seed,
        if context_full(out, max_tokens) {
            "context"
        } else {
            out.finish.as_str()
        }
    );
}
