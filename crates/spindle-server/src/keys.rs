//! API keys: `--api-key` checked on every keyed endpoint, and the tenant a
//! request belongs to (its key), which the fair queue and the traffic
//! drafts are kept by.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::Shared;

/// Refuses a request without the server's key (when it has one) with 401.
pub(crate) async fn require_key(State(state): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = bearer(req.headers());
        if !given.as_deref().is_some_and(|g| same_key(g, key)) {
            let msg = match given {
                None => "missing API key: send the header 'Authorization: Bearer <key>'",
                Some(_) => "incorrect API key",
            };
            return ApiError::new(StatusCode::UNAUTHORIZED, msg).into_response();
        }
    }
    next.run(req).await
}

/// The credentials of a `Bearer` authorization (the scheme is
/// case-insensitive, as HTTP schemes are).
pub(crate) fn bearer(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, key) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| key.trim().to_string())
}

/// Compares keys in time that does not depend on where they differ, so a
/// client cannot find the key a byte at a time by timing refusals.
fn same_key(given: &str, key: &str) -> bool {
    let (a, b) = (given.as_bytes(), key.as_bytes());
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    std::hint::black_box(diff) == 0
}

/// The tenant of a request: its API key, or everyone's.
pub(crate) fn tenant(headers: &HeaderMap) -> String {
    bearer(headers).unwrap_or_else(|| "default".into())
}
