//! The GGUF parser against hand-built files: every metadata type, every
//! malformed header it must refuse with a clear error, and real-model
//! headers. One concept, kept in one file (over ~500 lines) so that each
//! error case sits beside the builder that makes it.

mod common;

use std::time::Instant;

use common::*;
use spindle_formats::{FormatError, GgmlType, GgufFile, MetaValue};

fn parse(bytes: &[u8]) -> Result<GgufFile, FormatError> {
    GgufFile::from_bytes(bytes.to_vec())
}

fn err(bytes: &[u8]) -> FormatError {
    match parse(bytes) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

/// A header for hand-built files: magic, version, counts.
fn header(tensors: u64, kvs: u64) -> W {
    let mut w = W::default();
    w.bytes(b"GGUF").u32(3).u64(tensors).u64(kvs);
    w
}

// ---------------------------------------------------------------------------
// Round trip.

#[test]
fn round_trip_all_metadata_kinds_and_tensors() {
    let b = sample_builder();
    let (bytes, layout) = b.build_with_layout();
    let f = parse(&bytes).unwrap();

    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.file_len(), bytes.len() as u64);
    assert_eq!(f.data_offset(), layout.data_offset as u64);
    assert_eq!(f.data_offset() % 32, 0);
    assert_eq!(f.architecture(), Some("testarch"));

    // Metadata in file order, values exact.
    let want = all_kinds_metadata();
    assert_eq!(f.metadata().len(), want.len());
    for ((k, v), (wk, wv)) in f.metadata().iter().zip(&want) {
        assert_eq!(k, wk);
        assert_eq!(v, wv, "key {k}");
        assert_eq!(f.get(k), Some(wv));
    }
    assert_eq!(f.get("nope"), None);

    // Convenience accessors.
    assert_eq!(f.get_u64("t.u8"), Some(200));
    assert_eq!(f.get_u64("t.u64"), Some(u64::MAX));
    assert_eq!(f.get_u64("t.i8"), None, "negative is not a u64");
    assert_eq!(f.get_i64("t.i64"), Some(i64::MIN));
    assert_eq!(f.get_i64("t.u64"), None, "u64::MAX does not fit in i64");
    assert_eq!(f.get_i64("t.u32"), Some(4_000_000_000));
    assert_eq!(f.get_f64("t.f32"), Some(1.5));
    assert_eq!(f.get_f64("t.i16"), Some(-30000.0));
    assert_eq!(f.get_f64("t.f64"), Some(-2.25e100));
    assert_eq!(f.get_f64("general.name"), None);
    assert_eq!(f.get_str("general.name"), Some("tiny ✓ model"));
    assert_eq!(f.get_str("t.u8"), None);
    assert_eq!(f.get_bool("t.bool_t"), Some(true));
    assert_eq!(f.get_bool("t.bool_f"), Some(false));
    assert_eq!(f.get_array("t.arr_str").map(|a| a.len()), Some(4));
    let nested = f.get_array("t.arr_nested").unwrap();
    assert_eq!(nested[0].as_array().unwrap()[1].as_u64(), Some(2));
    assert_eq!(nested[1].as_array().unwrap().len(), 0);
    let deep = f.get_array("t.arr_nested_str").unwrap();
    assert_eq!(
        deep[0].as_array().unwrap()[0].as_array().unwrap()[0].as_str(),
        Some("deep")
    );

    // require_*.
    assert_eq!(f.require_u64("t.u16").unwrap(), 65000);
    assert!(matches!(f.require_u64("missing"), Err(FormatError::MissingKey(k)) if k == "missing"));
    let e = f.require_str("t.u8").unwrap_err();
    assert!(matches!(e, FormatError::WrongType { .. }), "{e}");
    assert!(e.to_string().contains("t.u8"), "{e}");

    // Tensors.
    assert_eq!(f.tensors().len(), b.tensors.len());
    for ((t, spec), &off) in f
        .tensors()
        .iter()
        .zip(&b.tensors)
        .zip(&layout.tensor_offsets)
    {
        assert_eq!(t.name, spec.name);
        assert_eq!(t.dims, spec.dims);
        assert_eq!(t.type_id, spec.type_id);
        assert_eq!(t.offset, off as u64, "{}", t.name);
        assert_eq!(t.offset % 32, 0);
        assert_eq!(t.n_bytes, spec.data.len() as u64, "{}", t.name);
        assert_eq!(t.n_elements(), spec.dims.iter().product::<u64>());
        let data = f.tensor_bytes(t);
        assert_eq!(&data[..], &spec.data[..], "{}", t.name);
        assert_eq!(data.len(), spec.data.len());
        assert_eq!(f.tensor(&t.name), Some(t));
        // Owned storage is 64-aligned, so tensor data is 32-aligned in memory.
        assert_eq!(data.as_ptr() as usize % 32, 0);
    }
    assert_eq!(f.tensor("f32.weight").unwrap().ty().unwrap(), GgmlType::F32);
    assert_eq!(f.tensor("q8.weight").unwrap().ty().unwrap(), GgmlType::Q8_0);
    assert_eq!(
        f.tensor("q4k.weight").unwrap().ty().unwrap(),
        GgmlType::Q4_K
    );
    assert_eq!(f.tensor("bf16.bias").unwrap().ty().unwrap(), GgmlType::BF16);
    assert!(f.tensor("missing").is_none());
    assert!(matches!(
        f.require_tensor("missing"),
        Err(FormatError::MissingTensor(_))
    ));

    // A known-but-unsupported type parses (it is bounds-checked) but ty() fails.
    let q81 = f.tensor("q81.weight").unwrap();
    assert_eq!(q81.type_name(), "Q8_1");
    match q81.ty() {
        Err(FormatError::UnsupportedType { tensor, type_name }) => {
            assert_eq!(tensor, "q81.weight");
            assert!(type_name.contains("Q8_1"), "{type_name}");
        }
        other => panic!("{other:?}"),
    }
    let msg = q81.ty().unwrap_err().to_string();
    assert!(msg.contains("q81.weight") && msg.contains("Q8_1"), "{msg}");

    // A tensor info from elsewhere yields no bytes rather than wrong ones.
    let mut foreign = f.tensors()[0].clone();
    foreign.offset += 32;
    assert!(f.tensor_bytes(&foreign).is_empty());

    let dbg = format!("{f:?}");
    assert!(dbg.contains("testarch"), "{dbg}");
}

