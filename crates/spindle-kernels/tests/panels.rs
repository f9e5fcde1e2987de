//! Q8_0 matrices in panels of 16 rows (`quant::panels`): a lossless
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

#[test]
fn the_rewrite_is_lossless_and_rows_read_back_as_the_files() {
    let mut rng = StdRng::seed_from_u64(3);
    for (rows, cols) in [(16, 32), (32, 640), (48, 256), (16, 96)] {
        let gguf = random_weights(&mut rng, Q8, rows, cols);
        let mut panels = gguf.clone();
        to_panels(Q8, rows, cols, &mut panels).unwrap();
        assert_ne!(panels, gguf, "{rows}x{cols}: the rewrite moved nothing");
        // The layout's definition, byte by byte: row 5's block 1 (or 0),
        // value 6 is at step 1, lane 5, stored as s + 128; its scale first.
        let nb = cols / 32;
        let b = nb.min(2) - 1;
        let file_block = &gguf[(5 * nb + b) * 34..(5 * nb + b + 1) * 34];
        let panel_block = &panels[b * 16 * 34..(b + 1) * 16 * 34];
        assert_eq!(panel_block[10..12], file_block[..2], "{rows}x{cols}: scale");
        assert_eq!(
            panel_block[32 + 64 + 4 * 5 + 2],
            (file_block[2 + 6] as i8 as i16 + 128) as u8,
            "{rows}x{cols}: value"
        );
        let mut back = vec![0u8; gguf.len()];
        from_panels(Q8, rows, cols, &panels, &mut back).unwrap();
        assert!(back == gguf, "{rows}x{cols}: not the file's bytes back");
        let row_bytes = nb * 34;
        let mut row = vec![0u8; row_bytes];
        for r in 0..rows {
            panel_row(cols, &panels, r, &mut row).unwrap();
            assert_eq!(
                row,
                gguf[r * row_bytes..(r + 1) * row_bytes],
                "{rows}x{cols} row {r}"
            );
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
    // nine blocks (a class with two).
    for (rows, cols) in [(144, 640), (32, 32), (48, 288), (16, 256)] {
        let gguf = random_weights(&mut rng, Q8, rows, cols);
        let mut panels = gguf.clone();
        to_panels(Q8, rows, cols, &mut panels).unwrap();
        let plain = WeightView::new(Q8, rows, cols, &gguf).unwrap();
        let view = WeightView::new(Q8, rows, cols, &panels)
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
                            "{rows}x{cols} n={n} {isa} {} threads: output {i}",
                            pool.n_threads()
                        );
                    }
                }
            }
        }
    }
}
