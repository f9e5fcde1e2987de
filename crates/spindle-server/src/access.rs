//! The access log: one line per request (target `spindle::access`, level
//! INFO), written when the request is over. A middleware makes an
//! [`Access`] record, puts it in the request's extensions and ties a clone
//! to the response body; handlers and the tasks that generate fill it in.
//! The line is written when the last clone drops: for a streamed response,
//! after its last event was written (or the client went away), not when
//! its headers went out.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};

use crate::generation::DraftCounts;
use crate::guarded_body::Guarded;

/// The `tracing` target of the access log (`SPINDLE_LOG=spindle::access=off`
/// silences it).
pub const TARGET: &str = "spindle::access";

/// One request's entry in the access log; clones share it.
#[derive(Clone)]
pub struct Access(Arc<Record>);

struct Record {
    method: String,
    path: String,
    started: Instant,
    fields: Mutex<Fields>,
}

#[derive(Default)]
struct Fields {
    status: Option<u16>,
    tenant: String,
    prompt_tokens: Option<usize>,
    /// Set for the endpoints that generate tokens.
    generation: Option<Generation>,
}

#[derive(Default)]
struct Generation {
    first_token: Option<Duration>,
    completion_tokens: usize,
    drafts: DraftCounts,
}

impl Access {
    fn new(method: &str, path: &str, tenant: String) -> Access {
        Access(Arc::new(Record {
            method: method.to_string(),
            path: path.to_string(),
            started: Instant::now(),
            fields: Mutex::new(Fields {
                tenant,
                ..Fields::default()
            }),
        }))
    }

    fn with<R>(&self, f: impl FnOnce(&mut Fields) -> R) -> R {
        // A panic elsewhere while the lock was held leaves fields that are
        // still fine to log.
        let mut fields = self.0.fields.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut fields)
    }

    /// The request's `user` field, which names its tenant (as the engine's
    /// fair queue takes it).
    pub fn set_user(&self, user: &str) {
        self.with(|f| f.tenant = format!("user:{user}"));
    }

    pub fn set_prompt_tokens(&self, tokens: usize) {
        self.with(|f| f.prompt_tokens = Some(tokens));
    }

    /// Marks a generation request: its line gets completion tokens, the
    /// time to first token and tokens per pass.
    pub fn start_generation(&self) {
        self.with(|f| {
            f.generation.get_or_insert_with(Generation::default);
        });
    }

    /// The first generated token arrived (of any choice): only the first
    /// call counts.
    pub fn first_token(&self) {
        let at = self.0.started.elapsed();
        self.with(|f| {
            let g = f.generation.get_or_insert_with(Generation::default);
            g.first_token.get_or_insert(at);
        });
    }

    /// A choice ended with `tokens` generated and `drafts` verified.
    pub fn add_completion(&self, tokens: usize, drafts: DraftCounts) {
        self.with(|f| {
            let g = f.generation.get_or_insert_with(Generation::default);
            g.completion_tokens += tokens;
            g.drafts += drafts;
        });
    }

    fn set_status(&self, status: u16) {
        self.with(|f| f.status = Some(status));
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let total = self.started.elapsed();
        let f = self.fields.get_mut().unwrap_or_else(|e| e.into_inner());
        tracing::info!(target: TARGET, "{}", line(&self.method, &self.path, f, total));
    }
}

