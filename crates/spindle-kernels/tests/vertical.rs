//! The vertical weight layout (`quant::vertical`): a lossless rewrite of the
//! file's bytes, and matmul on it bit-identical to matmul on the file's
//! bytes, on every ISA (the VNNI kernel reads it; the others convert back).

mod common;

use common::{random_acts, random_weights};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spindle_kernels::matmul::{matmul_with, matmul_with_isa};
use spindle_kernels::quant::q8_act::ActRounding;
use spindle_kernels::quant::vertical::{
    dequantize_vertical_row, from_vertical, to_vertical, to_vertical_scalar, vertical_supported,
};
use spindle_kernels::simd::{available_isas, Isa};
use spindle_kernels::{GgmlType, ThreadPool, WeightLayout, WeightView};

const TYPES: [GgmlType; 6] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Row lengths: whole groups, a half group after whole ones (Gemma's 640),
/// a half group alone; K-quants: one and several super-blocks.
fn cols_for(ty: GgmlType) -> &'static [usize] {
    if ty.block_len() == 32 {
        &[256, 640, 128, 2048]
    } else {
        &[256, 1024]
    }
}

#[test]
fn the_rewrite_is_lossless_and_the_fast_one_equals_the_reference() {
    let mut rng = StdRng::seed_from_u64(11);
    for ty in TYPES {
        for &cols in cols_for(ty) {
            assert!(vertical_supported(ty, cols), "{ty} {cols}");
            let gguf = random_weights(&mut rng, ty, 9, cols);
            let mut reference = vec![0u8; gguf.len()];
            to_vertical_scalar(ty, cols, &gguf, &mut reference).unwrap();
            assert_ne!(reference, gguf, "{ty} {cols}: the rewrite moved nothing");
            let mut fast = gguf.clone();
            to_vertical(ty, cols, &mut fast).unwrap();
            assert!(fast == reference, "{ty} {cols}: in-place rewrite differs");
            let mut back = vec![0u8; gguf.len()];
            from_vertical(ty, cols, &reference, &mut back).unwrap();
            assert!(back == gguf, "{ty} {cols}: not the file's bytes back");
        }
    }
}

/// A row read one at a time (the embedding lookup of a tied head)
/// dequantizes to the file's row, bit for bit.
#[test]
fn a_vertical_row_dequantizes_as_the_files_row() {
    let mut rng = StdRng::seed_from_u64(7);
    for ty in TYPES {
        for &cols in cols_for(ty) {
            let rows = 5;
            let (gguf, vertical) = gguf_and_vertical(&mut rng, ty, rows, cols);
            let row_bytes = gguf.len() / rows;
            for r in 0..rows {
                let bytes = r * row_bytes..(r + 1) * row_bytes;
                let mut want = vec![0f32; cols];
                spindle_kernels::dequantize(ty, &gguf[bytes.clone()], &mut want).unwrap();
                let mut got = vec![1f32; cols];
                dequantize_vertical_row(ty, cols, &vertical[bytes], &mut got).unwrap();
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(same, "{ty} {cols}: row {r}");
            }
        }
    }
}

#[test]
fn q8_0_values_sit_where_the_layout_says() {
    // Independent of the code under test: block j's value l (signed byte
    // at 2 + l of the GGUF block) is at step l / 4, byte 4j + l % 4 of a
    // full group, as value + 128, after the group's 8 scales.
    let mut rng = StdRng::seed_from_u64(3);
    let gguf = random_weights(&mut rng, GgmlType::Q8_0, 1, 256);
    let mut v = gguf.clone();
    to_vertical(GgmlType::Q8_0, 256, &mut v).unwrap();
    for j in 0..8 {
        assert_eq!(v[2 * j..2 * j + 2], gguf[34 * j..34 * j + 2]);
        for l in 0..32 {
            let s = gguf[34 * j + 2 + l] as i8;
            let u = v[16 + 32 * (l / 4) + 4 * j + l % 4];
            assert_eq!(u as i32, s as i32 + 128, "block {j} value {l}");
        }
    }
}

#[test]
fn matmul_on_vertical_weights_is_bit_identical_on_every_isa() {
    // Every row count on the tile unit where there is one (it takes over
    // from 64 rows by default).
    spindle_kernels::amx::set_min_rows(2);
    let mut rng = StdRng::seed_from_u64(5);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    for ty in TYPES {
        for &cols in cols_for(ty) {
            let rows = 13;
            let (gguf, vertical) = gguf_and_vertical(&mut rng, ty, rows, cols);
            let plain = WeightView::new(ty, rows, cols, &gguf).unwrap();
            let packed = WeightView::new(ty, rows, cols, &vertical)
                .unwrap()
                .with_layout(WeightLayout::Vertical);
            for n in [1, 2, 3, 6, 7, 16, 41] {
                let x = random_acts(&mut rng, n, cols);
                every_path_matches_the_scalar_gguf(&plain, &packed, &x, n, &pools);
            }
            // Another rounding converts back and gives the GGUF result too.
            let x = random_acts(&mut rng, 3, cols);
            let (mut a, mut b) = (vec![0.0f32; 3 * rows], vec![0.0f32; 3 * rows]);
            let isa = spindle_kernels::simd::detected_isa();
            let ggml = ActRounding::Ggml;
            matmul_with(isa, ggml, &plain, &x, 3, &mut a, &pools[1]).unwrap();
            matmul_with(isa, ggml, &packed, &x, 3, &mut b, &pools[1]).unwrap();
            assert_eq!(
                a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{ty} {cols}: ggml rounding"
            );
        }
    }
}