#[test]
fn version_2_parses() {
    let mut b = sample_builder();
    b.version = 2;
    let f = parse(&b.build()).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.tensors().len(), 6);
}

#[test]
fn custom_alignment_is_honoured() {
    for align in [1usize, 8, 64, 256] {
        let mut b = sample_builder();
        b.alignment = align;
        b.kvs
            .push(("general.alignment".into(), MetaValue::U32(align as u32)));
        let (bytes, layout) = b.build_with_layout();
        let f = parse(&bytes).unwrap();
        assert_eq!(f.alignment(), align as u64);
        assert_eq!(f.data_offset(), layout.data_offset as u64);
        for (t, &off) in f.tensors().iter().zip(&layout.tensor_offsets) {
            assert_eq!(t.offset, off as u64);
            assert_eq!(t.offset % align as u64, 0);
        }
    }
}

#[test]
fn empty_file_without_tensors_or_padding() {
    // No tensors, no padding after the header: valid (llama.cpp accepts it).
    let bytes = header(0, 0).buf;
    let f = parse(&bytes).unwrap();
    assert!(f.tensors().is_empty());
    assert!(f.metadata().is_empty());
    assert_eq!(f.data_offset(), 32);
    assert_eq!(f.architecture(), None);
}

#[test]
fn open_maps_the_file() {
    let bytes = sample_builder().build();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, &bytes).unwrap();
    for f in [
        GgufFile::open(&path).unwrap(),
        GgufFile::open_header(&path).unwrap(),
    ] {
        assert!(f.storage().is_mapped());
        assert_eq!(f.path(), Some(path.as_path()));
        let mem = parse(&bytes).unwrap();
        assert_eq!(f.metadata(), mem.metadata());
        assert_eq!(f.tensors(), mem.tensors());
        for t in f.tensors() {
            assert_eq!(&f.tensor_bytes(t)[..], &mem.tensor_bytes(t)[..]);
        }
    }
    // Bytes outlive the file object.
    let f = GgufFile::open(&path).unwrap();
    let t = f.tensor_bytes(f.tensor("q8.weight").unwrap());
    drop(f);
    assert_eq!(t.len(), 68);

    let missing = dir.path().join("absent.gguf");
    let e = GgufFile::open(&missing).unwrap_err();
    assert!(matches!(e, FormatError::Io { .. }), "{e}");
    assert!(e.to_string().contains("absent.gguf"), "{e}");
    // A directory is not a GGUF file.
    assert!(GgufFile::open(dir.path()).is_err());
    // An empty file is truncated at the magic.
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        GgufFile::open(&empty),
        Err(FormatError::Truncated { offset: 0, .. })
    ));
}

