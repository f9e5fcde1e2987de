//! Constrained decoding: a grammar (a JSON schema, a Lark grammar, a
//! regular expression) compiled by llguidance against the model's
//! vocabulary, and a matcher per sequence that gives the tokens allowed
//! next. Plain decoding's token step ([`crate::generate::next_token`])
//! applies the mask, so every decoder (plain, speculative walks, the
//! serving loop, each of `n` choices) chooses under the same constraint,
//! and speculative output stays exactly plain output.
//!
//! The matcher follows the emitted tokens only: a walk emits exactly what
//! plain decoding would, one token at a time, so nothing drafted is ever
//! consumed and nothing needs rolling back. A mask is computed only for a
//! token that is being chosen.

mod token_env;

use std::sync::Arc;
use std::time::Instant;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use spindle_model::tokenizer::Tokenizer;
use toktrie::InferenceCapabilities;

pub use token_env::SpindleTokEnv;

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// A JSON Schema (draft 2020-12 as llguidance reads it).
    JsonSchema(serde_json::Value),
    /// Any JSON object.
    JsonObject,
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
    /// A regular expression (Rust `regex` syntax) the whole output matches.
    Regex(String),
}

impl Grammar {
    /// The name of the request field a grammar of this kind comes from.
    pub fn kind(&self) -> &'static str {
        match self {
            Grammar::JsonSchema(_) => "json_schema",
            Grammar::JsonObject => "json_object",
            Grammar::Lark(_) => "grammar",
            Grammar::Regex(_) => "regex",
        }
    }

    /// A JSON grammar as a Lark `%json` item (its schema closed and
    /// compacted as when it is compiled alone), for composing it into a
    /// larger grammar; `None` for other kinds.
    pub fn json_lark(&self) -> Option<String> {
        let schema = match self {
            Grammar::JsonSchema(s) => close_objects(s.clone()),
            Grammar::JsonObject => serde_json::json!({"type": "object"}),
            _ => return None,
        };
        Some(format!("%json {}", compact(schema)))
    }

    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonSchema(s) => {
                TopLevelGrammar::from_json_schema(compact(close_objects(s.clone())))
            }
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            Grammar::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Grammar::Regex(r) => TopLevelGrammar::from_regex(r),
        }
    }
}

/// `schema` with `"additionalProperties": false` added to every object
/// schema that lists its properties and says nothing of others, as
/// llama.cpp's grammars and OpenAI's strict structured outputs read such
/// schemas: the output carries the keys the schema names, and a model
/// cannot wander into made-up ones (a small model otherwise repeats keys
/// until `max_tokens`). `"additionalProperties": true` keeps an object
/// open.
pub fn close_objects(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(o) = schema.as_object_mut() {
        if o.contains_key("properties") && !o.contains_key("additionalProperties") {
            o.insert(
                "additionalProperties".into(),
                serde_json::Value::Bool(false),
            );
        }
        for (k, v) in o.iter_mut() {
            match (k.as_str(), v) {
                ("properties" | "$defs" | "definitions", serde_json::Value::Object(props)) => {
                    for p in props.values_mut() {
                        *p = close_objects(std::mem::take(p));
                    }
                }
                ("items" | "additionalProperties", v @ serde_json::Value::Object(_)) => {
                    *v = close_objects(std::mem::take(v));
                }
                ("anyOf" | "oneOf" | "prefixItems", serde_json::Value::Array(list)) => {
                    for p in list.iter_mut() {
                        *p = close_objects(std::mem::take(p));
                    }
                }
                _ => {}
            }
        }
    }
    schema
}

/// JSON is written on one line with a space after `,` and `:` (as
/// `json.dumps` does) unless the schema sets its own `x-guidance` layout:
/// then keys, quotes and punctuation are forced, so they ride speculative
/// trees as certain drafts instead of leaving the model to choose
/// whitespace.
fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": "
            })
        });
    }
    schema
}

/// A grammar that does not compile, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the {kind} does not compile: {reason}")]
pub struct GrammarError {
    pub kind: &'static str,
    pub reason: String,
}

/// Compiles grammars against one model's vocabulary (the token trie is
/// built once, when the compiler is made: about a second for 262k tokens).
#[derive(Clone)]
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    /// Tokens that end a JSON value (a closing quote, a comma, a bracket):
    /// candidates for [`Constraint::closers`].
    closers: Arc<Vec<u32>>,
    /// The tokenizer's vocabulary size.
    vocab: usize,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GrammarCompiler")
    }
}

