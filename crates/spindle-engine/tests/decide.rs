//! Decisions on the real default model: options scored as one token tree
//! in one pass equal each option scored alone by plain scoring, and the
//! contract holds (probabilities sum to 1, the selected option carries its
//! own probability, option order and other questions change nothing, bad
//! options are refused by name).

mod common;

use spindle_engine::decide::{
    decide, decide_with, Debias, DecideError, DecisionPlan, DecisionRequest, Kind, Mode,
    OptionSpec, PriorCache, Question, RunError, State,
};
use spindle_engine::scheduler::{spawn_engine, EngineConfig, EngineHandle};
use spindle_engine::score::score;
use spindle_model::chat_template::{ChatMessage, ChatTemplate};
use spindle_model::tokenizer::Tokenizer;
use spindle_model::LoadedModel;

const STATE: &str = "Incident report. Since 09:30 UTC the checkout service returns HTTP 500 \
for every request. Payments fail for all customers in every region. The database shows \
connection errors. The on-call engineer acknowledged the alert at 09:41.";

struct Setup {
    engine: EngineHandle,
    reference: LoadedModel,
    tok: Tokenizer,
    template: ChatTemplate,
}

fn setup() -> Option<Setup> {
    let path = common::real_model()?;
    let reference = spindle_model::load(&path, 2).unwrap();
    let tok = reference.tokenizer.clone().unwrap();
    let template = ChatTemplate::for_tokenizer(&tok);
    let model = spindle_model::load(&path, 2).unwrap().model;
    let kv = model.new_kv_cache(model.default_kv_type(), 1024, 2);
    let engine = spawn_engine(model, kv, EngineConfig::default());
    Some(Setup {
        engine,
        reference,
        tok,
        template,
    })
}

fn choice(id: &str, options: &[&str]) -> Question {
    Question {
        id: id.into(),
        kind: Kind::Choice,
        question: None,
        options: options
            .iter()
            .map(|o| OptionSpec::Label(o.to_string()))
            .collect(),
        instructions: None,
        criteria: None,
    }
}

fn questions() -> Vec<Question> {
    vec![
        choice("severity", &["critical", "high", "medium", "low"]),
        Question {
            id: "customers_affected".into(),
            kind: Kind::YesNo,
            question: Some("Are customers affected?".into()),
            options: vec![],
            instructions: None,
            criteria: None,
        },
        Question {
            id: "next_action".into(),
            kind: Kind::Choice,
            question: None,
            options: vec![
                OptionSpec::Described {
                    label: "page_team".into(),
                    description: Some("wake the team that owns checkout".into()),
                },
                OptionSpec::Label("page".into()),
                OptionSpec::Label("gather_evidence".into()),
                OptionSpec::Label("wait".into()),
            ],
            instructions: None,
            criteria: None,
        },
        Question {
            id: "impact".into(),
            kind: Kind::Score,
            question: Some("How large is the impact?".into()),
            options: ["1", "2", "3", "4", "5"]
                .iter()
                .map(|o| OptionSpec::Label(o.to_string()))
                .collect(),
            instructions: None,
            criteria: None,
        },
    ]
}

fn request(state: State, questions: Vec<Question>, mode: Mode) -> DecisionRequest {
    debiased(state, questions, mode, Debias::None)
}

fn debiased(state: State, questions: Vec<Question>, mode: Mode, debias: Debias) -> DecisionRequest {
    DecisionRequest {
        state,
        questions,
        instructions: Some("Answer about the incident above.".into()),
        mode,
        debias,
    }
}

