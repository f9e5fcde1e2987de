//! A decision as tokens: the state, each question's suffix, and the
//! options as a token tree under it.

use std::collections::HashMap;

use spindle_model::chat_template::{ChatMessage, ChatTemplate};
use spindle_model::tokenizer::Tokenizer;

use super::normalize::normalize;
use super::{
    Answer, DecideError, DecisionRequest, Kind, Mode, OptionSpec, Question, State, MAX_OPTIONS,
    MAX_TREE_TOKENS,
};
use tokio::sync::mpsc::UnboundedSender;

use crate::sampler::SamplerConfig;
use crate::scheduler::{Event, Request, RequestParams, ScoreTree, TreeScores};

/// A decision ready to run: the state's tokens (the prompt), the tree the
/// engine scores after them, and where each option's scores land.
#[derive(Debug, Clone)]
pub struct DecisionPlan {
    pub prompt: Vec<u32>,
    pub tree: ScoreTree,
    mode: Mode,
    questions: Vec<PlannedQuestion>,
}

#[derive(Debug, Clone)]
struct PlannedQuestion {
    id: String,
    kind: Kind,
    labels: Vec<String>,
    /// Tokens of the question's suffix (before any option token).
    suffix: usize,
    /// Per option: indices into the tree's `scored` (its tokens, first
    /// token first) and into its `ends`.
    options: Vec<(Vec<usize>, usize)>,
}

/// The state's tokens, each question's suffix, and how options follow.
struct Tokenized {
    prompt: Vec<u32>,
    suffixes: Vec<Vec<u32>>,
    framing: Framing,
}

/// How options are written after a question's suffix, and what closes one.
struct Framing {
    /// Prepended to each label before tokenizing (" " after "Answer:").
    label_prefix: &'static str,
    end_token: u32,
}

impl DecisionPlan {
    /// Tokenizes `req` for `tokenizer` (chat states rendered with
    /// `template`), checking every rule of the contract that can be checked
    /// before the pass. `ctx` bounds the prompt and the deepest branch.
    pub fn new(
        req: &DecisionRequest,
        tokenizer: &Tokenizer,
        template: &ChatTemplate,
        ctx: usize,
    ) -> Result<DecisionPlan, DecideError> {
        check_questions(&req.questions)?;
        let tok_err =
            |e: spindle_model::tokenizer::TokenizerError| DecideError::Tokenizer(e.to_string());
        let Tokenized {
            prompt,
            suffixes,
            framing,
        } = match &req.state {
            State::Text(text) => {
                if text.trim().is_empty() {
                    return Err(DecideError::EmptyState);
                }
                let prompt = tokenizer.encode(text, true, false).map_err(tok_err)?;
                let mut suffixes = Vec::new();
                for q in &req.questions {
                    let text = format!("\n\n{}", question_text(req.instructions.as_deref(), q));
                    suffixes.push(tokenizer.encode(&text, false, false).map_err(tok_err)?);
                }
                let newline = tokenizer.encode("\n", false, false).map_err(tok_err)?;
                let framing = Framing {
                    label_prefix: " ",
                    end_token: *newline
                        .first()
                        .ok_or_else(|| DecideError::Tokenizer("\"\\n\" has no token".into()))?,
                };
                Tokenized {
                    prompt,
                    suffixes,
                    framing,
                }
            }
            State::Messages(messages) => chat_prompt(req, messages, tokenizer, template)?,
        };
        let mut tree = ScoreTree::default();
        let mut questions = Vec::new();
        let mut deepest = 0;
        for (q, suffix) in req.questions.iter().zip(suffixes) {
            let labels = labels(q);
            let mut tokens = Vec::with_capacity(labels.len());
            for l in &labels {
                let t = tokenizer
                    .encode(&format!("{}{l}", framing.label_prefix), false, false)
                    .map_err(tok_err)?;
                tokens.push(t);
            }
            check_tokens(&q.id, &labels, &tokens, req.mode)?;
            // The suffix: a chain under the state.
            let mut parent = None;
            for &t in &suffix {
                tree.nodes.push((t, parent));
                parent = Some(tree.nodes.len() - 1);
            }
            let after_suffix = parent;
            let mut children: HashMap<(Option<usize>, u32), usize> = HashMap::new();
            let mut scored_of: HashMap<usize, usize> = HashMap::new();
            let mut options = Vec::with_capacity(labels.len());
            for t in &tokens {
                let used = if req.mode == Mode::FirstToken {
                    &t[..1]
                } else {
                    &t[..]
                };
                let mut node = after_suffix;
                let mut scored = Vec::with_capacity(used.len());
                for &token in used {
                    let n = *children.entry((node, token)).or_insert_with(|| {
                        tree.nodes.push((token, node));
                        tree.nodes.len() - 1
                    });
                    let s = *scored_of.entry(n).or_insert_with(|| {
                        tree.scored.push(n);
                        tree.scored.len() - 1
                    });
                    scored.push(s);
                    node = Some(n);
                }
                let end = tree.ends.len();
                if req.mode != Mode::FirstToken {
                    tree.ends
                        .push((node.expect("options are not empty"), framing.end_token));
                }
                deepest = deepest.max(suffix.len() + used.len());
                options.push((scored, end));
            }
            questions.push(PlannedQuestion {
                id: q.id.clone(),
                kind: q.kind,
                labels,
                suffix: suffix.len(),
                options,
            });
        }
        if tree.nodes.len() > MAX_TREE_TOKENS {
            return Err(DecideError::TooManyTokens(tree.nodes.len()));
        }
        let tokens = prompt.len() + deepest;
        if tokens > ctx {
            return Err(DecideError::TooLong { tokens, ctx });
        }
        Ok(DecisionPlan {
            prompt,
            tree,
            mode: req.mode,
            questions,
        })
    }

