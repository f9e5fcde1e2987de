//! Decisions: given a state and typed questions, the probability of every
//! option of every question from one pass of the model.
//!
//! - [`DecisionPlan::new`] tokenizes the state once and, per question, a
//!   suffix that asks it; each question's options form a token tree under
//!   its suffix (shared prefixes merged, every option closed by an end
//!   marker, so an option that is a prefix of another is told apart).
//! - The engine prefills the state (from the prefix cache as far as it
//!   holds it) and scores the whole tree in the state's last pass
//!   ([`crate::scheduler::ScoreTree`]).
//! - [`DecisionPlan::answers`] sums each option's log-probabilities and
//!   normalises them per question with log-sum-exp.
//!
//! The contract: `selected` is the likeliest option and `confidence` is its
//! own probability; every option appears in `probabilities`; nothing
//! non-finite gets out; duplicate, empty or identically tokenising options
//! are refused by name. A question's tree branch sees only the state and
//! its own suffix, and rows do not change with what else is in the batch,
//! so answers do not depend on option order or on the other questions.

mod answers;
mod normalize;
mod prompt;

use serde::{Deserialize, Serialize};
use spindle_model::chat_template::ChatMessage;

mod prior_cache;
mod wire;

pub use normalize::normalize;
pub use prior_cache::{PriorCache, DEFAULT_PRIOR_CACHE_BYTES};
pub use prompt::DecisionPlan;
pub use wire::{parse_request, Form};

/// The most options a question may have.
pub const MAX_OPTIONS: usize = 255;

/// The most question and option tokens one decision may add to its pass
/// (each option token reads a row of logits: 1 MiB for a 262k vocabulary).
pub const MAX_TREE_TOKENS: usize = 1024;

/// What to decide.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DecisionRequest {
    /// What the decision is about: text, or chat messages.
    pub state: State,
    pub questions: Vec<Question>,
    /// Said before every question (e.g. the policy the answers follow).
    #[serde(default)]
    pub instructions: Option<String>,
    /// How options are scored (default `blend`).
    #[serde(default)]
    pub mode: Mode,
    /// What of the model's preferences is taken out (default `prior`).
    #[serde(default)]
    pub debias: Debias,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum State {
    Text(String),
    Messages(Vec<ChatMessage>),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Question {
    pub id: String,
    pub kind: Kind,
    /// The question as asked (default: the id, underscores as spaces).
    #[serde(default)]
    pub question: Option<String>,
    /// Choices, or rubric labels lowest first (2 to 255); none for `yes_no`
    /// and `noul`; a `score` without options is rated 1 to 5.
    #[serde(default)]
    pub options: Vec<OptionSpec>,
    /// Said before this question only (after the request's instructions).
    #[serde(default)]
    pub instructions: Option<String>,
    /// For `score`: what is rated (asked as "Rate: ..." when `question` is
    /// not given).
    #[serde(default)]
    pub criteria: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// One of the options.
    Choice,
    /// `yes` or `no`.
    YesNo,
    /// `yes` or `no`, answered with the probability of yes as a number
    /// (`probability`).
    Noul,
    /// One of rubric labels given lowest first; the answer also gives the
    /// expected position in that order.
    Score,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Choice => "choice",
            Kind::YesNo => "yes_no",
            Kind::Noul => "noul",
            Kind::Score => "score",
        }
    }
}

/// An option: a label, optionally with a description shown to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OptionSpec {
    Label(String),
    Described {
        label: String,
        #[serde(default)]
        description: Option<String>,
    },
}

impl OptionSpec {
    pub fn label(&self) -> &str {
        match self {
            OptionSpec::Label(l) => l,
            OptionSpec::Described { label, .. } => label,
        }
    }

    pub fn description(&self) -> Option<&str> {
        match self {
            OptionSpec::Label(_) => None,
            OptionSpec::Described { description, .. } => description.as_deref(),
        }
    }
}

