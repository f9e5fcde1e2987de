//! Reading a request before any handler sees it: header limits, the body
//! read whole within `--body-timeout` (or refused), and its JSON parsed.

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::Shared;

/// Header fields a request may carry, and their bytes all together; past
/// either it is refused with 431.
const MAX_HEADERS: usize = 100;
const MAX_HEADER_BYTES: usize = 32 * 1024;
/// A request body's most bytes (axum's default limit for `Json`).
const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// Checks a request's headers against the limits and reads its body, all of
/// it within `--body-timeout`, before any handler sees it: a client that
/// sends its body slowly, or never, gets 408 instead of holding a
/// connection and a task.
pub(crate) async fn read_request(
    State(state): State<Shared>,
    req: Request,
    next: Next,
) -> Response {
    let headers = req.headers();
    let header_bytes: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    if headers.len() > MAX_HEADERS || header_bytes > MAX_HEADER_BYTES {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!(
                "the request's headers are too large ({} fields, {header_bytes} bytes): at most {MAX_HEADERS} fields and {} KiB",
                headers.len(),
                MAX_HEADER_BYTES / 1024
            ),
        )
        .into_response();
    }
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body is over the {} MiB limit",
                MAX_BODY_BYTES >> 20
            ),
        )
        .into_response()
    };
    // A body declared too large is not kept, only read past (see
    // `read_body`).
    let declared_too_large = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|n| n > MAX_BODY_BYTES as u64);
    let keep = (!declared_too_large).then_some(MAX_BODY_BYTES);
    let (parts, body) = req.into_parts();
    let timeout = state.connections.body_timeout;
    let mut stopping = state.stopping.subscribe();
    let read = tokio::select! {
        read = tokio::time::timeout(timeout, read_body(body, keep)) => read,
        // A shutdown does not wait on a body that may never come.
        _ = crate::connections::stopped(&mut stopping) => {
            return ApiError {
                retry_after: Some(1),
                ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down")
            }
            .into_response();
        }
    };
    match read {
        Err(_) if declared_too_large => too_large(),
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s (--body-timeout)",
                timeout.as_secs_f64()
            ),
        )
        .into_response(),
        Ok(BodyRead::TooLarge) => too_large(),
        Ok(BodyRead::Broken) => ApiError::bad_request(
            "the request body could not be read: the connection closed before it ended",
        )
        .into_response(),
        Ok(BodyRead::Whole(bytes)) => {
            next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
                .await
        }
    }
}

/// A body read past its limit is still read, up to this many bytes, and
/// dropped: a client still sending gets to read the 413 rather than a
/// reset connection.
const MAX_BODY_DRAINED: usize = 16 * 1024 * 1024;

enum BodyRead {
    Whole(Bytes),
    TooLarge,
    Broken,
}

/// Reads `body`, keeping at most `keep` bytes; a longer body (any body
/// when `keep` is `None`) is read on, to [`MAX_BODY_DRAINED`], and
/// reported too large.
async fn read_body(mut body: axum::body::Body, keep: Option<usize>) -> BodyRead {
    let limit = keep.unwrap_or(0);
    use http_body_util::BodyExt;
    let mut kept = Vec::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return BodyRead::Broken;
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen += data.len();
        if keep.is_some() && seen <= limit {
            kept.extend_from_slice(&data);
        } else if seen > MAX_BODY_DRAINED {
            return BodyRead::TooLarge;
        } else {
            kept = Vec::new();
        }
    }
    if keep.is_none() || seen > limit {
        return BodyRead::TooLarge;
    }
    BodyRead::Whole(Bytes::from(kept))
}

/// A request body as `T`, or a 400 that says what is wrong with it.
pub(crate) fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}
