//! `--json-schema`, `--grammar` and `--regex` for `run` and `chat`: the
//! output must match, compiled against the model's vocabulary.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use spindle_engine::constraint::{Constraint, Grammar, GrammarCompiler};
use spindle_model::tokenizer::Tokenizer;

use crate::options::read_text_arg;

#[derive(Args, Debug, Clone, Default)]
pub struct GrammarArgs {
    /// The output is JSON matching the schema in this file.
    #[arg(long = "json-schema", value_name = "FILE")]
    pub json_schema: Option<PathBuf>,
    /// The output matches the Lark grammar in this file (llguidance's Lark
    /// syntax; GBNF is not accepted).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
    /// The whole output matches this regular expression.
    #[arg(long, value_name = "RE")]
    pub regex: Option<String>,
}

impl GrammarArgs {
    /// The grammar asked for, read and checked (`None` without one).
    pub fn grammar(&self) -> Result<Option<Grammar>> {
        let mut asked = Vec::new();
        if let Some(p) = &self.json_schema {
            let schema = serde_json::from_str(&read_text_arg("--json-schema", p)?)
                .with_context(|| format!("--json-schema {}: not JSON", p.display()))?;
            asked.push(Grammar::JsonSchema(schema));
        }
        if let Some(p) = &self.grammar {
            asked.push(Grammar::Lark(read_text_arg("--grammar", p)?));
        }
        if let Some(r) = &self.regex {
            asked.push(Grammar::Regex(r.clone()));
        }
        if asked.len() > 1 {
            bail!("give one of --json-schema, --grammar and --regex");
        }
        Ok(asked.pop())
    }

    /// The compiled constraint for `tokenizer`'s vocabulary, if one was
    /// asked for; a grammar that does not compile is an error saying why.
    pub fn constraint(&self, tokenizer: &Tokenizer) -> Result<Option<Constraint>> {
        let Some(grammar) = self.grammar()? else {
            return Ok(None);
        };
        let compiler = GrammarCompiler::new(tokenizer)?;
        Ok(Some(compiler.compile(&grammar)?))
    }
}
