//! matmul on every available ISA: against an f64 reference, batch invariance
//! (bit-identical whatever n, the neighbouring rows and the thread count), and
//! bit-identical scalar vs SIMD paths.

mod common;

use common::{random_acts, random_weights};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spindle_kernels::matmul::{matmul_with, matmul_with_isa};
use spindle_kernels::quant::q8_act::{ActFormat, ActRounding, QuantizedActs};
use spindle_kernels::simd::{available_isas, detected_isa, Isa};
use spindle_kernels::{dequantize, matmul, GgmlType, KernelError, ThreadPool, WeightView};

/// Column counts to try per type: several block counts, including ones that
/// are not a multiple of the 8 lanes (tails).
fn col_cases(ty: GgmlType) -> &'static [usize] {
    match ty.block_len() {
        1 => &[1, 7, 31, 33, 100, 640],
        32 => &[32, 96, 192, 224, 288, 416, 640],
        64 => &[64, 192, 640, 2304],
        128 => &[128, 384, 640, 2304],
        _ => &[256, 768, 2304],
    }
}

/// The activations the kernel actually multiplies with: quantized then
/// dequantized for quantized weights, as given for float weights.
fn effective_acts(
    ty: GgmlType,
    rounding: ActRounding,
    x: &[f32],
    n: usize,
    cols: usize,
) -> Vec<f32> {
    let Some(format) = rounding.format_for(ty) else {
        return x.to_vec();
    };
    let mut q = QuantizedActs::new();
    q.quantize(format, x, n, cols).unwrap();
    let mut out = vec![0.0f32; n * cols];
    for (i, row) in out.chunks_exact_mut(cols).enumerate() {
        q.dequantize_row(i, row).unwrap();
    }
    // Quantization error is at most half a step of the scale's group (plus,
    // for f16 scales, 127 times the scale's rounding, 2^-11 of it).
    let bl = format.scale_len();
    let steps = if format == ActFormat::Block32F16 {
        0.501 + 127.0 / 2048.0
    } else {
        0.501
    };
    for (xb, qb) in x.chunks_exact(bl).zip(out.chunks_exact(bl)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (a, b) in xb.iter().zip(qb) {
            assert!((a - b).abs() <= steps * amax / 127.0 + 1e-30, "{a} vs {b}");
        }
    }
    out
}

/// A random weight matrix under test.
struct Weights {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
}

impl Weights {
    fn random(rng: &mut StdRng, ty: GgmlType, rows: usize, cols: usize) -> Self {
        let data = random_weights(rng, ty, rows, cols);
        Weights {
            ty,
            rows,
            cols,
            data,
        }
    }

    fn view(&self) -> WeightView<'_> {
        WeightView::new(self.ty, self.rows, self.cols, &self.data).unwrap()
    }

    fn run(&self, isa: Isa, x: &[f32], n: usize, pool: &ThreadPool) -> Vec<f32> {
        let mut out = vec![f32::NAN; n * self.rows];
        matmul_with_isa(isa, &self.view(), x, n, &mut out, pool).unwrap();
        out
    }

    fn run_rounded(
        &self,
        isa: Isa,
        rounding: ActRounding,
        x: &[f32],
        n: usize,
        pool: &ThreadPool,
    ) -> Vec<f32> {
        let mut out = vec![f32::NAN; n * self.rows];
        matmul_with(isa, rounding, &self.view(), x, n, &mut out, pool).unwrap();
        out
    }

    /// Checks `got` (n x rows) against an f64 reference.
    fn check_reference(&self, x: &[f32], n: usize, got: &[f32], what: &str) {
        self.check_rounded(ActRounding::default(), x, n, got, what)
    }

    /// [`Weights::check_reference`] for activations rounded as `rounding`.
    fn check_rounded(&self, rounding: ActRounding, x: &[f32], n: usize, got: &[f32], what: &str) {
        let (ty, rows, cols) = (self.ty, self.rows, self.cols);
        let mut wf = vec![0.0f32; rows * cols];
        dequantize(ty, &self.data, &mut wf).unwrap();
        let a = effective_acts(ty, rounding, x, n, cols);
        for i in 0..n {
            let ar = &a[i * cols..(i + 1) * cols];
            for r in 0..rows {
                let wr = &wf[r * cols..(r + 1) * cols];
                let wmax = wr.iter().fold(0.0f64, |m, &v| m.max(v.abs() as f64));
                let mut dot = 0.0f64;
                let mut scale = 0.0f64;
                for (&wv, &av) in wr.iter().zip(ar) {
                    dot += wv as f64 * av as f64;
                    // f32 accumulation error, plus the rounding of the f32
                    // dequantized weights (K types subtract a min: up to wmax).
                    scale += (av as f64).abs() * ((wv as f64).abs() + wmax);
                }
                let g = got[i * rows + r] as f64;
                let tol = 1e-5 * scale + 1e-30;
                assert!(
                    (g - dot).abs() <= tol,
                    "{what}: {ty} {rows}x{cols} n={n} out[{i},{r}] = {g}, reference {dot} (tol {tol})"
                );
            }
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// Asserts equal bit patterns, reporting the first difference only.
#[track_caller]
fn assert_same(got: &[u32], want: &[u32], what: std::fmt::Arguments<'_>) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{what}: element {i} differs: {:e} vs {:e}",
            f32::from_bits(got[i]),
            f32::from_bits(want[i])
        );
    }
}