// ---------------------------------------------------------------------------
// Truncation.

#[test]
fn truncation_at_every_byte_is_an_error() {
    let b = sample_builder();
    let (bytes, layout) = b.build_with_layout();
    // Padding after the last tensor is not part of any tensor: cutting it is fine.
    let data_end = layout.tensor_offsets[5] + b.tensors[5].data.len();
    assert!(parse(&bytes[..data_end]).is_ok());
    for len in 0..data_end {
        match parse(&bytes[..len]) {
            Ok(_) => panic!("truncated to {len} of {} bytes parsed", bytes.len()),
            Err(FormatError::Truncated {
                offset,
                needed,
                file_len,
                field,
            }) => {
                assert_eq!(file_len, len as u64);
                assert!(offset + needed > file_len, "len {len}: {field}");
                assert!(!field.is_empty());
            }
            Err(e) => panic!("len {len}: unexpected {e:?}"),
        }
    }

    // Errors name the field being read. A small file, so that the count
    // checks (each entry needs some minimum of bytes) pass early on.
    let small = GgufBuilder::new()
        .kv("general.architecture", MetaValue::Str("x".repeat(100)))
        .kv("general.name", MetaValue::Str("n".into()))
        .tensor(TensorSpec::new(
            "f32.weight",
            &[4, 2],
            GGML_F32,
            filler(32, 1),
        ))
        .tensor(TensorSpec::new("bf16.bias", &[3], GGML_BF16, filler(6, 6)));
    let (sb, sl) = small.build_with_layout();
    let field_at = |len: usize| match parse(&sb[..len]) {
        Err(FormatError::Truncated { field, offset, .. }) => (field, offset),
        other => panic!("{len}: {other:?}"),
    };
    assert_eq!(field_at(0).0, "magic (file header)");
    assert_eq!(field_at(3).0, "magic (file header)");
    assert_eq!(field_at(5), ("GGUF version".into(), 4));
    assert_eq!(field_at(10), ("tensor count".into(), 8));
    assert_eq!(field_at(20), ("metadata entry count".into(), 16));
    let (f, off) = field_at(30);
    assert_eq!(off, 24);
    assert!(f.starts_with("tensor infos (2 declared"), "{f}");
    let k1 = sl.kv_starts[1];
    assert_eq!(field_at(k1 + 3).0, "length of key of metadata entry #1");
    assert_eq!(field_at(k1 + 9).0, "key of metadata entry #1");
    let name_len = "general.name".len();
    assert_eq!(
        field_at(k1 + 8 + name_len + 1).0,
        "value type of metadata 'general.name'"
    );
    assert_eq!(
        field_at(k1 + 8 + name_len + 4 + 2),
        (
            "length of value of metadata 'general.name'".into(),
            (k1 + 8 + name_len + 4) as u64
        )
    );
    // Within the first tensor info, the second count check reports that two
    // infos cannot fit; within the second, the field itself is named.
    let (f, _) = field_at(sl.info_starts[0] + 2);
    assert!(f.starts_with("tensor infos (2 declared"), "{f}");
    let info = sl.info_starts[1];
    assert_eq!(field_at(info + 2).0, "length of name of tensor #1");
    assert_eq!(field_at(info + 9).0, "name of tensor #1");
    let info_name = info + 8 + "bf16.bias".len();
    assert_eq!(
        field_at(info_name + 1),
        (
            "dimension count of tensor 'bf16.bias'".into(),
            info_name as u64
        )
    );
    assert_eq!(
        field_at(info_name + 4 + 7).0,
        "dimension 0 of tensor 'bf16.bias'"
    );
    assert_eq!(
        field_at(info_name + 4 + 8 + 1).0,
        "type of tensor 'bf16.bias'"
    );
    assert_eq!(
        field_at(info_name + 4 + 8 + 4 + 1).0,
        "data offset of tensor 'bf16.bias'"
    );
    // In the padding and in tensor data: the first tensor whose data is cut.
    let (f, off) = field_at(sl.info_starts[2]);
    assert!(f.starts_with("data of tensor 'f32.weight'"), "{f}");
    assert_eq!(off, sl.data_offset as u64);
    let (f, _) = field_at(sl.tensor_offsets[1] + 1);
    assert!(f.starts_with("data of tensor 'bf16.bias'"), "{f}");

    // The message says where, what and what to do.
    let msg = parse(&bytes[..layout.tensor_offsets[2] + 10])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("q8.weight"), "{msg}");
    assert!(msg.contains("truncated at byte"), "{msg}");
    assert!(msg.contains("fetch the model again"), "{msg}");
}