#[test]
fn one_pass_equals_each_option_scored_alone_and_the_contract_holds() {
    let Some(s) = setup() else { return };
    let mut kv = s
        .reference
        .model
        .new_kv_cache(s.reference.model.default_kv_type(), 1024, 1);
    for mode in [Mode::Sum, Mode::Mean] {
        let req = request(State::Text(STATE.into()), questions(), mode);
        let answers = decide(&s.engine, &s.tok, &s.template, &req).unwrap();
        let plan = DecisionPlan::new(&req, &s.tok, &s.template, 1024).unwrap();
        for (q, (a, (suffix, options))) in req
            .questions
            .iter()
            .zip(answers.iter().zip(plan.option_sequences()))
        {
            assert_eq!(a.id, q.id);
            // Each option alone: plain scoring of state + suffix + option
            // + end marker, its option tokens and end marker summed.
            let raw: Vec<f64> = options
                .iter()
                .map(|seq| {
                    let mut all = plan.prompt.clone();
                    all.extend(seq);
                    let lp = score(&s.reference.model, &mut kv, &all, 0).unwrap();
                    let own = &lp[plan.prompt.len() - 1 + suffix..];
                    let sum: f64 = own.iter().map(|p| p.logprob).sum();
                    if mode == Mode::Mean {
                        sum / own.len() as f64
                    } else {
                        sum
                    }
                })
                .collect();
            let max = raw.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + raw.iter().map(|r| (r - max).exp()).sum::<f64>().ln();
            for (i, (label, lp)) in a.logprobs.iter().enumerate() {
                assert!(
                    (lp - (raw[i] - lse)).abs() < 1e-6,
                    "{mode:?} {}: {label} {lp} against {}",
                    q.id,
                    raw[i] - lse
                );
            }
            let sum: f64 = a.probabilities.iter().map(|(_, p)| p).sum();
            assert!((sum - 1.0).abs() < 1e-9, "{sum}");
            assert!(a
                .probabilities
                .iter()
                .all(|(_, p)| p.is_finite() && *p >= 0.0));
            let best = a
                .probabilities
                .iter()
                .max_by(|x, y| x.1.total_cmp(&y.1))
                .unwrap();
            assert_eq!(a.selected, best.0);
            assert_eq!(Some(a.confidence), a.probability(&a.selected));
            assert_eq!(a.expected.is_some(), q.kind == Kind::Score);
        }
    }
    // The model reads the incident: payments fail for all customers.
    let req = request(State::Text(STATE.into()), questions(), Mode::Sum);
    let answers = decide(&s.engine, &s.tok, &s.template, &req).unwrap();
    assert_eq!(answers[1].selected, "yes", "{:?}", answers[1]);
}

#[test]
fn option_order_and_other_questions_change_no_probability() {
    let Some(s) = setup() else { return };
    let all = decide(
        &s.engine,
        &s.tok,
        &s.template,
        &request(State::Text(STATE.into()), questions(), Mode::Sum),
    )
    .unwrap();
    for (i, q) in questions().into_iter().enumerate() {
        // Options in another order (a scale's too: only its `expected`
        // reads the order).
        let mut q = q;
        q.options.reverse();
        let alone = decide(
            &s.engine,
            &s.tok,
            &s.template,
            &request(State::Text(STATE.into()), vec![q], Mode::Sum),
        )
        .unwrap();
        for (label, p) in &all[i].probabilities {
            let other = alone[0].probability(label).unwrap();
            assert!((p - other).abs() < 1e-6, "{label}: {p} against {other}");
        }
        assert_eq!(alone[0].selected, all[i].selected);
        if let (Some(a), Some(b)) = (all[i].expected, alone[0].expected) {
            let n = all[i].probabilities.len() as f64;
            assert!(
                (a - (n - 1.0 - b)).abs() < 1e-6,
                "a reversed scale mirrors `expected`"
            );
        }
    }
}