#[test]
fn matches_reference_on_every_isa() {
    if let Some(note) = spindle_kernels::simd::untested_isas_note() {
        eprintln!("{note}");
    }
    let mut rng = StdRng::seed_from_u64(7);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    for ty in GgmlType::ALL {
        for &cols in col_cases(ty) {
            for (rows, n) in [(1, 1), (3, 7), (7, 3), (17, 17), (5, 1)] {
                let w = Weights::random(&mut rng, ty, rows, cols);
                let x = random_acts(&mut rng, n, cols);
                let mut first: Option<Vec<u32>> = None;
                for isa in available_isas() {
                    for pool in &pools {
                        let out = w.run(isa, &x, n, pool);
                        w.check_reference(&x, n, &out, isa.name());
                        // Every ISA and thread count gives the same bits.
                        match &first {
                            None => first = Some(bits(&out)),
                            Some(f) => assert_same(
                                &bits(&out),
                                f,
                                format_args!(
                                    "{ty} {rows}x{cols} n={n}: {isa} with {} threads",
                                    pool.n_threads()
                                ),
                            ),
                        }
                    }
                }
            }
        }
    }
}

/// llama.cpp's rounding (one activation scale per 256 values for the types
/// ggml multiplies with Q8_K): the same reference check and the same bits on
/// every ISA and thread count, and a result that differs from the default
/// rounding (the option takes effect: f16 scales for the other types).
#[test]
fn ggml_rounding_matches_reference_on_every_isa() {
    let mut rng = StdRng::seed_from_u64(17);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let ggml = ActRounding::Ggml;
    for ty in GgmlType::ALL {
        if ggml.format_for(ty).is_none() {
            continue;
        }
        let cols = 768;
        for (rows, n) in [(5, 1), (7, 3), (17, 17)] {
            let w = Weights::random(&mut rng, ty, rows, cols);
            let x = random_acts(&mut rng, n, cols);
            let mut first: Option<Vec<u32>> = None;
            for isa in available_isas() {
                for pool in &pools {
                    let out = w.run_rounded(isa, ggml, &x, n, pool);
                    w.check_rounded(ggml, &x, n, &out, isa.name());
                    match &first {
                        None => first = Some(bits(&out)),
                        Some(f) => assert_same(
                            &bits(&out),
                            f,
                            format_args!(
                                "{ty} ggml rounding n={n}: {isa}, {} threads",
                                pool.n_threads()
                            ),
                        ),
                    }
                }
            }
            let default = bits(&w.run(available_isas()[0], &x, n, &pools[0]));
            assert!(
                first.as_ref() != Some(&default),
                "{ty}: ggml rounding gave the default's result"
            );
        }
    }
}

/// Shapes big enough that the pool really splits the rows.
fn invariance_shape(ty: GgmlType) -> (usize, usize) {
    match ty.block_len() {
        1 => (257, 100),
        32 => (257, 640),
        _ => (131, 1024),
    }
}

