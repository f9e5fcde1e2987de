use std::fs;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::json;
use spindle_formats::{is_hf_dir, FormatError, GgmlType, HfConfig, SafetensorsModel};

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

/// Writes a safetensors file of (name, dtype, shape, data).
fn write_st(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let out = safetensors::serialize(views, None).unwrap();
    fs::write(path, out).unwrap();
}

fn write_config(dir: &Path) {
    let cfg = json!({
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "hidden_size": 1,
        "vocab_size": 262208,
        "tie_word_embeddings": true,
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": 640,
            "rope_theta": 1000000.0,
            "num_hidden_layers": 18
        }
    });
    fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
}

/// A sharded model directory: two shards and an index.
fn sharded_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    write_st(
        &dir.path().join("model-00001-of-00002.safetensors"),
        &[
            ("a.weight", Dtype::F32, vec![2, 3], bytes(24, 1)),
            ("b.weight", Dtype::BF16, vec![4], bytes(8, 2)),
        ],
    );
    write_st(
        &dir.path().join("model-00002-of-00002.safetensors"),
        &[
            ("c.weight", Dtype::F16, vec![2, 2], bytes(8, 3)),
            ("d.position_ids", Dtype::I64, vec![2], bytes(16, 4)),
        ],
    );
    let index = json!({
        "metadata": {"total_size": 56},
        "weight_map": {
            "a.weight": "model-00001-of-00002.safetensors",
            "b.weight": "model-00001-of-00002.safetensors",
            "c.weight": "model-00002-of-00002.safetensors",
            "d.position_ids": "model-00002-of-00002.safetensors"
        }
    });
    fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    dir
}

#[test]
fn sharded_round_trip() {
    let dir = sharded_dir();
    assert!(is_hf_dir(dir.path()));
    let m = SafetensorsModel::open(dir.path()).unwrap();
    assert_eq!(m.dir(), dir.path());

    let a = m.tensor("a.weight").unwrap();
    assert_eq!(a.ty, GgmlType::F32);
    assert_eq!(a.shape, vec![2, 3]);
    assert_eq!(&a.bytes[..], &bytes(24, 1)[..]);
    let b = m.tensor("b.weight").unwrap();
    assert_eq!((b.ty, b.shape.clone()), (GgmlType::BF16, vec![4]));
    assert_eq!(&b.bytes[..], &bytes(8, 2)[..]);
    let c = m.tensor("c.weight").unwrap();
    assert_eq!((c.ty, c.shape.clone()), (GgmlType::F16, vec![2, 2]));
    assert_eq!(&c.bytes[..], &bytes(8, 3)[..]);
    assert!(c.bytes.storage().is_mapped());

    // Unsupported dtypes are kept out, and reported by name when required.
    assert!(m.tensor("d.position_ids").is_none());
    match m.require_tensor("d.position_ids") {
        Err(FormatError::UnsupportedType { tensor, type_name }) => {
            assert_eq!(tensor, "d.position_ids");
            assert_eq!(type_name, "I64");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        m.unsupported_tensors().collect::<Vec<_>>(),
        vec![("d.position_ids", "I64")]
    );
    assert!(matches!(
        m.require_tensor("nope"),
        Err(FormatError::MissingTensor(n)) if n == "nope"
    ));
    let mut names: Vec<&str> = m.tensors().map(|t| t.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["a.weight", "b.weight", "c.weight"]);

    // config.json and text_config merging.
    let cfg = m.config();
    assert_eq!(cfg.get_usize("hidden_size"), Some(1));
    assert_eq!(cfg.get_str("model_type"), Some("gemma3"));
    assert_eq!(cfg.get_bool("tie_word_embeddings"), Some(true));
    assert_eq!(cfg.get_usize("missing"), None);
    let text = cfg.text_config();
    assert_eq!(text.get_usize("hidden_size"), Some(640));
    assert_eq!(text.get_usize("num_hidden_layers"), Some(18));
    assert_eq!(text.get_f64("rope_theta"), Some(1e6));
    assert_eq!(text.model_type(), Some("gemma3_text"));
    assert_eq!(text.get_usize("vocab_size"), Some(262208), "top level kept");
    assert!(text.get("text_config").is_none());
    // Without text_config, the top level itself.
    let flat = HfConfig::from_value(json!({"hidden_size": 3}));
    assert_eq!(flat.text_config(), flat);

    // Bytes outlive the model.
    let keep = m.tensor("a.weight").unwrap().bytes.clone();
    drop(m);
    assert_eq!(keep.len(), 24);
}

#[test]
fn single_file_model() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            ("x", Dtype::F32, vec![3], bytes(12, 9)),
            ("y", Dtype::BF16, vec![1, 2], bytes(4, 8)),
        ],
    );
    let m = SafetensorsModel::open(dir.path()).unwrap();
    assert_eq!(m.tensors().count(), 2);
    assert_eq!(&m.tensor("x").unwrap().bytes[..], &bytes(12, 9)[..]);
    assert_eq!(m.tensor("y").unwrap().shape, vec![1, 2]);
}

