//! `spindle chat`: an interactive conversation with the chat template, with
//! line editing and history, commands (`/help`), Ctrl-C to stop a reply,
//! and one KV sequence kept across turns so each turn prefills only what is
//! new.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;
use spindle_engine::speculative::{Drafter, TreeBudget};
use spindle_engine::{FinishReason, GenerateOutput, GenerateRequest, SamplerConfig};
use spindle_model::chat_template::ChatMessage;
use spindle_model::tokenizer::Tokenizer;
use spindle_model::{KvCache, Model, SeqId};

use spindle_server::reasoning::{ReasoningFormat, Split};

use crate::commands::run::{context_full, encode_chat};
use crate::grammar::GrammarArgs;
use crate::options::{tokenizer, ModelArgs, SamplingArgs};
use crate::progress::prefill_with_bar;
use crate::speculation::{generate_on_with, SpecArgs};

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

const HELP: &str = "\
commands:
  /help          this list
  /clear         forget the conversation (the system prompt stays)
  /regen         drop the last reply and generate it again (another seed)
  /system TEXT   set or replace the system prompt (no TEXT: remove it)
  /save FILE     write the messages to FILE as JSON
  /load FILE     read messages from such a file
  /exit          quit (or Ctrl-D)
Ctrl-C stops a reply and keeps what was said; at the prompt it clears the line.";