#[test]
fn batch_and_thread_invariant_bit_identical() {
    if let Some(note) = spindle_kernels::simd::untested_isas_note() {
        eprintln!("{note}");
    }
    let mut rng = StdRng::seed_from_u64(11);
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let n = 16;
    for ty in GgmlType::ALL {
        let (rows, cols) = invariance_shape(ty);
        let w = Weights::random(&mut rng, ty, rows, cols);
        let x = random_acts(&mut rng, n, cols);
        // The whole batch, and each row alone.
        let alone: Vec<usize> = (0..n).collect();
        let reference = every_path_gives_one_result(&w, &x, n, &pools, &alone, ty);
        for &isa in &available_isas() {
            for pool in &pools {
                // A slice of 5 rows, and the same rows among other neighbours.
                let five = w.run(isa, &x[3 * cols..8 * cols], 5, pool);
                assert_same(
                    &bits(&five),
                    &reference[3 * rows..8 * rows],
                    format_args!("{ty} {isa}: rows 3..8"),
                );
                let mut mixed = random_acts(&mut rng, 7, cols);
                mixed[2 * cols..3 * cols].copy_from_slice(&x[5 * cols..6 * cols]);
                let m = w.run(isa, &mixed, 7, pool);
                assert_same(
                    &bits(&m[2 * rows..3 * rows]),
                    &reference[5 * rows..6 * rows],
                    format_args!("{ty} {isa}: row 5 among other rows"),
                );
            }
        }
    }
}

#[test]
fn prompt_sized_batches_split_by_rows_bit_identical() {
    // Enough activation rows that every thread gets whole chunks of its own
    // (`run_split_multi` then splits by activation rows, not weight rows):
    // the same bits as one thread, as the other paths, and as a row alone.
    let mut rng = StdRng::seed_from_u64(23);
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let n = 480;
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_XS,
        GgmlType::F16,
    ] {
        let cols = invariance_shape(ty).1;
        let rows = 40;
        let w = Weights::random(&mut rng, ty, rows, cols);
        let x = random_acts(&mut rng, n, cols);
        every_path_gives_one_result(&w, &x, n, &pools, &[0, 161, 317, n - 1], ty);
    }
    // Long rows: chunks of the minimum row count (128), so each thread's
    // share is cut into chunks that end inside it.
    let (ty, rows, cols) = (GgmlType::Q4_K, 16, 4096);
    let w = Weights::random(&mut rng, ty, rows, cols);
    let x = random_acts(&mut rng, n, cols);
    every_path_gives_one_result(&w, &x, n, &pools, &[0, 127, 128, n - 1], ty);
}

/// `w` times the `n` rows of `x` on every ISA and pool, bit for bit the
/// first ISA's on one thread, and so is each row of `alone` run by itself:
/// returns those bits.
fn every_path_gives_one_result(
    w: &Weights,
    x: &[f32],
    n: usize,
    pools: &[ThreadPool],
    alone: &[usize],
    ty: GgmlType,
) -> Vec<u32> {
    let (rows, cols) = (w.rows, w.cols);
    let isas = available_isas();
    let reference = bits(&w.run(isas[0], x, n, &pools[0]));
    for &isa in &isas {
        for pool in pools {
            let threads = pool.n_threads();
            let full = w.run(isa, x, n, pool);
            assert_same(
                &bits(&full),
                &reference,
                format_args!("{ty} {isa} {threads} threads, n={n}"),
            );
            for &i in alone {
                let one = w.run(isa, &x[i * cols..(i + 1) * cols], 1, pool);
                assert_same(
                    &bits(&one),
                    &reference[i * rows..(i + 1) * rows],
                    format_args!("{ty} {isa} {threads} threads: row {i} alone"),
                );
            }
        }
    }
    reference
}

#[test]
fn default_isa_is_available_and_used() {
    assert!(detected_isa().is_available());
    let mut rng = StdRng::seed_from_u64(3);
    let pool = ThreadPool::new(2);
    let (rows, cols, n) = (9, 64, 2);
    let w = Weights::random(&mut rng, GgmlType::Q8_0, rows, cols);
    let x = random_acts(&mut rng, n, cols);
    let mut out = vec![0.0; n * rows];
    matmul(&w.view(), &x, n, &mut out, &pool).unwrap();
    let again = w.run(detected_isa(), &x, n, &pool);
    assert_same(
        &bits(&out),
        &bits(&again),
        format_args!("matmul vs matmul_with_isa"),
    );
}