#[test]
fn directory_errors() {
    // Not a directory / no config.
    let dir = tempfile::tempdir().unwrap();
    assert!(!is_hf_dir(dir.path()));
    assert!(!is_hf_dir(&dir.path().join("nope")));
    let e = SafetensorsModel::open(&dir.path().join("nope")).unwrap_err();
    assert!(matches!(e, FormatError::Safetensors { .. }), "{e}");
    let e = SafetensorsModel::open(dir.path()).unwrap_err();
    assert!(
        matches!(&e, FormatError::Io { path, .. } if path.ends_with("config.json")),
        "{e}"
    );

    // Bad JSON.
    fs::write(dir.path().join("config.json"), "{\"hidden_size\": 6,").unwrap();
    let e = SafetensorsModel::open(dir.path()).unwrap_err();
    assert!(matches!(e, FormatError::Json { .. }), "{e}");
    assert!(e.to_string().contains("config.json"), "{e}");
    // JSON that is not an object.
    fs::write(dir.path().join("config.json"), "[1, 2]").unwrap();
    let e = SafetensorsModel::open(dir.path()).unwrap_err();
    assert!(e.to_string().contains("JSON object"), "{e}");

    // No weights at all.
    write_config(dir.path());
    let e = SafetensorsModel::open(dir.path()).unwrap_err();
    assert!(e.to_string().contains("model.safetensors"), "{e}");
}

#[test]
fn missing_shard() {
    let dir = sharded_dir();
    fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let e = SafetensorsModel::open(dir.path()).unwrap_err();
    assert!(
        matches!(&e, FormatError::Safetensors { path, .. } if path.ends_with("model-00002-of-00002.safetensors")),
        "{e}"
    );
    assert!(e.to_string().contains("missing"), "{e}");
}

#[test]
fn index_names_a_tensor_the_shard_lacks() {
    let dir = sharded_dir();
    let index = json!({"weight_map": {
        "a.weight": "model-00001-of-00002.safetensors",
        "c.weight": "model-00001-of-00002.safetensors",
    }});
    fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let e = SafetensorsModel::open(dir.path()).unwrap_err();
    assert!(e.to_string().contains("'c.weight'"), "{e}");
}

#[test]
fn bad_index() {
    let dir = sharded_dir();
    let index_path = dir.path().join("model.safetensors.index.json");
    for (text, want) in [
        ("{not json", "cannot parse"),
        ("{}", "weight_map"),
        (r#"{"weight_map": []}"#, "weight_map"),
        (r#"{"weight_map": {"a": 3}}"#, "not a file name"),
        (
            r#"{"weight_map": {"a": "../x.safetensors"}}"#,
            "inside the model directory",
        ),
        (
            r#"{"weight_map": {"a": "/etc/passwd"}}"#,
            "inside the model directory",
        ),
        (r#"{"weight_map": {"a": ""}}"#, "inside the model directory"),
    ] {
        fs::write(&index_path, text).unwrap();
        let e = SafetensorsModel::open(dir.path()).unwrap_err();
        assert!(e.to_string().contains(want), "{text}: {e}");
    }
}

#[test]
fn the_same_tensor_in_two_shards() {
    let dir = sharded_dir();
    write_st(
        &dir.path().join("model-00002-of-00002.safetensors"),
        &[
            ("a.weight", Dtype::F32, vec![2, 3], bytes(24, 1)),
            ("c.weight", Dtype::F16, vec![2, 2], bytes(8, 3)),
            ("d.position_ids", Dtype::I64, vec![2], bytes(16, 4)),
        ],
    );
    let e = SafetensorsModel::open(dir.path()).unwrap_err();
    assert!(e.to_string().contains("another shard"), "{e}");
}

#[test]
fn corrupt_shards() {
    let dir = sharded_dir();
    let shard = dir.path().join("model-00001-of-00002.safetensors");
    let good = fs::read(&shard).unwrap();
    // Truncated at every byte: an error, never a panic.
    for len in 0..good.len() {
        fs::write(&shard, &good[..len]).unwrap();
        let e = SafetensorsModel::open(dir.path()).unwrap_err();
        assert!(matches!(e, FormatError::Safetensors { .. }), "{len}: {e}");
    }
    // A header length far past the end.
    let mut bad = good.clone();
    bad[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    fs::write(&shard, &bad).unwrap();
    assert!(SafetensorsModel::open(dir.path()).is_err());
    // Garbage header.
    let mut bad = good.clone();
    bad[8] = b'[';
    fs::write(&shard, &bad).unwrap();
    let e = SafetensorsModel::open(dir.path()).unwrap_err();
    assert!(e.to_string().contains("fetch the model again"), "{e}");
}
