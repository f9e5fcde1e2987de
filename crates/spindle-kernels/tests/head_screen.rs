//! The head screen's bounds against the head's own logits: every bound at
//! or above its logit, on every ISA path and thread count; and a bound
//! shrunk below the sound one falls under some logit (the test can fail).

use rand::{Rng, SeedableRng};
use spindle_kernels::head_screen::HeadScreen;
use spindle_kernels::matmul::matmul_with;
use spindle_kernels::quant::panels::{panels_supported, to_panels};
use spindle_kernels::quant::q8_act::ActRounding;
use spindle_kernels::quant::vertical::{to_vertical, vertical_supported};
use spindle_kernels::simd::{available_isas, detected_isa};
use spindle_kernels::{GgmlType, ThreadPool, WeightLayout, WeightView};

/// A Q8_0 matrix of `rows` x `cols` with random scales and values.
fn q8_0(rng: &mut impl Rng, rows: usize, cols: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows * cols / 32 * 34);
    for _ in 0..rows * cols / 32 {
        let d = half::f16::from_f32(rng.random_range(2e-4f32..2e-3));
        out.extend_from_slice(&d.to_bits().to_le_bytes());
        for _ in 0..32 {
            out.push(rng.random_range(-127i32..=127) as i8 as u8);
        }
    }
    out
}

/// Hidden-state-like rows: a few shared directions with large weights
/// plus noise, as a model's final hidden states are.
fn hidden(rng: &mut impl Rng, n: usize, cols: usize, dirs: &[Vec<f32>]) -> Vec<f32> {
    let mut x = vec![0f32; n * cols];
    for row in x.chunks_exact_mut(cols) {
        for d in dirs {
            let a: f32 = rng.random_range(-30.0..30.0);
            row.iter_mut().zip(d).for_each(|(v, &e)| *v += a * e);
        }
        row.iter_mut()
            .for_each(|v| *v += rng.random_range(-1.0f32..1.0));
    }
    x
}

fn check(rows: usize, cols: usize, n: usize, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let data = q8_0(&mut rng, rows, cols);
    let w = WeightView::new(GgmlType::Q8_0, rows, cols, &data).unwrap();
    let dirs: Vec<Vec<f32>> = (0..3)
        .map(|_| (0..cols).map(|_| rng.random_range(-1.0f32..1.0)).collect())
        .collect();
    let calib = hidden(&mut rng, 64, cols, &dirs);
    let x = hidden(&mut rng, n, cols, &dirs);
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        let mut screen = HeadScreen::build(&w, &calib, &pool).unwrap();
        // A head the loader rewrote (into the vertical layout, or a Q8_0
        // head into panels of 16 rows) screens exactly as the file's.
        let same_screen = |bytes: &[u8], layout: WeightLayout| {
            let view = WeightView::new(GgmlType::Q8_0, rows, cols, bytes)
                .unwrap()
                .with_layout(layout);
            let other = HeadScreen::build(&view, &calib, &pool).unwrap();
            let isa = detected_isa();
            let a = screen
                .bounds(isa, ActRounding::Block32, &x, n, &pool)
                .unwrap();
            let b = other
                .bounds(isa, ActRounding::Block32, &x, n, &pool)
                .unwrap();
            let same =
                a.ub.iter()
                    .zip(&b.ub)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same && a.likeliest == b.likeliest,
                "{layout:?} head's screen differs"
            );
        };
        if vertical_supported(GgmlType::Q8_0, cols) {
            let mut v = data.clone();
            to_vertical(GgmlType::Q8_0, cols, &mut v).unwrap();
            same_screen(&v, WeightLayout::Vertical);
        }
        if panels_supported(GgmlType::Q8_0, rows, cols) {
            let mut p = data.clone();
            to_panels(GgmlType::Q8_0, rows, cols, &mut p).unwrap();
            same_screen(&p, WeightLayout::Panels);
        }
        for isa in available_isas() {
            for rounding in [ActRounding::Block32, ActRounding::Ggml] {
                let mut logits = vec![0f32; n * rows];
                matmul_with(isa, rounding, &w, &x, n, &mut logits, &pool).unwrap();
                screen.set_slack_scale(1.0);
                let b = screen.bounds(isa, rounding, &x, n, &pool).unwrap();
                let mut tight = 0f32;
                for (i, (&u, &l)) in b.ub.iter().zip(&logits).enumerate() {
                    assert!(
                        u >= l,
                        "{isa:?} {threads} threads: token {} of row {}: bound {u} < logit {l}",
                        i % rows,
                        i / rows
                    );
                    tight = tight.max(l - u);
                }
                // The bound is what keeps it sound: a tenth of the slack
                // falls below some logit.
                screen.set_slack_scale(0.1);
                let b = screen.bounds(isa, rounding, &x, n, &pool).unwrap();
                assert!(
                    b.ub.iter().zip(&logits).any(|(u, l)| u < l),
                    "{isa:?}: a bound a tenth as wide still held everywhere"
                );
            }
        }
    }
}

#[test]
fn every_bound_is_at_or_above_its_logit_on_every_isa_and_thread_count() {
    check(1000, 640, 5, 1);
    // An odd number of blocks (a half-used nibble pair) and one row.
    check(777, 96, 1, 2);
    // Rows in whole panels of 16, as a Q8_0 head is held on VNNI machines.
    check(1024, 640, 3, 3);
}