impl GrammarCompiler {
    pub fn new(tokenizer: &Tokenizer) -> Result<GrammarCompiler, GrammarError> {
        let env = SpindleTokEnv::new_env(tokenizer);
        let mut factory = ParserFactory::new(
            &env,
            InferenceCapabilities::default(),
            &llguidance::earley::SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| GrammarError {
            kind: "vocabulary",
            reason: e.to_string(),
        })?;
        // Errors come back as values; nothing is printed.
        factory.set_stderr_log_level(0);
        // Ends of JSON values, each one token when the vocabulary has it.
        const CLOSERS: [&str; 13] = [
            "\"", "\",", "\"]", "\"}", "\"],", "\"},", ",", "]", "}", "],", "},", "]}", "}]",
        ];
        let closers = CLOSERS
            .iter()
            .filter_map(|t| tokenizer.token_to_id(t))
            .filter(|&id| !tokenizer.is_special(id))
            .collect();
        Ok(GrammarCompiler {
            factory: Arc::new(factory),
            closers: Arc::new(closers),
            vocab: tokenizer.vocab_size(),
        })
    }

    /// A fresh matcher for `grammar`, or why it does not compile.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, GrammarError> {
        let err = |reason: String| GrammarError {
            kind: grammar.kind(),
            reason,
        };
        let parser = self
            .factory
            .create_parser(grammar.top_level())
            .map_err(|e| err(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(err(e));
        }
        Ok(Constraint {
            matcher,
            vocab: self.vocab,
            closers: self.closers.clone(),
            prepared: Vec::new(),
            since_prepared: Vec::new(),
            timing: MaskTiming::default(),
        })
    }
}

/// One sequence's position in its grammar.
pub struct Constraint {
    matcher: Matcher,
    /// Tokens of the tokenizer the grammar reads; a model's output rows
    /// may run past them (padding), and the matcher takes such an id as an
    /// error that ends it.
    vocab: usize,
    closers: Arc<Vec<u32>>,
    /// Masks computed ahead ([`Constraint::prepare`]), each for the state
    /// after the tokens of its path are consumed.
    prepared: Vec<(Vec<u32>, toktrie::SimpleVob)>,
    /// Tokens consumed since the masks were prepared.
    since_prepared: Vec<u32>,
    /// What computing masks has cost this sequence.
    pub timing: MaskTiming,
}

/// Masks computed for one sequence and their time: all of it, and the part
/// spent while a token waited for its mask (not prepared during a pass).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MaskTiming {
    pub masks: usize,
    pub seconds: f64,
    pub waiting_seconds: f64,
}

impl MaskTiming {
    /// `m`'s mask, counted and timed.
    fn mask(&mut self, m: &mut Matcher) -> Result<toktrie::SimpleVob, String> {
        let t = Instant::now();
        let mask = m.compute_mask().map_err(|e| e.to_string());
        self.masks += 1;
        self.seconds += t.elapsed().as_secs_f64();
        mask
    }
}