#[test]
fn size_errors_not_panics() {
    let pool = ThreadPool::new(2);
    let w = vec![0u8; 3 * 34];
    // Not whole blocks.
    assert!(matches!(
        WeightView::new(GgmlType::Q8_0, 3, 33, &w),
        Err(KernelError::NotBlockAligned { .. })
    ));
    // Wrong byte count.
    assert!(matches!(
        WeightView::new(GgmlType::Q8_0, 4, 32, &w),
        Err(KernelError::SizeMismatch { .. })
    ));
    let view = WeightView::new(GgmlType::Q8_0, 3, 32, &w).unwrap();
    assert_eq!(view.row_bytes(), 34);
    let x = vec![0.0f32; 2 * 32];
    let mut out = vec![0.0f32; 2 * 3];
    assert!(matches!(
        matmul(&view, &x[..63], 2, &mut out, &pool),
        Err(KernelError::SizeMismatch { .. })
    ));
    assert!(matches!(
        matmul(&view, &x, 2, &mut out[..5], &pool),
        Err(KernelError::SizeMismatch { .. })
    ));
    // A hand-built view with bad sizes is rejected by matmul too.
    let bad = WeightView {
        ty: GgmlType::Q8_0,
        rows: 5,
        cols: 32,
        data: &w,
        layout: spindle_kernels::WeightLayout::Gguf,
    };
    let mut out5 = vec![0.0f32; 2 * 5];
    assert!(matmul(&bad, &x, 2, &mut out5, &pool).is_err());
    // n = 0 is fine.
    matmul(&view, &[], 0, &mut [], &pool).unwrap();
    // Zero weights give zeros, also with NaN-free zero activations.
    matmul(&view, &x, 2, &mut out, &pool).unwrap();
    assert!(out.iter().all(|&v| v == 0.0));
}

/// Each row of `x` (n x cols) run alone, on the scalar path with one thread:
/// the bits every multi-row run must reproduce.
fn rows_alone(w: &Weights, x: &[f32], n: usize, pool: &ThreadPool) -> Vec<u32> {
    let mut want = Vec::with_capacity(n * w.rows);
    for xi in x.chunks_exact(w.cols).take(n) {
        want.extend(bits(&w.run(Isa::Scalar, xi, 1, pool)));
    }
    want
}

