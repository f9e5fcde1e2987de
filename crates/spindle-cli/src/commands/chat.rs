//! `spindle chat`: an interactive loop with the chat template.

use std::io::{BufRead, Write};

use anyhow::Result;
use clap::Args;
use spindle_engine::GenerateRequest;
use spindle_model::chat_template::ChatMessage;

use crate::commands::run::encode_chat;
use crate::grammar::GrammarArgs;
use crate::options::{tokenizer, ModelArgs, SamplingArgs};
use crate::speculation::{generate_with, SpecArgs};

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A system message.
    #[arg(long)]
    pub system: Option<String>,
    /// Tokens per reply at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    pub n: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    #[command(flatten)]
    pub grammar: GrammarArgs,
}

pub fn run(args: ChatArgs) -> Result<()> {
    let sampler = args.sampling.config()?;
    let loaded = args.model.load()?;
    let tok = tokenizer(&loaded)?;
    let constraint = args.grammar.constraint(tok)?;
    let mut kv = args.model.kv_cache(&loaded, None)?;
    let mut drafter = args
        .spec
        .drafter(&loaded.model, kv.max_len(), args.model.threads())?;
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(ChatMessage::new("system", s.clone()));
    }
    eprintln!(
        "Chatting with {} ({} threads). Empty line or Ctrl-D to quit.",
        loaded.name,
        loaded.model.n_threads()
    );
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    let mut turn = 0u64;
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        messages.push(ChatMessage::new("user", line.trim_end().to_string()));
        let prompt = encode_chat(tok, &messages)?;
        let req = GenerateRequest {
            prompt,
            max_tokens: args.n,
            sampler: spindle_engine::SamplerConfig {
                seed: sampler.seed.wrapping_add(turn),
                ..sampler.clone()
            },
            stop_ids: tok.stop_ids(),
            constraint: constraint.clone(),
        };
        let mut decoder = tok.stream_decoder();
        let budget = args.spec.spec_budget;
        let out = match generate_with(
            &loaded.model,
            &mut kv,
            &req,
            drafter.as_mut(),
            budget,
            |id| {
                if let Some(p) = decoder.push(id) {
                    let _ = stdout.write_all(p.as_bytes());
                    let _ = stdout.flush();
                }
                true
            },
        ) {
            Ok(out) => out,
            Err(e) => {
                // Keep the session alive: drop the turn and say why.
                eprintln!("\nerror: {e}");
                messages.pop();
                continue;
            }
        };
        if let Some(rest) = decoder.flush() {
            let _ = stdout.write_all(rest.as_bytes());
        }
        println!();
        messages.push(ChatMessage::new(
            "assistant",
            tok.decode(&out.tokens)?.trim().to_string(),
        ));
        turn += 1;
    }
    Ok(())
}
