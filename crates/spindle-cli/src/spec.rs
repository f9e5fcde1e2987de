//! Speculative decoding options shared by `run` and `chat`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use spindle_engine::spec::{
    generate_speculative, Adaptive, Combined, DraftModelDrafter, Drafter, NgramDrafter,
};
use spindle_engine::{generate, GenerateOutput, GenerateRequest};
use spindle_model::{KvCache, Model};

#[derive(Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: auto (n-gram drafting, tree size chosen each
    /// step from pass costs and acceptance), ngram (the same), draft:PATH (a
    /// smaller model with the same vocabulary, with n-gram drafts merged in),
    /// self (the model itself with every other layer skipped, as a draft
    /// model), or off. The output is the same in every mode.
    #[arg(long, default_value = "auto")]
    pub spec: String,
    /// Most drafted tokens verified in one pass (1 to 64).
    #[arg(long = "spec-budget", default_value_t = 16)]
    pub spec_budget: usize,
}

/// What `--spec` asked for.
pub enum SpecMode {
    Off,
    Ngram,
    DraftModel(PathBuf),
    SelfDraft,
}

impl SpecArgs {
    pub fn mode(&self) -> Result<SpecMode> {
        if !(1..=64).contains(&self.spec_budget) {
            bail!(
                "--spec-budget {} is out of range: give 1 to 64",
                self.spec_budget
            );
        }
        Ok(match self.spec.as_str() {
            "off" => SpecMode::Off,
            "auto" | "ngram" => SpecMode::Ngram,
            "self" => SpecMode::SelfDraft,
            s => match s.strip_prefix("draft:") {
                Some(p) if !p.is_empty() => SpecMode::DraftModel(PathBuf::from(p)),
                _ => bail!("--spec '{s}' is not one of auto, ngram, draft:PATH, self, off"),
            },
        })
    }

    /// The drafter `--spec` names (`None` for plain decoding), checked
    /// against the target model; `threads` for a draft model.
    pub fn drafter(
        &self,
        target: &Model,
        ctx: usize,
        threads: usize,
    ) -> Result<Option<Box<dyn Drafter>>> {
        Ok(match self.mode()? {
            SpecMode::Off => None,
            SpecMode::Ngram => Some(Box::new(NgramDrafter::default())),
            SpecMode::DraftModel(path) => {
                let draft = spindle_model::load(&path, threads)
                    .with_context(|| format!("cannot load the draft model {}", path.display()))?;
                let d = DraftModelDrafter::new(draft.model, ctx)?;
                d.check_vocab(target.config.vocab_size)?;
                Some(Box::new(Combined::new(vec![
                    Box::new(d),
                    Box::new(NgramDrafter::default()),
                ])))
            }
            SpecMode::SelfDraft => {
                // The first and last layers and every other one between.
                let n = target.config.n_layers;
                let keep: Vec<usize> = (0..n)
                    .filter(|&l| l == 0 || l + 1 == n || l % 2 == 0)
                    .collect();
                let d = DraftModelDrafter::new(target.with_layers(&keep, threads)?, ctx)?;
                Some(Box::new(Combined::new(vec![
                    Box::new(d),
                    Box::new(NgramDrafter::default()),
                ])))
            }
        })
    }
}

/// Generates with `drafter` when there is one, else plainly.
pub fn generate_with(
    model: &Model,
    kv: &mut KvCache,
    req: &GenerateRequest,
    drafter: Option<&mut Box<dyn Drafter>>,
    budget: usize,
    on_token: impl FnMut(u32) -> bool,
) -> Result<GenerateOutput> {
    Ok(match drafter {
        Some(d) => generate_speculative(
            model,
            kv,
            req,
            d.as_mut(),
            &mut Adaptive::new(budget),
            on_token,
        )?,
        None => generate(model, kv, req, on_token)?,
    })
}
