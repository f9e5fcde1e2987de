//! Opening a model from a path: a GGUF file or a Hugging Face directory.

use std::path::Path;

use spindle_formats::{FormatError, GgmlType, GgufFile, SafetensorsModel, TensorBytes};

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::forward::Model;
use crate::tokenizer::Tokenizer;
use crate::weights::{TensorSource, Weights};

/// A model with its tokenizer, as found on disk.
pub struct LoadedModel {
    pub model: Model,
    /// `None` when the file carries no vocabulary (e.g. test models); commands
    /// that need text then say so.
    pub tokenizer: Option<Tokenizer>,
    pub tokenizer_error: Option<String>,
    pub name: String,
}

/// `model` with its output head screened (`forward/head.rs`), calibrated
/// on [`crate::forward::CALIBRATION_TEXT`] through `tokenizer` and built
/// now (about 0.3 s for a 262k-token head on 2 cores); unchanged
/// without a tokenizer or with `SPINDLE_HEAD_SCREEN=0`.
fn screened(mut model: Model, tokenizer: Option<&Tokenizer>) -> Model {
    if std::env::var("SPINDLE_HEAD_SCREEN").is_ok_and(|v| v == "0") {
        return model;
    }
    let ids = tokenizer.and_then(|t| t.encode(crate::forward::CALIBRATION_TEXT, true, false).ok());
    model.set_head_screen(ids);
    // Built now, so the first generation does not pay for it; a screen
    // that cannot be built leaves the full head, which is always exact.
    if model.head_screen().is_err() {
        model.set_head_screen(None);
    }
    model
}

/// Loads the model at `path` with `n_threads` compute threads.
pub fn load(path: &Path, n_threads: usize) -> Result<LoadedModel, ModelError> {
    check_exists(path)?;
    if path.is_dir() {
        let st = open_hf_dir(path)?;
        let config = ModelConfig::from_hf(st.config())?;
        let weights = Weights::load(&TensorSource::Safetensors(&st), &config)?;
        let (tokenizer, tokenizer_error) = split(Tokenizer::from_hf_dir(path));
        return Ok(LoadedModel {
            model: screened(Model::new(config, weights, n_threads), tokenizer.as_ref()),
            tokenizer,
            tokenizer_error,
            name: file_name(path),
        });
    }
    // The tokenizer (a second, header-only view of the file) is built on its
    // own thread while the weights are copied and checked: the two take
    // similar time.
    std::thread::scope(|scope| {
        let tokenizer = scope.spawn(|| gguf_tokenizer(&GgufFile::open(path)?));
        let mut gguf = GgufFile::open(path)?;
        if resident_weights(gguf.file_len()) {
            let vertical = vertical_weights();
            let head = head_tensor(&gguf);
            gguf.make_resident_with(|t, bytes| vertical && rewrite_vertical(t, bytes, head))?;
        }
        let config = ModelConfig::from_gguf(&gguf)?;
        let weights = Weights::load(&TensorSource::Gguf(&gguf), &config)?;
        let (tokenizer, tokenizer_error) = tokenizer.join().expect("tokenizer thread panicked")?;
        crate::heap::release_freed_memory();
        Ok(LoadedModel {
            model: screened(Model::new(config, weights, n_threads), tokenizer.as_ref()),
            tokenizer,
            tokenizer_error,
            name: gguf
                .get_str("general.name")
                .map_or_else(|| file_name(path), str::to_string),
        })
    })
}

/// What [`check_weights`] scanned.
#[derive(Debug, Clone, Copy)]
pub struct WeightsCheck {
    pub tensors: usize,
    pub values: u64,
    pub bytes: u64,
}

