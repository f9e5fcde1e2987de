//! `dequantize` against reference vectors made by gguf-py
//! (scripts/make_quant_fixtures.py). Values must match bit for bit.

use spindle_kernels::{dequantize, GgmlType, KernelError};

struct Fixture {
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
    bits: Vec<u32>,
}

fn load(ty: GgmlType) -> Fixture {
    let path = format!(
        "{}/tests/fixtures/{}.json",
        env!("CARGO_MANIFEST_DIR"),
        ty.name().to_lowercase()
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["type"].as_str().unwrap(), ty.name());
    let hex = v["bytes_hex"].as_str().unwrap();
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let bits = v["f32_bits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap() as u32)
        .collect();
    Fixture {
        rows: v["rows"].as_u64().unwrap() as usize,
        cols: v["cols"].as_u64().unwrap() as usize,
        bytes,
        bits,
    }
}

fn assert_bits(ty: GgmlType, got: &[f32], want: &[u32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, &w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w,
            "{ty} value {i}: got {g:e}, want {:e}",
            f32::from_bits(w)
        );
    }
}

#[test]
fn every_type_matches_gguf_reference() {
    for ty in GgmlType::ALL {
        let f = load(ty);
        let n = f.rows * f.cols;
        assert_eq!(f.bits.len(), n);
        assert_eq!(f.bytes.len() as u64, ty.bytes_for(n as u64).unwrap());

        // The whole buffer at once.
        let mut out = vec![0.0f32; n];
        dequantize(ty, &f.bytes, &mut out).unwrap();
        assert_bits(ty, &out, &f.bits);

        // Row by row.
        let row_bytes = ty.bytes_for(f.cols as u64).unwrap() as usize;
        for r in 0..f.rows {
            let mut row = vec![0.0f32; f.cols];
            dequantize(ty, &f.bytes[r * row_bytes..(r + 1) * row_bytes], &mut row).unwrap();
            assert_bits(ty, &row, &f.bits[r * f.cols..(r + 1) * f.cols]);
        }
    }
}

#[test]
fn size_errors_not_panics() {
    for ty in GgmlType::ALL {
        let bl = ty.block_len();
        let bb = ty.block_bytes();
        let src = vec![0u8; 2 * bb];
        // Wrong source length.
        let mut dst = vec![0.0f32; 2 * bl];
        let err = dequantize(ty, &src[..bb], &mut dst).unwrap_err();
        assert!(
            matches!(err, KernelError::SizeMismatch { .. }),
            "{ty}: {err}"
        );
        // Destination not whole blocks.
        if bl > 1 {
            let mut dst = vec![0.0f32; bl + 1];
            let err = dequantize(ty, &src, &mut dst).unwrap_err();
            assert!(
                matches!(err, KernelError::NotBlockAligned { .. }),
                "{ty}: {err}"
            );
        }
        // Empty is fine.
        dequantize(ty, &[], &mut []).unwrap();
    }
}
