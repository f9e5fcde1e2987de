//! Errors as OpenAI's API writes them: a status code and
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use spindle_engine::{ErrorKind, RequestError};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<&'static str>,
    /// Seconds the client should wait before retrying (429).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// A bad value of one request field.
    pub fn invalid(param: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param),
            ..ApiError::bad_request(message)
        }
    }

    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    /// OpenAI's error `type` for this status.
    pub fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }
}

impl ApiError {
    /// The JSON body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.status.as_u16(),
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body();
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

/// The engine's refusals and failures by their kind: the request's own
/// faults are 4xx (never 5xx), a full engine 503 with `Retry-After`, and
/// only the engine's own faults 500.
impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> ApiError {
        let (status, retry_after) = match e.kind {
            ErrorKind::InvalidRequest | ErrorKind::TooLong => (StatusCode::BAD_REQUEST, None),
            ErrorKind::Capacity => (StatusCode::SERVICE_UNAVAILABLE, Some(1)),
            ErrorKind::Cancelled => (StatusCode::SERVICE_UNAVAILABLE, Some(1)),
            ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, None),
        };
        ApiError {
            status,
            message: e.message,
            param: e.param,
            retry_after,
        }
    }
}

/// Errors that axum itself answers (a wrong method, a body over the limit)
/// get OpenAI-style JSON bodies too, as every other error does.
pub(crate) async fn openai_errors(resp: Response) -> Response {
    let status = resp.status();
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || json {
        return resp;
    }
    let message = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            "this endpoint does not take that method (the Allow header says which it takes)"
        }
        StatusCode::PAYLOAD_TOO_LARGE => "the request body is over the 2 MiB limit",
        s => s.canonical_reason().unwrap_or("the request failed"),
    };
    let mut out = ApiError::new(status, message).into_response();
    if let Some(allow) = resp.headers().get(header::ALLOW) {
        out.headers_mut().insert(header::ALLOW, allow.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_fault_of_the_request_is_a_server_error() {
        let status = |kind| ApiError::from(RequestError::new(kind, "x")).status;
        assert_eq!(status(ErrorKind::InvalidRequest), StatusCode::BAD_REQUEST);
        assert_eq!(status(ErrorKind::TooLong), StatusCode::BAD_REQUEST);
        assert_eq!(status(ErrorKind::Capacity), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            status(ErrorKind::Internal),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let busy = ApiError::from(RequestError::new(ErrorKind::Capacity, "full"));
        assert_eq!(busy.retry_after, Some(1));
        let e = ApiError::from(RequestError::invalid("prompt", "empty"));
        assert_eq!(
            (e.param, e.kind()),
            (Some("prompt"), "invalid_request_error")
        );
    }
}
