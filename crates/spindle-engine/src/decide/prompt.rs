//! A decision as tokens: the state, each question's suffix, and the
//! options as a token tree under it (the answers from its scores are
//! `answers.rs`).

use std::collections::HashMap;

use spindle_model::chat_template::{ChatMessage, ChatTemplate};
use spindle_model::tokenizer::Tokenizer;

use super::prior_cache::{self, PriorCache};
use super::{
    Debias, DecideError, DecisionRequest, Kind, Mode, OptionSpec, Question, State, MAX_LABELS,
    MAX_OPTIONS, MAX_TREE_TOKENS,
};
use tokio::sync::mpsc::UnboundedSender;

use crate::sampler::SamplerConfig;
use crate::scheduler::{Event, Request, RequestParams, ScoreTree};

/// A decision ready to run: the state's tokens (the prompt), the tree the
/// engine scores after them, and where each option's scores land.
#[derive(Debug, Clone)]
pub struct DecisionPlan {
    pub prompt: Vec<u32>,
    pub tree: ScoreTree,
    pub(super) mode: Mode,
    pub(super) questions: Vec<PlannedQuestion>,
}

#[derive(Debug, Clone)]
pub(super) struct PlannedQuestion {
    pub(super) id: String,
    pub(super) kind: Kind,
    pub(super) labels: Vec<String>,
    /// Tokens of the question's suffix (before any option token).
    pub(super) suffix: usize,
    /// Per option: indices into the tree's `scored` (its tokens, first
    /// token first) and into its `ends`. Empty in `label` mode.
    pub(super) options: Vec<(Vec<usize>, usize)>,
    /// `label` mode: per listing (one, or one per cyclic shift), per option
    /// in the order asked, the index into the tree's `ends` of its label.
    pub(super) listings: Vec<Vec<usize>>,
    /// With `prior`: the same for each listing after the content-free
    /// state (parallel to `listings`).
    pub(super) priors: Vec<Vec<usize>>,
    /// With `prior` in the other modes: `options` after the content-free
    /// state.
    pub(super) prior_options: Vec<(Vec<usize>, usize)>,
    /// With `prior`: the content-free option log-softmax when a cache had
    /// it (then there is no content-free branch), else the key to keep it
    /// under once scored.
    pub(super) prior_kept: Option<Vec<f64>>,
    pub(super) prior_key: Option<Vec<u32>>,
}

/// The state's tokens, each asked text's suffix, and how options follow.
struct Tokenized {
    prompt: Vec<u32>,
    suffixes: Vec<Vec<u32>>,
    framing: Framing,
}

