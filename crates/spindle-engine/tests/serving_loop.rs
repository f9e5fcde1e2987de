//! The serving loop on the tiny models: many requests at once, with and
//! without speculation, with prefix reuse, each get exactly the tokens plain
//! decoding gives them alone; cancelled requests free their slots; the
//! fair queue lets a small tenant in ahead of a big one's backlog.

mod common;
use common::tiny;

use spindle_engine::scheduler::{
    spawn_engine, EngineConfig, EngineHandle, Event, Request, RequestParams, SubmitError,
};
use spindle_engine::{generate, ErrorKind, FinishReason, GenerateRequest, SamplerConfig};
use spindle_model::LoadedModel;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

fn sampler(i: u64) -> SamplerConfig {
    if i.is_multiple_of(2) {
        SamplerConfig::default()
    } else {
        SamplerConfig {
            temperature: 0.8,
            top_p: 0.9,
            seed: i,
            ..SamplerConfig::default()
        }
    }
}

/// Prompts that share beginnings (prefix reuse) and repeat themselves
/// (n-gram drafts).
fn prompt(i: u64) -> Vec<u32> {
    let mut p: Vec<u32> = (0..12).map(|k| (k * 17 + 3) % 200).collect();
    p.extend((0..(i % 5) * 3).map(|k| ((k * 31 + i * 7) % 150) as u32 + 20));
    p.extend([5, 6, 7, 5, 6, 7, 5, 6]);
    p
}

fn params(i: u64, max_tokens: usize) -> RequestParams {
    RequestParams {
        max_tokens,
        sampler: sampler(i),
        stop_ids: Vec::new(),
        logit_bias: Vec::new(),
        logprobs: None,
        constraint: None,
        speculate: true,
    }
}

/// Plain decoding of request `i` alone.
fn alone(m: &LoadedModel, i: u64, max_tokens: usize) -> Vec<u32> {
    let mut kv = m.model.new_kv_cache(m.model.default_kv_type(), 128, 1);
    let req = GenerateRequest {
        prompt: prompt(i),
        max_tokens,
        sampler: sampler(i),
        stop_ids: Vec::new(),
        constraint: None,
    };
    generate(&m.model, &mut kv, &req, |_| true).unwrap().tokens
}

fn engine(arch: &str, max_seqs: usize, config: EngineConfig) -> EngineHandle {
    let m = tiny(arch);
    let kv = m
        .model
        .new_kv_cache(m.model.default_kv_type(), 128, max_seqs);
    spawn_engine(m.model, kv, config)
}

fn submit(e: &EngineHandle, i: u64, max_tokens: usize, tenant: &str) -> UnboundedReceiver<Event> {
    let (tx, rx) = unbounded_channel();
    e.submit(Request {
        prompt: prompt(i),
        params: params(i, max_tokens),
        tenant: tenant.into(),
        score: None,
        events: tx,
    })
    .unwrap();
    rx
}

/// Tokens until the request finishes (after `seen` already received).
fn collect_after(rx: &mut UnboundedReceiver<Event>, seen: usize) -> (Vec<u32>, FinishReason) {
    let mut tokens = Vec::new();
    loop {
        match rx.blocking_recv().expect("the engine answers") {
            Event::Token { id, .. } => tokens.push(id),
            Event::Finished(f) => {
                assert_eq!(f.completion_tokens, seen + tokens.len());
                return (tokens, f.reason);
            }
            Event::Error(e) => panic!("{e}"),
            Event::Scores(s) => panic!("a generation request got scores: {s:?}"),
            Event::Speculated { drafted, accepted } => {
                // One per pass that chose tokens; 0 drafted in a plain pass.
                assert!(accepted <= drafted, "{drafted} {accepted}");
            }
        }
    }
}

fn collect(rx: &mut UnboundedReceiver<Event>) -> (Vec<u32>, FinishReason) {
    collect_after(rx, 0)
}