    /// The answers, in the order of the questions, from the engine's scores
    /// of [`DecisionPlan::tree`].
    pub fn answers(&self, scores: &TreeScores) -> Result<Vec<Answer>, DecideError> {
        self.questions
            .iter()
            .map(|q| {
                let option_scores: Vec<f64> = q
                    .options
                    .iter()
                    .map(|(scored, end)| {
                        let tokens: Vec<f64> = scored.iter().map(|&s| scores.scored[s]).collect();
                        match self.mode {
                            Mode::FirstToken => tokens[0],
                            Mode::Sum => tokens.iter().sum::<f64>() + scores.ends[*end],
                            Mode::Mean => {
                                (tokens.iter().sum::<f64>() + scores.ends[*end])
                                    / (tokens.len() + 1) as f64
                            }
                        }
                    })
                    .collect();
                normalize(&q.id, q.kind, &q.labels, &option_scores)
            })
            .collect()
    }

    /// The engine request that scores this plan; its events go to `events`.
    pub fn request(&self, tenant: &str, events: UnboundedSender<Event>) -> Request {
        Request {
            prompt: self.prompt.clone(),
            params: RequestParams {
                max_tokens: 0,
                sampler: SamplerConfig::default(),
                stop_ids: Vec::new(),
                logit_bias: Vec::new(),
                logprobs: None,
                constraint: None,
            },
            tenant: tenant.to_string(),
            score: Some(self.tree.clone()),
            events,
        }
    }

    /// For each question: how many tokens its suffix has and, for each
    /// option, the tokens that follow the state when that option is the
    /// answer (the suffix, the option, its end marker; `first_token`: the
    /// option's first token only). Scoring each of these after the state
    /// on its own gives what the tree gives in one pass.
    pub fn option_sequences(&self) -> Vec<(usize, Vec<Vec<u32>>)> {
        let chain = |mut node: Option<usize>| {
            let mut tokens = Vec::new();
            while let Some(n) = node {
                tokens.push(self.tree.nodes[n].0);
                node = self.tree.nodes[n].1;
            }
            tokens.reverse();
            tokens
        };
        self.questions
            .iter()
            .map(|q| {
                let seqs = q
                    .options
                    .iter()
                    .map(|(scored, end)| {
                        let last = self.tree.scored[*scored.last().expect("not empty")];
                        let mut tokens = chain(Some(last));
                        if self.mode != Mode::FirstToken {
                            tokens.push(self.tree.ends[*end].1);
                        }
                        tokens
                    })
                    .collect();
                (q.suffix, seqs)
            })
            .collect()
    }

