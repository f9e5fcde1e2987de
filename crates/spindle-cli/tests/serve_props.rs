//! `spindle serve` for everyday use, checked over raw HTTP: one access-log
//! line per request on stderr (plain text, with the token counts the
//! response reported, streams included), `GET /props` against the flags
//! the server was started with, CORS with and without `--cors-origin`,
//! content parts other than text refused by name, a tool round trip, and
//! the 404 body listing every endpoint.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const KEY: &str = "props-test-key";
const ORIGIN: &str = "http://example.test";
const MODEL: &str = "gemma-3-270m-q4_k_m";

/// A server child, killed when the test ends, failed or not.
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `spindle serve` on the real model with `args`; its stderr piped when
/// `log` (else dropped).
fn spawn(model: &std::path::Path, args: &[&str], log: bool) -> Served {
    let child = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["serve", "-m"])
        .arg(model)
        .args(["--port", "0", "-t", "2"])
        .args(args)
        // The default filter: the access log must show without SPINDLE_LOG.
        .env_remove("SPINDLE_LOG")
        .stdout(Stdio::piped())
        .stderr(if log { Stdio::piped() } else { Stdio::null() })
        .spawn()
        .expect("spindle serve starts");
    Served(child)
}

/// The server's stderr, line by line, read on a thread.
struct Log {
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Log {
    fn of(child: &mut Child) -> Log {
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Log {
            lines,
            seen: Vec::new(),
        }
    }

    /// The next access-log line for `method path` (the line is written when
    /// the response has ended, so it may come a moment after the client
    /// read the whole response).
    fn access(&mut self, method: &str, path: &str) -> (String, HashMap<String, String>) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = self.lines.recv_timeout(left) else {
                panic!(
                    "no access-log line for {method} {path}; stderr so far:\n{}",
                    self.seen.join("\n")
                );
            };
            self.seen.push(line.clone());
            let Some((_, rest)) = line.split_once("spindle::access: ") else {
                continue;
            };
            let fields: HashMap<String, String> = rest
                .split(' ')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            if fields.get("method").map(String::as_str) == Some(method)
                && fields.get("path").map(String::as_str) == Some(path)
            {
                return (line, fields);
            }
        }
    }
}

struct Resp {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// One request on a new connection (`Connection: close`), read whole.
fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole response");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let body = if headers.get("transfer-encoding").map(String::as_str) == Some("chunked") {
        dechunk(body)
    } else {
        body.to_string()
    };
    Resp {
        status,
        headers,
        body,
    }
}

/// A chunked body's data.
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

fn post(addr: &str, path: &str, body: &Value) -> Resp {
    let auth = format!("Bearer {KEY}");
    http(
        addr,
        "POST",
        path,
        &[("Authorization", &auth)],
        &body.to_string(),
    )
}

fn get(addr: &str, path: &str) -> Value {
    let auth = format!("Bearer {KEY}");
    let r = http(addr, "GET", path, &[("Authorization", &auth)], "");
    assert_eq!(r.status, 200, "{path}: {}", r.body);
    r.json()
}

fn number(fields: &HashMap<String, String>, key: &str, line: &str) -> f64 {
    fields
        .get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number {key} in: {line}"))
}

