//! Planning from GGUF headers: the real Gemma 3 270M, cut after its tensor
//! infos, against the figures in docs ANCHORS.md; and broken headers.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use spindle_formats::GgufFile;
use spindle_plan::{plan, Device, EngineProfile, Family, KvType, ModelShape, PlanRequest};

fn real_model() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let path = PathBuf::from(home).join(".cache/spindle/models/gemma-3-270m-q4_k_m.gguf");
    if path.is_file() {
        return Some(path);
    }
    if std::env::var("SPINDLE_REQUIRE_MODEL").is_ok_and(|v| v == "1") {
        panic!("SPINDLE_REQUIRE_MODEL=1 but {} is absent", path.display());
    }
    eprintln!("skipping: {} is absent", path.display());
    None
}

/// A copy of the model's header only: everything before the data section.
fn header_only_copy(path: &PathBuf) -> tempfile::NamedTempFile {
    let gguf = GgufFile::open_header(path).unwrap();
    let header_len = gguf.data_offset() as usize;
    let bytes = std::fs::read(path).unwrap();
    let mut out = tempfile::Builder::new().suffix(".gguf").tempfile().unwrap();
    out.write_all(&bytes[..header_len]).unwrap();
    assert!(header_len < 8 << 20, "header is {header_len} bytes");
    out
}

#[test]
fn gemma_3_270m_header_only_matches_the_anchors() {
    let Some(path) = real_model() else { return };
    let copy = header_only_copy(&path);
    let s = ModelShape::from_path(copy.path()).unwrap();

    // ANCHORS.md, bytes by type.
    let want: BTreeMap<String, u64> = [
        ("Q8_0", 179_824_640),
        ("Q5_0", 43_591_680),
        ("Q4_K", 13_271_040),
        ("Q6_K", 9_676_800),
        ("F32", 223_744),
    ]
    .into_iter()
    .map(|(t, b)| (t.to_string(), b))
    .collect();
    assert_eq!(s.weights.by_type, want);
    assert_eq!(s.weights.bytes, 246_587_904);
    assert_eq!(s.weights.tensors, 10 + 81 + 27 + 9 + 109);

    // ANCHORS.md, the model: 18 layers (5, 11, 17 global, the rest sliding
    // 512), 1 KV head of 256, vocab 262144, context 32768, tied head.
    assert_eq!(s.family, Family::Gemma3);
    assert_eq!((s.n_layers, s.n_embd, s.n_ff), (18, 640, 2048));
    assert_eq!((s.n_heads, s.n_kv_heads, s.head_dim), (4, 1, 256));
    assert_eq!((s.vocab_size, s.context_length), (262_144, 32_768));
    assert_eq!(s.sliding_window, Some(512));
    let globals: Vec<usize> = (0..18).filter(|&l| !s.layer_sliding[l]).collect();
    assert_eq!(globals, vec![5, 11, 17]);
    assert!(s.tied_embeddings);
    // 2 * 18 layers * 1 KV head * 256 * 2 bytes = 18432 bytes/token.
    assert_eq!(s.kv_bytes_per_token(KvType::F16), 18_432);
    // ctx 4096 in 16-token blocks: 3 global layers * 4096 + 15 sliding *
    // 528 (a window of 512 spans 33 blocks) = 20208 layer-tokens of
    // 2 * 256 * 2 = 1024 bytes: 20692992. Decoding reads the windows only.
    assert_eq!(s.kv_bytes(4096, 1, KvType::F16), 20_692_992);
    assert_eq!(s.kv_read_bytes_per_seq(4096, KvType::F16), 20_447_232);

    // The tied Q8_0 head is read once per step: the whole 246.6 MB, so
    // 26.9 GB/s gives the ~109 tokens/s ceiling of ANCHORS.md.
    assert_eq!(s.weights.decode_read_bytes(), 246_587_904);
    let device = Device::cpu_from_meminfo("MemTotal: 24684092 kB\n").unwrap();
    let p = plan(
        &s,
        &PlanRequest::new(1, 1, KvType::F16, device),
        &EngineProfile::cpu_with_threads(2),
    );
    // 26.9e9 / (246587904 + 1024 * 18 layer-tokens at ctx 1).
    let want = 26.9e9 / (246_587_904.0 + 18_432.0);
    assert!((p.decode_tokens_per_s.batch_1 - want).abs() < 1e-9 * want);
    assert!((p.decode_tokens_per_s.batch_1 - 109.0).abs() < 0.2);

    // The full file plans the same weights and shape (only the name source differs).
    let whole = ModelShape::from_path(&path).unwrap();
    assert_eq!(whole.weights, s.weights);
    assert_eq!(whole.layer_sliding, s.layer_sliding);
    // Header and padding: the file's length less its tensor bytes.
    let file_len = std::fs::metadata(&path).unwrap().len();
    assert_eq!(s.weights.file_overhead_bytes, file_len - 246_587_904);
}

fn gguf_file(bytes: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(".gguf").tempfile().unwrap();
    f.write_all(bytes).unwrap();
    f
}

fn gguf_string(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

#[test]
fn truncated_gguf_header_is_an_error() {
    let Some(path) = real_model() else { return };
    let bytes = std::fs::read(&path).unwrap();
    // Cut inside the metadata (the tokenizer's vocabulary).
    let f = gguf_file(&bytes[..100_000]);
    let err = ModelShape::from_path(f.path()).unwrap_err().to_string();
    assert!(err.contains("truncated"), "{err}");
}

#[test]
fn broken_gguf_headers_are_errors() {
    // Counts that promise more than the file holds.
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&5u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    let f = gguf_file(&b);
    let err = ModelShape::from_path(f.path()).unwrap_err().to_string();
    assert!(err.contains("truncated"), "{err}");

    // Not GGUF at all.
    let f = gguf_file(b"PK\x03\x04 this is a zip");
    let err = ModelShape::from_path(f.path()).unwrap_err().to_string();
    assert!(err.contains("not a GGUF file"), "{err}");

    // A valid header without the keys a shape needs.
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    gguf_string(&mut b, "general.architecture");
    b.extend_from_slice(&8u32.to_le_bytes());
    gguf_string(&mut b, "llama");
    let f = gguf_file(&b);
    let err = ModelShape::from_path(f.path()).unwrap_err().to_string();
    assert!(err.contains("llama.block_count"), "{err}");
}

#[cfg(unix)]
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
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let err = |p: &std::path::Path| ModelShape::from_path(p).unwrap_err().to_string();
        let _ = tx.send((err(&fifo), err(&a)));
    });
    let (fifo, looped) = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("planning a FIFO blocked");
    assert!(fifo.contains("is a FIFO (named pipe)"), "{fifo}");
    assert!(looped.contains("symlink loop"), "{looped}");
}