    /// Rows the pass runs besides the state: every suffix and option token.
    pub fn tree_rows(&self) -> usize {
        self.tree.nodes.len()
    }
}

/// The text that asks `q`, ending where the answer starts. Short, since
/// every token of it is a row of the decision's pass: options are scored
/// as continuations of "Answer:" and listed only when they carry
/// descriptions, sorted, so the order they were given in changes nothing.
fn question_text(instructions: Option<&str>, q: &Question) -> String {
    let mut s = String::new();
    if let Some(i) = instructions.filter(|i| !i.trim().is_empty()) {
        s.push_str(i.trim());
        s.push('\n');
    }
    let asked = q.question.clone().unwrap_or_else(|| q.id.replace('_', " "));
    let hint = if q.kind == Kind::YesNo {
        " (yes or no)"
    } else {
        ""
    };
    s.push_str(&format!("Question: {}{hint}\n", asked.trim()));
    let mut listed: Vec<&OptionSpec> = q.options.iter().collect();
    listed.sort_by(|a, b| a.label().cmp(b.label()));
    if listed.iter().any(|o| o.description().is_some()) {
        for o in listed {
            match o.description() {
                Some(d) => s.push_str(&format!("- {}: {}\n", o.label(), d.trim())),
                None => s.push_str(&format!("- {}\n", o.label())),
            }
        }
    }
    s.push_str("Answer:");
    s
}

fn labels(q: &Question) -> Vec<String> {
    match q.kind {
        Kind::YesNo => vec!["yes".into(), "no".into()],
        _ => q.options.iter().map(|o| o.label().to_string()).collect(),
    }
}

/// The state as a conversation and each question asked after it: at the
/// end of the last turn if that is the user's (templates want roles to
/// alternate), else in a new user turn; the answer is the assistant's
/// reply, closed by what the template writes after a reply.
fn chat_prompt(
    req: &DecisionRequest,
    messages: &[ChatMessage],
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
) -> Result<Tokenized, DecideError> {
    if messages.iter().all(|m| m.content.trim().is_empty()) {
        return Err(DecideError::EmptyState);
    }
    let render = |m: &[ChatMessage], gen: bool| {
        template
            .render_for(tokenizer, m, gen)
            .map_err(|e| DecideError::Template(e.to_string()))
    };
    let tok_err =
        |e: spindle_model::tokenizer::TokenizerError| DecideError::Tokenizer(e.to_string());
    // The conversation with `extra` where the question goes.
    let ends_with_user = messages.last().is_some_and(|m| m.role == "user");
    let with = |extra: &str| {
        let mut all = messages.to_vec();
        if ends_with_user {
            all.last_mut().expect("not empty").content.push_str(extra);
        } else {
            all.push(ChatMessage::new("user", extra));
        }
        all
    };
    // The state is the text before the question, whatever it is.
    let marker = "\u{2063}";
    let probe = render(&with(marker), true)?;
    let state = probe
        .split_once(marker)
        .map(|(before, _)| before.to_string())
        .ok_or_else(|| DecideError::Template("the template drops the question".into()))?;
    // What the messages say stays text: special-token text in a state
    // never becomes a control token.
    let texts: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
    let prompt = tokenizer
        .encode_chat_prompt_guarded(&state, &texts)
        .map_err(tok_err)?;
    let lead = if ends_with_user { "\n\n" } else { "" };
    let mut suffixes = Vec::new();
    for q in &req.questions {
        let asked = format!("{lead}{}", question_text(req.instructions.as_deref(), q));
        let full = render(&with(&asked), true)?;
        let rest = full.strip_prefix(&state).ok_or_else(|| {
            DecideError::Template("the question changes how the state renders".into())
        })?;
        suffixes.push(tokenizer.encode_guarded(rest, &[&asked]).map_err(tok_err)?);
    }
    // What the template writes after an assistant reply.
    let mut answered = with("?");
    answered.push(ChatMessage::new("assistant", marker));
    let text = render(&answered, false)?;
    let after = text
        .rsplit_once(marker)
        .map(|(_, after)| after.to_string())
        .filter(|a| !a.is_empty())
        .ok_or_else(|| DecideError::Template("the template writes nothing after a reply".into()))?;
    let end = tokenizer.encode(&after, false, true).map_err(tok_err)?;
    let framing = Framing {
        label_prefix: "",
        end_token: *end
            .first()
            .ok_or_else(|| DecideError::Template("the end of a reply has no token".into()))?,
    };
    Ok(Tokenized {
        prompt,
        suffixes,
        framing,
    })
}

