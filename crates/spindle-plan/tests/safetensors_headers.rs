//! Weights counted from safetensors headers alone: the files written here
//! hold only the 8-byte length and the JSON, never the data they describe.

mod common;

use std::path::Path;

use common::*;
use spindle_plan::{KvType, ModelShape, PlanError, WeightFormat};

/// A directory with the tiny config and a header-only `model.safetensors`.
fn single_file_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), TINY_CONFIG).unwrap();
    let tensors = tiny_tensors();
    let data_len = write_header_only(&dir.path().join("model.safetensors"), &as_refs(&tensors));
    // The data is absent: the file is far shorter than what it describes.
    let file_len = std::fs::metadata(dir.path().join("model.safetensors"))
        .unwrap()
        .len();
    assert_eq!(data_len, 404_800);
    assert!(file_len < 8000, "{file_len}");
    dir
}

#[test]
fn header_only_single_file_counts_every_tensor_by_dtype() {
    let dir = single_file_dir();
    let s = ModelShape::from_path(dir.path()).unwrap();
    let w = &s.weights;
    assert_eq!(w.format, WeightFormat::Safetensors);
    assert_eq!(w.tensors, 4 + 2 * 9);
    // BF16: embedding 1000*64*2 = 128000, head 128000, per layer
    // q 64*64*2 = 8192, k 32*64*2 = 4096, o 8192, gate/up/down 3 * 16384:
    // 69632 per layer, 139264 for two. 128000 + 128000 + 139264 = 395264.
    assert_eq!(w.by_type["BF16"], 395_264);
    // F16: v_proj 32*64*2 = 4096 per layer.
    assert_eq!(w.by_type["F16"], 8192);
    // F32: final norm 64*4 = 256, two norms per layer 2*2*256 = 1024.
    assert_eq!(w.by_type["F32"], 1280);
    // I64: 2*4*8 = 64.
    assert_eq!(w.by_type["I64"], 64);
    assert_eq!(w.bytes, 395_264 + 8192 + 1280 + 64);
    assert_eq!(w.embedding_bytes, 128_000);
    assert_eq!(w.output_head_bytes, 128_000);
    // Decoder matmuls: (64*64*2 + 32*64*2 + 128*64*3) = 36864 per layer.
    assert_eq!(w.layer_matmul_params, 2 * 36_864);
    assert_eq!(w.vector_params, 64 + 4 * 64);
    assert!(!w.quantized_matmuls);
    // An untied embedding is not streamed by decoding: 404800 - 128000.
    assert_eq!(w.decode_read_bytes(), 276_800);
    assert!(!s.tied_embeddings);
    // The config's shape: 2 * 2 layers * 2 KV heads * 16 * 2 bytes = 256 per token.
    assert_eq!(s.head_dim, 16);
    assert_eq!(s.kv_bytes_per_token(KvType::F16), 256);
}

#[test]
fn a_safetensors_file_path_plans_its_directory() {
    let dir = single_file_dir();
    let a = ModelShape::from_path(&dir.path().join("model.safetensors")).unwrap();
    let b = ModelShape::from_path(dir.path()).unwrap();
    assert_eq!(a.weights, b.weights);
}

#[test]
fn data_present_or_absent_gives_the_same_counts() {
    let dir = single_file_dir();
    let header_only = ModelShape::from_path(dir.path()).unwrap();
    // Append the data the header describes: nothing changes.
    let path = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.resize(bytes.len() + 404_800, 0x5a);
    std::fs::write(&path, bytes).unwrap();
    let whole = ModelShape::from_path(dir.path()).unwrap();
    assert_eq!(header_only, whole);
}