impl Clone for Constraint {
    /// An independent copy (each of `n` choices walks its own).
    fn clone(&self) -> Constraint {
        Constraint {
            matcher: self.matcher.deep_clone(),
            vocab: self.vocab,
            closers: self.closers.clone(),
            prepared: self.prepared.clone(),
            since_prepared: self.since_prepared.clone(),
            timing: self.timing,
        }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

/// What the grammar allows next.
pub enum Allowed {
    /// These tokens (a mask over the vocabulary), and `stop_ids` too when
    /// the output may end here.
    Tokens {
        mask: toktrie::SimpleVob,
        may_end: bool,
    },
    /// The grammar is complete: generation ends.
    Done,
}

impl Constraint {
    /// The tokens allowed next. A matcher in error allows nothing more
    /// (generation ends), which cannot happen for tokens it allowed.
    pub fn allowed(&mut self) -> Allowed {
        if self.matcher.is_stopped() {
            return Allowed::Done;
        }
        let may_end = self.matcher.is_accepting().unwrap_or(false);
        let ready = self
            .prepared
            .iter()
            .position(|(path, _)| *path == self.since_prepared);
        let mask = match ready {
            Some(i) => Ok(self.prepared.swap_remove(i).1),
            None => {
                let t = Instant::now();
                let mask = self.compute_mask();
                self.timing.waiting_seconds += t.elapsed().as_secs_f64();
                mask
            }
        };
        match mask {
            Ok(mask) if !mask.is_zero() || may_end => Allowed::Tokens { mask, may_end },
            Ok(_) => Allowed::Done,
            Err(e) => {
                tracing::warn!("the grammar matcher failed, ending the output: {e}");
                Allowed::Done
            }
        }
    }

    fn compute_mask(&mut self) -> Result<toktrie::SimpleVob, String> {
        self.timing.mask(&mut self.matcher)
    }

    /// Computes masks now, so that choosing tokens later does not wait:
    /// the next token's, then the mask after each token of `path` (the
    /// likeliest path of the tree about to be verified). Called on a helper
    /// thread while the model's pass runs: masks depend only on the tokens
    /// emitted before them.
    pub fn prepare(&mut self, path: &[u32]) {
        self.prepared.clear();
        self.since_prepared.clear();
        if self.matcher.is_stopped() {
            return;
        }
        if let Ok(mask) = self.compute_mask() {
            self.prepared.push((Vec::new(), mask));
        }
        if path.is_empty() {
            return;
        }
        let mut m = self.matcher.deep_clone();
        for (k, &t) in path.iter().enumerate() {
            if m.consume_token(t).is_err() || m.is_stopped() {
                break;
            }
            match self.timing.mask(&mut m) {
                Ok(mask) => self.prepared.push((path[..=k].to_vec(), mask)),
                Err(_) => break,
            }
        }
    }

    /// Advances past an emitted token (one the mask allowed).
    pub fn consume(&mut self, token: u32) {
        if self.prepared.is_empty() {
            self.since_prepared.clear();
        } else {
            self.since_prepared.push(token);
        }
        if let Err(e) = self.matcher.consume_token(token) {
            tracing::warn!("the grammar matcher refused token {token}: {e}");
        }
    }

    /// Whether nothing more may follow.
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Tokens the grammar forces next, whatever the model says (a schema's
    /// keys and punctuation): drafts certain to be accepted.
    pub fn forced(&mut self) -> Vec<u32> {
        if self.matcher.is_stopped() {
            return Vec::new();
        }
        // Computing them does not advance the matcher (it only caches).
        self.matcher.compute_ff_tokens()
    }

    /// Fits a draft to the grammar: of `draft` (tokens after `forced`, the
    /// run the grammar forces now), the longest prefix it allows, then the
    /// run it forces after that prefix. Drafted tokens the grammar forbids
    /// would be rejected anyway; the forced tail is certain once the
    /// prefix is accepted.
    pub fn fit_draft(&self, forced: &[u32], draft: &[u32]) -> (usize, Vec<u32>) {
        let mut m = self.matcher.deep_clone();
        if m.consume_tokens(forced).is_err() {
            return (0, Vec::new());
        }
        let valid = m.try_consume_tokens(draft).unwrap_or(0);
        if m.is_stopped() {
            return (valid, Vec::new());
        }
        (valid, m.compute_ff_tokens())
    }

    /// Guesses that a value ends right after `forced`: each token that
    /// closes it (a quote, a comma, a bracket) and is followed by a run
    /// the grammar then forces (the next key, say), as that token and the
    /// run. When the model does close the value there, the walk goes on
    /// through the run in the same pass instead of stopping at the closer.
    /// Closers after which the grammar forces nothing are left out: they
    /// would save no pass.
    pub fn closers(&self, forced: &[u32], depth: usize) -> Vec<Vec<u32>> {
        let mut m = self.matcher.deep_clone();
        if m.consume_tokens(forced).is_err() || m.is_stopped() || depth <= forced.len() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for &c in self.closers.iter() {
            if m.validate_tokens(&[c]).unwrap_or(0) != 1 || m.consume_token(c).is_err() {
                continue;
            }
            let tail = if m.is_stopped() {
                Vec::new()
            } else {
                m.compute_ff_tokens()
            };
            if !tail.is_empty() {
                let mut branch = vec![c];
                branch.extend(tail);
                branch.truncate(depth - forced.len());
                out.push(branch);
            }
            if m.rollback(1).is_err() {
                break;
            }
        }
        out
    }

    /// Whether the grammar allows `token` next (a stop token where the
    /// output may end), without computing the mask: one token's check.
    pub fn allows(&mut self, token: u32, stop_ids: &[u32]) -> bool {
        if self.matcher.is_stopped() || token as usize >= self.vocab {
            return false;
        }
        if stop_ids.contains(&token) && self.matcher.is_accepting().unwrap_or(false) {
            return true;
        }
        self.matcher.validate_tokens(&[token]).unwrap_or(0) == 1
    }

    /// Sets every logit the grammar forbids to minus infinity (stop tokens
    /// stay allowed where the output may end). `false` when generation must
    /// end instead.
    pub fn mask_logits(&mut self, logits: &mut [f32], stop_ids: &[u32]) -> bool {
        let Allowed::Tokens { mask, may_end } = self.allowed() else {
            return false;
        };
        for (id, l) in logits.iter_mut().enumerate() {
            let id = id as u32;
            let ok = (id as usize) < mask.len() && mask.is_allowed(id)
                || may_end && stop_ids.contains(&id);
            if !ok {
                *l = f32::NEG_INFINITY;
            }
        }
        true
    }
}