/// Submits request `i` for `lens[i]` tokens each at once (from `tenants`
/// tenants in turn) and checks that each gets what it gets alone.
fn expect_solo_tokens(
    e: &EngineHandle,
    m: &LoadedModel,
    lens: &[usize],
    tenants: u64,
    context: &str,
) {
    let mut rxs: Vec<_> = (0..lens.len() as u64)
        .map(|i| submit(e, i, lens[i as usize], &format!("t{}", i % tenants)))
        .collect();
    for (i, rx) in rxs.iter_mut().enumerate() {
        let (tokens, reason) = collect(rx);
        assert_eq!(reason, FinishReason::Length);
        assert_eq!(
            tokens,
            alone(m, i as u64, lens[i]),
            "{context}, request {i}"
        );
    }
}

#[test]
fn concurrent_requests_get_their_solo_tokens() {
    // qwen3moe and mixtral: rows of one pass route to different experts.
    for arch in ["gemma3", "qwen2", "llama", "qwen3moe", "mixtral", "gpt-oss"] {
        let m = tiny(arch);
        // Off, adaptive (sized from timings) and fixed (every pass drafts
        // as much as the drafter offers, so drafting does not depend on
        // the machine's speed).
        for (spec, fixed) in [(None, false), (Some(16), false), (Some(8), true)] {
            let config = EngineConfig {
                max_batch_tokens: 24,
                tree_budget: spec,
                fixed_tree_budget: fixed,
                ..EngineConfig::default()
            };
            // 4 slots for 12 requests: later ones wait, then reuse the
            // slots (and their cached prefixes) of finished ones.
            let e = engine(arch, 4, config);
            let lens: Vec<usize> = (0..12).map(|i| 5 + (i * 7) % 30).collect();
            let context = format!("{arch}, spec {spec:?} fixed {fixed}");
            expect_solo_tokens(&e, &m, &lens, 3, &context);
            let metrics = &e.metrics;
            let hits = metrics
                .prefix_cache_hits
                .load(std::sync::atomic::Ordering::Relaxed);
            // Requests 0, 5 and 10 share a prompt, whose first 16-token
            // block is cached. (The sliding layers of the tiny gemma3 and
            // gpt-oss have a pool of two blocks per sequence, so other
            // sequences reuse theirs long before request 5 arrives.)
            if arch != "gemma3" && arch != "gpt-oss" {
                assert!(hits >= 16, "{arch}: no prefix was reused");
            }
            if fixed {
                // Whether the tiny random models accept drafts is luck; the
                // trees were verified (and the tokens above are exact).
                let drafted = metrics
                    .spec_drafted
                    .load(std::sync::atomic::Ordering::Relaxed);
                assert!(drafted > 0, "{arch}: nothing was drafted");
            }
        }
    }
}

/// Suffix drafts from the request and from earlier outputs (one tenant),
/// merged with n-gram drafts, adaptive and fixed: every request still gets
/// its solo tokens, and a request that repeats an earlier one's prompt and
/// sampler has that output drafted and accepted.
#[test]
fn drafts_from_earlier_traffic_keep_every_request_exact() {
    use spindle_engine::speculative::{DraftSource, Source, TrafficCache, TrafficConfig};
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::{Arc, Mutex};
    for arch in ["gemma3", "llama"] {
        let m = tiny(arch);
        for fixed in [false, true] {
            let traffic = Arc::new(Mutex::new(TrafficCache::new(TrafficConfig::default())));
            let config = EngineConfig {
                max_batch_tokens: 24,
                tree_budget: Some(8),
                fixed_tree_budget: fixed,
                drafts: DraftSource::auto(Some(traffic.clone())),
                ..EngineConfig::default()
            };
            let e = engine(arch, 4, config);
            let lens: Vec<usize> = (0..12).map(|i| 5 + (i * 7) % 30).collect();
            expect_solo_tokens(&e, &m, &lens, 1, &format!("{arch}, traffic, fixed {fixed}"));
            let stats = traffic.lock().unwrap().stats();
            assert!(stats.outputs >= 8, "{stats:?}");
            if fixed {
                // Request 10 is request 0 again (greedy, same prompt), and
                // runs after it finished.
                let by_source = &e.metrics.spec_by_source[Source::Traffic.index()];
                let (drafted, accepted) = (by_source.0.load(Relaxed), by_source.1.load(Relaxed));
                assert!(
                    accepted >= 4 && drafted >= accepted,
                    "{arch}: {drafted} {accepted}"
                );
                let text = e.metrics.render("m");
                assert!(text.contains("source=\"suffix_traffic\"} "), "{text}");
                assert!(text.contains("spindle:spec_traffic_cache_outputs{model_name=\"m\"} "));
            }
        }
    }
}