#[test]
fn sharded_index_sums_every_shard() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), TINY_CONFIG).unwrap();
    let tensors = tiny_tensors();
    let (first, second) = tensors.split_at(9);
    let shards = [
        ("model-00001-of-00002.safetensors", first),
        ("model-00002-of-00002.safetensors", second),
    ];
    let mut weight_map = serde_json::Map::new();
    for (file, part) in shards {
        write_header_only(&dir.path().join(file), &as_refs(part));
        for (name, _, _) in part {
            weight_map.insert(name.clone(), file.into());
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 404_800}, "weight_map": weight_map});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();

    let sharded = ModelShape::from_path(dir.path()).unwrap();
    let single = ModelShape::from_path(single_file_dir().path()).unwrap();
    assert_eq!(sharded.weights.bytes, 404_800);
    assert_eq!(sharded.weights.by_type, single.weights.by_type);
    assert_eq!(
        sharded.weights.layer_matmul_params,
        single.weights.layer_matmul_params
    );
    assert_eq!(sharded.weights.tensors, single.weights.tensors);

    // A shard the index names but the directory lacks.
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let err = ModelShape::from_path(dir.path()).unwrap_err();
    assert!(matches!(err, PlanError::Safetensors { .. }), "{err:?}");
    assert!(err.to_string().contains("is missing"), "{err}");
}

#[test]
fn tied_when_the_files_have_no_head() {
    let dir = tempfile::tempdir().unwrap();
    // The config says untied, but the files decide.
    std::fs::write(dir.path().join("config.json"), TINY_CONFIG).unwrap();
    let tensors: Vec<_> = tiny_tensors()
        .into_iter()
        .filter(|t| t.0 != "lm_head.weight")
        .collect();
    write_header_only(&dir.path().join("model.safetensors"), &as_refs(&tensors));
    let s = ModelShape::from_path(dir.path()).unwrap();
    assert!(s.tied_embeddings);
    // Tied: the embedding is the head, read once per step: all 276800 bytes.
    assert_eq!(s.weights.decode_read_bytes(), 276_800);
}

fn dir_with_weights_file(bytes: &[u8]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), TINY_CONFIG).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    dir
}

fn plan_err(dir: &Path) -> String {
    match ModelShape::from_path(dir) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn truncated_header_is_an_error() {
    // Declares 1000 bytes of JSON, holds 10.
    let mut bytes = 1000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(br#"{"a": {"dt"#);
    let err = plan_err(dir_with_weights_file(&bytes).path());
    assert!(err.contains("header is truncated"), "{err}");
    // Shorter than the length field itself.
    let err = plan_err(dir_with_weights_file(&[1, 2, 3]).path());
    assert!(err.contains("fewer than the 8"), "{err}");
    // A length past the format's limit.
    let err = plan_err(dir_with_weights_file(&u64::MAX.to_le_bytes()).path());
    assert!(err.contains("more than the format allows"), "{err}");
}

#[test]
fn malformed_json_header_is_an_error() {
    let json = br#"{"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]"#;
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(json);
    let err = plan_err(dir_with_weights_file(&bytes).path());
    assert!(err.contains("does not parse"), "{err}");

    let bad_entries: [&[u8]; 4] = [
        br#"[1, 2]"#,
        br#"{"x": {"shape": [2], "data_offsets": [0, 8]}}"#,
        br#"{"x": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}"#,
        // 2 x F32 is 8 bytes, not 6.
        br#"{"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 6]}}"#,
    ];
    for json in bad_entries {
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(json);
        let err = plan_err(dir_with_weights_file(&bytes).path());
        assert!(err.contains("bad safetensors header"), "{err}");
    }
}

#[test]
fn missing_config_and_missing_weights_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let err = ModelShape::from_path(dir.path()).unwrap_err();
    assert!(matches!(err, PlanError::MissingConfig { .. }), "{err:?}");
    assert!(err.to_string().contains("has no config.json"), "{err}");

    std::fs::write(dir.path().join("config.json"), TINY_CONFIG).unwrap();
    let err = ModelShape::from_path(dir.path()).unwrap_err();
    assert!(matches!(err, PlanError::NoWeights { .. }), "{err:?}");

    std::fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    let err = plan_err(dir.path());
    assert!(err.contains("cannot parse"), "{err}");

    let err = plan_err(&dir.path().join("no-such-model.gguf"));
    assert!(
        err.contains("cannot read") && err.contains("no-such-model.gguf"),
        "{err}"
    );
}