/// A random matrix's GGUF bytes and the same matrix rewritten vertically.
fn gguf_and_vertical(
    rng: &mut StdRng,
    ty: GgmlType,
    rows: usize,
    cols: usize,
) -> (Vec<u8>, Vec<u8>) {
    let gguf = random_weights(rng, ty, rows, cols);
    let mut vertical = gguf.clone();
    to_vertical(ty, cols, &mut vertical).unwrap();
    (gguf, vertical)
}

#[test]
fn long_rows_read_ahead_and_keep_their_bits() {
    // From 10,240 columns the one-row kernel asks for its bytes ahead
    // (past the matrix's end for its last rows): the same bits as the
    // scalar GGUF result on every ISA and pool.
    let mut rng = StdRng::seed_from_u64(9);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
    ] {
        let (rows, cols) = (9, 10_240);
        let (gguf, vertical) = gguf_and_vertical(&mut rng, ty, rows, cols);
        let plain = WeightView::new(ty, rows, cols, &gguf).unwrap();
        let packed = WeightView::new(ty, rows, cols, &vertical)
            .unwrap()
            .with_layout(WeightLayout::Vertical);
        let x = random_acts(&mut rng, 1, cols);
        every_path_matches_the_scalar_gguf(&plain, &packed, &x, 1, &pools);
    }
}

/// `packed` (a vertical matrix) times the `n` rows of `x` on every ISA and
/// pool, bit for bit what the scalar kernel gives on `plain` (its GGUF
/// bytes) on one thread.
fn every_path_matches_the_scalar_gguf(
    plain: &WeightView<'_>,
    packed: &WeightView<'_>,
    x: &[f32],
    n: usize,
    pools: &[ThreadPool],
) {
    let (ty, rows, cols) = (plain.ty, plain.rows, plain.cols);
    let mut want = vec![0.0f32; n * rows];
    matmul_with_isa(Isa::Scalar, plain, x, n, &mut want, &pools[0]).unwrap();
    for isa in available_isas() {
        for pool in pools {
            let mut got = vec![0.0f32; n * rows];
            matmul_with_isa(isa, packed, x, n, &mut got, pool).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{ty} {rows}x{cols} n={n} {isa} {} threads: output {i}",
                    pool.n_threads()
                );
            }
        }
    }
}

/// The tile kernels (AMX: 16 weight rows x 16 activation rows per tile)
/// at shapes past one tile: whole and short tiles of both, several chunks
/// of activation rows, split over threads; bit for bit the scalar GGUF
/// result on every ISA.
#[test]
fn matmul_on_vertical_weights_past_one_tile_is_bit_identical() {
    spindle_kernels::amx::set_min_rows(2);
    let mut rng = StdRng::seed_from_u64(17);
    let pool = ThreadPool::new(2);
    for ty in TYPES {
        let cols = if ty.block_len() == 32 { 640 } else { 512 };
        for rows in [16, 37, 80] {
            let (gguf, vertical) = gguf_and_vertical(&mut rng, ty, rows, cols);
            let plain = WeightView::new(ty, rows, cols, &gguf).unwrap();
            let packed = WeightView::new(ty, rows, cols, &vertical)
                .unwrap()
                .with_layout(WeightLayout::Vertical);
            for n in [16, 29, 33, 520] {
                let x = random_acts(&mut rng, n, cols);
                let mut want = vec![0.0f32; n * rows];
                matmul_with_isa(Isa::Scalar, &plain, &x, n, &mut want, &pool).unwrap();
                for isa in available_isas() {
                    let mut got = vec![0.0f32; n * rows];
                    matmul_with_isa(isa, &packed, &x, n, &mut got, &pool).unwrap();
                    let bad = got
                        .iter()
                        .zip(&want)
                        .position(|(g, w)| g.to_bits() != w.to_bits());
                    assert!(
                        bad.is_none(),
                        "{ty} {rows}x{cols} n={n} {isa}: output {bad:?}: {} vs {}",
                        got[bad.unwrap_or(0)],
                        want[bad.unwrap_or(0)]
                    );
                }
            }
        }
    }
    if let Some(note) = spindle_kernels::simd::untested_isas_note() {
        eprintln!("{note}");
    }
}

#[test]
fn shapes_the_layout_cannot_hold_are_refused() {
    // 3 blocks of 32: neither whole groups nor a half group.
    assert!(!vertical_supported(GgmlType::Q8_0, 96));
    assert!(!vertical_supported(GgmlType::Q4_K, 128 * 3));
    assert!(!vertical_supported(GgmlType::Q2_K, 256));
    let mut bytes = vec![0u8; 34 * 3];
    assert!(to_vertical(GgmlType::Q8_0, 96, &mut bytes).is_err());
    let w = WeightView::new(GgmlType::Q8_0, 1, 96, &bytes)
        .unwrap()
        .with_layout(WeightLayout::Vertical);
    let mut out = [0.0f32; 1];
    let pool = ThreadPool::new(1);
    let err = spindle_kernels::matmul(&w, &[0.5; 96], 1, &mut out, &pool).unwrap_err();
    assert!(err.to_string().contains("vertical layout"), "{err}");
}