/// How an option's token log-probabilities make its score.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The sum, end marker included: the option's probability as text.
    Sum,
    /// The mean per token (end marker included): favours no length.
    Mean,
    /// The first token's alone (options must start with distinct tokens).
    FirstToken,
    /// The options are listed under one-token labels (A, B, C, ...) and
    /// each is scored by its label's probability as the answer: option
    /// length stops mattering.
    Label,
    /// The geometric mean of `sum` and `first_token` (each with its own
    /// debias), renormalised: the whole option's text and the model's
    /// commitment at its first token, from the same rows as `sum` (where
    /// options share a first token, `sum` alone). The default: on the
    /// labeled set of `bench/decide-set`, with `prior`, it is both more
    /// accurate and better calibrated than either part alone.
    #[default]
    Blend,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Sum => "sum",
            Mode::Mean => "mean",
            Mode::FirstToken => "first_token",
            Mode::Label => "label",
            Mode::Blend => "blend",
        }
    }
}

/// How `label` mode takes out the model's preference for some labels and
/// positions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Debias {
    /// Nothing taken out (in `label` mode: one listing, the options in a
    /// canonical order, sorted by label).
    None,
    /// The question asked under every cyclic shift of the canonical order
    /// (each option once at each position and under each label), each
    /// shift another branch of the same pass; an option's score is its
    /// mean log-probability over the shifts, so a preference for a label
    /// or position adds the same to every option and cancels.
    Permute,
    /// Each listing also asked after a content-free state ("N/A", as in
    /// "Calibrate Before Use"), as a branch of the same pass that sees only
    /// the start of the prompt; the letter probabilities the model gives
    /// with no evidence are divided out. The default: on the labeled set
    /// of `bench/decide-set` it cuts `sum`'s calibration error from 0.33 to
    /// 0.11 at the same accuracy.
    #[default]
    Prior,
    /// `permute` and `prior` together.
    Both,
}

impl Debias {
    pub fn name(self) -> &'static str {
        match self {
            Debias::None => "none",
            Debias::Permute => "permute",
            Debias::Prior => "prior",
            Debias::Both => "both",
        }
    }

    pub fn uses_permute(self) -> bool {
        matches!(self, Debias::Permute | Debias::Both)
    }

    pub fn uses_prior(self) -> bool {
        matches!(self, Debias::Prior | Debias::Both)
    }
}

/// The most options a `label` question may have (one label letter each).
pub const MAX_LABELS: usize = 26;

/// The answer to one question.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Answer {
    pub id: String,
    /// The likeliest option.
    pub selected: String,
    /// Every option with its probability, in the order asked; they sum to
    /// 1 within 1e-9.
    pub probabilities: Vec<(String, f64)>,
    /// Every option's normalised log-probability.
    pub logprobs: Vec<(String, f64)>,
    /// The selected option's own probability.
    pub confidence: f64,
    /// For `score` questions: the expected position (0 = first label).
    pub expected: Option<f64>,
    /// The question's kind (a `noul` answer also gives `probability`).
    pub kind: Kind,
}

impl Answer {
    /// The answer as `/v1/decide` and `spindle decide --json` give it:
    /// `{"id", "selected", "probabilities": {option: p}, "logprobs":
    /// {option: lp}, "confidence"}` (and `"expected"` for a score), options
    /// in the order asked.
    pub fn to_json(&self) -> serde_json::Value {
        let map = |pairs: &[(String, f64)]| -> serde_json::Value {
            serde_json::Value::Object(
                pairs
                    .iter()
                    .map(|(k, v)| (k.clone(), serde_json::json!(v)))
                    .collect(),
            )
        };
        let mut v = serde_json::json!({
            "id": self.id,
            "selected": self.selected,
            "probabilities": map(&self.probabilities),
            "logprobs": map(&self.logprobs),
            "confidence": self.confidence,
        });
        if let Some(e) = self.expected {
            v["expected"] = serde_json::json!(e);
        }
        if self.kind == Kind::Noul {
            v["probability"] = serde_json::json!(self.probability("yes"));
        }
        v
    }

    /// The answer as the map form of a request gets it under `answers`:
    /// `{"type", "answer", "probabilities", "confidence"}` (with
    /// `probability` for `noul`, `expected` for `score`).
    pub fn to_keyed_json(&self) -> serde_json::Value {
        let mut v = self.to_json();
        let obj = v.as_object_mut().expect("an object");
        obj.remove("id");
        obj.remove("logprobs");
        let selected = obj.remove("selected").unwrap_or_default();
        obj.insert("answer".into(), selected);
        obj.insert("type".into(), serde_json::json!(self.kind.name()));
        v
    }

    /// The probability of `option`, if it was asked.
    pub fn probability(&self, option: &str) -> Option<f64> {
        self.probabilities
            .iter()
            .find(|(o, _)| o == option)
            .map(|(_, p)| *p)
    }
}

