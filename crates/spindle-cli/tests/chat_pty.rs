//! `spindle chat` driven in a pseudo-terminal, as a person would use it, on
//! the real default model (skipped with a note when it is absent, failing
//! instead when SPINDLE_REQUIRE_MODEL=1): history, Ctrl-C, commands, the
//! context running out, and turns that prefill only what is new.

mod common;

use std::path::Path;
use std::process::Command;
use std::thread::sleep;
use std::time::Duration;

use expectrl::session::OsSession;
use expectrl::{Eof, Expect, Regex, Session};

/// Every expect gives up after this, so a stuck session fails the test.
const TIMEOUT: Duration = Duration::from_secs(30);

const STATS: &str = r"\[(\d+) tokens, [^|\]]*\| prompt (\d+) tokens, (\d+) new, [0-9.]+ ms\]";

fn chat(model: &Path, extra: &[&str]) -> OsSession {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spindle"));
    cmd.args(["chat", "-m"])
        .arg(model)
        .args(["--temp", "0", "-t", "2"])
        .args(extra);
    let mut s = Session::spawn(cmd).expect("spawn spindle chat in a pty");
    s.set_expect_timeout(Some(TIMEOUT));
    s.expect("Type /help").expect("the banner");
    s.expect("> ").expect("the first prompt");
    s
}

/// The next stats line: (generated, prompt tokens, prefilled tokens).
fn stats(s: &mut OsSession) -> (usize, usize, usize) {
    let c = s.expect(Regex(STATS)).expect("a stats line");
    let n = |i| {
        std::str::from_utf8(c.get(i).unwrap())
            .unwrap()
            .parse::<usize>()
            .unwrap()
    };
    (n(1), n(2), n(3))
}

fn say(s: &mut OsSession, line: &str) -> (usize, usize, usize) {
    s.send_line(line).unwrap();
    let st = stats(s);
    s.expect("> ").expect("the prompt after a reply");
    st
}

fn quit(mut s: OsSession) {
    s.send_line("/exit").unwrap();
    s.expect(Eof).expect("the session ends at /exit");
}

