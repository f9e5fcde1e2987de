//! The web pages of `spindle serve` in a real browser: headless Chromium,
//! driven by Selenium (tests/webui/check_webui.py), against a live server
//! with the real model and an API key: the key dialog, a streamed reply
//! equal to the API's, Stop, a reload that keeps the conversation, model
//! output with `<script>` and `<img onerror>` rendered as text, the
//! decision playground, phone width, no request off the origin, and the
//! dashboard's charts moving under load. Screenshots go to
//! `target/webui-screenshots` (the ones in docs/screenshots come from
//! there). Also: `--no-webui` serves no pages.
//!
//! Needs Debian's `chromium` and `chromium-driver` and the `selenium`
//! package in `target/pydeps` (`.ci/run` installs them); without them the
//! test skips with a note, except under `SPINDLE_REQUIRE_MODEL=1` (CI).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `spindle serve` on a free port; its `host:port`.
fn start(model: &Path, extra: &[&str]) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["serve", "-m"])
        .arg(model)
        .args(["--port", "0", "-t", "2", "--ctx", "2048", "--max-seqs", "4"])
        .args(extra)
        .env("SPINDLE_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spindle serve starts");
    let addr = common::serve_addr(&mut child);
    (Server(child), addr)
}

/// The status line and body of `GET path`.
fn get(addr: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connects");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.lines().next().unwrap_or_default().to_string();
    let body = out.split_once("\r\n\r\n").map(|x| x.1).unwrap_or_default();
    (status, body.to_string())
}

/// The browser, its driver and Selenium, or a note (a failure in CI).
fn browser_available() -> bool {
    let chromium = Path::new("/usr/bin/chromium").exists();
    let driver = Path::new("/usr/bin/chromedriver").exists();
    let selenium = Command::new("python3")
        .args(["-c", "import selenium"])
        .env("PYTHONPATH", common::pydeps())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let ok = chromium && driver && selenium;
    if !ok {
        let fix = "apt-get install chromium chromium-driver; python3 -m pip install --target target/pydeps selenium";
        assert!(
            std::env::var("SPINDLE_REQUIRE_MODEL").ok().as_deref() != Some("1"),
            "the browser tests need Chromium, chromedriver and selenium: {fix}"
        );
        eprintln!("skipping: Chromium, chromedriver or selenium is missing ({fix})");
    }
    ok
}

#[test]
fn the_pages_work_in_a_real_browser() {
    let Some(model) = common::real_model() else {
        return;
    };
    if !browser_available() {
        return;
    }
    let key = "browser-test-key";
    let (_server, addr) = start(&model, &["--api-key", key]);
    // The pages themselves need no key (they hold no data); the API does.
    let (status, body) = get(&addr, "/");
    assert!(status.contains("200"), "{status}");
    assert!(body.contains("/webui/chat.js"), "{body}");
    let (status, _) = get(&addr, "/v1/models");
    assert!(status.contains("401"), "{status}");
    let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/webui-screenshots");
    let out = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/webui/check_webui.py"))
        .env("PYTHONPATH", common::pydeps())
        .env("SPINDLE_ROOT", format!("http://{addr}"))
        .env("SPINDLE_KEY", key)
        .env("SPINDLE_MODEL", "gemma-3-270m-q4_k_m")
        .env("SPINDLE_SCREENSHOTS", &shots)
        .stderr(Stdio::inherit())
        .output()
        .expect("python3 runs");
    let report = String::from_utf8_lossy(&out.stdout);
    print!("{report}");
    assert!(
        out.status.success(),
        "the browser checks failed (screenshots in {})",
        shots.display()
    );
    assert!(report.contains("all web page checks passed"));
}

#[test]
fn no_webui_serves_no_pages() {
    let Some(model) = common::real_model() else {
        return;
    };
    let (_server, addr) = start(&model, &["--no-webui"]);
    for path in ["/", "/dashboard", "/webui/chat.js"] {
        let (status, body) = get(&addr, path);
        assert!(status.contains("404"), "{path}: {status}");
        assert!(body.contains("no such endpoint"), "{path}: {body}");
        assert!(
            !body.contains("/dashboard"),
            "the 404 lists the pages: {body}"
        );
    }
    let (status, _) = get(&addr, "/health");
    assert!(status.contains("200"), "{status}");
}
