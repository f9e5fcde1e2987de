//! Shared helpers for the kernel tests: random weights in every type.

#![allow(dead_code)]

use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::Rng;
use spindle_kernels::GgmlType;

/// A random f32 in [-1, 1).
pub fn uniform(rng: &mut StdRng) -> f32 {
    rng.random::<f32>() * 2.0 - 1.0
}

/// Roughly normal (sum of uniforms), scaled.
pub fn normalish(rng: &mut StdRng, scale: f32) -> f32 {
    let s: f32 = (0..4).map(|_| uniform(rng)).sum();
    s * 0.87 * scale
}

fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_bits().to_le_bytes()
}

/// A finite, non-tiny scale of either sign.
fn scale(rng: &mut StdRng, signed: bool) -> f32 {
    let mag = 1e-3 + rng.random::<f32>() * 0.1;
    if signed && rng.random::<bool>() {
        -mag
    } else {
        mag
    }
}

/// `rows x cols` random weights of type `ty`: random block bytes with finite
/// f16 scales for the quantized types, random values for the float types.
pub fn random_weights(rng: &mut StdRng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * cols;
    match ty {
        GgmlType::F32 => (0..n)
            .flat_map(|_| normalish(rng, 0.5).to_le_bytes())
            .collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| f16_bytes(normalish(rng, 0.5)))
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| bf16::from_f32(normalish(rng, 0.5)).to_bits().to_le_bytes())
            .collect(),
        _ => {
            let nb = n / ty.block_len();
            let bb = ty.block_bytes();
            let mut out = vec![0u8; nb * bb];
            for block in out.chunks_exact_mut(bb) {
                rng.fill(block);
                match ty {
                    GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => {
                        block[0..2].copy_from_slice(&f16_bytes(scale(rng, true)));
                    }
                    GgmlType::Q4_K | GgmlType::Q5_K => {
                        block[0..2].copy_from_slice(&f16_bytes(scale(rng, false)));
                        block[2..4].copy_from_slice(&f16_bytes(scale(rng, false)));
                    }
                    GgmlType::Q6_K => {
                        block[208..210].copy_from_slice(&f16_bytes(scale(rng, true)));
                    }
                    _ => unreachable!(),
                }
            }
            out
        }
    }
}

/// `n x cols` activations: mostly normal-ish, with a zero row, a row of large
/// values and a row with one outlier per block when `n` allows.
pub fn random_acts(rng: &mut StdRng, n: usize, cols: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n * cols).map(|_| normalish(rng, 1.0)).collect();
    if n >= 3 {
        x[cols..2 * cols].fill(0.0);
        for v in &mut x[2 * cols..3 * cols] {
            *v *= 1000.0;
        }
    }
    if n >= 4 {
        for k in (0..cols).step_by(32) {
            x[3 * cols + k] = 50.0;
        }
    }
    x
}
