//! `--spec` and `--spec-budget`, parsed in one place for `run`, `chat` and
//! `serve`: which drafter each sequence gets, and how large its trees may be.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use spindle_engine::speculative::{
    generate_speculative_on, DraftSource, Drafter, TrafficConfig, TreeBudget,
};
use spindle_engine::{generate_on, GenerateOutput, GenerateRequest};
use spindle_model::{KvCache, Model, SeqId};

#[derive(Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: auto (suffix-trie drafts from the request and,
    /// in `serve`, from earlier requests' outputs, merged with n-gram
    /// lookup into one tree; its size chosen each step from pass costs and
    /// the acceptance learned per source), ngram (n-gram lookup only),
    /// suffix (suffix tries only), draft:PATH (a smaller model with the
    /// same vocabulary, with the suffix and n-gram drafts merged in), self
    /// (the model itself with every other layer skipped, as a draft
    /// model), or off. The output is the same in every mode.
    #[arg(long, default_value = "auto")]
    pub spec: String,
    /// Most drafted tokens verified in one pass (1 to 64).
    #[arg(long = "spec-budget", default_value_t = 16)]
    pub spec_budget: usize,
    /// `serve`: most memory (MiB) of the suffix tries over earlier
    /// requests' outputs; the least recently used outputs are evicted
    /// beyond it. 0 turns drafting from earlier traffic off.
    #[arg(long = "spec-cache-mb", default_value_t = spindle_engine::speculative::DEFAULT_TRAFFIC_CACHE_BYTES >> 20)]
    pub spec_cache_mb: usize,
    /// `serve`: one trie of earlier outputs for every tenant instead of
    /// one per API key or `user` (for single-user servers: with separate
    /// tries, how fast drafts are accepted cannot reveal one tenant's
    /// outputs to another).
    #[arg(long = "spec-share-tenants")]
    pub spec_share_tenants: bool,
}

/// What `--spec` asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum SpecMode {
    Off,
    /// Suffix tries and n-gram lookup.
    Auto,
    Ngram,
    Suffix,
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
            "auto" => SpecMode::Auto,
            "ngram" => SpecMode::Ngram,
            "suffix" => SpecMode::Suffix,
            "self" => SpecMode::SelfDraft,
            s => match s.strip_prefix("draft:") {
                Some(p) if !p.is_empty() => {
                    let path = PathBuf::from(p);
                    // Checked here so the error names --spec, not the loader's -m.
                    crate::options::check_path_exists("--spec draft:PATH:", &path)?;
                    SpecMode::DraftModel(path)
                }
                _ => bail!("--spec '{s}' is not one of auto, ngram, suffix, draft:PATH, self, off"),
            },
        })
    }

    /// The largest tree per sequence, `None` for plain decoding.
    pub fn tree_budget(&self) -> Result<Option<usize>> {
        Ok((self.mode()? != SpecMode::Off).then_some(self.spec_budget))
    }

    /// The cache of earlier outputs `serve` drafts from (`None` when the
    /// mode has no suffix drafts or `--spec-cache-mb` is 0).
    pub fn traffic_config(&self) -> Result<Option<TrafficConfig>> {
        let suffix = !matches!(self.mode()?, SpecMode::Off | SpecMode::Ngram);
        Ok((suffix && self.spec_cache_mb > 0).then(|| TrafficConfig {
            max_bytes: self.spec_cache_mb << 20,
            share_tenants: self.spec_share_tenants,
            ..TrafficConfig::default()
        }))
    }

    /// Where drafts come from (`None` for plain decoding), checked against
    /// the target model; `threads` for a draft model. Earlier traffic is
    /// added by `serve` ([`SpecArgs::traffic_config`]).
    pub fn source(&self, target: &Model, threads: usize) -> Result<Option<DraftSource>> {
        let with_model = |model: Model| DraftSource {
            suffix: true,
            ..DraftSource::model(Arc::new(model))
        };
        let source = match self.mode()? {
            SpecMode::Off => return Ok(None),
            SpecMode::Auto => DraftSource::auto(None),
            SpecMode::Ngram => DraftSource::ngram(),
            SpecMode::Suffix => DraftSource {
                suffix: true,
                ..DraftSource::default()
            },
            SpecMode::DraftModel(path) => {
                let draft = spindle_model::load(&path, threads).with_context(|| {
                    format!(
                        "--spec draft:PATH: cannot load the draft model {}",
                        path.display()
                    )
                })?;
                with_model(draft.model)
            }
            SpecMode::SelfDraft => {
                // The first and last layers and every other one between.
                let n = target.config.n_layers;
                let keep: Vec<usize> = (0..n)
                    .filter(|&l| l == 0 || l + 1 == n || l % 2 == 0)
                    .collect();
                with_model(target.with_layers(&keep, threads)?)
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

/// Generates on an open sequence that keeps its KV (a chat's, or one a
/// progress bar prefilled), with the drafter when there is one, else
/// plainly: the sequence may hold the KV of a prefix of the prompt, and
/// only the rest is prefilled. The tree budget is the caller's, so a chat
/// keeps what it learned across turns.
pub fn generate_on_with(
    model: &Model,
    kv: &mut KvCache,
    seq: SeqId,
    req: &GenerateRequest,
    speculate: Option<(&mut Box<dyn Drafter>, &mut TreeBudget)>,
    on_token: &mut impl FnMut(u32) -> bool,
) -> Result<GenerateOutput> {
    Ok(match speculate {
        Some((d, policy)) => {
            generate_speculative_on(model, kv, seq, req, d.as_mut(), policy, on_token)?
        }
        None => generate_on(model, kv, seq, req, on_token)?,
    })
}