/// What one line asks for.
#[derive(Debug, PartialEq)]
enum Command<'a> {
    Say(&'a str),
    Help,
    Clear,
    Regen,
    System(&'a str),
    Save(&'a str),
    Load(&'a str),
    Exit,
    /// Needs an argument it did not get.
    Usage(&'static str),
    Unknown(&'a str),
}

fn parse(line: &str) -> Command<'_> {
    let Some(rest) = line.strip_prefix('/') else {
        return Command::Say(line);
    };
    let (name, arg) = match rest.split_once(char::is_whitespace) {
        Some((n, a)) => (n, a.trim()),
        None => (rest, ""),
    };
    match name {
        "help" | "?" => Command::Help,
        "clear" => Command::Clear,
        "regen" => Command::Regen,
        "system" => Command::System(arg),
        "save" if arg.is_empty() => Command::Usage("/save FILE"),
        "save" => Command::Save(arg),
        "load" if arg.is_empty() => Command::Usage("/load FILE"),
        "load" => Command::Load(arg),
        "exit" | "quit" => Command::Exit,
        _ => Command::Unknown(name),
    }
}

/// The conversation and the KV sequence that holds its tokens so far.
struct Session<'a> {
    model: &'a Model,
    tok: &'a Tokenizer,
    kv: KvCache,
    seq: SeqId,
    /// The tokens whose KV `seq` holds, in order.
    held: Vec<u32>,
    messages: Vec<ChatMessage>,
    drafter: Option<Box<dyn Drafter>>,
    policy: TreeBudget,
    /// Set by the SIGINT handler: stop the reply.
    stop: Arc<AtomicBool>,
    /// Tokens kept free for a reply when turns are dropped to fit.
    reserve: usize,
}

impl Session<'_> {
    fn system(&self) -> Option<&ChatMessage> {
        self.messages.first().filter(|m| m.role == "system")
    }

    fn clear(&mut self) {
        let system = self.system().cloned();
        self.messages = system.into_iter().collect();
    }

    fn set_system(&mut self, text: &str) {
        if self.system().is_some() {
            self.messages.remove(0);
        }
        if !text.is_empty() {
            self.messages
                .insert(0, ChatMessage::new("system", text.to_string()));
        }
    }

    /// Drops the oldest turns until the conversation and a reply reserve fit
    /// the context, saying so; `None` (the newest message dropped, said)
    /// when even that message alone does not fit.
    fn fit(&mut self) -> Result<Option<Vec<u32>>> {
        let ctx = self.kv.max_len();
        let first = usize::from(self.system().is_some());
        let mut dropped = 0;
        loop {
            let prompt = encode_chat(self.tok, &self.messages)?;
            if prompt.len() + self.reserve <= ctx {
                if dropped > 0 {
                    let turns = match dropped {
                        1 => "the oldest turn".to_string(),
                        n => format!("the {n} oldest turns"),
                    };
                    eprintln!("[context {ctx} tokens: dropped {turns}]");
                }
                return Ok(Some(prompt));
            }
            // Turns before the newest user message go first, a user
            // message with the reply that followed it.
            if self.messages.len() > first + 1 {
                self.messages.remove(first);
                if self.messages.len() > first + 1 && self.messages[first].role == "assistant" {
                    self.messages.remove(first);
                }
                dropped += 1;
                continue;
            }
            self.messages.pop();
            eprintln!(
                "[context {ctx} tokens: this message does not fit ({} tokens with the reply reserve of {}); dropped it]",
                prompt.len() + self.reserve,
                self.reserve
            );
            return Ok(None);
        }
    }

    /// Rolls the sequence back to what it shares with `prompt`, or starts
    /// a new one where it cannot roll back (a sliding window has moved on).
    fn reuse_prefix(&mut self, prompt: &[u32]) -> Result<()> {
        let common = self
            .held
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            // The last prompt token must run to give the logits.
            .min(prompt.len().saturating_sub(1));
        if self.kv.truncate(self.seq, common).is_ok() {
            self.held.truncate(common);
            return Ok(());
        }
        self.restart()
    }

    fn restart(&mut self) -> Result<()> {
        self.kv.remove_sequence(self.seq);
        self.seq = self.kv.add_sequence()?;
        self.held.clear();
        Ok(())
    }

    /// Generates the assistant's reply to the conversation, streaming it
    /// to stdout; the reply (partial, when stopped) becomes its turn.
    fn reply(&mut self, req_template: &GenerateRequest, seed: u64) -> Result<()> {
        let Some(prompt) = self.fit()? else {
            return Ok(());
        };
        self.reuse_prefix(&prompt)?;
        let req = GenerateRequest {
            prompt,
            sampler: SamplerConfig {
                seed,
                ..req_template.sampler.clone()
            },
            ..req_template.clone()
        };
        let mut decoder = self.tok.stream_decoder();
        let mut stdout = std::io::stdout();
        let stop = self.stop.clone();
        // A Ctrl-C pressed before this reply is not for it.
        stop.store(false, Ordering::SeqCst);
        // A reasoning model's thinking is shown dimmed (on a terminal) and
        // kept apart from the answer in the conversation.
        let mut split = ReasoningFormat::of(self.tok)
            .map(|f| f.split(self.tok, &req.prompt, false, req.constraint.is_some()));
        let dim = std::io::IsTerminal::is_terminal(&stdout);
        let (mut thinking, mut answer) = (String::new(), String::new());
        let mut show = |s: Split, out: &mut std::io::Stdout| {
            if !s.reasoning.is_empty() {
                let r = &s.reasoning;
                let _ = if dim {
                    write!(out, "\x1b[2m{r}\x1b[0m")
                } else {
                    write!(out, "{r}")
                };
                thinking.push_str(r);
            }
            if !s.content.is_empty() {
                if !thinking.is_empty() && answer.is_empty() {
                    let _ = writeln!(out);
                }
                let _ = out.write_all(s.content.as_bytes());
                answer.push_str(&s.content);
            }
        };
        let mut on_token = |id| {
            let piece = decoder.push(id).unwrap_or_default();
            match split.as_mut() {
                Some(r) => show(r.push(Some(id), &piece), &mut stdout),
                None => {
                    let _ = stdout.write_all(piece.as_bytes());
                }
            }
            let _ = stdout.flush();
            !stop.load(Ordering::SeqCst)
        };
        // A long new part is prefilled first with a progress bar (on a
        // terminal); the generation then runs only the last prompt token.
        let result = prefill_with_bar(self.model, &mut self.kv, self.seq, &req.prompt).and_then(
            |prefilled| {
                let mut out = generate_on_with(
                    self.model,
                    &mut self.kv,
                    self.seq,
                    &req,
                    self.drafter.as_mut().map(|d| (d, &mut self.policy)),
                    &mut on_token,
                )?;
                prefilled.add_to(&mut out.stats);
                Ok(out)
            },
        );
        let out = match result {
            Ok(out) => out,
            Err(e) => {
                // Keep the session alive: drop the turn, say why, and start
                // the sequence afresh (what it holds is unknown now).
                eprintln!("\nerror: {e}");
                self.messages.pop();
                self.restart()?;
                return Ok(());
            }
        };
        let rest = decoder.flush().unwrap_or_default();
        let mut stdout = std::io::stdout();
        let reply = match split.as_mut() {
            Some(r) => {
                show(r.push(None, &rest), &mut stdout);
                show(r.finish(), &mut stdout);
                Some((std::mem::take(&mut thinking), std::mem::take(&mut answer)))
            }
            None => {
                let _ = stdout.write_all(rest.as_bytes());
                None
            }
        };
        println!();
        if out.finish == FinishReason::Cancelled {
            eprintln!("[stopped]");
        }
        self.stop.store(false, Ordering::SeqCst);
        let mut held = req.prompt.clone();
        held.extend(&out.tokens);
        held.truncate(self.kv.seq_len(self.seq));
        self.held = held;
        print_stats(&out, context_full(&out, req.max_tokens));
        let message = match reply {
            Some((thinking, answer)) => {
                let mut m = ChatMessage::new("assistant", answer.trim());
                if !thinking.is_empty() {
                    m.reasoning_content = Some(thinking.clone());
                    m.thinking = Some(thinking);
                }
                m
            }
            None => ChatMessage::new("assistant", self.tok.decode(&out.tokens)?.trim()),
        };
        self.messages.push(message);
        Ok(())
    }
}

/// One line on stderr after each reply.
fn print_stats(out: &GenerateOutput, context_full: bool) {
    let s = &out.stats;
    let spec = if s.drafted > 0 {
        format!(", accepted {}/{} drafted", s.accepted, s.drafted)
    } else {
        String::new()
    };
    let end = if context_full { ", context full" } else { "" };
    eprintln!(
        "[{} tokens, {:.1} tok/s, {:.2} tokens/pass{spec}{end} | prompt {} tokens, {} new, {:.0} ms]",
        s.gen_tokens,
        s.gen_tokens_per_s(),
        s.tokens_per_pass(),
        s.prompt_tokens,
        s.prefilled_tokens,
        1e3 * s.prompt_seconds
    );
}

fn save(messages: &[ChatMessage], path: &Path) -> Result<()> {
    let json = serde_json::to_string_pretty(messages)?;
    std::fs::write(path, json + "\n").with_context(|| format!("cannot write {}", path.display()))
}

fn load(path: &Path) -> Result<Vec<ChatMessage>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let messages: Vec<ChatMessage> = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a list of messages ({{\"role\", \"content\"}})",
            path.display()
        )
    })?;
    Ok(messages)
}

pub fn run(args: ChatArgs) -> Result<()> {
    let sampler = args.sampling.config()?;
    args.spec.mode()?;
    let loaded = args.model.load()?;
    let tok = tokenizer(&loaded)?;
    let constraint = args.grammar.constraint(tok)?;
    let mut kv = args.model.kv_cache(&loaded, None)?;
    let drafter = args
        .spec
        .drafter(&loaded.model, kv.max_len(), args.model.threads())?;
    let ctx = kv.max_len();
    let seq = kv.add_sequence()?;

    // Before the SIGINT handler: rustyline installs its own for a terminal,
    // which the handler must replace (rustyline reads keys with signals
    // off, so Ctrl-C at the prompt still reaches it as a key).
    let mut editor = DefaultEditor::new()?;
    // Installed after the load, so that Ctrl-C while loading still quits.
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    if let Err(e) = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst)) {
        eprintln!("warning: Ctrl-C will quit rather than stop a reply ({e})");
    }

    let mut session = Session {
        model: &loaded.model,
        tok,
        kv,
        seq,
        held: Vec::new(),
        messages: Vec::new(),
        drafter,
        policy: TreeBudget::new(args.spec.spec_budget),
        stop,
        reserve: args.n.min(ctx / 4),
    };
    if let Some(s) = &args.system {
        session.set_system(s);
    }
    let template = GenerateRequest {
        prompt: Vec::new(),
        max_tokens: args.n,
        sampler: sampler.clone(),
        stop_ids: tok.stop_ids(),
        constraint,
    };
    eprintln!(
        "Chatting with {} ({} threads), context {ctx} tokens ({}).",
        loaded.name,
        loaded.model.n_threads(),
        args.model.ctx_reason(ctx)
    );
    eprintln!("Type /help for commands; Ctrl-D or /exit quits.");

    // Each reply gets its own seed, so /regen gives another answer.
    let mut replies = 0u64;
    let mut next_seed = || {
        replies += 1;
        sampler.seed.wrapping_add(replies - 1)
    };
    loop {
        let line = match editor.readline("> ") {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => {
                eprintln!("(Ctrl-C clears the line; Ctrl-D or /exit quits)");
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let _ = editor.add_history_entry(line);
        match parse(line) {
            Command::Say(text) => {
                session
                    .messages
                    .push(ChatMessage::new("user", text.to_string()));
                if let Err(e) = session.reply(&template, next_seed()) {
                    // E.g. a template that rejects a loaded conversation.
                    eprintln!("error: {e:#}");
                    if session.messages.last().is_some_and(|m| m.role == "user") {
                        session.messages.pop();
                    }
                }
            }
            Command::Help => eprintln!("{HELP}"),
            Command::Clear => {
                session.clear();
                eprintln!(
                    "[conversation cleared{}]",
                    if session.system().is_some() {
                        "; the system prompt stays"
                    } else {
                        ""
                    }
                );
            }
            Command::Regen => match session.messages.last() {
                Some(m) if m.role == "assistant" => {
                    session.messages.pop();
                    if let Err(e) = session.reply(&template, next_seed()) {
                        eprintln!("error: {e:#}");
                    }
                }
                _ => eprintln!("[no reply to regenerate]"),
            },
            Command::System(text) => {
                session.set_system(text);
                eprintln!(
                    "[{}]",
                    if text.is_empty() {
                        "system prompt removed"
                    } else {
                        "system prompt set"
                    }
                );
            }
            Command::Save(file) => match save(&session.messages, Path::new(file)) {
                Ok(()) => eprintln!("[saved {} messages to {file}]", session.messages.len()),
                Err(e) => eprintln!("error: {e:#}"),
            },
            Command::Load(file) => match load(Path::new(file)) {
                Ok(messages) => {
                    eprintln!("[loaded {} messages from {file}]", messages.len());
                    session.messages = messages;
                }
                Err(e) => eprintln!("error: {e:#}"),
            },
            Command::Exit => break,
            Command::Usage(usage) => eprintln!("usage: {usage}"),
            Command::Unknown(name) => {
                eprintln!("unknown command /{name}: /help lists the commands")
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_into_commands() {
        assert_eq!(parse("hello"), Command::Say("hello"));
        assert_eq!(parse("/help"), Command::Help);
        assert_eq!(parse("/system  be brief "), Command::System("be brief"));
        assert_eq!(parse("/system"), Command::System(""));
        assert_eq!(parse("/save"), Command::Usage("/save FILE"));
        assert_eq!(parse("/load a.json"), Command::Load("a.json"));
        assert_eq!(parse("/frobnicate x"), Command::Unknown("frobnicate"));
        assert_eq!(parse("/exit"), Command::Exit);
    }
}
