//! `spindle serve` stopped as orchestrators stop it: SIGTERM lets a stream
//! in flight finish with `[DONE]`, refuses new connections, does not wait
//! for clients that send half a request and then nothing, and logs each
//! step.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn sigterm_drains_streams_and_does_not_wait_on_silent_clients() {
    let Some(model) = common::real_model() else {
        return;
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["serve", "-m"])
        .arg(&model)
        .args([
            "--port",
            "0",
            "-t",
            "2",
            "--ctx",
            "512",
            "--drain-timeout",
            "30",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spindle serve starts");
    let addr = common::serve_addr(&mut child);
    // A stream in flight.
    let body = r#"{"model": "gemma-3-270m-q4_k_m", "prompt": "Once upon a time", "max_tokens": 48, "temperature": 0, "ignore_eos": true, "stream": true}"#;
    let mut stream = TcpStream::connect(&addr).unwrap();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut seen = String::new();
    while !seen.contains("data: {") {
        let mut l = String::new();
        assert!(
            reader.read_line(&mut l).unwrap() > 0,
            "the stream ended early: {seen}"
        );
        seen.push_str(&l);
    }
    // Clients that send half their headers, or half a body, and then
    // nothing.
    let mut silent = Vec::new();
    for _ in 0..5 {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        silent.push(s);
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 90\r\n\r\n{\"pro",
        )
        .unwrap();
        silent.push(s);
    }
    std::thread::sleep(Duration::from_millis(200));

    let signalled = Instant::now();
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    // The stream in flight finishes whole.
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    seen.push_str(&rest);
    assert!(seen.contains("data: [DONE]"), "the stream was cut: {seen}");
    // No new connections once the drain began.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        TcpStream::connect(&addr).is_err(),
        "a new connection was accepted while draining"
    );
    // The silent clients are not waited for: the stop comes once the
    // stream ends, long before the 30 s drain timeout.
    let status = child.wait().unwrap();
    let waited = signalled.elapsed();
    assert!(waited < Duration::from_secs(10), "stopped after {waited:?}");
    assert!(status.success(), "{status:?}");
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(log.contains("SIGTERM: shutting down"), "{log}");
    assert!(log.contains("every request finished"), "{log}");
    drop(silent);
}
