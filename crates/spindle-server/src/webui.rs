//! The web pages: a chat page (with a decision playground) at `/` and live
//! charts of `/metrics` at `/dashboard`, from files compiled into the
//! binary (`crates/spindle-server/webui/`). They need no network: every
//! script, style and request stays on this server's origin, which the
//! Content-Security-Policy they are served with enforces in the browser
//! (no inline scripts, no other hosts). Model output is put into the page
//! as text nodes only, never parsed as HTML. `--no-webui` turns them off.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::error::ApiError;
use crate::Shared;

/// One file of the pages.
struct Asset {
    name: &'static str,
    mime: &'static str,
    body: &'static str,
}

/// A file of `crates/spindle-server/webui/` compiled in, with its type.
macro_rules! asset {
    ($name:literal, $mime:literal) => {
        Asset {
            name: $name,
            mime: $mime,
            body: include_str!(concat!("../webui/", $name)),
        }
    };
}

/// Every file the pages use, by the name they are asked for under
/// `/webui/`.
const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("dashboard.html", "text/html; charset=utf-8"),
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("api.js", "text/javascript; charset=utf-8"),
    asset!("markdown.js", "text/javascript; charset=utf-8"),
    asset!("chat.js", "text/javascript; charset=utf-8"),
    asset!("decide.js", "text/javascript; charset=utf-8"),
    asset!("dashboard.js", "text/javascript; charset=utf-8"),
    asset!("charts.js", "text/javascript; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
];

/// What the pages may load and call: this origin only, no inline script
/// or style, no plugins, not framed by other sites.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// The routes of the pages (none of them needs the API key: they hold no
/// data; the page asks for the key when the API refuses it).
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/", get(|| async { page("index.html") }))
        .route("/dashboard", get(|| async { page("dashboard.html") }))
        .route(
            "/webui/{file}",
            get(|Path(file): Path<String>| async move { page(&file) }),
        )
}

/// The paths the pages add to the endpoint list of a 404.
pub(crate) const PATHS: &[&str] = &["/", "/dashboard"];

/// The asset `name` with its type and the page headers, or a 404.
fn page(name: &str) -> Response {
    let Some(a) = ASSETS.iter().find(|a| a.name == name) else {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no such file of the web pages: {name}"),
        )
        .into_response();
    };
    let mut resp = a.body.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(a.mime));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // The files change only with the binary; a reload asks again.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file a page names under `/webui/` is served, and no script
    /// parses text as HTML or evaluates it: model output reaches the page
    /// through text nodes only.
    #[test]
    fn pages_load_only_their_own_files_and_never_parse_html() {
        for a in ASSETS {
            for (i, _) in a.body.match_indices("/webui/") {
                let rest = &a.body[i + "/webui/".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
                    .collect();
                assert!(
                    ASSETS.iter().any(|b| b.name == name),
                    "{} names /webui/{name}, which is not served",
                    a.name
                );
            }
            for banned in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
                "new Function",
                "http://",
                "https://",
            ] {
                // The SVG namespace is a name, not a request.
                let body = a.body.replace("http://www.w3.org/2000/svg", "");
                assert!(!body.contains(banned), "{} contains {banned}", a.name);
            }
        }
    }
}
