//! Counters and latency histograms of the engine, shared with the server,
//! which renders them in Prometheus' text format: vLLM's metric names under
//! `spindle:`, and beside them the `vllm:` gauges that endpoint pickers
//! (the Kubernetes Gateway API Inference Extension, llm-d) read from any
//! vLLM-compatible server to route requests between replicas.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use spindle_model::KvCache;

use crate::speculative::token_tree::{Node, MAX_DEPTH};
use crate::speculative::{Source, TokenTree, TrafficStats};

/// Upper bounds (seconds) of the latency buckets.
const BUCKETS: [f64; 18] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0,
    40.0, 80.0,
];

/// A cumulative histogram of seconds.
#[derive(Debug, Default, Clone)]
pub struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    pub fn observe(&mut self, seconds: f64) {
        for (c, &b) in self.counts.iter_mut().zip(&BUCKETS) {
            if seconds <= b {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (c, b) in self.counts.iter().zip(&BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// What the engine has done, updated as it runs.
#[derive(Debug, Default)]
pub struct Metrics {
    pub requests_running: AtomicU64,
    pub requests_waiting: AtomicU64,
    /// Bytes of KV blocks that sequences hold, and of the whole pool.
    pub kv_used: AtomicU64,
    pub kv_capacity: AtomicU64,
    /// Blocks of the KV pool (every layer group), and tokens per block.
    pub kv_blocks: AtomicU64,
    pub kv_block_tokens: AtomicU64,
    pub prefix_cache_queries: AtomicU64,
    pub prefix_cache_hits: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    /// Requests that ended well (a stop, or the token limit).
    pub requests_finished: AtomicU64,
    /// Of those, the ones that ended at the token limit or the context.
    pub requests_finished_length: AtomicU64,
    /// Requests whose client went away (cancelled, waiting or running).
    pub requests_cancelled: AtomicU64,
    /// Requests ended by an error of the engine.
    pub requests_failed: AtomicU64,
    /// Requests failed because a pass gave them NaN or infinite values.
    pub non_finite: AtomicU64,
    pub spec_drafted: AtomicU64,
    pub spec_accepted: AtomicU64,
    /// Drafted and accepted tokens by draft source ([`Source::index`]); a
    /// node two sources proposed counts for both.
    pub spec_by_source: [(AtomicU64, AtomicU64); Source::COUNT],
    /// Drafted and accepted tokens by position in the draft (0: the first
    /// token after the pending one; a tree's depth minus one).
    pub spec_by_position: [(AtomicU64, AtomicU64); MAX_DEPTH],
    /// The traffic cache (suffix tries of earlier outputs), when there is one.
    pub traffic_bytes: AtomicU64,
    pub traffic_nodes: AtomicU64,
    pub traffic_outputs: AtomicU64,
    pub traffic_evicted: AtomicU64,
    /// The output head's screen ([`spindle_model::ScreenCounts`]).
    pub screen_paid: AtomicU64,
    pub screen_missed: AtomicU64,
    pub screen_rested: AtomicU64,
    /// Bytes of logits buffers kept for the next pass.
    pub spare_logits_bytes: AtomicU64,
    /// What the model holds ([`spindle_model::ModelMemory`]), and the KV
    /// pool's free blocks kept for the prefix cache.
    pub weights_bytes: AtomicU64,
    pub head_screen_bytes: AtomicU64,
    pub pass_buffer_bytes: AtomicU64,
    pub kv_prefix_cached_bytes: AtomicU64,
    pub passes: AtomicU64,
    /// Sequences preempted for KV blocks (recomputed later).
    pub preemptions: AtomicU64,
    /// Grammar masks of finished constrained requests, the microseconds
    /// they took, and the part a token waited for (the rest ran beside
    /// passes).
    pub grammar_masks: AtomicU64,
    pub grammar_mask_micros: AtomicU64,
    pub grammar_mask_wait_micros: AtomicU64,
    pub time_to_first_token: Mutex<Histogram>,
    pub inter_token_latency: Mutex<Histogram>,
    pub e2e_latency: Mutex<Histogram>,
}

impl Metrics {
    /// Share of the KV cache in use, 0 to 1.
    pub fn kv_usage(&self) -> f64 {
        let cap = self.kv_capacity.load(Ordering::Relaxed);
        if cap == 0 {
            0.0
        } else {
            self.kv_used.load(Ordering::Relaxed) as f64 / cap as f64
        }
    }

    /// Records the size of the KV pool.
    pub fn set_pool(&self, kv: &KvCache) {
        self.kv_capacity
            .store(kv.layout().bytes() as u64, Ordering::Relaxed);
        self.kv_blocks
            .store(kv.block_usage().total as u64, Ordering::Relaxed);
        self.kv_block_tokens
            .store(spindle_model::BLOCK as u64, Ordering::Relaxed);
    }

    /// A prompt of `tokens` looked up in the prefix cache, `cached` found.
    pub(crate) fn record_prefix_lookup(&self, tokens: usize, cached: usize) {
        self.prefix_cache_queries
            .fetch_add(tokens as u64, Ordering::Relaxed);
        self.prefix_cache_hits
            .fetch_add(cached as u64, Ordering::Relaxed);
    }

    /// A token emitted for a request that arrived at `arrived`, whose last
    /// token came at `last` (updated to now): time to first token or
    /// inter-token latency.
    pub(crate) fn record_token(&self, arrived: Instant, last: &mut Option<Instant>) {
        self.generation_tokens.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        match *last {
            None => self.observe(&self.time_to_first_token, (now - arrived).as_secs_f64()),
            Some(t) => self.observe(&self.inter_token_latency, (now - t).as_secs_f64()),
        }
        *last = Some(now);
    }

    /// A verified tree, of which the walk kept the nodes `accepted`.
    pub(crate) fn record_drafts(&self, tree: &TokenTree, accepted: &[usize]) {
        self.spec_drafted
            .fetch_add(tree.len() as u64, Ordering::Relaxed);
        self.spec_accepted
            .fetch_add(accepted.len() as u64, Ordering::Relaxed);
        for (s, (d, a)) in tree.source_counts(accepted).into_iter().enumerate() {
            self.spec_by_source[s].0.fetch_add(d, Ordering::Relaxed);
            self.spec_by_source[s].1.fetch_add(a, Ordering::Relaxed);
        }
        let position = |node: &Node| node.depth.clamp(1, MAX_DEPTH) - 1;
        for node in &tree.nodes {
            self.spec_by_position[position(node)]
                .0
                .fetch_add(1, Ordering::Relaxed);
        }
        for &i in accepted {
            if let Some(node) = tree.nodes.get(i) {
                self.spec_by_position[position(node)]
                    .1
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// What the traffic cache holds now.
    pub(crate) fn set_traffic(&self, s: &TrafficStats) {
        self.traffic_bytes.store(s.bytes as u64, Ordering::Relaxed);
        self.traffic_nodes.store(s.nodes as u64, Ordering::Relaxed);
        self.traffic_outputs
            .store(s.outputs as u64, Ordering::Relaxed);
        self.traffic_evicted.store(s.evicted, Ordering::Relaxed);
    }

    /// How the head's screen has fared, and the spare logits buffers.
    pub(crate) fn set_head(&self, s: spindle_model::ScreenCounts, spare_bytes: usize) {
        self.screen_paid.store(s.paid, Ordering::Relaxed);
        self.screen_missed.store(s.missed, Ordering::Relaxed);
        self.screen_rested.store(s.rested, Ordering::Relaxed);
        self.spare_logits_bytes
            .store(spare_bytes as u64, Ordering::Relaxed);
    }

    /// What the model and the KV pool hold now.
    pub(crate) fn set_memory(&self, model: spindle_model::ModelMemory, kv: &KvCache) {
        self.weights_bytes
            .store(model.weights as u64, Ordering::Relaxed);
        self.head_screen_bytes
            .store(model.head_screen as u64, Ordering::Relaxed);
        self.pass_buffer_bytes
            .store(model.pass_buffers as u64, Ordering::Relaxed);
        self.kv_prefix_cached_bytes
            .store(kv.bytes_prefix_cached() as u64, Ordering::Relaxed);
    }

    /// The engine's memory by part, in bytes, as `spindle:memory_bytes`
    /// reports it: the KV pool (allocated up front) and, inside it, the
    /// blocks the prefix cache keeps; the weights; the head screen; the pass
    /// buffers; the spare logits; the traffic cache.
    pub fn memory_parts(&self) -> Vec<(&'static str, u64)> {
        let get = |v: &AtomicU64| v.load(Ordering::Relaxed);
        vec![
            ("weights", get(&self.weights_bytes)),
            ("head_screen", get(&self.head_screen_bytes)),
            ("kv_pool", get(&self.kv_capacity)),
            ("kv_prefix_cached", get(&self.kv_prefix_cached_bytes)),
            ("pass_buffers", get(&self.pass_buffer_bytes)),
            ("spare_logits", get(&self.spare_logits_bytes)),
            ("spec_traffic_cache", get(&self.traffic_bytes)),
        ]
    }

    pub(crate) fn observe(&self, h: &Mutex<Histogram>, seconds: f64) {
        h.lock().unwrap_or_else(|p| p.into_inner()).observe(seconds);
    }

    /// Prometheus text exposition, vLLM's names under the `spindle:` prefix.
    pub fn render(&self, model: &str) -> String {
        let mut out = String::new();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let label = format!("{{model_name=\"{model}\"}}");
        let gauges: [(&str, &str, f64); 3] = [
            (
                "spindle:num_requests_running",
                "Requests in the running batch.",
                get(&self.requests_running) as f64,
            ),
            (
                "spindle:num_requests_waiting",
                "Requests waiting to be admitted.",
                get(&self.requests_waiting) as f64,
            ),
            (
                "spindle:kv_cache_usage_perc",
                "KV-cache usage, 1 means full.",
                self.kv_usage(),
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{label} {v}"
            );
        }
        // The same gauges under the names endpoint pickers map by default
        // for vLLM-compatible servers, with vLLM's meanings.
        for (name, _, v) in gauges {
            let vllm = name.replacen("spindle:", "vllm:", 1);
            let _ = writeln!(
                out,
                "# HELP {vllm} {name}, under vLLM's name.\n# TYPE {vllm} gauge\n{vllm}{label} {v}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP vllm:cache_config_info Information of the KV cache: tokens per block and blocks in the pool.\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{model_name=\"{model}\",block_size=\"{}\",num_gpu_blocks=\"{}\"}} 1",
            get(&self.kv_block_tokens),
            get(&self.kv_blocks)
        );
        let counters: [(&str, &str, &AtomicU64); 11] = [
            (
                "spindle:prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache.",
                &self.prefix_cache_queries,
            ),
            (
                "spindle:prefix_cache_hits_total",
                "Prompt tokens found in the prefix cache.",
                &self.prefix_cache_hits,
            ),
            (
                "spindle:prompt_tokens_total",
                "Prompt tokens processed.",
                &self.prompt_tokens,
            ),
            (
                "spindle:generation_tokens_total",
                "Tokens generated.",
                &self.generation_tokens,
            ),
            (
                "spindle:request_cancelled_total",
                "Requests whose client went away before they finished.",
                &self.requests_cancelled,
            ),
            (
                "spindle:request_failed_total",
                "Requests ended by an error of the engine.",
                &self.requests_failed,
            ),
            (
                "spindle:request_failed_non_finite_total",
                "Requests ended because a pass gave them NaN or infinite values (corrupt weights?).",
                &self.non_finite,
            ),
            (
                "spindle:spec_decode_num_draft_tokens_total",
                "Drafted tokens verified.",
                &self.spec_drafted,
            ),
            (
                "spindle:spec_decode_num_accepted_tokens_total",
                "Drafted tokens accepted.",
                &self.spec_accepted,
            ),
            (
                "spindle:num_forward_passes_total",
                "Forward passes of the model.",
                &self.passes,
            ),
            (
                "spindle:num_preemptions_total",
                "Sequences preempted for KV blocks and recomputed later.",
                &self.preemptions,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{label} {}",
                get(v)
            );
        }
        let by_source = [
            (
                "spindle:spec_decode_num_draft_tokens_by_source_total",
                "Drafted tokens verified, by draft source (a token two sources proposed counts for both).",
                false,
            ),
            (
                "spindle:spec_decode_num_accepted_tokens_by_source_total",
                "Drafted tokens accepted, by draft source.",
                true,
            ),
        ];
        for (name, help, accepted) in by_source {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for s in Source::ALL {
                let (d, a) = &self.spec_by_source[s.index()];
                let n = get(if accepted { a } else { d });
                let source = s.name();
                let _ = writeln!(
                    out,
                    "{name}{{model_name=\"{model}\",source=\"{source}\"}} {n}"
                );
            }
        }
        let by_position = [
            (
                "spindle:spec_decode_num_draft_tokens_per_pos_total",
                "Drafted tokens verified, by position in the draft (0: the first after the pending token).",
                false,
            ),
            (
                "spindle:spec_decode_num_accepted_tokens_per_pos_total",
                "Drafted tokens accepted, by position in the draft (vLLM's spec_decode_num_accepted_tokens_per_pos).",
                true,
            ),
        ];
        for (name, help, accepted) in by_position {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (pos, (d, a)) in self.spec_by_position.iter().enumerate() {
                let n = get(if accepted { a } else { d });
                let _ = writeln!(
                    out,
                    "{name}{{model_name=\"{model}\",position=\"{pos}\"}} {n}"
                );
            }
        }
        for (name, help, v) in [
            (
                "spindle:spec_traffic_cache_bytes",
                "Bytes the traffic cache (suffix tries of earlier outputs) holds.",
                &self.traffic_bytes,
            ),
            (
                "spindle:spec_traffic_cache_nodes",
                "Suffix-trie nodes in the traffic cache.",
                &self.traffic_nodes,
            ),
            (
                "spindle:spec_traffic_cache_outputs",
                "Earlier outputs stored in the traffic cache.",
                &self.traffic_outputs,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{label} {}",
                get(v)
            );
        }
        let name = "spindle:head_screen_rows_total";
        let _ = writeln!(out, "# HELP {name} Rows whose chosen token the output head's screen found (paid), rows it screened that still took the full head (missed), and rows that skipped it while it rested after misses (rested).\n# TYPE {name} counter");
        for (outcome, v) in [
            ("paid", &self.screen_paid),
            ("missed", &self.screen_missed),
            ("rested", &self.screen_rested),
        ] {
            let _ = writeln!(
                out,
                "{name}{{model_name=\"{model}\",outcome=\"{outcome}\"}} {}",
                get(v)
            );
        }
        let _ = writeln!(
            out,
            "# HELP spindle:spare_logits_bytes Bytes of logits buffers kept for the next pass (bounded).\n# TYPE spindle:spare_logits_bytes gauge\nspindle:spare_logits_bytes{label} {}",
            get(&self.spare_logits_bytes)
        );
        let _ = writeln!(
            out,
            "# HELP spindle:spec_traffic_cache_evictions_total Outputs evicted from the traffic cache to stay within its bound.\n# TYPE spindle:spec_traffic_cache_evictions_total counter\nspindle:spec_traffic_cache_evictions_total{label} {}",
            get(&self.traffic_evicted)
        );
        // vLLM's success counter, by finish reason.
        let length = get(&self.requests_finished_length);
        let stop = get(&self.requests_finished).saturating_sub(length);
        let _ = writeln!(
            out,
            "# HELP spindle:request_success_total Requests finished, by reason (a stop, or the token limit).\n# TYPE spindle:request_success_total counter"
        );
        for (reason, n) in [("stop", stop), ("length", length)] {
            let _ = writeln!(
                out,
                "spindle:request_success_total{{model_name=\"{model}\",finished_reason=\"{reason}\"}} {n}"
            );
        }
        let seconds = [
            (
                "spindle:grammar_mask_seconds_total",
                "Seconds spent computing grammar masks (finished requests).",
                &self.grammar_mask_micros,
            ),
            (
                "spindle:grammar_mask_wait_seconds_total",
                "Of those, seconds a token waited for its mask (not computed beside a pass).",
                &self.grammar_mask_wait_micros,
            ),
        ];
        let _ = writeln!(
            out,
            "# HELP spindle:grammar_masks_total Grammar masks computed (finished requests).\n# TYPE spindle:grammar_masks_total counter\nspindle:grammar_masks_total{label} {}",
            get(&self.grammar_masks)
        );
        for (name, help, v) in seconds {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{label} {}",
                get(v) as f64 / 1e6
            );
        }
        let lock = |h: &Mutex<Histogram>| h.lock().unwrap_or_else(|p| p.into_inner()).clone();
        lock(&self.time_to_first_token).render(
            &mut out,
            "spindle:time_to_first_token_seconds",
            "Time from arrival to the first token.",
        );
        lock(&self.inter_token_latency).render(
            &mut out,
            "spindle:inter_token_latency_seconds",
            "Time between consecutive tokens of a request.",
        );
        lock(&self.e2e_latency).render(
            &mut out,
            "spindle:e2e_request_latency_seconds",
            "Time from arrival to the last token.",
        );
        out
    }
}
