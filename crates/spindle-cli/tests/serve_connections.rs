//! `spindle serve` against clients that hold connections: byte-by-byte
//! headers, bodies that never end, idle keep-alive connections, oversized
//! headers, and more idle connections than the process has file
//! descriptors. Each must be cut off or refused with a JSON error, and
//! `/health` must keep answering.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server child, killed when the test ends, failed or not.
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `spindle serve` on the real model with `args`, under an open-file
/// limit of 256 (soft and hard, so the server cannot raise it); returns
/// the child and its `host:port`.
fn serve_with_256_files(model: &std::path::Path, args: &[&str]) -> (Served, String) {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 256 && exec \"$@\"")
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_spindle"))
        .args(["serve", "-m"])
        .arg(model)
        .args(["--port", "0", "-t", "2", "--ctx", "512"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spindle serve starts");
    let addr = common::serve_addr(&mut child);
    (Served(child), addr)
}

/// Sends `request` on a new connection and reads the whole answer (the
/// server closes the connection: `Connection: close`).
fn exchange(addr: &str, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    parse(&out)
}

fn parse(raw: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// The JSON error body of a response, checked for OpenAI's shape.
fn error_code(response: &str) -> i64 {
    let body = response.split("\r\n\r\n").nth(1).unwrap_or("");
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not a JSON body ({e}): {response}"));
    assert!(v["error"]["message"].is_string(), "{response}");
    v["error"]["code"].as_i64().unwrap()
}

/// Reads until the server closes the connection; returns how long it took.
fn time_to_close(s: &mut TcpStream, limit: Duration) -> Duration {
    let start = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return start.elapsed(),
            Ok(_) => {}
        }
    }
}

const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

#[test]
fn slow_idle_and_oversized_clients_are_cut_off_and_health_keeps_answering() {
    let Some(model) = common::real_model() else {
        return;
    };
    let (_child, addr) = serve_with_256_files(
        &model,
        &[
            "--header-timeout",
            "1",
            "--body-timeout",
            "1",
            "--idle-timeout",
            "2",
        ],
    );

    // Headers a byte every 100 ms: cut off at the header timeout.
    let mut slow = TcpStream::connect(&addr).unwrap();
    let start = Instant::now();
    for b in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "
        .iter()
        .cycle()
    {
        if slow.write_all(&[*b]).is_err() || start.elapsed() > Duration::from_secs(8) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        slow.set_nonblocking(true).unwrap();
        let mut probe = [0u8; 16];
        let closed = matches!(slow.read(&mut probe), Ok(0));
        slow.set_nonblocking(false).unwrap();
        if closed {
            break;
        }
    }
    let cut = start.elapsed();
    assert!(
        cut < Duration::from_secs(4),
        "a byte-by-byte client held its connection for {cut:?}"
    );

    // A body that never ends: 408 with a JSON error.
    let start = Instant::now();
    let (status, text) = exchange(
        &addr,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": \"he",
    );
    assert_eq!((status, error_code(&text)), (408, 408), "{text}");
    assert!(start.elapsed() < Duration::from_secs(4));

    // An idle keep-alive connection is closed.
    let mut idle = TcpStream::connect(&addr).unwrap();
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 512];
    assert!(idle.read(&mut first).unwrap() > 0);
    let held = time_to_close(&mut idle, Duration::from_secs(10));
    assert!(
        held < Duration::from_secs(5),
        "an idle connection stayed open {held:?}"
    );

    // Oversized headers: 431 with a JSON error.
    let mut big = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 40_000));
    big.extend(b"\r\n\r\n");
    let (status, text) = exchange(&addr, &big);
    assert_eq!((status, error_code(&text)), (431, 431), "{text}");
}

#[test]
fn more_idle_connections_than_file_descriptors_leave_health_answering() {
    let Some(model) = common::real_model() else {
        return;
    };
    // The default limits: idle connections are held 10 s and more.
    let (_child, addr) = serve_with_256_files(&model, &[]);
    let mut crowd = Vec::new();
    for _ in 0..400 {
        match TcpStream::connect(&addr) {
            Ok(s) => crowd.push(s),
            Err(_) => break,
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..3 {
        let start = Instant::now();
        let (status, text) = exchange(&addr, HEALTH);
        assert_eq!(status, 200, "/health under fd pressure: {text}");
        assert!(start.elapsed() < Duration::from_secs(2));
    }
    // Idle connections make room: the idlest is closed for a new one.
    let (status, text) = exchange(
        &addr,
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200, "{text}");
    drop(crowd);
    // Once they are gone the server serves again.
    let start = Instant::now();
    loop {
        let (status, text) = exchange(
            &addr,
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        if status == 200 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still refused: {text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn past_the_cap_of_busy_connections_health_answers_and_the_rest_get_503() {
    let Some(model) = common::real_model() else {
        return;
    };
    let (_child, addr) = serve_with_256_files(&model, &["--max-connections", "4"]);
    // Four connections with a request in flight (bodies still coming):
    // none is idle, none can be closed to make room.
    let mut busy = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 90\r\n\r\n{\"pro",
        )
        .unwrap();
        busy.push(s);
    }
    std::thread::sleep(Duration::from_millis(300));
    let (status, text) = exchange(&addr, HEALTH);
    assert_eq!(status, 200, "/health past the cap: {text}");
    let (status, text) = exchange(
        &addr,
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!((status, error_code(&text)), (503, 503), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("retry-after: 1"),
        "{text}"
    );
    drop(busy);
}