// ---------------------------------------------------------------------------
// Absurd counts and lengths: clean errors, no huge allocations.

#[test]
fn absurd_tensor_count() {
    let e = err(&header(1 << 60, 0).buf);
    assert!(
        matches!(&e, FormatError::Truncated { field, offset: 24, .. } if field.starts_with("tensor infos")),
        "{e}"
    );
    assert!(
        e.to_string().contains("1152921504606846976 declared"),
        "{e}"
    );
    // u64::MAX overflows the size computation: still clean.
    assert!(matches!(
        err(&header(u64::MAX, 0).buf),
        FormatError::Truncated {
            needed: u64::MAX,
            ..
        }
    ));
    // Plausible for the whole file, too many once the metadata is read.
    let mut w = header(3, 1);
    w.kv("k", &MetaValue::Str("x".repeat(60))).bytes(&[0; 10]);
    let e = err(&w.buf);
    assert!(e.to_string().contains("tensor infos (3 declared"), "{e}");
}

#[test]
fn absurd_kv_count() {
    let e = err(&header(0, 1 << 60).buf);
    assert!(
        matches!(&e, FormatError::Truncated { field, offset: 24, .. } if field.starts_with("metadata entries")),
        "{e}"
    );
    assert!(matches!(
        err(&header(0, u64::MAX).buf),
        FormatError::Truncated { .. }
    ));
}

#[test]
fn absurd_string_length() {
    // Key length 2^40.
    let mut w = header(0, 1);
    w.u64(1 << 40).bytes(&[0; 64]);
    let e = err(&w.buf);
    assert!(
        matches!(&e, FormatError::Truncated { needed, offset: 32, .. } if *needed == 1 << 40),
        "{e}"
    );
    // Value string length u64::MAX.
    let mut w = header(0, 1);
    w.str("k").u32(T_STRING).u64(u64::MAX).bytes(&[0; 64]);
    assert!(matches!(err(&w.buf), FormatError::Truncated { .. }));
    // Tensor name length 2^40.
    let mut w = header(1, 0);
    w.u64(1 << 40).bytes(&[0; 64]);
    assert!(matches!(err(&w.buf), FormatError::Truncated { .. }));
}

#[test]
fn absurd_array_lengths() {
    for ety in [T_U8, T_U64, T_STRING, T_ARRAY, T_BOOL] {
        for len in [1u64 << 50, u64::MAX, 1000] {
            let mut w = header(0, 1);
            w.str("arr").u32(T_ARRAY).u32(ety).u64(len).bytes(&[0; 100]);
            let e = err(&w.buf);
            assert!(
                matches!(&e, FormatError::Truncated { field, offset: 51, .. }
                    if field.contains("elements of array metadata 'arr'")),
                "type {ety} len {len}: {e}"
            );
        }
    }
    // Nested: an inner array with an absurd length.
    let mut w = header(0, 1);
    w.str("arr").u32(T_ARRAY).u32(T_ARRAY).u64(1);
    w.u32(T_STRING).u64(1 << 50).bytes(&[0; 100]);
    let e = err(&w.buf);
    assert!(e.to_string().contains("'arr'[0]"), "{e}");
}

#[test]
fn deeply_nested_arrays_are_rejected_without_overflowing_the_stack() {
    let mut w = header(0, 1);
    w.str("deep").u32(T_ARRAY);
    for _ in 0..100_000 {
        w.u32(T_ARRAY).u64(1);
    }
    w.u32(T_U8).u64(0);
    let e = err(&w.buf);
    assert!(e.to_string().contains("nest"), "{e}");
}

