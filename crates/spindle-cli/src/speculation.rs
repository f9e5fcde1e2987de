//! `--spec` and `--spec-budget`, parsed in one place for `run`, `chat` and
//! `serve`: which drafter each sequence gets, and how large its trees may be.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use spindle_engine::speculative::{generate_speculative, DraftSource, Drafter, TreeBudget};
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
#[derive(Debug, Clone, PartialEq)]
pub enum SpecMode {
    Off,
    Ngram,
    DraftModel(PathBuf),
    SelfDraft,
}

impl SpecArgs {
    /// The mode, after checking `--spec` and `--spec-budget`.
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

    /// The largest tree per sequence, `None` for plain decoding.
    pub fn tree_budget(&self) -> Result<Option<usize>> {
        Ok((self.mode()? != SpecMode::Off).then_some(self.spec_budget))
    }

    /// Where drafts come from (`None` for plain decoding), checked against
    /// the target model; `threads` for a draft model.
    pub fn source(&self, target: &Model, threads: usize) -> Result<Option<DraftSource>> {
        let source = match self.mode()? {
            SpecMode::Off => return Ok(None),
            SpecMode::Ngram => DraftSource::Ngram,
            SpecMode::DraftModel(path) => {
                let draft = spindle_model::load(&path, threads)
                    .with_context(|| format!("cannot load the draft model {}", path.display()))?;
                DraftSource::Model(Arc::new(draft.model))
            }
            SpecMode::SelfDraft => {
                // The first and last layers and every other one between.
                let n = target.config.n_layers;
                let keep: Vec<usize> = (0..n)
                    .filter(|&l| l == 0 || l + 1 == n || l % 2 == 0)
                    .collect();
                DraftSource::Model(Arc::new(target.with_layers(&keep, threads)?))
            }
        };
        source.check_vocab(target.config.vocab_size)?;
        Ok(Some(source))
    }

    /// The drafter of one sequence of up to `ctx` tokens (`None` for plain
    /// decoding).
    pub fn drafter(
        &self,
        target: &Model,
        ctx: usize,
        threads: usize,
    ) -> Result<Option<Box<dyn Drafter>>> {
        match self.source(target, threads)? {
            Some(source) => Ok(Some(source.make(ctx)?)),
            None => Ok(None),
        }
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
            &mut TreeBudget::new(budget),
            on_token,
        )?,
        None => generate(model, kv, req, on_token)?,
    })
}