/// Dequantizes every value of every tensor of the model at `path` and
/// errors at the first NaN or infinity, naming the tensor, the element and
/// its block. Loading checks only what is cheap (norms, biases, block
/// scales); this reads everything.
pub fn check_weights(path: &Path) -> Result<WeightsCheck, ModelError> {
    check_exists(path)?;
    let mut tensors: Vec<(String, GgmlType, usize, TensorBytes)> = Vec::new();
    let (gguf, st);
    if path.is_dir() {
        st = open_hf_dir(path)?;
        for t in st.tensors() {
            tensors.push((
                t.name.clone(),
                t.ty,
                t.shape.iter().product(),
                t.bytes.clone(),
            ));
        }
    } else {
        gguf = GgufFile::open(path)?;
        for t in gguf.tensors() {
            let n = t.dims.iter().product::<u64>() as usize;
            tensors.push((t.name.clone(), t.ty()?, n, gguf.tensor_bytes(t)));
        }
    }
    let mut check = WeightsCheck {
        tensors: 0,
        values: 0,
        bytes: 0,
    };
    for (name, ty, n, bytes) in &tensors {
        if let Some((index, value)) = spindle_kernels::first_non_finite(*ty, bytes, *n)? {
            return Err(ModelError::NonFiniteWeight {
                name: name.clone(),
                index,
                block: index / ty.block_len(),
                value,
            });
        }
        check.tensors += 1;
        check.values += *n as u64;
        check.bytes += bytes.len() as u64;
    }
    Ok(check)
}

/// Only the tokenizer of the model at `path` (no weights are read).
pub fn load_tokenizer(path: &Path) -> Result<(Option<Tokenizer>, Option<String>), ModelError> {
    check_exists(path)?;
    if path.is_dir() {
        // A tokenizer-only directory (tokenizer.json, and maybe
        // tokenizer_config.json) is enough to tokenize, as a vocab-only
        // GGUF is.
        if !path.join("tokenizer.json").is_file() {
            open_hf_dir(path)?;
        }
        return Ok(split(Tokenizer::from_hf_dir(path)));
    }
    gguf_tokenizer(&GgufFile::open(path)?)
}

fn gguf_tokenizer(gguf: &GgufFile) -> Result<(Option<Tokenizer>, Option<String>), ModelError> {
    // A file without a vocabulary (test models) is fine until text is needed.
    if gguf.get("tokenizer.ggml.tokens").is_none() {
        return Ok((None, None));
    }
    Ok(split(Tokenizer::from_gguf(gguf)))
}

/// The path must be a file or a directory: a symlink loop is named as one
/// (not "no such file"), and a FIFO or device is refused before it is opened.
fn check_exists(path: &Path) -> Result<(), ModelError> {
    match spindle_formats::file_kind::metadata(path) {
        Ok(meta) if meta.is_file() || meta.is_dir() => Ok(()),
        Ok(meta) => Err(FormatError::WrongFileKind {
            path: path.to_path_buf(),
            found: spindle_formats::file_kind::kind_name(meta.file_type()),
            expected: "a model file or directory",
        }
        .into()),
        Err(FormatError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Err(ModelError::Open {
                path: path.display().to_string(),
                reason: "no such file or directory; give a .gguf file or a model directory with -m, or run `spindle pull`".into(),
            })
        }
        Err(e) => Err(e.into()),
    }
}

