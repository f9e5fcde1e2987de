//! The endpoints: one table that the router and the 404's list are both
//! built from, the layers every request passes (access log, CORS, body
//! reading, the key check, OpenAI-shaped errors), and `/metrics`.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};

use crate::error::ApiError;
use crate::Shared;

/// One endpoint: its path, whether it needs the API key, its handlers.
struct Endpoint {
    path: &'static str,
    keyed: bool,
    route: fn() -> MethodRouter<Shared>,
}

/// Every endpoint. The router and the list in the 404 body are both built
/// from it, so they cannot disagree.
const ENDPOINTS: &[Endpoint] = &[
    Endpoint {
        path: "/v1/models",
        keyed: true,
        route: || get(crate::models::models),
    },
    Endpoint {
        path: "/v1/completions",
        keyed: true,
        route: || post(crate::completions::completions),
    },
    Endpoint {
        path: "/v1/chat/completions",
        keyed: true,
        route: || post(crate::completions::chat_completions),
    },
    Endpoint {
        path: "/v1/decide",
        keyed: true,
        route: || post(crate::decide::decide),
    },
    Endpoint {
        path: "/v1/embeddings",
        keyed: true,
        route: || post(crate::embeddings::embeddings),
    },
    Endpoint {
        path: "/v1/rerank",
        keyed: true,
        route: || post(crate::embeddings::rerank),
    },
    Endpoint {
        path: "/tokenize",
        keyed: true,
        route: || post(crate::tokens::tokenize),
    },
    Endpoint {
        path: "/detokenize",
        keyed: true,
        route: || post(crate::tokens::detokenize),
    },
    Endpoint {
        path: "/props",
        keyed: true,
        route: || get(crate::props::props),
    },
    Endpoint {
        path: "/health",
        keyed: false,
        route: || get(|| async { Json(crate::replies::health_body()) }),
    },
    Endpoint {
        path: "/metrics",
        keyed: false,
        route: || get(metrics),
    },
];

/// The 404 message: every endpoint, from [`ENDPOINTS`] (and the pages'
/// paths when they are served).
fn not_found_message(webui: bool) -> String {
    let pages = if webui { crate::webui::PATHS } else { &[] };
    let paths: Vec<&str> = ENDPOINTS
        .iter()
        .map(|e| e.path)
        .chain(pages.iter().copied())
        .collect();
    format!("no such endpoint: see {}", paths.join(", "))
}

/// Every route; `/health`, `/metrics` and the web pages need no key. Each request is
/// logged (outermost, so refusals by the layers below are logged too),
/// and with `--cors-origin` preflights are answered before the key check.
pub fn router(state: Shared) -> Router {
    let mut guarded = Router::new();
    let mut open = Router::new();
    for e in ENDPOINTS {
        if e.keyed {
            guarded = guarded.route(e.path, (e.route)());
        } else {
            open = open.route(e.path, (e.route)());
        }
    }
    if state.webui {
        open = open.merge(crate::webui::routes());
    }
    let guarded = guarded.route_layer(middleware::from_fn_with_state(
        state.clone(),
        crate::keys::require_key,
    ));
    let not_found = not_found_message(state.webui);
    let mut app = open
        .merge(guarded)
        .fallback(move || async move { ApiError::new(StatusCode::NOT_FOUND, not_found) })
        .layer(middleware::from_fn_with_state(
            state.clone(),
            crate::body::read_request,
        ))
        .layer(middleware::map_response(crate::error::openai_errors));
    if let Some(cors) = state.cors.layer() {
        app = app.layer(cors);
    }
    app.layer(middleware::from_fn(crate::access::log_access))
        .with_state(state)
}

async fn metrics(State(state): State<Shared>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.engine.metrics.render(&state.model_name)
            + &state.decisions.render(&state.model_name)
            + &crate::memory::render(&state)
            + &state
                .embedder
                .as_ref()
                .map(crate::embeddings::render_metrics)
                .unwrap_or_default(),
    )
}