#[test]
fn absurd_dims() {
    // n_dims 1000.
    let mut w = header(1, 0);
    w.str("t").u32(1000).bytes(&[0; 64]);
    let e = err(&w.buf);
    assert!(
        matches!(&e, FormatError::Invalid { field, .. } if field.contains("dimension count")),
        "{e}"
    );
    // n_dims u32::MAX.
    let mut w = header(1, 0);
    w.str("t").u32(u32::MAX).bytes(&[0; 64]);
    assert!(matches!(err(&w.buf), FormatError::Invalid { .. }));

    // Dimensions whose product overflows.
    for dims in [
        vec![1u64 << 32, 1 << 32, 1 << 32],
        vec![u64::MAX, 2],
        vec![1 << 63],
    ] {
        let mut w = header(1, 0);
        w.str("t").u32(dims.len() as u32);
        for d in &dims {
            w.u64(*d);
        }
        w.u32(GGML_F32).u64(0).pad_to(32).bytes(&[0; 64]);
        let e = err(&w.buf);
        assert!(
            matches!(&e, FormatError::Invalid { field, .. } if field.contains("dimensions of tensor 't'")),
            "{dims:?}: {e}"
        );
    }
    // Elements fit but bytes overflow (2^62 F32 elements = 2^64 bytes).
    let mut w = header(1, 0);
    w.str("t").u32(2).u64(1 << 31).u64(1 << 31);
    w.u32(GGML_F32).u64(0).pad_to(32);
    let e = err(&w.buf);
    assert!(
        matches!(
            e,
            FormatError::Invalid { .. } | FormatError::Truncated { .. }
        ),
        "{e}"
    );
    // Large but representable: data past EOF.
    let mut w = header(1, 0);
    w.str("t").u32(2).u64(1 << 20).u64(1 << 20);
    w.u32(GGML_F32).u64(0).pad_to(32);
    assert!(matches!(err(&w.buf), FormatError::Truncated { needed, .. } if needed == 1 << 42));
}

// ---------------------------------------------------------------------------
// Malformed headers and tensor infos.

#[test]
fn wrong_magic() {
    let mut bytes = sample_builder().build();
    bytes[..4].copy_from_slice(b"GGML");
    let e = err(&bytes);
    assert!(matches!(e, FormatError::BadMagic { found } if &found == b"GGML"));
    assert!(e.to_string().contains("not a GGUF file"), "{e}");
    let e = err(b"PK\x03\x04 a zip file");
    assert!(matches!(e, FormatError::BadMagic { .. }), "{e}");
}

#[test]
fn unsupported_versions() {
    for v in [0u32, 1, 4, 99] {
        let mut b = sample_builder();
        b.version = v;
        let e = err(&b.build());
        assert!(
            matches!(e, FormatError::UnsupportedVersion(x) if x == v),
            "{e}"
        );
        let msg = e.to_string();
        assert!(msg.contains(&format!("version {v}")), "{msg}");
    }
    let e = err(&{
        let mut b = sample_builder();
        b.version = 1;
        b.build()
    });
    assert!(e.to_string().contains("no longer supported"), "{e}");
    // A big-endian file reads its version byte-swapped.
    let mut b = sample_builder();
    b.version = 3u32.swap_bytes();
    let e = err(&b.build());
    assert!(e.to_string().contains("big-endian"), "{e}");
}

#[test]
fn bad_alignment() {
    for v in [
        MetaValue::U32(0),
        MetaValue::U32(3),
        MetaValue::U32(48),
        MetaValue::I32(-32),
        MetaValue::Str("32".into()),
        MetaValue::F32(32.0),
    ] {
        let mut b = sample_builder();
        b.kvs.push(("general.alignment".into(), v.clone()));
        let e = err(&b.build());
        assert!(
            matches!(&e, FormatError::Invalid { field, .. } if field.contains("general.alignment")),
            "{v:?}: {e}"
        );
        assert!(e.to_string().contains("power of two"), "{e}");
    }
    // Other integer widths are accepted.
    let mut b = sample_builder();
    b.kvs.push(("general.alignment".into(), MetaValue::U64(32)));
    assert_eq!(parse(&b.build()).unwrap().alignment(), 32);
}