fn open_hf_dir(path: &Path) -> Result<SafetensorsModel, ModelError> {
    if !spindle_formats::is_hf_dir(path) {
        return Err(ModelError::NotAModel {
            path: path.display().to_string(),
        });
    }
    Ok(SafetensorsModel::open(path)?)
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Whether weights are copied into huge-page memory at load (decoding runs
/// 20% faster, docs/PERF.md §4, §52) or read through the file's memory
/// map: the map when `SPINDLE_MMAP=1`, or when the file is over half the
/// available memory and the copy would not leave [`copy_headroom`] of it
/// for the KV cache and the pass's buffers. (The file's pages that the copy
/// reads through the page cache are clean and reclaimable, so they need no
/// room of their own.)
fn resident_weights(file_len: u64) -> bool {
    if std::env::var("SPINDLE_MMAP").is_ok_and(|v| v == "1") {
        return false;
    }
    mem_available().is_none_or(|avail| fits_resident(file_len, avail))
}

/// Whether a file of `file_len` bytes is copied when `avail` bytes are
/// available: under half of it (as small machines always did), or the copy
/// plus [`copy_headroom`] fit.
fn fits_resident(file_len: u64, avail: u64) -> bool {
    file_len < avail / 2 || file_len.saturating_add(copy_headroom(avail)) <= avail
}

/// Memory a resident copy leaves free: an eighth of what is available, at
/// least 2 GiB (a 4,096-token f16 KV cache of a 30B-A3B model is 0.4 GB).
fn copy_headroom(avail: u64) -> u64 {
    (avail / 8).max(2 << 30)
}

/// Whether the resident copy's layer matrices are rewritten into the
/// vertical layout (`spindle_kernels::quant::vertical`): on machines whose
/// kernels read it (AVX-512 VNNI), unless `SPINDLE_VERTICAL=0` (to compare
/// against the file's order).
fn vertical_weights() -> bool {
    spindle_kernels::simd::detected_isa().uses_avx512()
        && std::env::var("SPINDLE_VERTICAL").map_or(true, |v| v != "0")
}

/// The matrices of a decoder layer (only matmul reads them). The output
/// head is rewritten too (its readers row by row, the embedding lookup of
/// a tied head and the head's screen, read the layout); an embedding
/// matrix that is not the head keeps the file's order (nothing multiplies
/// it).
const LAYER_MATRICES: [&str; 15] = [
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "attn_qkv",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
    "ffn_gate_inp",
    "ffn_gate_exps",
    "ffn_up_exps",
    "ffn_down_exps",
    "ffn_gate_shexp",
    "ffn_up_shexp",
    "ffn_down_shexp",
];

/// Rewrites tensor `t`'s bytes into the vertical layout when it is a layer
/// matrix of a type and shape the layout holds; says whether it did. A
/// tensor with a bad block scale keeps the file's order, so that the load's
/// check names the block as the file has it.
fn rewrite_vertical(t: &spindle_formats::GgufTensorInfo, bytes: &mut [u8], head: &str) -> bool {
    use spindle_kernels::quant::vertical::{to_vertical, vertical_supported};
    let stem = t
        .name
        .strip_prefix("blk.")
        .and_then(|rest| rest.split_once('.'))
        .and_then(|(_, rest)| rest.strip_suffix(".weight"));
    let Ok(ty) = t.ty() else {
        return false;
    };
    let matrix = stem.is_some_and(|stem| LAYER_MATRICES.contains(&stem)) || t.name == head;
    let cols = t.dims.first().map_or(0, |&c| c as usize);
    let rows = t.dims.get(1).map_or(0, |&r| r as usize);
    if !matrix || spindle_kernels::first_bad_scale(ty, bytes).is_some() {
        return false;
    }
    if t.name == head && head_in_panels(ty, rows, cols) {
        return spindle_kernels::quant::panels::to_panels(ty, rows, cols, bytes).is_ok();
    }
    if t.name != head && t.dims.len() == 2 && layer_in_panels(ty, rows, cols) {
        return spindle_kernels::quant::panels::to_panels(ty, rows, cols, bytes).is_ok();
    }
    vertical_supported(ty, cols) && to_vertical(ty, cols, bytes).is_ok()
}

/// Whether a rewritten output head of this type and shape is held in panels
/// of 16 rows (`spindle_kernels::quant::panels`: a Q8_0 head, whose
/// multi-row tile then needs no lane reduction, PERF §49) rather than the
/// vertical layout; `SPINDLE_HEAD_PANELS=0` keeps it vertical (to compare).
/// The loader and the weights' reader ask the same question.
pub(crate) fn head_in_panels(ty: spindle_kernels::GgmlType, rows: usize, cols: usize) -> bool {
    // Q8_0 only: panels hold Q5_0 too, but a Q5_0 head in them is unmeasured.
    ty == spindle_kernels::GgmlType::Q8_0
        && spindle_kernels::quant::panels::panels_supported(ty, rows, cols)
        && std::env::var("SPINDLE_HEAD_PANELS").map_or(true, |v| v != "0")
}

/// Whether a rewritten layer matrix (two dimensions) of this type and shape
/// is held in panels of 16 rows rather than the vertical layout: Q5_0 on
/// AVX-512 VNNI machines without AMX (AMX's tiles read the vertical
/// layout), and only when `SPINDLE_LAYER_PANELS=1`. The panel tile runs
/// 15-20% faster than the vertical one on warm weights at 16 rows, but in
/// a pass, where each matrix comes from DRAM, the 2-core Zen 4 measured no
/// gain at 16 or 512 rows and one-row passes no faster (PERF §56): worth
/// pricing on machines with more cores per pass. The loader and the
/// weights' reader ask the same question.
pub(crate) fn layer_in_panels(ty: spindle_kernels::GgmlType, rows: usize, cols: usize) -> bool {
    ty == spindle_kernels::GgmlType::Q5_0
        && spindle_kernels::quant::panels::panels_supported(ty, rows, cols)
        && spindle_kernels::simd::detected_isa() == spindle_kernels::simd::Isa::Avx512Vnni
        && std::env::var("SPINDLE_LAYER_PANELS").is_ok_and(|v| v == "1")
}

/// The tensor the output head multiplies: `output.weight`, or the
/// embeddings where the head is tied to them.
fn head_tensor(gguf: &GgufFile) -> &'static str {
    if gguf.tensor("output.weight").is_some() {
        "output.weight"
    } else {
        "token_embd.weight"
    }
}

/// `MemAvailable` from /proc/meminfo, in bytes.
fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

fn split<T, E: std::fmt::Display>(r: Result<T, E>) -> (Option<T>, Option<String>) {
    match r {
        Ok(t) => (Some(t), None),
        Err(e) => (None, Some(e.to_string())),
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn only_what_was_measured_goes_into_panels() {
        use spindle_kernels::GgmlType;
        // A Q5_0 head stays vertical (panels hold Q5_0, but such a head
        // was never measured in them), and so do shapes panels cannot hold.
        assert!(!head_in_panels(GgmlType::Q5_0, 262_144, 640));
        assert!(!head_in_panels(GgmlType::Q8_0, 262_145, 640));
        assert!(!head_in_panels(GgmlType::Q6_K, 262_144, 640));
        // Layer matrices: Q5_0 only, and only when asked for (the variable
        // is not set in the tests).
        if std::env::var_os("SPINDLE_LAYER_PANELS").is_none() {
            assert!(!layer_in_panels(GgmlType::Q5_0, 2048, 640));
        }
        assert!(!layer_in_panels(GgmlType::Q8_0, 2048, 640));
    }

    #[test]
    fn weights_are_copied_when_the_copy_leaves_room() {
        const GB: u64 = 1_000_000_000;
        // A 30B-A3B Q4_K_M file (18.55 GB) on a 24 GiB machine: copied
        // (docs/PERF.md §52: decode 21% faster than through the map).
        assert!(fits_resident(18_550_000_000, 22_100_000_000));
        // Not when the copy would leave under an eighth (or 2 GiB) free.
        assert!(!fits_resident(20 * GB, 22 * GB));
        assert!(!fits_resident(7 * GB, 8 * GB));
        assert!(!fits_resident(30 * GB, 22 * GB));
        // Small machines as before: under half of what is available.
        assert!(fits_resident(250_000_000, 2 * GB));
        assert!(!fits_resident(1_500_000_000, 2 * GB));
    }

    #[test]
    fn fifos_and_symlink_loops_are_refused_promptly() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("model.gguf");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo failed");
        let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();

        // On its own thread, so that a regression fails instead of hanging.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let err = |r: Result<(), ModelError>| r.err().map(|e| e.to_string());
            let _ = tx.send([
                err(load_tokenizer(&fifo).map(drop)),
                err(load(&fifo, 1).map(drop)),
                err(load(&a, 1).map(drop)),
            ]);
        });
        let [tok, fifo, looped] = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("opening a FIFO blocked");
        for e in [tok, fifo] {
            let e = e.expect("a FIFO must be refused");
            assert!(e.contains("is a FIFO (named pipe)"), "{e}");
        }
        let looped = looped.expect("a symlink loop must be refused");
        assert!(looped.contains("symlink loop"), "{looped}");
    }
}