/// The multi-row kernels' tails: every n that leaves a partial register tile
/// of activation rows, weight-row counts that leave partial tiles of weight
/// rows, and column counts with a partial group of blocks (half or more).
/// Each output must be the bits of its (weight row, activation row) alone.
#[test]
fn multi_row_tails_bit_identical() {
    if let Some(note) = spindle_kernels::simd::untested_isas_note() {
        eprintln!("{note}");
    }
    let mut rng = StdRng::seed_from_u64(17);
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let ns = [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 17, 33];
    let max_n = 33;
    for ty in GgmlType::ALL {
        let cols_cases: &[usize] = match ty.block_len() {
            1 => &[31, 100],
            // 3 blocks (a group of up to 4), 7 (a masked group), 20 (2 groups
            // and 4 blocks, as Gemma's 640).
            32 => &[96, 224, 640],
            _ => &[256, 768],
        };
        for &cols in cols_cases {
            for rows in [1, 3, 4, 6, 9] {
                let w = Weights::random(&mut rng, ty, rows, cols);
                let x = random_acts(&mut rng, max_n, cols);
                let want = rows_alone(&w, &x, max_n, &pools[0]);
                for isa in available_isas() {
                    for pool in &pools {
                        for &n in &ns {
                            let got = w.run(isa, &x[..n * cols], n, pool);
                            assert_same(
                                &bits(&got),
                                &want[..n * rows],
                                format_args!(
                                    "{ty} {rows}x{cols} n={n}: {isa}, {} threads",
                                    pool.n_threads()
                                ),
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Long rows (activation rows in several cache-sized chunks) and enough work
/// to split between threads (work items of activation-row chunks x blocks of
/// weight-row tiles, taken in any order), still bit-identical to each row
/// alone.
#[test]
fn multi_row_chunks_and_splits_bit_identical() {
    if let Some(note) = spindle_kernels::simd::untested_isas_note() {
        eprintln!("{note}");
    }
    let mut rng = StdRng::seed_from_u64(19);
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let rows = 37;
    for ty in GgmlType::ALL {
        let cols = if ty.block_len() == 1 { 2048 } else { 4096 };
        let w = Weights::random(&mut rng, ty, rows, cols);
        let n = 45;
        let x = random_acts(&mut rng, n, cols);
        let want = rows_alone(&w, &x, n, &pools[0]);
        for isa in available_isas() {
            for pool in &pools {
                for n in [9, 45] {
                    let got = w.run(isa, &x[..n * cols], n, pool);
                    assert_same(
                        &bits(&got),
                        &want[..n * rows],
                        format_args!(
                            "{ty} {rows}x{cols} n={n}: {isa}, {} threads",
                            pool.n_threads()
                        ),
                    );
                }
            }
        }
    }
}

/// `matmul_shared` (several matrices times one `x`: neighbours of one type,
/// width and layout share the activations' quantization and one pool run)
/// gives each matrix the bits one `matmul_with` call gives it, on every ISA
/// and pool, for the one-row, shared-item and own-rows (prompt) splits and
/// for layouts the VNNI kernels read.
#[test]
fn shared_calls_give_each_matrix_its_own_calls_bits() {
    use spindle_kernels::matmul::matmul_shared;
    use spindle_kernels::quant::vertical::to_vertical;
    use spindle_kernels::WeightLayout;
    let mut rng = StdRng::seed_from_u64(23);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let cols = 640;
    // A layer's q, k, v (v of another type: a group of two, then one) and a
    // float matrix between quantized ones (never shared).
    let specs = [
        (GgmlType::Q5_0, 1024),
        (GgmlType::Q5_0, 256),
        (GgmlType::Q8_0, 256),
        (GgmlType::F32, 48),
        (GgmlType::Q5_0, 40),
        (GgmlType::Q5_0, 8),
    ];
    let gguf: Vec<Vec<u8>> = specs
        .iter()
        .map(|&(ty, rows)| random_weights(&mut rng, ty, rows, cols))
        .collect();
    let vertical: Vec<Vec<u8>> = specs
        .iter()
        .zip(&gguf)
        .map(|(&(ty, _), g)| {
            let mut v = g.clone();
            if ty != GgmlType::F32 {
                to_vertical(ty, cols, &mut v).unwrap();
            }
            v
        })
        .collect();
    for layout_vertical in [false, true] {
        let views: Vec<WeightView<'_>> = specs
            .iter()
            .enumerate()
            .map(|(m, &(ty, rows))| {
                let quantized = ty != GgmlType::F32;
                if layout_vertical && quantized {
                    WeightView::new(ty, rows, cols, &vertical[m])
                        .unwrap()
                        .with_layout(WeightLayout::Vertical)
                } else {
                    WeightView::new(ty, rows, cols, &gguf[m]).unwrap()
                }
            })
            .collect();
        for n in [1, 2, 7, 16, 41, 300] {
            let x = random_acts(&mut rng, n, cols);
            for isa in available_isas() {
                for pool in &pools {
                    let rounding = ActRounding::default();
                    let mut want: Vec<Vec<f32>> =
                        views.iter().map(|w| vec![0.0; n * w.rows]).collect();
                    for (w, out) in views.iter().zip(&mut want) {
                        matmul_with(isa, rounding, w, &x, n, out, pool).unwrap();
                    }
                    let mut got: Vec<Vec<f32>> =
                        views.iter().map(|w| vec![f32::NAN; n * w.rows]).collect();
                    let mut parts: Vec<(WeightView<'_>, &mut [f32])> = views
                        .iter()
                        .zip(&mut got)
                        .map(|(w, o)| (*w, o.as_mut_slice()))
                        .collect();
                    matmul_shared(isa, rounding, &mut parts, &x, n, pool).unwrap();
                    for (m, (g, w)) in got.iter().zip(&want).enumerate() {
                        let bad = g
                            .iter()
                            .zip(w)
                            .position(|(a, b)| a.to_bits() != b.to_bits());
                        assert!(
                            bad.is_none(),
                            "matrix {m} ({:?}, vertical {layout_vertical}) n={n} {isa} {} threads: output {bad:?}",
                            specs[m],
                            pool.n_threads()
                        );
                    }
                }
            }
        }
    }
    // A matrix of another width is an error, as one call's would be.
    let w = WeightView::new(GgmlType::Q8_0, 4, 64, &gguf[2][..4 * 2 * 34]).unwrap();
    let x = random_acts(&mut rng, 1, cols);
    let (mut a, mut b) = (vec![0.0f32; 1024], vec![0.0f32; 4]);
    let mut parts = [
        (
            WeightView::new(GgmlType::Q5_0, 1024, cols, &gguf[0]).unwrap(),
            &mut a[..],
        ),
        (w, &mut b[..]),
    ];
    let err = matmul_shared(
        detected_isa(),
        ActRounding::default(),
        &mut parts,
        &x,
        1,
        &pools[1],
    );
    assert!(
        matches!(err, Err(KernelError::SizeMismatch { .. })),
        "{err:?}"
    );
}

#[test]
fn visited_rows_get_every_output_once_with_the_calls_bits() {
    use spindle_kernels::matmul::matmul_visit;
    use spindle_kernels::quant::panels::to_panels;
    use spindle_kernels::quant::vertical::to_vertical;
    use spindle_kernels::WeightLayout;
    use std::sync::Mutex;
    let mut rng = StdRng::seed_from_u64(29);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    // An output head in panels (many items per row), the other layouts, a
    // K-quant, and a float matrix (computed whole, then visited).
    let cases = [
        (GgmlType::Q8_0, 4096, 640, WeightLayout::Panels),
        (GgmlType::Q8_0, 200, 640, WeightLayout::Gguf),
        (GgmlType::Q5_0, 512, 640, WeightLayout::Vertical),
        (GgmlType::Q4_K, 96, 768, WeightLayout::Gguf),
        (GgmlType::F32, 48, 640, WeightLayout::Gguf),
    ];
    for (ty, rows, cols, layout) in cases {
        let mut data = random_weights(&mut rng, ty, rows, cols);
        match layout {
            WeightLayout::Panels => to_panels(ty, rows, cols, &mut data).unwrap(),
            WeightLayout::Vertical => to_vertical(ty, cols, &mut data).unwrap(),
            WeightLayout::Gguf => {}
        }
        let w = WeightView::new(ty, rows, cols, &data)
            .unwrap()
            .with_layout(layout);
        for n in [1, 2, 7, 16, 41] {
            let x = random_acts(&mut rng, n, cols);
            // Every row visited, every row but one, every other row.
            let masks: Vec<Vec<bool>> = vec![
                vec![false; n],
                (0..n).map(|i| i == n / 2).collect(),
                (0..n).map(|i| i % 2 == 1).collect(),
            ];
            for isa in available_isas() {
                for pool in &pools {
                    let rounding = ActRounding::default();
                    let mut want = vec![0.0f32; n * rows];
                    matmul_with(isa, rounding, &w, &x, n, &mut want, pool).unwrap();
                    for keep in &masks {
                        let kept = keep.iter().filter(|&&k| k).count();
                        let mut out = vec![f32::NAN; kept * rows];
                        // Each output's value and how often it was visited.
                        let seen = Mutex::new(vec![(0u32, 0u32); n * rows]);
                        let visit = |i: usize, r0: usize, piece: &mut [f32]| {
                            assert!(!keep[i], "kept row {i} visited");
                            let mut seen = seen.lock().unwrap();
                            for (r, v) in piece.iter().enumerate() {
                                let s = &mut seen[i * rows + r0 + r];
                                *s = (v.to_bits(), s.1 + 1);
                            }
                        };
                        matmul_visit(isa, rounding, &w, &x, n, keep, &mut out, pool, &visit)
                            .unwrap();
                        let seen = seen.into_inner().unwrap();
                        let what =
                            format!("{ty} {layout:?} n={n} {isa} {} threads", pool.n_threads());
                        let mut k = 0;
                        for i in 0..n {
                            let want = &want[i * rows..(i + 1) * rows];
                            let got: Vec<u32> = if keep[i] {
                                k += 1;
                                bits(&out[(k - 1) * rows..k * rows])
                            } else {
                                let s = &seen[i * rows..(i + 1) * rows];
                                let twice = s.iter().position(|s| s.1 != 1);
                                assert!(
                                    twice.is_none(),
                                    "{what}: row {i} output {twice:?} visited not once"
                                );
                                s.iter().map(|s| s.0).collect()
                            };
                            assert_same(&got, &bits(want), format_args!("{what}: row {i}"));
                        }
                    }
                }
            }
        }
    }
    // The mask and the kept rows' buffer must fit the call.
    let cols = 640;
    let data = random_weights(&mut rng, GgmlType::Q8_0, 32, cols);
    let w = WeightView::new(GgmlType::Q8_0, 32, cols, &data).unwrap();
    let x = random_acts(&mut rng, 2, cols);
    let isa = detected_isa();
    let r = ActRounding::default();
    let mut out = vec![0.0f32; 32];
    let err = matmul_visit(
        isa,
        r,
        &w,
        &x,
        2,
        &[true],
        &mut out,
        &pools[0],
        &|_, _, _| {},
    );
    assert!(
        matches!(err, Err(KernelError::SizeMismatch { .. })),
        "{err:?}"
    );
    let err = matmul_visit(
        isa,
        r,
        &w,
        &x,
        2,
        &[true, true],
        &mut out,
        &pools[0],
        &|_, _, _| {},
    );
    assert!(
        matches!(err, Err(KernelError::SizeMismatch { .. })),
        "{err:?}"
    );
}