#[test]
fn chat_in_a_terminal() {
    let Some(m) = common::real_model() else {
        return;
    };

    // Short greedy replies, plain decoding.
    let mut s = chat(&m, &["-n", "12", "--ctx", "1024", "--spec", "off"]);
    let (_, total1, new1) = say(&mut s, "Name a color.");
    assert_eq!(new1, total1, "the first turn prefills everything");
    let (_, total2, new2) = say(&mut s, "Name another color.");
    assert!(
        new2 < total2,
        "the second turn reuses the KV: {new2} of {total2}"
    );
    assert!(
        new2 <= total2 - total1,
        "{new2} new of {total2}, {total1} before"
    );

    // Up recalls the last line; Enter sends it again.
    s.send("\x1b[A").unwrap();
    s.expect("Name another color.").expect("the recalled line");
    s.send("\r").unwrap();
    let (_, total3, _) = stats(&mut s);
    assert!(total3 > total2);
    s.expect("> ").unwrap();

    // Ctrl-C at the prompt clears the line and does not quit.
    s.send("half a line").unwrap();
    s.send("\x03").unwrap();
    s.expect("Ctrl-C clears the line").expect("the hint");
    s.expect("> ").unwrap();

    // Commands.
    s.send_line("/frobnicate").unwrap();
    s.expect("unknown command /frobnicate").unwrap();
    s.expect("> ").unwrap();
    let (_, regen_total, regen_new) = say(&mut s, "/regen");
    assert_eq!(regen_total, total3, "/regen answers the same prompt");
    assert!(regen_new < regen_total, "/regen reuses the prompt's KV");
    s.send_line("/clear").unwrap();
    s.expect("[conversation cleared").unwrap();
    s.expect("> ").unwrap();
    let (_, total, _) = say(&mut s, "Name a color.");
    assert_eq!(total, total1, "after /clear the conversation starts over");
    quit(s);

    // Ctrl-C stops a long reply (speculative decoding, the default); the
    // conversation goes on.
    let mut s = chat(&m, &["-n", "400", "--ctx", "1024"]);
    s.send_line("Write a very long story about a dragon and a knight.")
        .unwrap();
    // Wait for the reply to be under way.
    s.expect("\n").unwrap();
    sleep(Duration::from_millis(500));
    s.send("\x03").unwrap();
    s.expect("[stopped]").expect("Ctrl-C stops the reply");
    let (generated, _, _) = stats(&mut s);
    assert!(generated < 400, "stopped at {generated} tokens");
    s.expect("> ").unwrap();
    s.send_line("Now name a color.").unwrap();
    let (_, total, new) = stats(&mut s);
    assert!(new < total, "the stopped reply's KV is kept");
    s.expect("> ").unwrap();
    quit(s);

    // A tiny context: old turns are dropped, a message too long alone is
    // refused, and the chat keeps answering.
    let mut s = chat(&m, &["-n", "16", "--ctx", "128", "--spec", "off"]);
    let mut dropped = false;
    for i in 0..6 {
        s.send_line(format!("Tell me one thing about the number {i}, please."))
            .unwrap();
        let c = s
            .expect(Regex(
                r"dropped the (oldest turn|\d+ oldest turns)|\[\d+ tokens, ",
            ))
            .unwrap();
        if c.get(0).is_some_and(|m| m.starts_with(b"dropped")) {
            dropped = true;
            stats(&mut s);
        }
        s.expect("> ").unwrap();
        if dropped {
            break;
        }
    }
    assert!(
        dropped,
        "a 128-token context filled without dropping a turn"
    );
    let long = "word ".repeat(200);
    s.send_line(long.trim()).unwrap();
    s.expect("does not fit")
        .expect("a message longer than the context");
    s.expect("> ").unwrap();
    say(&mut s, "Hi.");
    quit(s);
}

/// A long prompt in a terminal shows a prefill bar once it has run a
/// second, and the bar's smaller passes change nothing: the same greedy
/// text as the same command with standard error piped (no bar).
#[test]
fn a_long_prompt_shows_a_prefill_bar_and_the_same_text() {
    let Some(m) = common::real_model() else {
        return;
    };
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3")
        .unwrap_or_else(|_| "The quick brown fox jumps over the lazy dog. ".repeat(300));
    let dir = std::env::temp_dir().join(format!("spindle-bar-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prompt = dir.join("long.txt");
    // About 3,000 tokens: several seconds of prefill on 2 cores.
    std::fs::write(&prompt, &text[..text.len().min(14_000)]).unwrap();
    let args = |cmd: &mut Command| {
        cmd.args(["run", "-m"])
            .arg(&m)
            .arg("-f")
            .arg(&prompt)
            .args(["-n", "6", "--temp", "0", "-t", "2", "--spec", "off"]);
    };
    let mut piped = Command::new(env!("CARGO_BIN_EXE_spindle"));
    args(&mut piped);
    let piped = piped.output().unwrap();
    assert!(piped.status.success());
    let piped_err = String::from_utf8_lossy(&piped.stderr);
    assert!(
        !piped_err.contains("prefill ["),
        "no bar when piped: {piped_err}"
    );
    let expected = String::from_utf8_lossy(&piped.stdout).trim().to_string();
    assert!(!expected.is_empty());

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spindle"));
    args(&mut cmd);
    let mut s = Session::spawn(cmd).expect("spawn spindle run in a pty");
    s.set_expect_timeout(Some(Duration::from_secs(120)));
    s.expect(Regex(r"prefill \[[=> ]+\] \d+/\d+ tokens"))
        .expect("a prefill bar");
    s.expect(expected.as_str())
        .expect("the same text in a terminal as piped");
    s.expect(Eof).expect("the run ends");
    std::fs::remove_dir_all(dir).ok();
}