#[test]
fn access_log_props_cors_content_parts_and_404() {
    let Some(model) = common::real_model() else {
        return;
    };
    // Both servers load at once.
    let mut with_cors = spawn(
        &model,
        &[
            "--ctx",
            "512",
            "--max-seqs",
            "2",
            "--spec-budget",
            "8",
            "--api-key",
            KEY,
            "--cors-origin",
            ORIGIN,
            "--cors-origin",
            "http://second.test",
            "--decide-cache-mb",
            "2",
        ],
        true,
    );
    let mut plain = spawn(
        &model,
        &["--ctx", "256", "--max-seqs", "1", "--spec", "off"],
        false,
    );
    let addr = common::serve_addr(&mut with_cors.0);
    let mut log = Log::of(&mut with_cors.0);
    let plain_addr = common::serve_addr(&mut plain.0);

    // A completion's line: its fields, the response's usage, plain text,
    // and the key only as a fingerprint.
    let r = post(
        &addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "The history of the bicycle", "max_tokens": 3, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let usage = r.json()["usage"].clone();
    let (line, f) = log.access("POST", "/v1/completions");
    assert!(line.contains(" INFO "), "{line}");
    assert!(
        !line.contains('\u{1b}'),
        "colour codes in a piped log: {line:?}"
    );
    assert_eq!(f["status"], "200", "{line}");
    assert_eq!(
        f["prompt_tokens"],
        usage["prompt_tokens"].to_string(),
        "{line}"
    );
    assert_eq!(
        f["completion_tokens"],
        usage["completion_tokens"].to_string(),
        "{line}"
    );
    let (ttft, total) = (number(&f, "ttft_ms", &line), number(&f, "total_ms", &line));
    assert!(0.0 < ttft && ttft <= total, "{line}");
    assert!(number(&f, "tokens_per_pass", &line) >= 1.0, "{line}");
    assert!(f["tenant"].starts_with("\"key:"), "{line}");
    assert!(!line.contains(KEY), "the API key is in the log: {line}");

    // A stream gets one line, once it has ended, with the usage it sent.
    let r = post(
        &addr,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                "stream": true, "stream_options": {"include_usage": true}, "user": "alice"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("data: [DONE]"), "{}", r.body);
    let usage: Value = r
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| v.get("usage").filter(|u| u.is_object()).cloned())
        .expect("a usage chunk");
    let (line, f) = log.access("POST", "/v1/chat/completions");
    assert_eq!(f["status"], "200", "{line}");
    assert_eq!(
        f["prompt_tokens"],
        usage["prompt_tokens"].to_string(),
        "{line}"
    );
    assert_eq!(
        f["completion_tokens"],
        usage["completion_tokens"].to_string(),
        "{line}"
    );
    assert!(f.contains_key("ttft_ms"), "{line}");
    assert_eq!(f["tenant"], "\"user:alice\"", "{line}");

    // /props says what the flags said.
    let p = get(&addr, "/props");
    assert_eq!(p["model"]["name"], MODEL, "{p}");
    assert_eq!(p["model"]["architecture"], "gemma3", "{p}");
    assert!(
        p["model"]["path"]
            .as_str()
            .is_some_and(|s| s.ends_with("gemma-3-270m-q4_k_m.gguf")),
        "{p}"
    );
    assert_eq!(p["context_length"], 512, "{p}");
    assert_eq!(p["max_seqs"], 2, "{p}");
    assert_eq!(p["threads"], 2, "{p}");
    assert_eq!(
        p["speculation"],
        json!({"mode": "auto", "budget": 8}),
        "{p}"
    );
    assert_eq!(p["kv"]["type"], "f16", "{p}");
    assert_eq!(p["kv"]["block_tokens"], 16, "{p}");
    let blocks = p["kv"]["blocks"].as_u64().expect("kv.blocks");
    // Room for both sequences at the whole context.
    assert!(blocks >= 2 * 512 / 16, "{p}");
    assert_eq!(p["kv"]["tokens"].as_u64(), Some(blocks * 16), "{p}");
    // Everything that grows with the traffic has a bound, and says it.
    assert_eq!(
        p["memory_bounds"],
        json!({
            "spec_traffic_cache": 16 << 20,
            "decide_priors": 2 << 20,
            "spare_logits": 32 << 20,
            "kv_pool": p["kv"]["bytes"],
        }),
        "{p}"
    );
    assert_eq!(p["build"]["version"], env!("CARGO_PKG_VERSION"), "{p}");
    assert!(p["build"]["isa"].is_string(), "{p}");
    let q = get(&plain_addr, "/props");
    assert_eq!(q["context_length"], 256, "{q}");
    assert_eq!(
        q["speculation"],
        json!({"mode": "off", "budget": null}),
        "{q}"
    );
    assert!(
        q["memory_bounds"].get("spec_traffic_cache").is_none(),
        "{q}"
    );
    // The memory by part: the weights are the file's tensors (a tied head
    // counted once), the KV pool is what /props says, and the allocator
    // and the resident set are read from the process.
    let r = http(&plain_addr, "GET", "/metrics", &[], "");
    let metrics = match r.header("transfer-encoding") {
        Some("chunked") => dechunk(&r.body),
        _ => r.body,
    };
    let part = |name: &str| -> f64 {
        let key = format!("spindle:memory_bytes{{model_name=\"{MODEL}\",part=\"{name}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} in\n{metrics}"))
    };
    let file = std::fs::metadata(&model).unwrap().len() as f64;
    let weights = part("weights");
    assert!(
        weights > 0.9 * file && weights <= file,
        "{weights} bytes of weights in a file of {file}"
    );
    assert_eq!(part("kv_pool"), q["kv"]["bytes"].as_f64().unwrap());
    assert!(part("kv_prefix_cached") <= part("kv_pool"));
    assert!(part("allocator_in_use") > 0.0);
    let rss: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no resident set in\n{metrics}"));
    assert!(rss > part("kv_pool"), "{rss}");
    // It names a path: behind the key like the rest of the API.
    assert_eq!(http(&addr, "GET", "/props", &[], "").status, 401);

    // CORS: a preflight needs no key and names the origin, methods and
    // headers; responses to a listed origin carry it, errors included.
    let preflight = [
        ("Origin", ORIGIN),
        ("Access-Control-Request-Method", "POST"),
        (
            "Access-Control-Request-Headers",
            "authorization, content-type",
        ),
    ];
    let r = http(&addr, "OPTIONS", "/v1/chat/completions", &preflight, "");
    assert!(
        matches!(r.status, 200 | 204),
        "{} {:?}",
        r.status,
        r.headers
    );
    assert_eq!(r.header("access-control-allow-origin"), Some(ORIGIN));
    let methods = r.header("access-control-allow-methods").unwrap_or("");
    assert!(
        methods.contains("POST") && methods.contains("GET"),
        "{methods}"
    );
    let allowed = r
        .header("access-control-allow-headers")
        .unwrap_or("")
        .to_ascii_lowercase();
    assert!(
        allowed.contains("authorization") && allowed.contains("content-type"),
        "{allowed}"
    );
    let auth = format!("Bearer {KEY}");
    let r = http(
        &addr,
        "GET",
        "/v1/models",
        &[("Origin", ORIGIN), ("Authorization", &auth)],
        "",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), Some(ORIGIN));
    let r = http(&addr, "GET", "/v1/models", &[("Origin", ORIGIN)], "");
    assert_eq!(r.status, 401);
    assert_eq!(r.header("access-control-allow-origin"), Some(ORIGIN));
    let r = http(
        &addr,
        "OPTIONS",
        "/v1/chat/completions",
        &[
            ("Origin", "http://other.test"),
            ("Access-Control-Request-Method", "POST"),
        ],
        "",
    );
    assert_eq!(r.header("access-control-allow-origin"), None);
    // Without --cors-origin: no CORS headers, OPTIONS as before.
    let r = http(
        &plain_addr,
        "OPTIONS",
        "/v1/chat/completions",
        &preflight,
        "",
    );
    assert_eq!(r.status, 405, "{}", r.body);
    assert_eq!(r.header("access-control-allow-origin"), None);
    let r = http(&plain_addr, "GET", "/health", &[("Origin", ORIGIN)], "");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), None);

    // Content parts other than text: a 400 naming the part.
    for part in [
        json!({"type": "image_url", "image_url": {"url": "http://example.test/cat.png"}}),
        json!({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}),
    ] {
        let kind = part["type"].as_str().unwrap().to_string();
        let r = post(
            &addr,
            "/v1/chat/completions",
            &json!({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is this?"}, part]}]}),
        );
        assert_eq!(r.status, 400, "{}", r.body);
        let e = r.json();
        let msg = e["error"]["message"].as_str().unwrap_or("");
        assert!(
            msg.contains(&format!("'{kind}'")) && msg.contains("only text parts"),
            "{msg}"
        );
        assert_eq!(e["error"]["param"], "messages");
    }
    // Text parts alone are read.
    let r = post(
        &addr,
        "/v1/chat/completions",
        &json!({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Hi"}]}]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);

    // A tool round trip renders through the template (Gemma 3 has no tool
    // format: the calls and results are written into the turns).
    let r = post(
        &addr,
        "/v1/chat/completions",
        &json!({"model": MODEL, "max_tokens": 2, "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);

    // The 404 body lists every endpoint.
    let r = http(&addr, "GET", "/v2/nothing", &[], "");
    assert_eq!(r.status, 404);
    let msg = r.json()["error"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    for path in [
        "/v1/models",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/decide",
        "/tokenize",
        "/detokenize",
        "/props",
        "/health",
        "/metrics",
    ] {
        assert!(msg.contains(path), "{path} missing: {msg}");
    }
    let (line, f) = log.access("GET", "/v2/nothing");
    assert_eq!(f["status"], "404", "{line}");
}
