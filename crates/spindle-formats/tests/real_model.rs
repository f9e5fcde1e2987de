//! The real model, when present: `$SPINDLE_HOME/models/gemma-3-270m-q4_k_m.gguf`
//! (`SPINDLE_HOME` defaults to `~/.cache/spindle`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use spindle_formats::{GgmlType, GgufFile};

fn model_path() -> Option<PathBuf> {
    let home = match std::env::var_os("SPINDLE_HOME") {
        Some(h) => PathBuf::from(h),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/spindle"),
    };
    Some(home.join("models/gemma-3-270m-q4_k_m.gguf"))
}

#[test]
fn gemma3_270m_header() {
    let Some(path) = model_path().filter(|p| p.is_file()) else {
        eprintln!("note: gemma-3-270m-q4_k_m.gguf not found under $SPINDLE_HOME/models; skipping");
        return;
    };
    let start = Instant::now();
    let f = GgufFile::open(&path).unwrap();
    let took = start.elapsed();
    eprintln!("parsed {} in {took:?}", path.display());

    assert!(f.version() == 3 || f.version() == 2);
    assert_eq!(f.architecture(), Some("gemma3"));
    assert_eq!(f.get_u64("gemma3.block_count"), Some(18));
    assert_eq!(f.get_u64("gemma3.embedding_length"), Some(640));
    assert_eq!(
        f.get_array("tokenizer.ggml.tokens").map(|a| a.len()),
        Some(262_144)
    );

    // Per-type counts and bytes, from an independent measurement.
    let mut by_type: BTreeMap<&'static str, (usize, u64)> = BTreeMap::new();
    for t in f.tensors() {
        let ty = t.ty().unwrap();
        let e = by_type.entry(ty.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
        assert_eq!(f.tensor_bytes(t).len() as u64, t.n_bytes);
        assert_eq!(t.offset % f.alignment(), 0);
        assert!(t.offset >= f.data_offset());
    }
    let want: BTreeMap<&'static str, (usize, u64)> = [
        (GgmlType::Q8_0.name(), (10, 179_824_640)),
        (GgmlType::Q5_0.name(), (81, 43_591_680)),
        (GgmlType::Q4_K.name(), (27, 13_271_040)),
        (GgmlType::Q6_K.name(), (9, 9_676_800)),
        (GgmlType::F32.name(), (109, 223_744)),
    ]
    .into_iter()
    .collect();
    assert_eq!(by_type, want);
    let total: usize = want.values().map(|v| v.0).sum();
    assert_eq!(f.tensors().len(), total);
    assert_eq!(total, 236);

    // The data section ends within the file.
    let end = f
        .tensors()
        .iter()
        .map(|t| t.offset + t.n_bytes)
        .max()
        .unwrap();
    assert!(end <= f.file_len());
}
