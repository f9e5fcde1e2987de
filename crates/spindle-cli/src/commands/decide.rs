//! `spindle decide`: the probability of every option of typed questions
//! about a state, from one pass (the same engine path as `/v1/decide`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde_json::json;
use spindle_engine::decide::{
    decide, parse_request, Debias, DecisionPlan, DecisionRequest, Kind, Mode, OptionSpec, Question,
    State,
};
use spindle_engine::scheduler::{spawn_engine, EngineConfig};
use spindle_model::chat_template::ChatTemplate;

use crate::options::{read_text_arg, tokenizer, ModelArgs};

#[derive(Args, Debug)]
pub struct DecideArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The whole request as `/v1/decide` takes it (JSON: state, questions,
    /// instructions, mode; `model` is ignored). `-` reads standard input.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// The state as text.
    #[arg(long)]
    pub state: Option<String>,
    /// The state from a text file.
    #[arg(long = "state-file")]
    pub state_file: Option<PathBuf>,
    /// A choice question: ID=option,option,... (repeatable).
    #[arg(long = "choice", value_name = "ID=A,B,...")]
    pub choices: Vec<String>,
    /// A yes/no question: ID (repeatable).
    #[arg(long = "yes-no", value_name = "ID")]
    pub yes_no: Vec<String>,
    /// A score question: ID=lowest,...,highest (repeatable).
    #[arg(long = "score", value_name = "ID=L1,L2,...")]
    pub scores: Vec<String>,
    /// The text of a question: ID=TEXT (default: the id).
    #[arg(long = "ask", value_name = "ID=TEXT")]
    pub ask: Vec<String>,
    /// Said before every question.
    #[arg(long)]
    pub instructions: Option<String>,
    /// How options are scored: blend (default: the geometric mean of sum
    /// and first_token), sum, mean, first_token, or label (options listed
    /// under letters, each scored by its letter).
    #[arg(long, default_value = "blend")]
    pub mode: String,
    /// prior (default: the probabilities the model gives after a
    /// content-free state divided out), none, permute (--mode label: every
    /// cyclic shift of the options, averaged) or both.
    #[arg(long, default_value = "prior")]
    pub debias: String,
    /// Print JSON (the shape `/v1/decide` answers with).
    #[arg(long)]
    pub json: bool,
}

fn split_pair<'a>(flag: &str, s: &'a str) -> Result<(&'a str, &'a str)> {
    s.split_once('=')
        .ok_or_else(|| anyhow!("{flag} '{s}': write ID=..."))
}

fn request(args: &DecideArgs) -> Result<DecisionRequest> {
    if let Some(f) = &args.file {
        let text = read_text_arg("-f", f)?;
        let value: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{} is not JSON", f.display()))?;
        return parse_request(value)
            .map(|(req, _)| req)
            .with_context(|| format!("{} is not a decision request", f.display()));
    }
    let state = match (&args.state, &args.state_file) {
        (Some(s), None) => s.clone(),
        (None, Some(f)) => read_text_arg("--state-file", f)?,
        _ => bail!("give the state: --state TEXT, --state-file FILE, or the whole request with -f"),
    };
    let options = |list: &str| {
        list.split(',')
            .map(|o| OptionSpec::Label(o.trim().to_string()))
            .collect()
    };
    let mut questions = Vec::new();
    for c in &args.choices {
        let (id, list) = split_pair("--choice", c)?;
        questions.push((id, Kind::Choice, options(list)));
    }
    for id in &args.yes_no {
        questions.push((id.as_str(), Kind::YesNo, Vec::new()));
    }
    for c in &args.scores {
        let (id, list) = split_pair("--score", c)?;
        questions.push((id, Kind::Score, options(list)));
    }
    let mut asked = std::collections::HashMap::new();
    for a in &args.ask {
        let (id, text) = split_pair("--ask", a)?;
        asked.insert(id, text.to_string());
    }
    let mode = match args.mode.as_str() {
        "sum" => Mode::Sum,
        "mean" => Mode::Mean,
        "first_token" => Mode::FirstToken,
        "label" => Mode::Label,
        "blend" => Mode::Blend,
        m => bail!("--mode '{m}': give blend, sum, mean, first_token or label"),
    };
    let debias = match args.debias.as_str() {
        "none" => Debias::None,
        "permute" => Debias::Permute,
        "prior" => Debias::Prior,
        "both" => Debias::Both,
        d => bail!("--debias '{d}': give none, permute, prior or both"),
    };
    Ok(DecisionRequest {
        state: State::Text(state),
        questions: questions
            .into_iter()
            .map(|(id, kind, options)| Question {
                id: id.to_string(),
                kind,
                question: asked.get(id).cloned(),
                options,
                instructions: None,
                criteria: None,
            })
            .collect(),
        instructions: args.instructions.clone(),
        mode,
        debias,
    })
}

pub fn run(args: DecideArgs) -> Result<()> {
    let req = request(&args)?;
    let path = args.model.resolve()?;
    let ctx = args.model.planned_ctx(&path, Some(4096))?;
    let loaded = args.model.load()?;
    let tok = tokenizer(&loaded)?.clone();
    let template = ChatTemplate::for_tokenizer(&tok);
    // Tokenize first, so a bad request fails before anything runs.
    let plan = DecisionPlan::new(&req, &tok, &template, ctx)?;
    let ty = args.model.kv_type(&loaded.model)?;
    let kv = loaded.model.new_kv_cache(ty, ctx, 1);
    let engine = spawn_engine(loaded.model, kv, EngineConfig::default());
    let t = Instant::now();
    let answers = decide(&engine, &tok, &template, &req)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if args.json {
        let out = json!({
            "questions": answers.iter().map(|a| a.to_json()).collect::<Vec<_>>(),
            "usage": {
                "prompt_tokens": plan.prompt.len(),
                "question_tokens": plan.tree_rows(),
                "total_tokens": plan.prompt.len() + plan.tree_rows(),
            },
            "timing_ms": ms,
        });
        println!("{out}");
        return Ok(());
    }
    for a in &answers {
        println!("{}: {} (p = {:.4})", a.id, a.selected, a.confidence);
        for (option, p) in &a.probabilities {
            let mark = if *option == a.selected { "*" } else { " " };
            println!("  {mark} {option:<24} {p:.4}");
        }
        if let Some(e) = a.expected {
            println!("    expected position {e:.3} (0 = first label)");
        }
    }
    eprintln!(
        "{} state tokens, {} question and option tokens, one pass: {ms:.1} ms",
        plan.prompt.len(),
        plan.tree_rows()
    );
    Ok(())
}
