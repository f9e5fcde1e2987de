//! `spindle serve`: the OpenAI-compatible HTTP server.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use spindle_engine::scheduler::{spawn_engine, EngineConfig};
use spindle_engine::speculative::TrafficCache;
use spindle_model::KvCache;
use spindle_server::connections::{connection_capacity, ConnectionLimits};
use spindle_server::{AppState, CorsOrigins, KvProps, Props, SpecProps};

use crate::commands::embed::EncoderArgs;
use crate::options::{tokenizer, ModelArgs};
use crate::speculation::{SpecArgs, SpecMode};

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (loopback by default; 0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port to listen on (0: any free port).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Clients must send `Authorization: Bearer KEY` (also from SPINDLE_API_KEY).
    #[arg(long = "api-key", env = "SPINDLE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Read the API key from this file (its first line), so that it does not
    /// show in the process list.
    #[arg(long = "api-key-file", conflicts_with = "api_key")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Sequences decoded at once (KV-cache slots).
    #[arg(long = "max-seqs", default_value_t = 8)]
    pub max_seqs: usize,
    /// Rows per forward pass: decode rows first, prompt chunks in the rest.
    #[arg(long = "max-batch-tokens", default_value_t = 512)]
    pub max_batch_tokens: usize,
    /// Requests allowed to wait for a slot; more get 429 with Retry-After.
    #[arg(long = "max-waiting", default_value_t = 1024)]
    pub max_waiting: usize,
    /// Log filter, as `SPINDLE_LOG` takes it (which this overrides):
    /// `debug` adds a line per pass and, every 10 s, the memory by part
    /// (`spindle_server::memory=debug` for that line alone); the default
    /// shows errors and the access log.
    #[arg(long, value_name = "FILTER")]
    pub log: Option<String>,
    /// Most memory (MiB) for the content-free answers `/v1/decide` keeps
    /// between decisions (least recently used out first; 0 keeps none).
    #[arg(long = "decide-cache-mb", default_value_t = spindle_engine::decide::DEFAULT_PRIOR_CACHE_BYTES >> 20)]
    pub decide_cache_mb: usize,
    /// Seconds a request may take before it is cancelled.
    #[arg(long = "request-timeout", default_value_t = 600)]
    pub request_timeout: u64,
    /// Seconds a shutdown (SIGTERM or SIGINT) waits for the requests in
    /// flight before it stops anyway.
    #[arg(long = "drain-timeout", default_value_t = 30)]
    pub drain_timeout: u64,
    /// Seconds a client has to send a request's headers; slower ones are
    /// disconnected.
    #[arg(long = "header-timeout", default_value_t = 10)]
    pub header_timeout: u64,
    /// Seconds a client has to send a request's body; slower ones get 408.
    #[arg(long = "body-timeout", default_value_t = 30)]
    pub body_timeout: u64,
    /// Seconds a connection may stay open with no request in flight and
    /// no bytes moving.
    #[arg(long = "idle-timeout", default_value_t = 30)]
    pub idle_timeout: u64,
    /// Connections served at once; past it /health still answers and other
    /// requests get 503 (default: 1024, or less when the open-file limit
    /// leaves less room).
    #[arg(long = "max-connections")]
    pub max_connections: Option<usize>,
    /// The model name clients use (default: the file's name without extension).
    #[arg(long = "served-model-name")]
    pub served_model_name: Option<String>,
    /// Serve waiting requests first come, first served instead of taking
    /// turns between tenants (API keys or `user` fields).
    #[arg(long)]
    pub fifo: bool,
    /// Admit new requests only when the running batch is empty (static
    /// batching, for comparison).
    #[arg(long = "static-batching")]
    pub static_batching: bool,
    /// Speculative decoding inside the batch, as for `spindle run`: every
    /// sequence slot gets its own drafter (a draft model's weights are
    /// shared, its KV cache is one per slot, allocated at start and counted
    /// in --kv-memory and the plan).
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Let browser pages from ORIGIN (scheme://host[:port], or * for any)
    /// call the API: preflights are answered and responses carry
    /// Access-Control-Allow-Origin. Repeat for several origins; off by
    /// default.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,
    /// Serve no web pages: without it, / is a chat page (and a decision
    /// playground) and /dashboard live charts of /metrics, both from files
    /// inside the binary that call only this server.
    #[arg(long = "no-webui")]
    pub no_webui: bool,
    /// Reasoning models' thinking (`<think>` blocks, gpt-oss's analysis
    /// channel): `auto` gives it apart from the answer as
    /// `reasoning_content`, `none` leaves it in `content`. A request's
    /// `reasoning_format` field overrides it.
    #[arg(long = "reasoning-format", value_enum, default_value = "auto")]
    pub reasoning_format: ReasoningFormatArg,
    /// Variables for every chat template render, as a JSON object (e.g.
    /// '{"enable_thinking": false}' for Qwen3, '{"reasoning_effort":
    /// "high"}' for gpt-oss); a request's `chat_template_kwargs` override
    /// them one by one.
    #[arg(long = "chat-template-kwargs", value_name = "JSON")]
    pub chat_template_kwargs: Option<String>,
    /// Also answer /v1/embeddings and /v1/rerank, with this encoder (a BERT
    /// GGUF or Hugging Face directory; `default` for all-MiniLM-L6-v2,
    /// pulled on first use). It has its own queue and batches its requests
    /// together; it shares the cores with the chat model.
    #[arg(long = "embedding-model", value_name = "PATH")]
    pub embedding_model: Option<PathBuf>,
    #[command(flatten)]
    pub encoder: EncoderArgs,
}

/// Context per sequence when neither --ctx nor --kv-memory is given.
const DEFAULT_CTX: usize = 4096;

/// The context and the KV pool. Without `--kv-memory` every sequence slot
/// can reach the context at once (`--ctx`, default 4096). With it, the
/// pool is that memory, shared: the sliding layers' windows for every
/// slot, the rest full-attention blocks for whichever sequences need them
/// (a full pool preempts). A sequence may reach the model's context
/// (or `--ctx`) as far as the pool holds it.
/// `draft_bytes(ctx)`: the KV bytes every slot's drafter takes at that
/// context, all slots together (taken from `--kv-memory` first).
fn kv_pool(
    args: &ServeArgs,
    path: &Path,
    draft_bytes: &dyn Fn(usize) -> u64,
) -> Result<(usize, Option<usize>)> {
    let shape = spindle_plan::ModelShape::from_path(path)
        .with_context(|| format!("cannot plan {}", path.display()))?;
    let model_ctx = shape.context_length as usize;
    let Some(budget) = args.model.kv_memory else {
        let ctx = args.model.planned_ctx_for(
            path,
            Some(DEFAULT_CTX.min(model_ctx)),
            args.max_seqs as u64,
        )?;
        return Ok((ctx, None));
    };
    let kv = args.model.plan_kv_type()?;
    let wanted = args.model.ctx.unwrap_or(model_ctx) as u64;
    let drafts = draft_bytes(wanted as usize);
    if drafts >= budget {
        bail!(
            "--kv-memory {} cannot hold the draft model's KV caches ({} for {} sequences of {wanted} tokens) \
             and the model's: raise --kv-memory, lower --ctx or --max-seqs, or use --spec ngram",
            spindle_plan::human_bytes(budget),
            spindle_plan::human_bytes(drafts),
            args.max_seqs
        );
    }
    let tokens = shape
        .kv_pool_tokens(budget - drafts, args.max_seqs as u64, wanted, kv)
        .filter(|&t| t > 0)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--kv-memory {} is too small for {} sequences: their sliding windows alone need more; \
                 raise --kv-memory or lower --max-seqs",
                spindle_plan::human_bytes(budget),
                args.max_seqs
            )
        })?;
    let ctx = wanted.min(tokens) as usize;
    // The machine must hold the weights and the whole pool.
    let mut one = args.model.clone();
    one.ctx = Some(ctx);
    one.kv_memory = None;
    one.planned_ctx_for(path, None, 1)?;
    Ok((ctx, Some(tokens as usize)))
}