/// A question's texts as asked: one, or in `label` mode one per listing,
/// with the option (index as asked) at each listed position.
struct Asked {
    texts: Vec<String>,
    orders: Vec<Vec<usize>>,
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
        Self::with_priors(req, tokenizer, template, ctx, None)
    }

    /// [`DecisionPlan::new`], taking content-free answers (`prior`) from
    /// `cache` where it has them instead of scoring them again.
    pub fn with_priors(
        req: &DecisionRequest,
        tokenizer: &Tokenizer,
        template: &ChatTemplate,
        ctx: usize,
        cache: Option<&PriorCache>,
    ) -> Result<DecisionPlan, DecideError> {
        check_questions(&req.questions)?;
        if req.mode != Mode::Label && req.debias.uses_permute() {
            return Err(DecideError::DebiasNeedsLabel(req.debias.name()));
        }
        let asked: Vec<Asked> = req
            .questions
            .iter()
            .map(|q| asked(req.instructions.as_deref(), q, req.mode, req.debias))
            .collect::<Result<_, _>>()?;
        let all_texts: Vec<&str> = asked
            .iter()
            .flat_map(|a| a.texts.iter().map(String::as_str))
            .collect();
        let tok_err =
            |e: spindle_model::tokenizer::TokenizerError| DecideError::Tokenizer(e.to_string());
        let Tokenized {
            prompt,
            suffixes,
            framing,
        } = tokenize_state(&req.state, &all_texts, tokenizer, template)?;
        // The content-free state ("N/A" in the state's form) and its own
        // suffixes, for `prior`: its branch starts at position 0 and sees
        // nothing of the real prompt (its BOS and a template's header are
        // its own rows: a few tokens, and no committed block it could need
        // that a sliding layer has dropped).
        let content_free = if req.debias.uses_prior() {
            let cf_state = match &req.state {
                State::Text(_) => State::Text(CONTENT_FREE.into()),
                State::Messages(_) => State::Messages(vec![ChatMessage::new("user", CONTENT_FREE)]),
            };
            let cf = tokenize_state(&cf_state, &all_texts, tokenizer, template)?;
            Some((0usize, cf.prompt, cf.suffixes.into_iter()))
        } else {
            None
        };
        let mut content_free = content_free;
        let mut tree = ScoreTree::default();
        let mut questions = Vec::new();
        let mut deepest = 0;
        let mut suffixes = suffixes.into_iter();
        for (q, asked) in req.questions.iter().zip(&asked) {
            let labels = labels(q);
            if req.mode == Mode::Label {
                let letters = label_tokens(tokenizer, framing.label_prefix, labels.len())?;
                let mut children: HashMap<(Option<usize>, u32), usize> = HashMap::new();
                let mut cf_children: HashMap<(Option<usize>, u32), usize> = HashMap::new();
                let mut listings = Vec::with_capacity(asked.orders.len());
                let mut priors = Vec::new();
                let mut suffix_len = 0;
                // A chain of tokens in the tree, sharing nodes already made
                // for the same tokens after the same parent; its last node.
                let chain = |tree: &mut ScoreTree,
                             children: &mut HashMap<(Option<usize>, u32), usize>,
                             tokens: &[u32]|
                 -> Result<usize, DecideError> {
                    let mut node = None;
                    for &t in tokens {
                        node = Some(*children.entry((node, t)).or_insert_with(|| {
                            tree.nodes.push((t, node));
                            tree.nodes.len() - 1
                        }));
                    }
                    node.ok_or_else(|| DecideError::Tokenizer("empty question".into()))
                };
                let letter_ends = |tree: &mut ScoreTree, last: usize, order: &[usize]| {
                    let mut ends = vec![0; order.len()];
                    for (position, &option) in order.iter().enumerate() {
                        ends[option] = tree.ends.len();
                        tree.ends.push((last, letters[position]));
                    }
                    ends
                };
                for order in &asked.orders {
                    let suffix = suffixes.next().expect("one suffix per asked text");
                    // Listings share their common beginning (the question).
                    let last = chain(&mut tree, &mut children, &suffix)?;
                    listings.push(letter_ends(&mut tree, last, order));
                    suffix_len = suffix_len.max(suffix.len());
                    deepest = deepest.max(suffix.len());
                    if let Some((shared, own, cf_suffixes)) = content_free.as_mut() {
                        let cf_suffix = cf_suffixes.next().expect("one suffix per asked text");
                        let tokens: Vec<u32> = own.iter().chain(&cf_suffix).copied().collect();
                        let before = tree.nodes.len();
                        let last = chain(&mut tree, &mut cf_children, &tokens)?;
                        if tree.nodes.len() > before && tree.nodes[before].1.is_none() {
                            tree.prefix_roots.push((before, *shared));
                        }
                        priors.push(letter_ends(&mut tree, last, order));
                    }
                }
                questions.push(PlannedQuestion {
                    id: q.id.clone(),
                    kind: q.kind,
                    labels,
                    suffix: suffix_len,
                    options: Vec::new(),
                    listings,
                    priors,
                    prior_options: Vec::new(),
                    prior_kept: None,
                    prior_key: None,
                });
                continue;
            }
            let suffix = suffixes.next().expect("one suffix per asked text");
            let mut prior_options = Vec::new();
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
            let after_suffix =
                parent.ok_or_else(|| DecideError::Tokenizer("empty question".into()))?;
            let mut children: HashMap<(Option<usize>, u32), usize> = HashMap::new();
            let mut scored_of: HashMap<usize, usize> = HashMap::new();
            let mut under = |tree: &mut ScoreTree, after: usize| {
                options_under(
                    tree,
                    after,
                    &tokens,
                    req.mode,
                    framing.end_token,
                    &mut children,
                    &mut scored_of,
                )
            };
            let options = under(&mut tree, after_suffix);
            let longest = tokens.iter().map(|t| {
                if req.mode == Mode::FirstToken {
                    1
                } else {
                    t.len()
                }
            });
            deepest = deepest.max(suffix.len() + longest.max().unwrap_or(0));
            // With `prior`: the same options after the content-free state,
            // unless the cache has what they score there.
            let (mut prior_kept, mut prior_key) = (None, None);
            if let Some((shared, own, cf_suffixes)) = content_free.as_mut() {
                let cf_suffix = cf_suffixes.next().expect("one suffix per asked text");
                let branch: Vec<u32> = own.iter().chain(&cf_suffix).copied().collect();
                let k = prior_cache::key(req.mode as u32, &branch, &tokens);
                match cache.and_then(|c| c.get(&k)) {
                    Some(kept) => prior_kept = Some(kept),
                    None => {
                        let before = tree.nodes.len();
                        let mut node = None;
                        for &t in &branch {
                            tree.nodes.push((t, node));
                            node = Some(tree.nodes.len() - 1);
                        }
                        let last =
                            node.ok_or_else(|| DecideError::Tokenizer("empty question".into()))?;
                        tree.prefix_roots.push((before, *shared));
                        let cf_options = under(&mut tree, last);
                        prior_options.push(cf_options);
                        prior_key = Some(k);
                    }
                }
            }
            questions.push(PlannedQuestion {
                id: q.id.clone(),
                kind: q.kind,
                labels,
                suffix: suffix.len(),
                options,
                listings: Vec::new(),
                priors: Vec::new(),
                prior_options: prior_options.pop().unwrap_or_default(),
                prior_kept,
                prior_key,
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
                speculate: true,
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

    /// For each `label` question: per listing, the tokens after the state
    /// (the listing's suffix) and the letter token of each option in the
    /// order asked. Scoring the letters after state + suffix alone gives
    /// what the tree gives in one pass.
    pub fn label_sequences(&self) -> Vec<Vec<(Vec<u32>, Vec<u32>)>> {
        self.questions
            .iter()
            .map(|q| {
                q.listings
                    .iter()
                    .map(|ends| {
                        let mut tokens = Vec::new();
                        let mut node = Some(self.tree.ends[ends[0]].0);
                        while let Some(n) = node {
                            tokens.push(self.tree.nodes[n].0);
                            node = self.tree.nodes[n].1;
                        }
                        tokens.reverse();
                        let letters = ends.iter().map(|&e| self.tree.ends[e].1).collect();
                        (tokens, letters)
                    })
                    .collect()
            })
            .collect()
    }

    /// For each `label` question with `prior`: per listing, the whole
    /// content-free sequence its letters follow (the prompt tokens it
    /// shares, then its own branch) and its letter tokens in the order
    /// asked.
    pub fn prior_sequences(&self) -> Vec<Vec<(Vec<u32>, Vec<u32>)>> {
        self.questions
            .iter()
            .map(|q| {
                q.priors
                    .iter()
                    .map(|ends| {
                        let mut tokens = Vec::new();
                        let mut node = Some(self.tree.ends[ends[0]].0);
                        let mut root = 0;
                        while let Some(n) = node {
                            tokens.push(self.tree.nodes[n].0);
                            root = n;
                            node = self.tree.nodes[n].1;
                        }
                        let k = self
                            .tree
                            .prefix_roots
                            .iter()
                            .find(|&&(r, _)| r == root)
                            .map_or(self.prompt.len(), |&(_, k)| k);
                        tokens.extend(self.prompt[..k].iter().rev());
                        tokens.reverse();
                        let letters = ends.iter().map(|&e| self.tree.ends[e].1).collect();
                        (tokens, letters)
                    })
                    .collect()
            })
            .collect()
    }

    /// Rows the pass runs besides the state: every suffix and option token.
    pub fn tree_rows(&self) -> usize {
        self.tree.nodes.len()
    }
}

/// Each option's tokens as a branch under node `after` (options sharing a
/// first token share its node), every option token scored and, but in
/// `first_token` mode, the end marker after its last token; per option its
/// indices into the tree's `scored` and `ends`.
fn options_under(
    tree: &mut ScoreTree,
    after: usize,
    tokens: &[Vec<u32>],
    mode: Mode,
    end_token: u32,
    children: &mut HashMap<(Option<usize>, u32), usize>,
    scored_of: &mut HashMap<usize, usize>,
) -> Vec<(Vec<usize>, usize)> {
    let mut options = Vec::with_capacity(tokens.len());
    for t in tokens {
        let used = if mode == Mode::FirstToken {
            &t[..1]
        } else {
            &t[..]
        };
        let mut node = after;
        let mut scored = Vec::with_capacity(used.len());
        for &token in used {
            let n = *children.entry((Some(node), token)).or_insert_with(|| {
                tree.nodes.push((token, Some(node)));
                tree.nodes.len() - 1
            });
            let s = *scored_of.entry(n).or_insert_with(|| {
                tree.scored.push(n);
                tree.scored.len() - 1
            });
            scored.push(s);
            node = n;
        }
        let end = tree.ends.len();
        if mode != Mode::FirstToken {
            tree.ends.push((node, end_token));
        }
        options.push((scored, end));
    }
    options
}

/// The content-free state `prior` debiasing scores the question after.
const CONTENT_FREE: &str = "N/A";

/// The state's prompt tokens and the suffix of each asked text.
fn tokenize_state(
    state: &State,
    all_texts: &[&str],
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
) -> Result<Tokenized, DecideError> {
    let tok_err =
        |e: spindle_model::tokenizer::TokenizerError| DecideError::Tokenizer(e.to_string());
    match state {
        State::Text(text) => {
            if text.trim().is_empty() {
                return Err(DecideError::EmptyState);
            }
            let prompt = tokenizer.encode(text, true, false).map_err(tok_err)?;
            let mut suffixes = Vec::new();
            for asked in all_texts {
                let text = format!("\n\n{asked}");
                suffixes.push(tokenizer.encode(&text, false, false).map_err(tok_err)?);
            }
            let newline = tokenizer.encode("\n", false, false).map_err(tok_err)?;
            let framing = Framing {
                label_prefix: " ",
                end_token: *newline
                    .first()
                    .ok_or_else(|| DecideError::Tokenizer("\"\\n\" has no token".into()))?,
            };
            Ok(Tokenized {
                prompt,
                suffixes,
                framing,
            })
        }
        State::Messages(messages) => chat_prompt(all_texts, messages, tokenizer, template),
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
    if let Some(i) = q.instructions.as_deref().filter(|i| !i.trim().is_empty()) {
        s.push_str(i.trim());
        s.push('\n');
    }
    let asked = asked_question(q);
    let hint = if matches!(q.kind, Kind::YesNo | Kind::Noul) {
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

/// What `q` is asked as: in `label` mode one listing of the options under
/// letters per ordering (the canonical order, options sorted by label, and
/// with `permute` each of its cyclic shifts); else the one question text.
fn asked(
    instructions: Option<&str>,
    q: &Question,
    mode: Mode,
    debias: Debias,
) -> Result<Asked, DecideError> {
    if mode != Mode::Label {
        return Ok(Asked {
            texts: vec![question_text(instructions, q)],
            orders: Vec::new(),
        });
    }
    let labels = labels(q);
    let n = labels.len();
    if n > MAX_LABELS {
        return Err(DecideError::TooManyLabels {
            id: q.id.clone(),
            n,
        });
    }
    let mut canonical: Vec<usize> = (0..n).collect();
    canonical.sort_by(|&a, &b| labels[a].cmp(&labels[b]));
    let shifts = if debias.uses_permute() { n } else { 1 };
    let orders: Vec<Vec<usize>> = (0..shifts)
        .map(|k| (0..n).map(|p| canonical[(p + k) % n]).collect())
        .collect();
    let description = |i: usize| q.options.get(i).and_then(|o| o.description());
    let texts = orders
        .iter()
        .map(|order| {
            let mut s = String::new();
            for i in [instructions, q.instructions.as_deref()]
                .into_iter()
                .flatten()
            {
                if !i.trim().is_empty() {
                    s.push_str(i.trim());
                    s.push('\n');
                }
            }
            s.push_str(&format!("Question: {}\n", asked_question(q).trim()));
            for (p, &i) in order.iter().enumerate() {
                let letter = char::from(b'A' + p as u8);
                match description(i) {
                    Some(d) => s.push_str(&format!("{letter}. {}: {}\n", labels[i], d.trim())),
                    None => s.push_str(&format!("{letter}. {}\n", labels[i])),
                }
            }
            s.push_str("Answer:");
            s
        })
        .collect();
    Ok(Asked { texts, orders })
}

/// The token of each of the first `n` letters as an answer (after
/// `prefix`); a letter that is not one token is an error.
fn label_tokens(tokenizer: &Tokenizer, prefix: &str, n: usize) -> Result<Vec<u32>, DecideError> {
    (0..n)
        .map(|p| {
            let text = format!("{prefix}{}", char::from(b'A' + p as u8));
            match tokenizer.encode(&text, false, false) {
                Ok(t) if t.len() == 1 => Ok(t[0]),
                Ok(_) => Err(DecideError::LabelTokens(text.trim().to_string())),
                Err(e) => Err(DecideError::Tokenizer(e.to_string())),
            }
        })
        .collect()
}

/// The question as asked: its text, else a score's criteria, else its id
/// with underscores as spaces.
fn asked_question(q: &Question) -> String {
    match (&q.question, &q.criteria) {
        (Some(t), _) => t.clone(),
        (None, Some(c)) => format!("Rate: {c}"),
        (None, None) => q.id.replace('_', " "),
    }
}

fn labels(q: &Question) -> Vec<String> {
    match q.kind {
        Kind::YesNo | Kind::Noul => vec!["yes".into(), "no".into()],
        Kind::Score if q.options.is_empty() => (1..=5).map(|i| i.to_string()).collect(),
        _ => q.options.iter().map(|o| o.label().to_string()).collect(),
    }
}

/// The state as a conversation and each question asked after it: at the
/// end of the last turn if that is the user's (templates want roles to
/// alternate), else in a new user turn; the answer is the assistant's
/// reply, closed by what the template writes after a reply.
fn chat_prompt(
    asked_texts: &[&str],
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
    for text in asked_texts {
        let asked = format!("{lead}{text}");
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
            Kind::YesNo | Kind::Noul if !q.options.is_empty() => {
                return Err(DecideError::YesNoOptions(q.id.clone()))
            }
            Kind::YesNo | Kind::Noul => {}
            Kind::Score if q.options.is_empty() => {}
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