#[test]
fn chat_states_first_token_mode_and_bad_options() {
    let Some(s) = setup() else { return };
    let chat = State::Messages(vec![
        ChatMessage::new("system", "You triage incidents."),
        ChatMessage::new("user", STATE),
    ]);
    let qs = vec![choice("severity", &["critical", "low"])];
    let a = decide(
        &s.engine,
        &s.tok,
        &s.template,
        &request(chat.clone(), qs.clone(), Mode::Sum),
    )
    .unwrap();
    let sum: f64 = a[0].probabilities.iter().map(|(_, p)| p).sum();
    assert!((sum - 1.0).abs() < 1e-9);
    // Asked again, the state comes from the prefix cache: same answer.
    let hits = || {
        s.engine
            .metrics
            .prefix_cache_hits
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = hits();
    let b = decide(
        &s.engine,
        &s.tok,
        &s.template,
        &request(chat, qs, Mode::Sum),
    )
    .unwrap();
    assert!(hits() > before);
    assert_eq!(a, b);

    let first = decide(
        &s.engine,
        &s.tok,
        &s.template,
        &request(
            State::Text(STATE.into()),
            vec![choice("severity", &["critical", "low"])],
            Mode::FirstToken,
        ),
    )
    .unwrap();
    assert!(first[0].logprobs.iter().all(|(_, l)| l.is_finite()));

    let bad = |qs: Vec<Question>, mode: Mode| -> DecideError {
        match decide(
            &s.engine,
            &s.tok,
            &s.template,
            &request(State::Text(STATE.into()), qs, mode),
        ) {
            Err(RunError::Invalid(e)) => e,
            other => panic!("accepted: {other:?}"),
        }
    };
    assert_eq!(
        bad(vec![choice("a", &["x", "y", "x"])], Mode::Sum),
        DecideError::DuplicateOption {
            id: "a".into(),
            option: "x".into()
        }
    );
    assert!(matches!(
        bad(vec![choice("a", &["x", " "])], Mode::Sum),
        DecideError::EmptyOption { index: 1, .. }
    ));
    assert!(matches!(
        bad(vec![choice("a", &["x"])], Mode::Sum),
        DecideError::OptionCount { n: 1, .. }
    ));
    assert_eq!(
        bad(
            vec![choice("a", &["x", "y"]), choice("a", &["x", "z"])],
            Mode::Sum
        ),
        DecideError::DuplicateId("a".into())
    );
    let mut yn = choice("b", &["yes", "no"]);
    yn.kind = Kind::YesNo;
    assert_eq!(
        bad(vec![yn], Mode::Sum),
        DecideError::YesNoOptions("b".into())
    );
    // " page" and " page_team" share their first token.
    assert!(matches!(
        bad(vec![choice("c", &["page", "page_team"])], Mode::FirstToken),
        DecideError::SameFirstToken { .. }
    ));
    assert_eq!(bad(vec![], Mode::Sum), DecideError::NoQuestions);
}

/// `label` mode: each listing's letters scored in the one pass equal the
/// letters scored after that listing alone; with `permute` an option's
/// log-probability is the mean over the cyclic shifts of its letter's
/// log-softmax, and option order, other questions alongside and which
/// letter an option was first given change no probability.
#[test]
fn label_mode_one_pass_equals_each_listing_alone_and_permute_is_invariant() {
    let Some(s) = setup() else { return };
    let mut kv = s
        .reference
        .model
        .new_kv_cache(s.reference.model.default_kv_type(), 1024, 1);
    let log_softmax = |raw: &[f64]| -> Vec<f64> {
        let max = raw.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + raw.iter().map(|r| (r - max).exp()).sum::<f64>().ln();
        raw.iter().map(|r| r - lse).collect()
    };
    for debias in [Debias::None, Debias::Permute, Debias::Prior, Debias::Both] {
        let req = debiased(State::Text(STATE.into()), questions(), Mode::Label, debias);
        let answers = decide(&s.engine, &s.tok, &s.template, &req).unwrap();
        let plan = DecisionPlan::new(&req, &s.tok, &s.template, 1024).unwrap();
        for (q, ((a, listings), priors)) in req.questions.iter().zip(
            answers
                .iter()
                .zip(plan.label_sequences())
                .zip(plan.prior_sequences()),
        ) {
            let n = a.probabilities.len();
            assert_eq!(listings.len(), if debias.uses_permute() { n } else { 1 });
            assert_eq!(
                priors.len(),
                if debias.uses_prior() {
                    listings.len()
                } else {
                    0
                }
            );
            // The log-probs of each letter after `before`, scored alone.
            let mut letters_after = |before: &[u32], letters: &[u32]| -> Vec<f64> {
                let raw: Vec<f64> = letters
                    .iter()
                    .map(|&l| {
                        let mut seq = before.to_vec();
                        seq.push(l);
                        score(&s.reference.model, &mut kv, &seq, 0)
                            .unwrap()
                            .last()
                            .unwrap()
                            .logprob
                    })
                    .collect();
                log_softmax(&raw)
            };
            let mut mean = vec![0.0f64; n];
            for (j, (suffix, letters)) in listings.iter().enumerate() {
                let mut all = plan.prompt.clone();
                all.extend(suffix);
                let mut lp = letters_after(&all, letters);
                if let Some((cf, cf_letters)) = priors.get(j) {
                    assert_eq!(cf_letters, letters);
                    assert!(
                        !cf.windows(5).any(|w| w == &plan.prompt[1..6]),
                        "the state leaks"
                    );
                    let prior = letters_after(cf, cf_letters);
                    let diff: Vec<f64> = lp.iter().zip(&prior).map(|(a, b)| a - b).collect();
                    lp = log_softmax(&diff);
                }
                for (m, l) in mean.iter_mut().zip(&lp) {
                    *m += l / listings.len() as f64;
                }
            }
            let max = mean.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + mean.iter().map(|r| (r - max).exp()).sum::<f64>().ln();
            for (i, (label, lp)) in a.logprobs.iter().enumerate() {
                assert!(
                    (lp - (mean[i] - lse)).abs() < 1e-6,
                    "{debias:?} {}: {label} {lp} against {}",
                    q.id,
                    mean[i] - lse
                );
            }
            assert_eq!(Some(a.confidence), a.probability(&a.selected));
        }
        // Options rotated (so each gets another letter in the order asked)
        // and asked alone: the same probabilities.
        for (i, q) in questions().into_iter().enumerate() {
            let mut q = q;
            if !q.options.is_empty() {
                q.options.rotate_left(1);
            }
            let alone = decide(
                &s.engine,
                &s.tok,
                &s.template,
                &debiased(State::Text(STATE.into()), vec![q], Mode::Label, debias),
            )
            .unwrap();
            for (label, p) in &answers[i].probabilities {
                let other = alone[0].probability(label).unwrap();
                assert!((p - other).abs() < 1e-6, "{label}: {p} against {other}");
            }
        }
    }
}

/// A one-token option among longer ones: `sum` hands it nearly all the
/// probability for its length alone (the example); `label` with
/// `permute` scores letters, so length cannot pay, and the default (blend
/// with prior) divides the length's cost out.
#[test]
fn a_one_token_option_is_not_favoured_for_its_length_in_label_mode() {
    let Some(s) = setup() else { return };
    let state = "Alert: payments-api error rate 38% since the 08:02 deploy. \
                 Customers report checkout failures.";
    let q = vec![choice(
        "next_action",
        &["inspect_logs", "check_deployment", "page_team", "stop"],
    )];
    let tokens = |o: &str| s.tok.encode(&format!(" {o}"), false, false).unwrap().len();
    assert_eq!(tokens("stop"), 1);
    assert!(["inspect_logs", "check_deployment", "page_team"]
        .iter()
        .all(|o| tokens(o) >= 3));
    let p_stop = |mode, debias| {
        let req = debiased(State::Text(state.into()), q.clone(), mode, debias);
        decide(&s.engine, &s.tok, &s.template, &req).unwrap()[0]
            .probability("stop")
            .unwrap()
    };
    let sum = p_stop(Mode::Sum, Debias::None);
    let label = p_stop(Mode::Label, Debias::Permute);
    assert!(sum > 0.99, "sum: {sum}");
    assert!(label < 0.5, "label/permute: {label}");
    // The default divides out what the same options get after a
    // content-free state, where length costs the same.
    let default = p_stop(Mode::default(), Debias::default());
    assert!(default < 0.5, "default: {default}");
}

#[test]
fn label_mode_errors_name_the_problem() {
    let Some(s) = setup() else { return };
    let plan = |req: &DecisionRequest| DecisionPlan::new(req, &s.tok, &s.template, 1024).err();
    let text = || State::Text(STATE.into());
    assert_eq!(
        plan(&debiased(text(), questions(), Mode::Sum, Debias::Permute)),
        Some(DecideError::DebiasNeedsLabel("permute"))
    );
    let many: Vec<String> = (0..27).map(|i| format!("option {i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert_eq!(
        plan(&debiased(
            text(),
            vec![choice("pick", &many)],
            Mode::Label,
            Debias::None
        )),
        Some(DecideError::TooManyLabels {
            id: "pick".into(),
            n: 27
        })
    );
    // 26 options: every letter is one token.
    assert_eq!(
        plan(&debiased(
            text(),
            vec![choice("pick", &many[..26])],
            Mode::Label,
            Debias::None
        )),
        None
    );
}

/// `prior` in any mode: the answer is the undebiased one with the
/// content-free state's ("N/A") undebiased answer divided out, and that
/// content-free branch, run inside the same pass, equals asking about "N/A"
/// on its own.
#[test]
fn prior_divides_out_the_content_free_answer_in_every_mode() {
    let Some(s) = setup() else { return };
    let qs = vec![
        choice("severity", &["critical", "high", "medium", "low"]),
        choice("next_action", &["page_team", "gather_evidence", "wait"]),
    ];
    for mode in [Mode::Sum, Mode::Mean, Mode::FirstToken, Mode::Label] {
        let ask = |state: &str, debias| {
            let req = debiased(State::Text(state.into()), qs.clone(), mode, debias);
            decide(&s.engine, &s.tok, &s.template, &req).unwrap()
        };
        let (with, plain, free) = (
            ask(STATE, Debias::Prior),
            ask(STATE, Debias::None),
            ask("N/A", Debias::None),
        );
        for ((w, p), f) in with.iter().zip(&plain).zip(&free) {
            let raw: Vec<f64> = p
                .logprobs
                .iter()
                .zip(&f.logprobs)
                .map(|((_, a), (_, b))| a - b)
                .collect();
            let max = raw.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + raw.iter().map(|r| (r - max).exp()).sum::<f64>().ln();
            for ((label, lp), r) in w.logprobs.iter().zip(&raw) {
                assert!(
                    (lp - (r - lse)).abs() < 1e-6,
                    "{mode:?} {}: {label} {lp} against {}",
                    w.id,
                    r - lse
                );
            }
        }
    }
}

/// `blend` is the geometric mean of `sum` and `first_token`, each asked on
/// its own with the same debias, renormalised; where options share a first
/// token it is `sum`.
#[test]
fn blend_is_the_geometric_mean_of_sum_and_first_token() {
    let Some(s) = setup() else { return };
    let distinct = vec![
        choice("severity", &["critical", "high", "medium", "low"]),
        choice("next_action", &["page_team", "gather_evidence", "wait"]),
    ];
    let ask = |qs: &Vec<Question>, mode, debias| {
        let req = debiased(State::Text(STATE.into()), qs.clone(), mode, debias);
        decide(&s.engine, &s.tok, &s.template, &req).unwrap()
    };
    for debias in [Debias::None, Debias::Prior] {
        // The same rows as `sum`: blend costs what sum costs.
        let rows = |mode| {
            let req = debiased(State::Text(STATE.into()), distinct.clone(), mode, debias);
            let plan = DecisionPlan::new(&req, &s.tok, &s.template, 1024).unwrap();
            (plan.tree_rows(), plan.tree.ends.len())
        };
        assert_eq!(rows(Mode::Blend), rows(Mode::Sum));
        let blend = ask(&distinct, Mode::Blend, debias);
        let sum = ask(&distinct, Mode::Sum, debias);
        let first = ask(&distinct, Mode::FirstToken, debias);
        for ((b, s), f) in blend.iter().zip(&sum).zip(&first) {
            let raw: Vec<f64> = s
                .logprobs
                .iter()
                .zip(&f.logprobs)
                .map(|((_, a), (_, b))| (a + b) / 2.0)
                .collect();
            let max = raw.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + raw.iter().map(|r| (r - max).exp()).sum::<f64>().ln();
            for ((label, lp), r) in b.logprobs.iter().zip(&raw) {
                assert!(
                    (lp - (r - lse)).abs() < 1e-9,
                    "{debias:?} {}: {label} {lp} against {}",
                    b.id,
                    r - lse
                );
            }
        }
    }
    // "page" and "page_team" start with the same token: blend is sum there.
    let shared = vec![choice("c", &["page", "page_team", "wait"])];
    let blend = ask(&shared, Mode::Blend, Debias::Prior);
    let sum = ask(&shared, Mode::Sum, Debias::Prior);
    for ((label, b), (_, s)) in blend[0].logprobs.iter().zip(&sum[0].logprobs) {
        assert!((b - s).abs() < 1e-12, "{label}: {b} against {s}");
    }
}

/// The default debias (`prior`) on a state longer than the model's
/// sliding window: the content-free branch needs none of the state's KV
/// (the sliding layers have dropped its first blocks by then), so the
/// decision still comes from one pass and still divides the prior out.
#[test]
fn the_default_prior_works_on_states_longer_than_the_sliding_window() {
    let Some(s) = setup() else { return };
    let long = [STATE; 14].join(" ");
    assert!(s.tok.encode(&long, true, false).unwrap().len() > 520);
    let qs = vec![choice("severity", &["critical", "high", "medium", "low"])];
    assert_eq!(
        (Mode::default(), Debias::default()),
        (Mode::Blend, Debias::Prior)
    );
    // The default debias under `sum`, whose parts are simplest to check
    // (blend's are `sum`'s and `first_token`'s: the test above).
    let req = DecisionRequest {
        debias: Debias::default(),
        ..request(State::Text(long.clone()), qs.clone(), Mode::Sum)
    };
    let with = decide(&s.engine, &s.tok, &s.template, &req).unwrap();
    let plain = decide(
        &s.engine,
        &s.tok,
        &s.template,
        &request(State::Text(long), qs.clone(), Mode::Sum),
    )
    .unwrap();
    let free = decide(
        &s.engine,
        &s.tok,
        &s.template,
        &request(State::Text("N/A".into()), qs, Mode::Sum),
    )
    .unwrap();
    let raw: Vec<f64> = plain[0]
        .logprobs
        .iter()
        .zip(&free[0].logprobs)
        .map(|((_, a), (_, b))| a - b)
        .collect();
    let max = raw.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + raw.iter().map(|r| (r - max).exp()).sum::<f64>().ln();
    for ((label, lp), r) in with[0].logprobs.iter().zip(&raw) {
        assert!(
            (lp - (r - lse)).abs() < 1e-6,
            "{label}: {lp} against {}",
            r - lse
        );
    }
}

/// Content-free answers kept between decisions: the same questions about a
/// new state need no content-free branch (fewer rows in the pass) and give
/// the same probabilities as when the branch runs.
#[test]
fn kept_priors_skip_the_content_free_branch_and_change_nothing() {
    let Some(s) = setup() else { return };
    let cache = PriorCache::new(1 << 20);
    let qs = questions();
    let ask = |state: &str, cache: Option<&PriorCache>| {
        let req = debiased(
            State::Text(state.into()),
            qs.clone(),
            Mode::Sum,
            Debias::Prior,
        );
        let plan = DecisionPlan::with_priors(&req, &s.tok, &s.template, 1024, cache).unwrap();
        (
            decide_with(&s.engine, &s.tok, &s.template, &req, cache).unwrap(),
            plan.tree_rows(),
        )
    };
    let (first, rows_first) = ask(STATE, Some(&cache));
    assert_eq!(cache.len(), qs.len());
    let other = "Every dashboard is green and no customer has complained today.";
    let (kept, rows_kept) = ask(other, Some(&cache));
    let (fresh, rows_fresh) = ask(other, None);
    assert!(
        rows_kept < rows_fresh,
        "{rows_kept} rows against {rows_fresh}"
    );
    assert_eq!(rows_first, rows_fresh);
    for (a, b) in kept.iter().zip(&fresh) {
        for ((label, p), (_, q)) in a.probabilities.iter().zip(&b.probabilities) {
            assert!((p - q).abs() < 1e-12, "{label}: {p} against {q}");
        }
    }
    assert_eq!(first.len(), qs.len());
}