/// Why [`kv_pool`] chose `ctx`, in words, for the line `serve` prints at
/// start.
fn ctx_reason(args: &ServeArgs, path: &Path, ctx: usize) -> String {
    let own = spindle_plan::ModelShape::from_path(path)
        .ok()
        .map(|s| s.context_length as usize);
    let own_note = match own {
        Some(own) if own != ctx => format!("; the model's own is {own}"),
        _ => String::new(),
    };
    match (args.model.ctx, args.model.kv_memory) {
        (Some(c), Some(_)) if c > ctx => {
            format!("--ctx {c} cut to what the --kv-memory pool holds")
        }
        (Some(_), _) => "set by --ctx".to_string(),
        (None, Some(_)) if own == Some(ctx) => {
            "the model's own, which the --kv-memory pool holds".to_string()
        }
        (None, Some(_)) => format!("the longest the --kv-memory pool holds{own_note}"),
        (None, None) if own == Some(ctx) => "the model's own".to_string(),
        (None, None) if ctx == DEFAULT_CTX => format!(
            "serve's default, each of --max-seqs {} sequences able to reach it at once{own_note}: \
             set --ctx, or --kv-memory to share a pool",
            args.max_seqs
        ),
        (None, None) => format!("the longest that fits in memory{own_note}"),
    }
}