/// The line's `key=value` fields, those the request has.
fn line(method: &str, path: &str, f: &Fields, total: Duration) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut s = format!("method={method} path={path}");
    match f.status {
        Some(code) => write!(s, " status={code}"),
        // The response was never made (the connection closed first).
        None => write!(s, " status=-"),
    }
    .ok();
    if let Some(p) = f.prompt_tokens {
        write!(s, " prompt_tokens={p}").ok();
    }
    if let Some(g) = &f.generation {
        write!(s, " completion_tokens={}", g.completion_tokens).ok();
        if let Some(t) = g.first_token {
            write!(s, " ttft_ms={:.1}", ms(t)).ok();
        }
    }
    write!(s, " total_ms={:.1}", ms(total)).ok();
    if let Some(tpp) = f.generation.as_ref().and_then(tokens_per_pass) {
        write!(s, " tokens_per_pass={tpp:.2}").ok();
    }
    if let Some(g) = f.generation.as_ref().filter(|g| g.drafts.drafted > 0) {
        write!(
            s,
            " drafted={} accepted={}",
            g.drafts.drafted, g.drafts.accepted
        )
        .ok();
    }
    // Quoted with escapes: a `user` field is the client's text.
    write!(s, " tenant={:?}", f.tenant).ok();
    s
}

/// Tokens generated per model pass: every pass yields one token of its own
/// and keeps `accepted` drafted ones, so `completion / (completion -
/// accepted)`; `None` before any token.
fn tokens_per_pass(g: &Generation) -> Option<f64> {
    let passes = g.completion_tokens.checked_sub(g.drafts.accepted)?;
    (passes > 0).then(|| g.completion_tokens as f64 / passes as f64)
}

/// Who a request is, as the log shows it: a fingerprint of its API key
/// (never the key), or `default`.
fn tenant_label(headers: &HeaderMap) -> String {
    match crate::keys::bearer(headers) {
        Some(key) => {
            let digest = Sha256::digest(key.as_bytes());
            let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
            format!("key:{hex}")
        }
        None => "default".into(),
    }
}

/// The middleware: an [`Access`] for every request, in its extensions and
/// held by its response body until that ends.
pub(crate) async fn log_access(mut req: Request, next: Next) -> Response {
    let access = Access::new(
        req.method().as_str(),
        req.uri().path(),
        tenant_label(req.headers()),
    );
    req.extensions_mut().insert(access.clone());
    let resp = next.run(req).await;
    access.set_status(resp.status().as_u16());
    // The line is written when the body is over, so a stream logs once.
    resp.map(|body| {
        Body::new(Guarded {
            body,
            _guard: access,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_carry_the_fields_a_request_has() {
        let mut f = Fields {
            status: Some(200),
            tenant: "user:a\nb".into(),
            prompt_tokens: Some(7),
            generation: Some(Generation {
                first_token: Some(Duration::from_millis(12)),
                completion_tokens: 9,
                drafts: DraftCounts {
                    drafted: 10,
                    accepted: 6,
                    passes: 3,
                },
            }),
        };
        let l = line("POST", "/v1/completions", &f, Duration::from_millis(40));
        assert_eq!(
            l,
            "method=POST path=/v1/completions status=200 prompt_tokens=7 completion_tokens=9 \
             ttft_ms=12.0 total_ms=40.0 tokens_per_pass=3.00 drafted=10 accepted=6 tenant=\"user:a\\nb\""
        );
        f.generation = None;
        f.prompt_tokens = None;
        f.status = None;
        let l = line("GET", "/health", &f, Duration::from_millis(1));
        assert_eq!(
            l,
            "method=GET path=/health status=- total_ms=1.0 tenant=\"user:a\\nb\""
        );
    }

    #[test]
    fn keys_are_fingerprinted_not_logged() {
        let mut h = HeaderMap::new();
        assert_eq!(tenant_label(&h), "default");
        h.insert("authorization", "Bearer sk-secret".parse().unwrap());
        let label = tenant_label(&h);
        assert!(label.starts_with("key:") && label.len() == 12, "{label}");
        assert!(!label.contains("secret"));
    }

    #[test]
    fn no_tokens_no_rate() {
        assert_eq!(tokens_per_pass(&Generation::default()), None);
        let plain = Generation {
            completion_tokens: 4,
            ..Generation::default()
        };
        assert_eq!(tokens_per_pass(&plain), Some(1.0));
    }
}