#[test]
fn misaligned_tensor_offset() {
    let mut w = header(1, 0);
    w.str("t").u32(1).u64(4).u32(GGML_F32).u64(16);
    w.pad_to(32).bytes(&[0; 64]);
    let e = err(&w.buf);
    assert!(
        matches!(&e, FormatError::Invalid { field, .. } if field == "data offset of tensor 't'"),
        "{e}"
    );
    assert!(e.to_string().contains("alignment 32"), "{e}");
    // Offset so large that the absolute position overflows.
    let mut w = header(1, 0);
    w.str("t").u32(1).u64(4).u32(GGML_F32).u64(u64::MAX - 31);
    w.pad_to(32);
    assert!(matches!(err(&w.buf), FormatError::Invalid { .. }));
}

#[test]
fn tensor_data_past_eof() {
    let mut b = sample_builder();
    // Claim more rows than there are bytes for: the last tensor runs past EOF.
    b.tensors[5].dims = vec![3, 100];
    let e = err(&b.build());
    match &e {
        FormatError::Truncated { field, needed, .. } => {
            assert!(field.contains("bf16.bias"), "{field}");
            assert_eq!(*needed, 600);
        }
        other => panic!("{other:?}"),
    }
    // An offset past the end.
    let mut w = header(1, 0);
    w.str("t").u32(1).u64(4).u32(GGML_F32).u64(1 << 20);
    w.pad_to(32).bytes(&[0; 64]);
    assert!(matches!(err(&w.buf), FormatError::Truncated { .. }));
}

#[test]
fn unknown_tensor_type_id() {
    for id in [4u32, 5, 31, 43, 1000, u32::MAX] {
        let mut b = sample_builder();
        b.tensors[0].type_id = id;
        let e = err(&b.build());
        assert!(
            matches!(&e, FormatError::Invalid { field, .. } if field == "type of tensor 'f32.weight'"),
            "{id}: {e}"
        );
        assert!(
            e.to_string()
                .contains(&format!("unknown ggml type id {id}")),
            "{e}"
        );
    }
}

#[test]
fn row_not_a_whole_number_of_blocks() {
    let mut w = header(1, 0);
    w.str("q").u32(2).u64(33).u64(1).u32(GGML_Q8_0).u64(0);
    w.pad_to(32).bytes(&[0; 128]);
    let e = err(&w.buf);
    assert!(e.to_string().contains("block size 32"), "{e}");
}

#[test]
fn duplicate_tensor_names() {
    let mut b = sample_builder();
    b.tensors[3].name = "f32.weight".into();
    let e = err(&b.build());
    assert!(e.to_string().contains("'f32.weight' appears twice"), "{e}");
}

#[test]
fn duplicate_metadata_keys() {
    let mut b = sample_builder();
    b.kvs.push(("t.u8".into(), MetaValue::U8(1)));
    let e = err(&b.build());
    assert!(e.to_string().contains("'t.u8'"), "{e}");
}

#[test]
fn unknown_metadata_value_type() {
    for ty in [13u32, 255, u32::MAX] {
        let mut w = header(0, 1);
        w.str("k").u32(ty).bytes(&[0; 16]);
        let e = err(&w.buf);
        assert!(
            matches!(&e, FormatError::Invalid { field, offset: 33, .. } if field.contains("'k'")),
            "{e}"
        );
        // As an array element type.
        let mut w = header(0, 1);
        w.str("k").u32(T_ARRAY).u32(ty).u64(1).bytes(&[0; 16]);
        assert!(matches!(err(&w.buf), FormatError::Invalid { .. }));
    }
}

#[test]
fn bad_bools_and_utf8() {
    let mut w = header(0, 1);
    w.str("b").u32(T_BOOL).u8(2);
    assert!(err(&w.buf).to_string().contains("0 or 1"));
    let mut w = header(0, 1);
    w.str("b").u32(T_ARRAY).u32(T_BOOL).u64(2).u8(1).u8(7);
    assert!(err(&w.buf).to_string().contains("'b'[1]"));

    // Keys and tensor names must be UTF-8.
    let mut w = header(0, 1);
    w.raw_str(b"k\xff").u32(T_U8).u8(0);
    assert!(matches!(err(&w.buf), FormatError::Invalid { .. }));
    let mut w = header(1, 0);
    w.raw_str(b"\xc3")
        .u32(1)
        .u64(1)
        .u32(GGML_F32)
        .u64(0)
        .pad_to(32)
        .bytes(&[0; 32]);
    assert!(matches!(err(&w.buf), FormatError::Invalid { .. }));

    // String values are decoded lossily rather than failing the file.
    let mut w = header(0, 1);
    w.str("v").u32(T_STRING).raw_str(b"a\xffb");
    let f = parse(&w.buf).unwrap();
    assert_eq!(f.get_str("v"), Some("a\u{fffd}b"));
}

