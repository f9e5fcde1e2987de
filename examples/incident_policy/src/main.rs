//! `cargo run -p incident_policy` (recorded responses) or
//! `cargo run -p incident_policy -- --live [MODEL]` (the model itself;
//! `--record` also writes its responses as the new fixtures).

use std::path::{Path, PathBuf};

use anyhow::Result;
use incident_policy::{default_model, gate, incidents, DecisionJson, Live, Outcome, Source};

fn main() -> Result<()> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let live = args.iter().any(|a| a == "--live");
    let record = args.iter().any(|a| a == "--record");
    let source = if live {
        let model = args
            .iter()
            .find(|a| !a.starts_with("--"))
            .map(PathBuf::from)
            .unwrap_or_else(default_model);
        Source::Live(Box::new(Live::load(&model)?))
    } else {
        Source::Fixtures(here.join("responses"))
    };
    for incident in incidents(&here.join("incidents"))? {
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
            } => format!("ACT: {action} ({probability:.3})"),
            Outcome::GatherEvidence { reason } => format!("GATHER EVIDENCE: {reason}"),
            Outcome::Human { reason } => format!("HUMAN: {reason}"),
        };
        println!("{}: {}\n  -> {outcome}", incident.name, summary.join(", "));
    }
    Ok(())
}
