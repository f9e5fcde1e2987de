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
                // f16 scales: (offset, signed).
                let scales: &[(usize, bool)] = match ty {
                    GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => &[(0, true)],
                    GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[(0, true)],
                    GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S => &[(0, true)],
                    GgmlType::IQ3_XXS | GgmlType::IQ3_S | GgmlType::IQ1_S => &[(0, true)],
                    // IQ1_M: the f16 lives in the top nibbles of the last 4
                    // words; random bits there can be NaN, so set them.
                    GgmlType::IQ1_M => {
                        let d = f16::from_f32(scale(rng, true)).to_bits();
                        for i in 0..4 {
                            let at = 48 + 2 * i;
                            let w = u16::from_le_bytes([block[at], block[at + 1]]);
                            let top = (d >> (4 * i)) & 0xF;
                            let w = (w & 0x0FFF) | (top << 12);
                            block[at..at + 2].copy_from_slice(&w.to_le_bytes());
                        }
                        &[]
                    }
                    GgmlType::Q4_K | GgmlType::Q5_K => &[(0, false), (2, false)],
                    GgmlType::Q4_1 | GgmlType::Q5_1 => &[(0, false), (2, true)],
                    GgmlType::Q6_K => &[(208, true)],
                    GgmlType::Q2_K => &[(80, false), (82, false)],
                    GgmlType::Q3_K => &[(108, true)],
                    GgmlType::TQ1_0 => &[(52, true)],
                    GgmlType::TQ2_0 => &[(64, true)],
                    GgmlType::Q1_0 | GgmlType::Q2_0 => &[(0, true)],
                    GgmlType::MXFP4 => {
                        // A power-of-two scale near 2^-6.
                        block[0] = rng.random_range(115..128);
                        &[]
                    }
                    _ => unreachable!(),
                };
                for &(at, signed) in scales {
                    block[at..at + 2].copy_from_slice(&f16_bytes(scale(rng, signed)));
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