/// Why a decision cannot be made as asked (HTTP 400).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecideError {
    #[error("give at least one question")]
    NoQuestions,
    #[error("question {index} has an empty id: give every question an id")]
    EmptyId { index: usize },
    #[error("two questions have the id '{0}': ids must be unique")]
    DuplicateId(String),
    #[error("question '{id}' has {n} options: a {kind} question takes 2 to {MAX_OPTIONS}")]
    OptionCount {
        id: String,
        kind: &'static str,
        n: usize,
    },
    #[error("question '{0}' is yes_no or noul: it takes no options (they are yes and no)")]
    YesNoOptions(String),
    #[error("{0}")]
    Malformed(String),
    #[error("question '{id}' has an empty option (number {index})")]
    EmptyOption { id: String, index: usize },
    #[error("question '{id}' lists the option '{option}' twice")]
    DuplicateOption { id: String, option: String },
    #[error("question '{id}': the options '{a}' and '{b}' tokenize identically, so the model cannot tell them apart")]
    SameTokens { id: String, a: String, b: String },
    #[error("question '{id}': the options '{a}' and '{b}' start with the same token; mode first_token needs distinct first tokens (use sum or mean)")]
    SameFirstToken { id: String, a: String, b: String },
    #[error("question '{id}' has {n} options: mode label takes at most {MAX_LABELS} (one letter each); use sum or mean")]
    TooManyLabels { id: String, n: usize },
    #[error("the label '{0}' is not one token for this model, so mode label cannot score it")]
    LabelTokens(String),
    #[error("debias {0} needs mode label (the other modes do not list the options)")]
    DebiasNeedsLabel(&'static str),
    #[error("the state is empty: give the text or messages the decision is about")]
    EmptyState,
    #[error("the decision needs {tokens} tokens (state, questions and options) but the context holds {ctx}")]
    TooLong { tokens: usize, ctx: usize },
    #[error("the questions and options come to {0} tokens, more than the {MAX_TREE_TOKENS} one decision may have: ask fewer or shorter ones per request")]
    TooManyTokens(usize),
    #[error("the chat template cannot render the state: {0}")]
    Template(String),
    #[error("the tokenizer failed: {0}")]
    Tokenizer(String),
    #[error("the model gave question '{0}' a score that is not a finite number")]
    NotFinite(String),
}

/// Why running a decision failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Invalid(#[from] DecideError),
    #[error(transparent)]
    Submit(#[from] crate::scheduler::SubmitError),
    #[error("the engine failed: {0}")]
    Engine(crate::error::RequestError),
}

/// Plans `req`, runs it on `engine` (the state's KV stays in the prefix
/// cache) and waits for the answers. Blocking: not for async contexts.
pub fn decide(
    engine: &crate::scheduler::EngineHandle,
    tokenizer: &spindle_model::tokenizer::Tokenizer,
    template: &spindle_model::chat_template::ChatTemplate,
    req: &DecisionRequest,
) -> Result<Vec<Answer>, RunError> {
    decide_with(engine, tokenizer, template, req, None)
}

/// [`decide`], with content-free answers (`prior`) taken from and kept in
/// `priors`.
pub fn decide_with(
    engine: &crate::scheduler::EngineHandle,
    tokenizer: &spindle_model::tokenizer::Tokenizer,
    template: &spindle_model::chat_template::ChatTemplate,
    req: &DecisionRequest,
    priors: Option<&PriorCache>,
) -> Result<Vec<Answer>, RunError> {
    use crate::scheduler::Event;
    let plan = DecisionPlan::with_priors(req, tokenizer, template, engine.ctx, priors)?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    engine.submit(plan.request("local", tx))?;
    let mut scores = None;
    loop {
        match rx.blocking_recv() {
            Some(Event::Scores(s)) => scores = Some(s),
            Some(Event::Finished(_)) => break,
            Some(Event::Error(e)) => return Err(RunError::Engine(e)),
            Some(Event::Token { .. } | Event::Speculated { .. }) => {}
            None => {
                return Err(RunError::Engine(crate::error::RequestError::internal(
                    "the engine stopped",
                )))
            }
        }
    }
    let scores = scores.ok_or_else(|| {
        RunError::Engine(crate::error::RequestError::internal("no scores came back"))
    })?;
    Ok(plan.answers_with(&scores, priors)?)
}