/// The machine must hold the model, its KV pool and the drafters' KV
/// caches (`draft_kv` bytes) at once, a separate draft model's weights, and
/// the cache of earlier outputs at its bound (`traffic` bytes).
fn check_memory_with_drafts(
    args: &ServeArgs,
    path: &Path,
    ctx: usize,
    draft_kv: u64,
    traffic: u64,
) -> Result<()> {
    if draft_kv == 0 && traffic == 0 {
        return Ok(());
    }
    let shape = spindle_plan::ModelShape::from_path(path)
        .with_context(|| format!("cannot plan {}", path.display()))?;
    let device = spindle_plan::Device::cpu()?;
    let profile = spindle_plan::EngineProfile::cpu_with_threads(args.model.threads() as u64);
    let request = spindle_plan::PlanRequest {
        spec_cache_bytes: traffic,
        decide_cache_bytes: (args.decide_cache_mb << 20) as u64,
        ..spindle_plan::PlanRequest::new(
            ctx as u64,
            args.max_seqs as u64,
            args.model.plan_kv_type()?,
            device.clone(),
        )
    };
    let target = spindle_plan::plan(&shape, &request, &profile).total_bytes;
    let draft_weights = match args.spec.mode()? {
        SpecMode::DraftModel(p) => {
            spindle_plan::ModelShape::from_path(&p)
                .with_context(|| format!("--spec draft:PATH: cannot plan {}", p.display()))?
                .weights
                .bytes
        }
        _ => 0,
    };
    let total = target + draft_weights + draft_kv;
    if total > device.memory_bytes {
        bail!(
            "the model, its KV pool and the drafts need {} ({} of it the draft KV caches of {} sequences, {} the cache of earlier outputs) \
             but this machine has {}: lower --ctx, --max-seqs or --spec-cache-mb, or use --spec ngram",
            spindle_plan::human_bytes(total),
            spindle_plan::human_bytes(draft_kv),
            args.max_seqs,
            spindle_plan::human_bytes(traffic),
            spindle_plan::human_bytes(device.memory_bytes)
        );
    }
    Ok(())
}

/// The API key clients must send: from --api-key, SPINDLE_API_KEY or
/// --api-key-file. An empty key is refused (it would lock every client
/// out); a bind beyond loopback without a key is warned about.
fn api_key(args: &ServeArgs) -> Result<Option<String>> {
    let key = match &args.api_key_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --api-key-file {}", path.display()))?;
            Some(text.lines().next().unwrap_or("").trim().to_string())
        }
        None => args.api_key.clone(),
    };
    if key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        bail!(
            "the API key is empty (from --api-key, SPINDLE_API_KEY or --api-key-file): \
             give a non-empty key, or none to serve without one"
        );
    }
    if key.is_none() && !args.host.is_loopback() {
        eprintln!(
            "warning: serving on {} without an API key: anyone who can reach this address can use the model (set --api-key or --api-key-file)",
            args.host
        );
    }
    Ok(key)
}

