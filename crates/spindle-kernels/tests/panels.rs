//! Q8_0 and Q5_0 matrices in panels of 16 rows (`quant::panels`): a lossless
//! rewrite of the file's bytes, rows read back one at a time as the file
//! has them, and matmul on panels bit-identical to matmul on the file's
//! bytes on every ISA (the VNNI paths read panels; the others convert
//! back), whatever the row count, thread count, and split of the rows.

mod common;

use common::{random_acts, random_weights};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spindle_kernels::matmul::matmul_with_isa;
use spindle_kernels::quant::panels::{from_panels, panel_row, panels_supported, to_panels};
use spindle_kernels::simd::{available_isas, Isa};
use spindle_kernels::{GgmlType, ThreadPool, WeightLayout, WeightView};

const Q8: GgmlType = GgmlType::Q8_0;
/// The types panels hold.
const TYPES: [GgmlType; 2] = [GgmlType::Q8_0, GgmlType::Q5_0];

/// The 32 signed values of one file block of `ty` (Q8_0 or Q5_0), as the
/// format defines them: an independent decoding of the file's bytes.
fn file_values(ty: GgmlType, block: &[u8]) -> [i32; 32] {
    std::array::from_fn(|j| match ty {
        GgmlType::Q8_0 => block[2 + j] as i8 as i32,
        _ => {
            let qh = u32::from_le_bytes(block[2..6].try_into().unwrap());
            let nibble = if j < 16 {
                block[6 + j] & 15
            } else {
                block[6 + j - 16] >> 4
            };
            (nibble as i32 | (((qh >> j) & 1) as i32) << 4) - 16
        }
    })
}

/// Value `4k + v` of row `i` of a panel block, from the layout's
/// definition (the module's docs), as a signed value.
fn panel_value(ty: GgmlType, block: &[u8], i: usize, k: usize, v: usize) -> i32 {
    match ty {
        GgmlType::Q8_0 => block[32 + 64 * k + 4 * i + v] as i32 - 128,
        _ => {
            let nibble = (block[32 + 64 * (k % 4) + 4 * i + v] >> (4 * (k / 4))) & 15;
            let mask = u64::from_le_bytes(block[288 + 8 * k..296 + 8 * k].try_into().unwrap());
            let fifth = ((mask >> (4 * i + v)) & 1) as i32;
            (nibble as i32 | fifth << 4) - 16
        }
    }
}

#[test]
fn the_rewrite_is_lossless_and_rows_read_back_as_the_files() {
    let mut rng = StdRng::seed_from_u64(3);
    for ty in TYPES {
        let bb = ty.block_bytes();
        for (rows, cols) in [(16, 32), (32, 640), (48, 256), (16, 96)] {
            let gguf = random_weights(&mut rng, ty, rows, cols);
            let mut panels = gguf.clone();
            to_panels(ty, rows, cols, &mut panels).unwrap();
            assert_ne!(
                panels, gguf,
                "{ty} {rows}x{cols}: the rewrite moved nothing"
            );
            // The layout's definition, value by value: every row of the
            // first panel's block 1 (or 0), its scale first.
            let nb = cols / 32;
            let b = nb.min(2) - 1;
            let panel_block = &panels[b * 16 * bb..(b + 1) * 16 * bb];
            for i in 0..16 {
                let file_block = &gguf[(i * nb + b) * bb..(i * nb + b + 1) * bb];
                assert_eq!(
                    panel_block[2 * i..2 * i + 2],
                    file_block[..2],
                    "{ty} {rows}x{cols}: scale"
                );
                let want = file_values(ty, file_block);
                for k in 0..8 {
                    for v in 0..4 {
                        assert_eq!(
                            panel_value(ty, panel_block, i, k, v),
                            want[4 * k + v],
                            "{ty} {rows}x{cols}: row {i} value {}",
                            4 * k + v
                        );
                    }
                }
            }
            let mut back = vec![0u8; gguf.len()];
            from_panels(ty, rows, cols, &panels, &mut back).unwrap();
            assert!(
                back == gguf,
                "{ty} {rows}x{cols}: not the file's bytes back"
            );
            let row_bytes = nb * bb;
            let mut row = vec![0u8; row_bytes];
            for r in 0..rows {
                panel_row(ty, cols, &panels, r, &mut row).unwrap();
                assert_eq!(
                    row,
                    gguf[r * row_bytes..(r + 1) * row_bytes],
                    "{ty} {rows}x{cols} row {r}"
                );
            }
        }
    }
}

#[test]
fn shapes_that_panels_cannot_hold_are_errors() {
    assert!(!panels_supported(Q8, 15, 64));
    assert!(!panels_supported(Q8, 0, 64));
    assert!(!panels_supported(GgmlType::Q4_0, 16, 64));
    let mut rng = StdRng::seed_from_u64(1);
    let mut w = random_weights(&mut rng, Q8, 15, 64);
    assert!(to_panels(Q8, 15, 64, &mut w).is_err());
    let mut w = random_weights(&mut rng, Q8, 16, 64);
    assert!(to_panels(Q8, 16, 96, &mut w).is_err(), "wrong byte count");
    let view = WeightView::new(GgmlType::Q4_0, 16, 64, &w[..16 * 36]);
    let view = view.unwrap().with_layout(WeightLayout::Panels);
    let mut out = vec![0.0; 16];
    let pool = ThreadPool::new(1);
    let err = matmul_with_isa(Isa::Scalar, &view, &[0.5; 64], 1, &mut out, &pool);
    assert!(err.is_err(), "a Q4_0 matrix in panels was multiplied");
}

#[test]
fn matmul_on_panels_is_bit_identical_on_every_isa() {
    spindle_kernels::amx::set_min_rows(2);
    let mut rng = StdRng::seed_from_u64(9);
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    // 144 rows of 640 split between 2 or 3 threads leave panels cut in the
    // middle (72 and 48 rows a thread); 32 columns have one lane class, 288
    // nine blocks (a class with two); 13 panels are enough for the tiles to
    // ask for panels ahead, each its share of the blocks.
    for (ty, rows, cols) in TYPES.into_iter().flat_map(|ty| {
        [
            (ty, 144, 640),
            (ty, 32, 32),
            (ty, 48, 288),
            (ty, 16, 256),
            (ty, 208, 96),
        ]
    }) {
        let gguf = random_weights(&mut rng, ty, rows, cols);
        let mut panels = gguf.clone();
        to_panels(ty, rows, cols, &mut panels).unwrap();
        let plain = WeightView::new(ty, rows, cols, &gguf).unwrap();
        let view = WeightView::new(ty, rows, cols, &panels)
            .unwrap()
            .with_layout(WeightLayout::Panels);
        for n in [1, 2, 3, 5, 6, 7, 12, 13, 16, 41] {
            let x = random_acts(&mut rng, n, cols);
            let mut want = vec![0.0f32; n * rows];
            matmul_with_isa(Isa::Scalar, &plain, &x, n, &mut want, &pools[0]).unwrap();
            for isa in available_isas() {
                for pool in &pools {
                    // NaN where nothing was written: a skipped output fails.
                    let mut got = vec![f32::NAN; n * rows];
                    matmul_with_isa(isa, &view, &x, n, &mut got, pool).unwrap();
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
    }
}