// ---------------------------------------------------------------------------
// Random mutations: never a panic.

#[test]
fn random_mutations_never_panic() {
    let (bytes, layout) = sample_builder().build_with_layout();
    let header_end = layout.data_offset;
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut ok = 0;
    for _ in 0..4000 {
        let mut m = bytes.clone();
        match rng.below(4) {
            // Flip a few bytes, mostly in the header.
            0 | 1 => {
                for _ in 0..=rng.below(4) {
                    let i = rng.below(header_end as u64) as usize;
                    m[i] = rng.next() as u8;
                }
            }
            // Overwrite an 8-byte window with an extreme value.
            2 => {
                let i = rng.below((header_end - 8) as u64) as usize;
                let v = match rng.below(4) {
                    0 => u64::MAX,
                    1 => 1u64 << rng.below(64),
                    2 => rng.next(),
                    _ => 0,
                };
                m[i..i + 8].copy_from_slice(&v.to_le_bytes());
            }
            // Flip and truncate.
            _ => {
                let i = rng.below(m.len() as u64) as usize;
                m[i] ^= 1 << rng.below(8);
                m.truncate(rng.below(m.len() as u64 + 1) as usize);
            }
        }
        if let Ok(f) = parse(&m) {
            ok += 1;
            // Everything a caller might touch must be safe too.
            for t in f.tensors() {
                let b = f.tensor_bytes(t);
                assert_eq!(b.len() as u64, t.n_bytes);
                assert!(t.offset + t.n_bytes <= f.file_len());
                let _ = t.ty();
                let _ = t.n_elements();
            }
            for (k, v) in f.metadata() {
                let _ = (f.get(k), v.as_f64(), v.as_str());
            }
        }
    }
    // Some mutations hit tensor data or values only; they must still parse.
    assert!(ok > 0);
}

// ---------------------------------------------------------------------------
// Scale: a real-size vocabulary.

#[test]
fn large_token_array_parses_fast() {
    let n = 262_144;
    let tokens: Vec<MetaValue> = (0..n).map(|i| MetaValue::Str(format!("tok{i}"))).collect();
    let scores: Vec<MetaValue> = (0..n).map(|i| MetaValue::F32(i as f32)).collect();
    let types: Vec<MetaValue> = (0..n).map(|i| MetaValue::I32(i % 6)).collect();
    let b = GgufBuilder::new()
        .kv("tokenizer.ggml.tokens", MetaValue::Array(tokens))
        .kv("tokenizer.ggml.scores", MetaValue::Array(scores))
        .kv("tokenizer.ggml.token_type", MetaValue::Array(types));
    let bytes = b.build();
    let start = Instant::now();
    let f = GgufFile::from_bytes(bytes).unwrap();
    let took = start.elapsed();
    let toks = f.get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(toks.len(), n as usize);
    assert_eq!(toks[123_456].as_str(), Some("tok123456"));
    assert_eq!(
        f.get_array("tokenizer.ggml.scores").unwrap()[7].as_f64(),
        Some(7.0)
    );
    // Generous: the machine is shared. A sane parser takes a few milliseconds.
    assert!(took.as_secs_f64() < 2.0, "parse took {took:?}");
}

#[test]
fn overlapping_tensors_are_an_error_naming_both() {
    let mut bytes = sample_builder().build();
    // Point f16.weight (one dimension) at offset 0, where f32.weight's 32
    // bytes are: the offset field follows its name, dimension count (4),
    // one dimension (8) and type (4).
    let name = b"f16.weight";
    let at = bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("the name is in the header")
        + name.len()
        + 16;
    bytes[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
    let e = err(&bytes);
    let text = e.to_string();
    assert!(
        matches!(&e, FormatError::Invalid { field, offset, .. }
            if field == "data offset of tensor 'f16.weight'" && *offset == at as u64),
        "{text}"
    );
    assert!(
        text.contains("overlap") && text.contains("'f32.weight'"),
        "{text}"
    );
    // The untouched file parses.
    assert!(parse(&sample_builder().build()).is_ok());
}
