//! An incident agent's policy gate over Spindle decisions.
//!
//! For each incident the agent asks two questions about the report: the
//! next action (`page_team`, `gather_evidence`, `open_ticket`, `wait`) and
//! whether customers are affected. The gate then:
//! - acts on the selected action when its own probability is at least 0.80;
//! - gathers more evidence from 0.55 up to 0.80;
//! - hands over to a human below 0.55;
//! - pages a team only if `customers_affected` is `yes` at 0.80 or more
//!   (else it gathers evidence first);
//! - hands over to a human whenever a response breaks the contract: the
//!   selected option has no probability of its own, `confidence` is not
//!   that probability, or a number is not finite. A missing probability is
//!   never filled in from another option.
//!
//! Decisions come from a [`Source`]: recorded responses (fixtures, which
//! can never fall through to a live request) or the model itself.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;

/// Probability at or above which the agent acts.
pub const ACT_AT: f64 = 0.80;
/// Probability at or above which (and below [`ACT_AT`]) it gathers evidence.
pub const GATHER_AT: f64 = 0.55;

/// One answer as `/v1/decide` (and `spindle decide --json`) gives it.
#[derive(Debug, Clone, Deserialize)]
pub struct AnswerJson {
    pub id: String,
    pub selected: String,
    pub probabilities: HashMap<String, f64>,
    pub confidence: f64,
}

/// A decision response; only what the gate reads.
#[derive(Debug, Clone, Deserialize)]
pub struct DecisionJson {
    pub questions: Vec<AnswerJson>,
}

/// What the agent does.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Carry out the action.
    Act { action: String, probability: f64 },
    /// Look for more evidence before acting.
    GatherEvidence { reason: String },
    /// A person decides.
    Human { reason: String },
}

/// The selected option's own probability, if the answer keeps the contract.
fn own_probability(a: &AnswerJson) -> std::result::Result<f64, String> {
    let Some(&p) = a.probabilities.get(&a.selected) else {
        return Err(format!(
            "'{}' selected '{}' but gave it no probability",
            a.id, a.selected
        ));
    };
    if !p.is_finite() || !a.confidence.is_finite() || !(0.0..=1.0).contains(&p) {
        return Err(format!(
            "'{}' has a probability that is not a number in [0, 1]",
            a.id
        ));
    }
    if (a.confidence - p).abs() > 1e-9 {
        return Err(format!(
            "'{}' reports confidence {} for '{}', whose probability is {p}",
            a.id, a.confidence, a.selected
        ));
    }
    Ok(p)
}

/// The gate.
pub fn gate(decision: &DecisionJson) -> Outcome {
    let human = |reason: String| Outcome::Human { reason };
    let find = |id: &str| decision.questions.iter().find(|a| a.id == id);
    let Some(action) = find("next_action") else {
        return human("the response has no next_action answer".into());
    };
    let p = match own_probability(action) {
        Ok(p) => p,
        Err(e) => return human(e),
    };
    if p < GATHER_AT {
        return human(format!(
            "'{}' at {p:.3} is below {GATHER_AT}",
            action.selected
        ));
    }
    if p < ACT_AT {
        return Outcome::GatherEvidence {
            reason: format!("'{}' at {p:.3} is below {ACT_AT}", action.selected),
        };
    }
    if action.selected == "page_team" {
        let Some(customers) = find("customers_affected") else {
            return human("paging needs a customers_affected answer".into());
        };
        let pc = match own_probability(customers) {
            Ok(p) => p,
            Err(e) => return human(e),
        };
        if customers.selected != "yes" || pc < ACT_AT {
            return Outcome::GatherEvidence {
                reason: format!(
                    "paging needs customers_affected = yes at {ACT_AT}, got '{}' at {pc:.3}",
                    customers.selected
                ),
            };
        }
    }
    Outcome::Act {
        action: action.selected.clone(),
        probability: p,
    }
}

/// Where decisions come from.
pub enum Source {
    /// Recorded responses, `<dir>/<incident>.json`. A missing one is an
    /// error: this source holds no model, so nothing live can be asked.
    Fixtures(PathBuf),
    /// The model, in this process.
    Live(Box<Live>),
}

/// Where `spindle pull` puts the default model (`$SPINDLE_HOME`, else
/// `~/.cache/spindle`).
pub fn default_model() -> PathBuf {
    let home = std::env::var_os("SPINDLE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/spindle")
        });
    home.join("models/gemma-3-270m-q4_k_m.gguf")
}

/// A loaded model behind Spindle's engine.
pub struct Live {
    engine: spindle_engine::scheduler::EngineHandle,
    tokenizer: spindle_model::tokenizer::Tokenizer,
    template: spindle_model::chat_template::ChatTemplate,
}

impl Live {
    pub fn load(model: &Path) -> Result<Live> {
        let loaded = spindle_model::load(model, 2)
            .with_context(|| format!("cannot load {}", model.display()))?;
        let tokenizer = loaded
            .tokenizer
            .clone()
            .ok_or_else(|| anyhow!("{} has no tokenizer", model.display()))?;
        let template = spindle_model::chat_template::ChatTemplate::for_tokenizer(&tokenizer);
        let m = loaded.model;
        let kv = m.new_kv_cache(m.default_kv_type(), 2048, 1);
        let engine = spindle_engine::scheduler::spawn_engine(m, kv, Default::default());
        Ok(Live {
            engine,
            tokenizer,
            template,
        })
    }
}

/// An incident: its name and the decision request about it.
pub struct Incident {
    pub name: String,
    pub request: spindle_engine::decide::DecisionRequest,
}

/// The incidents of a directory of `<name>.json` decision requests, by name.
pub fn incidents(dir: &Path) -> Result<Vec<Incident>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path)?;
            let request = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a decision request", path.display()))?;
            let name = path
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            out.push(Incident { name, request });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

impl Source {
    /// The decision about `incident`, as the JSON `/v1/decide` answers with.
    pub fn decide(&self, incident: &Incident) -> Result<serde_json::Value> {
        match self {
            Source::Fixtures(dir) => {
                let path = dir.join(format!("{}.json", incident.name));
                if !path.exists() {
                    bail!(
                        "no recorded response for '{}' ({}): fixture mode never asks the model",
                        incident.name,
                        path.display()
                    );
                }
                let text = std::fs::read_to_string(&path)?;
                Ok(serde_json::from_str(&text)?)
            }
            Source::Live(live) => {
                let answers = spindle_engine::decide::decide(
                    &live.engine,
                    &live.tokenizer,
                    &live.template,
                    &incident.request,
                )?;
                Ok(serde_json::json!({
                    "questions": answers.iter().map(|a| a.to_json()).collect::<Vec<_>>()
                }))
            }
        }
    }
}