/// A server ready to answer: its state and what it says at start.
pub struct Prepared {
    pub state: AppState,
    /// The model name clients use.
    pub name: String,
    /// Threads, context, KV pool and drafts, in words (the start line).
    pub summary: String,
}

/// `spindle serve`'s flags from `argv` (without the command name), for
/// callers other than the command line (the Python package).
pub fn args_from(argv: &[String]) -> Result<ServeArgs, clap::Error> {
    #[derive(clap::Parser)]
    #[command(name = "serve")]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }
    let all = std::iter::once("serve".to_string()).chain(argv.iter().cloned());
    <Serve as clap::Parser>::try_parse_from(all).map(|s| s.args)
}

pub fn run(args: ServeArgs) -> Result<()> {
    let Prepared {
        state,
        name,
        summary,
    } = prepare(&args)?;
    let addr = SocketAddr::new(args.host, args.port);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let webui = state.webui;
    rt.block_on(spindle_server::serve(state, addr, |bound| {
        eprintln!("serving {name} ({summary}) at http://{bound}/v1");
        if webui {
            eprintln!("chat page at http://{bound}/, dashboard at http://{bound}/dashboard (--no-webui: off)");
        }
        // Scripts wait for this line on stdout.
        println!("http://{bound}/v1");
    }))
    .with_context(|| format!("cannot serve on {addr}"))?;
    Ok(())
}

