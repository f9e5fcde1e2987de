//! `spindle`: run, chat, score and measure language models on the CPU.

use clap::{Parser, Subcommand};
use spindle_cli::commands;

#[derive(Parser)]
#[command(
    name = "spindle",
    version,
    about = "A CPU inference engine for decoder-only language models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fetch the default model (Gemma 3 270M, Q4_K_M) into $SPINDLE_HOME.
    Pull(commands::pull::PullArgs),
    /// Generate text from a prompt.
    Run(commands::run::RunArgs),
    /// Talk with a model in a loop, using its chat template.
    Chat(commands::chat::ChatArgs),
    /// One vector per text from an encoder model (default: all-MiniLM-L6-v2),
    /// as JSON lines.
    Embed(commands::embed::EmbedArgs),
    /// Print the token ids of a text as a JSON list.
    Tokenize(commands::tokenize::TokenizeArgs),
    /// Print the text of token ids.
    Detokenize(commands::tokenize::DetokenizeArgs),
    /// Log-probability of every next token of a text, in one pass.
    #[command(mut_arg("ctx", |a| a.help("Context length in tokens (default: the text's length)")))]
    Score(commands::score::ScoreArgs),
    /// Perplexity of a text file (llama.cpp's protocol).
    #[command(mut_arg("ctx", |a| a.help("Context length in tokens (default: the chunk, -c)")))]
    Perplexity(commands::perplexity::PerplexityArgs),
    /// Prompt and generation speed, bandwidth use, and pass cost by rows.
    // bench sizes its own KV cache from -p, -n, -d and --rows.
    #[command(mut_arg("ctx", |a| a.hide(true)), mut_arg("kv_memory", |a| a.hide(true)))]
    Bench(commands::bench::BenchArgs),
    /// Memory (weights, KV, activations, overhead) and speed ceiling from file
    /// headers alone, before anything is loaded.
    #[command(
        mut_arg("ctx", |a| a.help("Context length in tokens (default: the model's)")),
        mut_arg("kv_memory", |a| a.hide(true)),
        mut_arg("check_weights", |a| a.hide(true)),
        mut_arg("act_rounding", |a| a.hide(true))
    )]
    Plan(commands::plan::PlanArgs),
    /// An OpenAI-compatible HTTP server with continuous batching.
    #[command(mut_arg("ctx", |a| a.help(
        "Context per sequence in tokens (default: 4096, or the model's when shorter; \
         with --kv-memory, the model's as far as the shared pool holds it)"
    )))]
    Serve(commands::serve::ServeArgs),
    /// The probability of every option of typed questions about a state,
    /// from one pass.
    #[command(mut_arg("ctx", |a| a.help("Context length in tokens (default: 4096)")))]
    Decide(commands::decide::DecideArgs),
}

/// Dies quietly on a closed stdout (`spindle plan ... | head`), like other
/// command-line tools, instead of panicking in `println!`.
fn restore_sigpipe() {
    #[cfg(unix)]
    {
        extern "C" {
            fn signal(signum: std::ffi::c_int, handler: usize) -> usize;
        }
        const SIGPIPE: std::ffi::c_int = 13;
        const SIG_DFL: usize = 0;
        // SAFETY: resetting a signal to its default action has no
        // preconditions; no handler of ours is involved.
        unsafe { signal(SIGPIPE, SIG_DFL) };
    }
}

/// Logs go to stderr, in colour only on a terminal (a file, a pipe or a
/// journal gets plain text). `serve --log` or else `SPINDLE_LOG` sets the
/// filter; without either only errors show, and for `serve` its access log
/// too (one line per request, `spindle::access`).
fn init_logging(serving: bool, flag: Option<String>) {
    use std::io::IsTerminal;
    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::EnvFilter;
    let given = flag
        .or_else(|| std::env::var("SPINDLE_LOG").ok())
        .filter(|s| !s.trim().is_empty());
    let directives = match (given, serving) {
        (Some(s), _) => s,
        (None, true) => format!("error,{}=info", spindle_server::access::TARGET),
        (None, false) => "error".to_string(),
    };
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::ERROR.into())
        .parse_lossy(directives);
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

fn main() {
    restore_sigpipe();
    let cli = Cli::parse();
    let (serving, flag) = match &cli.command {
        Command::Serve(a) => (true, a.log.clone()),
        _ => (false, None),
    };
    init_logging(serving, flag);
    let result = match cli.command {
        Command::Pull(a) => commands::pull::run(a),
        Command::Run(a) => commands::run::run(a),
        Command::Chat(a) => commands::chat::run(a),
        Command::Embed(a) => commands::embed::run(a),
        Command::Tokenize(a) => commands::tokenize::tokenize(a),
        Command::Detokenize(a) => commands::tokenize::detokenize(a),
        Command::Score(a) => commands::score::run(a),
        Command::Perplexity(a) => commands::perplexity::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Plan(a) => commands::plan::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::Decide(a) => commands::decide::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