/// A KV pool of 8 blocks (128 tokens) for 4 sequences that each grow to
/// 40-66 tokens: the engine must preempt and recompute, and every request
/// still gets exactly its solo tokens; at the end no block is held.
#[test]
fn preempted_requests_are_recomputed_to_their_solo_tokens() {
    use std::sync::atomic::Ordering::Relaxed;
    for arch in ["gemma3", "llama"] {
        let m = tiny(arch);
        for spec in [None, Some(8)] {
            let mut layout = m.model.kv_layout(m.model.default_kv_type(), 128, 4);
            layout.pool_tokens = Some(128);
            let kv = spindle_model::KvCache::new(layout);
            let config = EngineConfig {
                max_batch_tokens: 24,
                tree_budget: spec,
                fixed_tree_budget: true,
                ..EngineConfig::default()
            };
            let m2 = tiny(arch);
            let e = spawn_engine(m2.model, kv, config);
            let lens: Vec<usize> = (0..8).map(|i| 20 + (i * 5) % 20).collect();
            expect_solo_tokens(&e, &m, &lens, 1, &format!("{arch}, spec {spec:?}"));
            let preemptions = e.metrics.preemptions.load(Relaxed);
            assert!(preemptions > 0, "{arch}: nothing was preempted");
            let t = std::time::Instant::now();
            while e.metrics.kv_used.load(Relaxed) != 0 {
                assert!(t.elapsed().as_secs() < 10, "blocks are still held");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }
}

#[test]
fn a_dropped_request_frees_its_slot_and_errors_are_reported() {
    let e = engine("gemma3", 1, EngineConfig::default());
    // The only slot: a long request, dropped after its first token.
    let mut rx = submit(&e, 0, 100, "a");
    assert!(matches!(rx.blocking_recv(), Some(Event::Token { .. })));
    drop(rx);
    // The next request gets the slot and finishes.
    let mut next = submit(&e, 1, 8, "a");
    let (tokens, _) = collect(&mut next);
    assert_eq!(tokens.len(), 8);
    // A prompt longer than the context is refused with a reason, at
    // submission (it never takes a place in the queue).
    let (tx, rx) = unbounded_channel();
    let refused = e.submit(Request {
        prompt: vec![3; 200],
        params: params(0, 4),
        tenant: "a".into(),
        score: None,
        events: tx,
    });
    match refused {
        Err(SubmitError::Refused(err)) => {
            let msg = &err.message;
            assert!(msg.contains("200") && msg.contains("128"), "{msg}");
            assert_eq!(err.kind, ErrorKind::TooLong);
        }
        other => panic!("{other:?}"),
    }
    drop(rx);
    // So are an empty prompt, a token outside the vocabulary and a
    // completion that would outgrow the context; the engine goes on.
    for (prompt, max_tokens, kind) in [
        (vec![], 4, ErrorKind::InvalidRequest),
        (vec![3, 1 << 30], 4, ErrorKind::InvalidRequest),
        (vec![3; 100], 29, ErrorKind::TooLong),
    ] {
        let (tx, _rx) = unbounded_channel();
        let r = e.submit(Request {
            prompt,
            params: params(0, max_tokens),
            tenant: "a".into(),
            score: None,
            events: tx,
        });
        assert!(
            matches!(&r, Err(SubmitError::Refused(err)) if err.kind == kind),
            "{r:?}"
        );
    }
    let mut after = submit(&e, 2, 4, "a");
    assert_eq!(collect(&mut after).0.len(), 4);
}

/// With one slot busy, a big tenant queues 5 requests and then a small
/// tenant 1: how many of the big tenant's requests finished after the
/// small one. They share one event channel, so events arrive in the order
/// the engine sent them, and each is told apart by its length (big ones
/// 4-8 tokens, the small one 3). `None` when the busy request finished
/// before all six were queued (a slow host), so the order says nothing.
fn big_ones_behind_small(fair: bool) -> Option<usize> {
    use std::sync::atomic::Ordering::SeqCst;
    let config = EngineConfig {
        max_waiting: 6,
        fair,
        tree_budget: None,
        ..EngineConfig::default()
    };
    let e = engine("gemma3", 1, config);
    let mut first = submit(&e, 0, 90, "big");
    assert!(matches!(first.blocking_recv(), Some(Event::Token { .. })));
    let (tx, mut events) = unbounded_channel();
    let queue = |i: u64, max_tokens: usize, tenant: &str| {
        e.submit(Request {
            prompt: prompt(i),
            params: params(i, max_tokens),
            tenant: tenant.into(),
            score: None,
            events: tx.clone(),
        })
    };
    for i in 1..6 {
        queue(i, 3 + i as usize, "big").unwrap();
    }
    queue(9, 3, "small").unwrap();
    // Still running: all six reach the queue before its slot frees.
    let in_time = e.metrics.requests_finished.load(SeqCst) == 0;
    // The queue is full now.
    assert!(matches!(
        queue(1, 3, "big"),
        Err(SubmitError::QueueFull { waiting: 6 })
    ));
    drop(tx);
    collect_after(&mut first, 1);
    let mut lengths = Vec::new();
    while let Some(event) = events.blocking_recv() {
        match event {
            Event::Finished(f) => lengths.push(f.completion_tokens),
            Event::Token { .. } | Event::Speculated { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(lengths.len(), 6);
    let small = lengths
        .iter()
        .position(|&n| n == 3)
        .expect("the small one finished");
    in_time.then_some(lengths.len() - 1 - small)
}

/// [`big_ones_behind_small`], tried until the busy request outlasts the
/// queueing.
fn behind(fair: bool) -> usize {
    (0..10)
        .find_map(|_| big_ones_behind_small(fair))
        .expect("in 10 tries the first request always finished before six were queued")
}

#[test]
fn a_full_queue_refuses_and_tenants_take_turns() {
    // Fair: big's first waiting request, then small's, then the rest of big's.
    assert_eq!(behind(true), 4);
    // First come, first served: small waits for all of big's.
    assert_eq!(behind(false), 0);
}

/// A NaN in a weight matrix (which loading does not scan) makes the pass
/// non-finite: each request ends with an internal error that says so,
/// counted in its own metric, instead of tokens chosen from NaN; the
/// engine goes on answering. Plain `generate` stops with the error too.
#[test]
fn a_pass_with_non_finite_values_fails_its_requests_with_the_reason() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../spindle-model/tests/fixtures/tiny/llama/model.gguf");
    let info = spindle_formats::GgufFile::open(&src).unwrap();
    let t = info.tensor("blk.0.ffn_down.weight").unwrap().clone();
    assert_eq!(t.type_id, 0, "an F32 matrix");
    let mut bytes = std::fs::read(&src).unwrap();
    let at = t.offset as usize + 4 * 5;
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, &bytes).unwrap();

    let m = spindle_model::load(&path, 2).expect("only the full scan reads matrices");
    let mut kv = m.model.new_kv_cache(m.model.default_kv_type(), 128, 1);
    let req = GenerateRequest {
        prompt: prompt(0),
        max_tokens: 4,
        sampler: sampler(0),
        stop_ids: Vec::new(),
        constraint: None,
    };
    let e = generate(&m.model, &mut kv, &req, |_| true).unwrap_err();
    assert!(e.to_string().contains("NaN or infinite"), "{e}");

    let kv = m.model.new_kv_cache(m.model.default_kv_type(), 128, 2);
    let e = spawn_engine(m.model, kv, EngineConfig::default());
    for round in 0..2 {
        let mut rxs: Vec<_> = (0..2).map(|i| submit(&e, i, 8, "t")).collect();
        for rx in &mut rxs {
            match rx.blocking_recv().expect("the engine answers") {
                Event::Error(err) => {
                    assert_eq!(err.kind, ErrorKind::Internal, "round {round}");
                    assert!(err.message.contains("NaN or infinite"), "{err}");
                }
                other => panic!("round {round}: expected an error, got {other:?}"),
            }
        }
    }
    let counted = |name: &str| {
        let text = e.metrics.render("m");
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
    };
    assert_eq!(counted("spindle:request_failed_non_finite_total"), 4.0);
    assert_eq!(counted("spindle:request_failed_total"), 4.0);
}
