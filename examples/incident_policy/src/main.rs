//! `cargo run -p incident_policy` (recorded responses) or
//! `cargo run -p incident_policy -- --live [MODEL]` (the model itself;
//! `--record` also writes its responses as the new fixtures; `--mode M`
//! and `--debias D` ask in another scoring mode than the incidents say).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use incident_policy::{default_model, gate, incidents, DecisionJson, Live, Outcome, Source};
use spindle_engine::decide::{Debias, Mode};

fn main() -> Result<()> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let live = args.iter().any(|a| a == "--live");
    let record = args.iter().any(|a| a == "--record");
    let value_of = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let mode: Option<Mode> = value_of("--mode")
        .map(|m| serde_json::from_value(serde_json::json!(m)))
        .transpose()
        .context("--mode: give blend, sum, mean, first_token or label")?;
    let debias: Option<Debias> = value_of("--debias")
        .map(|d| serde_json::from_value(serde_json::json!(d)))
        .transpose()
        .context("--debias: give none, permute, prior or both")?;
    let flag_values: Vec<String> = [value_of("--mode"), value_of("--debias")]
        .into_iter()
        .flatten()
        .collect();
    let source = if live {
        let model = args
            .iter()
            .find(|a| !a.starts_with("--") && !flag_values.contains(a))
            .map(PathBuf::from)
            .unwrap_or_else(default_model);
        Source::Live(Box::new(Live::load(&model)?))
    } else {
        Source::Fixtures(here.join("responses"))
    };
    let (mut acted, mut gathered, mut handed) = (0, 0, 0);
    for mut incident in incidents(&here.join("incidents"))? {
        if let Some(m) = mode {
            incident.request.mode = m;
        }
        if let Some(d) = debias {
            incident.request.debias = d;
        }
        let response = source.decide(&incident)?;
        if record && live {
            let path = here
                .join("responses")
                .join(format!("{}.json", incident.name));
            std::fs::write(&path, serde_json::to_string_pretty(&response)? + "\n")?;
        }
        let decision: DecisionJson = serde_json::from_value(response)?;
        let summary: Vec<String> = decision
            .questions
            .iter()
            .map(|a| format!("{} = {} ({:.3})", a.id, a.selected, a.confidence))
            .collect();
        let outcome = match gate(&decision) {
            Outcome::Act {
                action,
                probability,
            } => {
                acted += 1;
                format!("ACT: {action} ({probability:.3})")
            }
            Outcome::GatherEvidence { reason } => {
                gathered += 1;
                format!("GATHER EVIDENCE: {reason}")
            }
            Outcome::Human { reason } => {
                handed += 1;
                format!("HUMAN: {reason}")
            }
        };
        println!("{}: {}\n  -> {outcome}", incident.name, summary.join(", "));
    }
    println!("acted {acted}, gathered evidence {gathered}, handed over {handed}");
    Ok(())
}