fn check_questions(questions: &[Question]) -> Result<(), DecideError> {
    if questions.is_empty() {
        return Err(DecideError::NoQuestions);
    }
    let mut ids = std::collections::HashSet::new();
    for (i, q) in questions.iter().enumerate() {
        if q.id.trim().is_empty() {
            return Err(DecideError::EmptyId { index: i });
        }
        if !ids.insert(q.id.as_str()) {
            return Err(DecideError::DuplicateId(q.id.clone()));
        }
        match q.kind {
            Kind::YesNo if !q.options.is_empty() => {
                return Err(DecideError::YesNoOptions(q.id.clone()))
            }
            Kind::YesNo => {}
            Kind::Choice | Kind::Score => {
                let n = q.options.len();
                if !(2..=MAX_OPTIONS).contains(&n) {
                    let kind = if q.kind == Kind::Score {
                        "score"
                    } else {
                        "choice"
                    };
                    return Err(DecideError::OptionCount {
                        id: q.id.clone(),
                        kind,
                        n,
                    });
                }
                let mut seen = std::collections::HashSet::new();
                for (j, o) in q.options.iter().enumerate() {
                    if o.label().trim().is_empty() {
                        return Err(DecideError::EmptyOption {
                            id: q.id.clone(),
                            index: j,
                        });
                    }
                    if !seen.insert(o.label()) {
                        return Err(DecideError::DuplicateOption {
                            id: q.id.clone(),
                            option: o.label().to_string(),
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

/// Options the model could not tell apart: the same tokens, or (for
/// `first_token`) the same first token.
fn check_tokens(
    id: &str,
    labels: &[String],
    tokens: &[Vec<u32>],
    mode: Mode,
) -> Result<(), DecideError> {
    let mut by_tokens: HashMap<&[u32], usize> = HashMap::new();
    let mut by_first: HashMap<u32, usize> = HashMap::new();
    for (i, t) in tokens.iter().enumerate() {
        if t.is_empty() {
            return Err(DecideError::EmptyOption {
                id: id.to_string(),
                index: i,
            });
        }
        if let Some(&j) = by_tokens.get(t.as_slice()) {
            return Err(DecideError::SameTokens {
                id: id.to_string(),
                a: labels[j].clone(),
                b: labels[i].clone(),
            });
        }
        by_tokens.insert(t, i);
        if mode == Mode::FirstToken {
            if let Some(&j) = by_first.get(&t[0]) {
                return Err(DecideError::SameFirstToken {
                    id: id.to_string(),
                    a: labels[j].clone(),
                    b: labels[i].clone(),
                });
            }
            by_first.insert(t[0], i);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(l: &[&str]) -> Vec<String> {
        l.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_the_model_cannot_tell_apart_are_named() {
        let l = labels(&["ok", "okay", "fine"]);
        let same = check_tokens("q", &l, &[vec![5], vec![5], vec![6]], Mode::Sum);
        assert_eq!(
            same,
            Err(DecideError::SameTokens {
                id: "q".into(),
                a: "ok".into(),
                b: "okay".into()
            })
        );
        let first = vec![vec![5, 1], vec![5, 2], vec![6]];
        assert!(check_tokens("q", &l, &first, Mode::Sum).is_ok());
        assert_eq!(
            check_tokens("q", &l, &first, Mode::FirstToken),
            Err(DecideError::SameFirstToken {
                id: "q".into(),
                a: "ok".into(),
                b: "okay".into()
            })
        );
        assert!(matches!(
            check_tokens("q", &l, &[vec![1], vec![], vec![2]], Mode::Sum),
            Err(DecideError::EmptyOption { index: 1, .. })
        ));
    }
}
