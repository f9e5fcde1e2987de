//! Spindle's HTTP server: the OpenAI API (`/v1/models`, `/v1/completions`,
//! `/v1/chat/completions` with streaming), `/v1/decide`, `/tokenize`, `/detokenize`,
//! `/props`, `/health` and Prometheus `/metrics`, over the engine's continuous
//! batching loop. The server knows requests and text; the engine knows
//! sequences and tokens. Every request gets one access-log line
//! ([`access::TARGET`]).

pub mod access;
mod body;
mod completions;
pub mod connections;
mod cors;
mod decide;
mod embeddings;
mod error;
mod generation;
mod guarded_body;
mod keys;
mod memory;
mod models;
pub mod openai;
mod prompts;
mod props;
pub mod reasoning;
mod replies;
mod routes;
mod stream;
mod text;
mod tokens;
pub mod tools;
mod webui;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use spindle_engine::constraint::GrammarCompiler;
use spindle_engine::scheduler::EngineHandle;
use spindle_model::chat_template::ChatTemplate;
use spindle_model::tokenizer::Tokenizer;

pub use cors::{CorsOriginError, CorsOrigins};
pub use error::ApiError;
pub use props::{KvProps, Props, SpecProps};
pub use routes::router;

/// The state every handler is given.
pub(crate) type Shared = Arc<AppState>;

/// What every handler shares.
pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// The name clients give as `model`.
    pub model_name: String,
    /// Clients must send `Authorization: Bearer <key>` when set.
    pub api_key: Option<String>,
    pub request_timeout: Duration,
    /// How long a shutdown waits for the requests in flight.
    pub drain_timeout: Duration,
    /// Timeouts and the cap on connections.
    pub connections: connections::ConnectionLimits,
    /// Turns true when the server starts to shut down.
    pub(crate) stopping: tokio::sync::watch::Sender<bool>,
    pub created: u64,
    /// Compiles `response_format`, `json_schema`, `grammar` and `regex`
    /// against the model's vocabulary (built once, at start).
    pub grammars: Option<GrammarCompiler>,
    /// How the model writes tool calls (its template's format, or the
    /// generic JSON one).
    pub tool_format: tools::ToolFormat,
    /// Bytes of the vocabulary's longest token: a text of `b` bytes has at
    /// least `b / longest_token` tokens, so an over-long prompt is refused
    /// before it is tokenized.
    pub longest_token: usize,
    /// Content-free answers of the questions `/v1/decide` was asked
    /// (`debias: prior`), so a question asked again skips that branch.
    pub priors: spindle_engine::decide::PriorCache,
    /// What `/props` reports (set by whoever starts the server).
    pub props: Props,
    /// Origins browsers may call from (`--cors-origin`); off by default.
    pub cors: CorsOrigins,
    /// The encoder behind `/v1/embeddings` and `/v1/rerank`
    /// (`--embedding-model`), with its own queue.
    pub embedder: Option<spindle_engine::embed::EmbedHandle>,
    /// Decisions answered (`/metrics`).
    pub(crate) decisions: decide::DecisionCounts,
    /// Whether `/` and `/dashboard` serve the web pages (`--no-webui`
    /// turns them off).
    pub webui: bool,
    /// How the model writes its thinking, read out of chat replies as
    /// `reasoning_content`; `None` leaves replies whole
    /// (`--reasoning-format none`, or a model that does not reason apart).
    pub reasoning: Option<reasoning::ReasoningFormat>,
    /// Variables every chat template render gets (`--chat-template-kwargs`),
    /// under a request's own `chat_template_kwargs`.
    pub template_kwargs: serde_json::Map<String, serde_json::Value>,
}

