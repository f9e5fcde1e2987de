//! The packed float matmul of encoders: each output is one fused
//! multiply-add chain over k in order, so it equals a plain scalar chain
//! written here (bit for bit) on every available ISA and thread count, for
//! any row count, column count and position in the batch; and it is a dot
//! product (against an f64 reference).

mod common;

use common::{normalish, random_acts};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spindle_kernels::float_panels::{matmul_panels, PanelMatrix};
use spindle_kernels::simd::available_isas;
use spindle_kernels::ThreadPool;

/// `out[i][j]` as the contract defines it, independently of the packing.
fn fma_chain(w: &[f32], x: &[f32], rows: usize, cols: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n * rows];
    for i in 0..n {
        for j in 0..rows {
            let mut acc = 0.0f32;
            for k in 0..cols {
                acc = x[i * cols + k].mul_add(w[j * cols + k], acc);
            }
            out[i * rows + j] = acc;
        }
    }
    out
}

fn packed(w: &[f32], rows: usize, cols: usize) -> PanelMatrix {
    PanelMatrix::from_rows(rows, cols, |r, dst: &mut [f32]| {
        dst.copy_from_slice(&w[r * cols..(r + 1) * cols]);
        Ok::<(), ()>(())
    })
    .unwrap()
}

#[test]
fn every_path_gives_the_fma_chain_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(41);
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    // Output counts off the panel (16) and group (64) sizes, row counts off
    // the tile (6) and task (96) sizes.
    for &(rows, cols) in &[
        (384, 384),
        (1536, 384),
        (384, 1536),
        (100, 37),
        (17, 5),
        (1, 64),
    ] {
        let w: Vec<f32> = (0..rows * cols)
            .map(|_| normalish(&mut rng, 0.05))
            .collect();
        let m = packed(&w, rows, cols);
        for n in [1, 5, 6, 13, 100] {
            let x = random_acts(&mut rng, n, cols);
            let want = fma_chain(&w, &x, rows, cols, n);
            for isa in available_isas() {
                for pool in &pools {
                    // Poisoned, so a column the kernel skips shows.
                    let mut out = vec![f32::NAN; n * rows + 3];
                    matmul_panels(isa, &m, &x, n, &mut out, pool).unwrap();
                    let differ = (0..n * rows)
                        .filter(|&e| out[e].to_bits() != want[e].to_bits())
                        .count();
                    assert_eq!(
                        differ,
                        0,
                        "{rows}x{cols}, n {n}, {isa}, {} threads: {differ} outputs differ",
                        pool.n_threads()
                    );
                    assert!(
                        out[n * rows..].iter().all(|v| v.is_nan()),
                        "wrote past the output"
                    );
                }
            }
        }
    }
}

#[test]
fn the_product_is_a_matrix_product() {
    let mut rng = StdRng::seed_from_u64(7);
    let (rows, cols, n) = (70, 384, 9);
    let w: Vec<f32> = (0..rows * cols)
        .map(|_| normalish(&mut rng, 0.05))
        .collect();
    let x: Vec<f32> = (0..n * cols).map(|_| normalish(&mut rng, 1.0)).collect();
    let m = packed(&w, rows, cols);
    let pool = ThreadPool::new(2);
    for isa in available_isas() {
        let mut out = vec![0.0f32; n * rows];
        matmul_panels(isa, &m, &x, n, &mut out, &pool).unwrap();
        for i in 0..n {
            for j in 0..rows {
                let exact: f64 = (0..cols)
                    .map(|k| f64::from(x[i * cols + k]) * f64::from(w[j * cols + k]))
                    .sum();
                let scale: f64 = (0..cols)
                    .map(|k| (f64::from(x[i * cols + k]) * f64::from(w[j * cols + k])).abs())
                    .sum();
                let err = (f64::from(out[i * rows + j]) - exact).abs();
                assert!(
                    err <= 1e-5 * scale + 1e-30,
                    "{isa} ({i}, {j}): {} vs {exact}",
                    out[i * rows + j]
                );
            }
        }
    }
}

#[test]
fn short_buffers_are_errors() {
    let m = packed(&[1.0; 32], 2, 16);
    let pool = ThreadPool::new(1);
    let mut out = vec![0.0; 4];
    assert!(matmul_panels(available_isas()[0], &m, &[0.0; 31], 2, &mut out, &pool).is_err());
    assert!(matmul_panels(available_isas()[0], &m, &[0.0; 32], 2, &mut out[..3], &pool).is_err());
}
