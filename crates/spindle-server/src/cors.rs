//! Cross-origin requests from browsers (`spindle serve --cors-origin`):
//! off unless origins are listed. With them, a preflight (`OPTIONS`) is
//! answered before the API key is checked, as browsers send preflights
//! without credentials, and every response to a listed origin carries
//! `Access-Control-Allow-Origin`.

use std::time::Duration;

use axum::http::{header, HeaderValue, Method};
use tower_http::cors::{AllowOrigin, CorsLayer};

/// Which origins may call the API from a browser.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum CorsOrigins {
    /// No CORS headers at all (the default).
    #[default]
    Off,
    /// `*`: any origin.
    Any,
    /// Exactly these origins (`scheme://host[:port]`).
    List(Vec<HeaderValue>),
}

/// An origin `--cors-origin` cannot take.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("--cors-origin '{origin}': {why}")]
pub struct CorsOriginError {
    pub origin: String,
    pub why: &'static str,
}

impl CorsOrigins {
    /// The origins as given on the command line: each `*` or
    /// `scheme://host[:port]`, as browsers send them in `Origin` (no path,
    /// no trailing slash: such an origin would never match).
    pub fn parse(origins: &[String]) -> Result<CorsOrigins, CorsOriginError> {
        if origins.is_empty() {
            return Ok(CorsOrigins::Off);
        }
        if origins.iter().any(|o| o == "*") {
            return Ok(CorsOrigins::Any);
        }
        let mut list = Vec::with_capacity(origins.len());
        for o in origins {
            let bad = |why| CorsOriginError {
                origin: o.clone(),
                why,
            };
            let Some((scheme, rest)) = o.split_once("://") else {
                return Err(bad("give scheme://host[:port], e.g. http://localhost:3000"));
            };
            if scheme.is_empty() || rest.is_empty() {
                return Err(bad("give scheme://host[:port], e.g. http://localhost:3000"));
            }
            if rest.contains('/') {
                return Err(bad(
                    "an origin has no path or trailing slash (browsers send scheme://host[:port])",
                ));
            }
            let v = HeaderValue::from_str(o)
                .map_err(|_| bad("an origin is printable ASCII without spaces"))?;
            if o.chars().any(char::is_whitespace) {
                return Err(bad("an origin is printable ASCII without spaces"));
            }
            list.push(v);
        }
        Ok(CorsOrigins::List(list))
    }

    /// The layer that answers preflights and adds the headers; `None` when
    /// off.
    pub(crate) fn layer(&self) -> Option<CorsLayer> {
        let allow = match self {
            CorsOrigins::Off => return None,
            CorsOrigins::Any => AllowOrigin::any(),
            CorsOrigins::List(list) => AllowOrigin::list(list.iter().cloned()),
        };
        Some(
            CorsLayer::new()
                .allow_origin(allow)
                .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
                .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE, header::ACCEPT])
                .expose_headers([header::RETRY_AFTER])
                .max_age(Duration::from_secs(600)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(list: &[&str]) -> Result<CorsOrigins, CorsOriginError> {
        CorsOrigins::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn origins_are_checked() {
        assert_eq!(parse(&[]), Ok(CorsOrigins::Off));
        assert_eq!(parse(&["http://a.test", "*"]), Ok(CorsOrigins::Any));
        assert_eq!(
            parse(&["http://a.test", "https://b.test:8443"]),
            Ok(CorsOrigins::List(vec![
                HeaderValue::from_static("http://a.test"),
                HeaderValue::from_static("https://b.test:8443"),
            ]))
        );
        for bad in ["a.test", "http://a.test/", "http://", "http://a b", "://x"] {
            let e = parse(&[bad]).unwrap_err();
            assert_eq!(e.origin, bad);
        }
        assert!(parse(&["http://a.test/"])
            .unwrap_err()
            .to_string()
            .contains("trailing slash"));
    }
}