impl AppState {
    pub fn new(
        engine: EngineHandle,
        tokenizer: Tokenizer,
        model_name: String,
        api_key: Option<String>,
    ) -> AppState {
        let template = ChatTemplate::for_tokenizer(&tokenizer);
        let grammars = match GrammarCompiler::new(&tokenizer) {
            Ok(g) => Some(g),
            Err(e) => {
                tracing::warn!("structured output is off: {e}");
                None
            }
        };
        let tool_format = tools::ToolFormat::of(&template, &tokenizer);
        let reasoning = reasoning::ReasoningFormat::of(&tokenizer);
        let longest_token = (0..tokenizer.vocab_size() as u32)
            .filter_map(|id| tokenizer.token_bytes(id).map(<[u8]>::len))
            .max()
            .unwrap_or(1)
            .max(1);
        AppState {
            engine,
            tokenizer,
            template,
            tool_format,
            longest_token,
            model_name,
            api_key,
            request_timeout: generation::default_timeout(),
            drain_timeout: Duration::from_secs(30),
            connections: connections::ConnectionLimits::default(),
            stopping: tokio::sync::watch::Sender::new(false),
            created: generation::now_unix(),
            grammars,
            priors: spindle_engine::decide::PriorCache::new(
                spindle_engine::decide::DEFAULT_PRIOR_CACHE_BYTES,
            ),
            props: Props::default(),
            cors: CorsOrigins::Off,
            embedder: None,
            decisions: decide::DecisionCounts::default(),
            webui: true,
            reasoning,
            template_kwargs: serde_json::Map::new(),
        }
    }
}

impl AppState {
    /// Sets the variables every chat template render gets
    /// (`--chat-template-kwargs`): a JSON object, without the names the
    /// server sets itself (`messages`, `tools`, ...).
    pub fn set_template_kwargs(&mut self, json: &str) -> Result<(), String> {
        let example = "such as '{\"enable_thinking\": false}'";
        let Ok(serde_json::Value::Object(m)) = serde_json::from_str(json) else {
            return Err(format!("must be a JSON object, {example}; got {json}"));
        };
        if let Some(k) = m
            .keys()
            .find(|k| prompts::RESERVED_TEMPLATE_VARS.contains(&k.as_str()))
        {
            return Err(format!("may not set '{k}' (requests set it)"));
        }
        self.template_kwargs = m;
        Ok(())
    }
}

/// Serves `state` on `addr` until SIGINT or SIGTERM; `on_ready` is called
/// with the bound address once connections are accepted.
///
/// The first signal stops accepting connections, closes those with no
/// request in flight (a client that sends nothing is not waited for) and
/// lets the requests in flight finish, for at most `state.drain_timeout`; a
/// second signal stops at once. Each step is logged.
pub async fn serve(
    state: AppState,
    addr: SocketAddr,
    on_ready: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    on_ready(listener.local_addr()?);
    let drain = state.drain_timeout;
    let limits = state.connections.clone();
    let stop = state.stopping.clone();
    let state = Arc::new(state);
    memory::spawn_housekeeping(state.clone());
    let app = router(state);
    let (accepting, open) = connections::spawn_accept_loop(listener, app, limits, stop.subscribe());
    let name = stop_signal().await;
    eprintln!(
        "{name}: shutting down: no new connections; finishing the requests in flight (at most {} s; a second signal stops at once)",
        drain.as_secs()
    );
    let _ = stop.send(true);
    let _ = accepting.await;
    tokio::select! {
        _ = open.all_closed() => eprintln!("every request finished: stopped"),
        name = stop_signal() => {
            eprintln!("{name} again: stopping now");
            std::process::exit(130);
        }
        _ = tokio::time::sleep(drain) => {
            eprintln!("the drain timeout passed with requests still in flight: stopping now");
        }
    }
    Ok(())
}

/// The server's routes over `state`, for a caller that answers requests in
/// its own process instead of on a socket (the Python package): the same
/// checks, handlers and error messages as [`serve`]. Call it inside a Tokio
/// runtime (it starts the memory housekeeping there).
pub fn in_process(state: AppState) -> axum::Router {
    let state = Arc::new(state);
    memory::spawn_housekeeping(state.clone());
    router(state)
}

/// Waits for SIGINT (Ctrl-C) or SIGTERM (what orchestrators send); returns
/// its name.
async fn stop_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = tokio::signal::ctrl_c() => "SIGINT",
                _ = term.recv() => "SIGTERM",
            },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                "SIGINT"
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}