/// Checks the flags, plans memory, loads the model (pulling the default one
/// on first use) and starts the engine's batching loop: everything `serve`
/// does before it listens.
pub fn prepare(args: &ServeArgs) -> Result<Prepared> {
    if args.max_seqs == 0 || args.max_batch_tokens == 0 {
        bail!("--max-seqs and --max-batch-tokens must be at least 1");
    }
    let key = api_key(args)?;
    let cors = CorsOrigins::parse(&args.cors_origins)?;
    let tree_budget = args.spec.tree_budget()?;
    let path = args.model.resolve()?;
    if spindle_model::encoder::is_encoder(&path) {
        bail!(
            "{} is an embedding model (BERT), not a chat model: serve it with --embedding-model beside a chat model (-m), or use `spindle embed`",
            path.display()
        );
    }
    // What does not fit even without drafts is refused before anything loads.
    let without_drafts = kv_pool(args, &path, &|_| 0)?;
    let loaded = args.model.load()?;
    let threads = loaded.model.n_threads();
    let mut drafts = args.spec.source(&loaded.model, threads)?;
    let traffic = args.spec.traffic_config()?;
    if let (Some(d), Some(config)) = (&mut drafts, traffic) {
        d.traffic = Some(Arc::new(Mutex::new(TrafficCache::new(config))));
    }
    let traffic_bytes = traffic.map_or(0, |t| t.max_bytes as u64);
    let draft_bytes = |ctx: usize| {
        drafts
            .as_ref()
            .map_or(0, |d| (d.kv_bytes(ctx) * args.max_seqs) as u64)
    };
    // A draft model's KV caches need the model loaded to be sized.
    let (ctx, pool_tokens) = match draft_bytes(without_drafts.0) {
        0 => without_drafts,
        _ => kv_pool(args, &path, &draft_bytes)?,
    };
    check_memory_with_drafts(args, &path, ctx, draft_bytes(ctx), traffic_bytes)?;
    eprintln!(
        "context: {ctx} tokens per sequence ({})",
        ctx_reason(args, &path, ctx)
    );
    let tok = tokenizer(&loaded)?.clone();
    let ty = args.model.kv_type(&loaded.model)?;
    let mut layout = loaded.model.kv_layout(ty, ctx, args.max_seqs);
    layout.pool_tokens = pool_tokens;
    let props = Props {
        model_path: Some(path.display().to_string()),
        architecture: Some(loaded.model.config.family().name().to_string()),
        kv: Some(KvProps::of(&layout)),
        speculation: Some(SpecProps {
            mode: args.spec.spec.clone(),
            budget: tree_budget,
            traffic_cache_bytes: traffic.map(|t| t.max_bytes),
        }),
        threads: Some(threads),
        max_seqs: Some(args.max_seqs),
        isa: Some(loaded.model.isa().name().to_string()),
    };
    let kv = KvCache::new(layout);
    let kv_bytes = spindle_plan::human_bytes(kv.layout().bytes() as u64);
    let pool = match pool_tokens {
        Some(t) => format!("{t} tokens shared by {} sequences", args.max_seqs),
        None => format!("{} sequences x {ctx} tokens", args.max_seqs),
    };
    let name = args.served_model_name.clone().unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| loaded.name.clone())
    });
    let drafting = match &drafts {
        None => String::new(),
        Some(_) => format!(
            ", {} drafts{}{}",
            args.spec.spec,
            match draft_bytes(ctx) {
                0 => String::new(),
                b => format!(" with {} of draft KV", spindle_plan::human_bytes(b)),
            },
            match traffic {
                None => String::new(),
                Some(t) => format!(
                    ", earlier outputs in up to {} ({})",
                    spindle_plan::human_bytes(t.max_bytes as u64),
                    if t.share_tenants {
                        "shared by all tenants"
                    } else {
                        "per tenant"
                    }
                ),
            }
        ),
    };
    let engine = spawn_engine(
        loaded.model,
        kv,
        EngineConfig {
            max_batch_tokens: args.max_batch_tokens,
            max_waiting: args.max_waiting,
            fair: !args.fifo,
            static_batching: args.static_batching,
            tree_budget,
            fixed_tree_budget: false,
            drafts: drafts.unwrap_or_default(),
        },
    );
    let key_required = key.is_some();
    let mut state = AppState::new(engine, tok, name.clone(), key);
    state.request_timeout = Duration::from_secs(args.request_timeout.max(1));
    state.drain_timeout = Duration::from_secs(args.drain_timeout);
    state.props = props;
    state.priors = spindle_engine::decide::PriorCache::new(args.decide_cache_mb << 20);
    state.cors = cors;
    state.webui = !args.no_webui;
    if args.reasoning_format == ReasoningFormatArg::None {
        state.reasoning = None;
    }
    if let Some(json) = &args.chat_template_kwargs {
        state
            .set_template_kwargs(json)
            .map_err(|e| anyhow::anyhow!("--chat-template-kwargs {e}"))?;
    }
    if let Some(p) = &args.embedding_model {
        let given = (p.as_os_str() != "default").then(|| p.clone());
        let mut e = args.encoder.load(&given, threads)?;
        // Named as the chat model is: by its file or directory.
        let from = given
            .unwrap_or_else(|| crate::home::models_dir().join(crate::home::DEFAULT_EMBEDDING_DIR));
        if let Some(stem) = from.file_stem() {
            e.name = stem.to_string_lossy().into_owned();
        }
        eprintln!(
            "embeddings: {} ({} dimensions, up to {} tokens, {})",
            e.name,
            e.dimensions(),
            e.max_tokens(),
            if e.is_cross_encoder() {
                "a cross-encoder: /v1/rerank scores pairs"
            } else {
                "mean of rows"
            }
        );
        state.embedder = Some(spindle_engine::embed::spawn_embedder(
            Arc::new(e),
            args.max_waiting,
        ));
    }
    state.connections = ConnectionLimits {
        header_timeout: Duration::from_secs(args.header_timeout.max(1)),
        body_timeout: Duration::from_secs(args.body_timeout.max(1)),
        idle_timeout: Duration::from_secs(args.idle_timeout.max(1)),
        max_connections: args
            .max_connections
            .unwrap_or_else(connection_capacity)
            .max(1),
    };
    let summary = format!(
        "{threads} threads, context {ctx}, KV pool {kv_bytes} {}: {pool}{drafting}{}",
        ty.name(),
        if key_required {
            ", API key required"
        } else {
            ""
        }
    );
    Ok(Prepared {
        state,
        name,
        summary,
    })
}

/// `--reasoning-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReasoningFormatArg {
    Auto,
    None,
}
