//! Activation quantization: identical on every ISA, within half a step of the
//! input, never -128.

mod common;

use common::random_acts;
use rand::rngs::StdRng;
use rand::SeedableRng;
use spindle_kernels::quant::q8_act::{ActFormat, QuantizedActs};
use spindle_kernels::simd::available_isas;

fn snapshot(q: &QuantizedActs) -> (Vec<i8>, Vec<u32>, Vec<i16>) {
    let mut qs = Vec::new();
    let mut d = Vec::new();
    let mut bs = Vec::new();
    for i in 0..q.n() {
        let r = q.row(i).unwrap();
        qs.extend_from_slice(r.qs);
        d.extend(r.d.iter().map(|v| v.to_bits()));
        bs.extend_from_slice(r.bsums);
    }
    (qs, d, bs)
}

#[test]
fn every_isa_gives_the_same_bits() {
    if let Some(note) = spindle_kernels::simd::untested_isas_note() {
        eprintln!("{note}");
    }
    let mut rng = StdRng::seed_from_u64(5);
    let format = ActFormat::Block32;
    let cols = 4 * format.block_len();
    let n = 6;
    let mut x = random_acts(&mut rng, n, cols);
    // Special values in row 4: NaN, infinities, signed zeros, ties.
    let specials = [
        f32::NAN,
        -0.0,
        0.0,
        f32::INFINITY,
        1e-40,
        0.5,
        -0.5,
        1.5,
        2.5,
        -2.5,
        f32::MAX,
        f32::MIN_POSITIVE,
    ];
    for (k, v) in specials.iter().enumerate() {
        x[4 * cols + (37 * k) % cols] = *v;
    }
    // Row 5: a block with exact ties at the chosen scale.
    for k in 0..32 {
        x[5 * cols + k] = (k as f32 - 16.0) * 0.5;
    }
    x[5 * cols] = 127.0;

    let mut first = None;
    for isa in available_isas() {
        let mut q = QuantizedActs::new();
        q.quantize_with_isa(isa, format, &x, n, cols).unwrap();
        let snap = snapshot(&q);
        assert!(snap.0.iter().all(|&v| v != -128));
        match &first {
            None => first = Some(snap),
            Some(f) => assert!(f == &snap, "{format:?}: {isa} differs"),
        }
    }
}

#[test]
fn bsums_and_round_trip() {
    let mut rng = StdRng::seed_from_u64(6);
    let (n, cols) = (3, 512);
    let x = random_acts(&mut rng, n, cols);
    let format = ActFormat::Block32;
    let mut q = QuantizedActs::new();
    q.quantize(format, &x, n, cols).unwrap();
    let bl = format.block_len();
    let mut deq = vec![0.0f32; cols];
    for i in 0..n {
        let r = q.row(i).unwrap();
        assert_eq!(r.bsums.len(), cols / bl);
        for (s, run) in r.bsums.iter().zip(r.qs.chunks_exact(bl)) {
            assert_eq!(*s as i32, run.iter().map(|&v| v as i32).sum::<i32>());
        }
        q.dequantize_row(i, &mut deq).unwrap();
        for (b, (xb, db)) in x[i * cols..(i + 1) * cols]
            .chunks_exact(bl)
            .zip(deq.chunks_exact(bl))
            .enumerate()
        {
            let step = r.d[b];
            for (a, c) in xb.iter().zip(db) {
                assert!((a - c).abs() <= 0.501 * step + 1e-30);
            }
        }
    }
    let mut q = QuantizedActs::new();
    assert!(q.row(n).is_none());
    assert!(q.quantize(ActFormat::Block32, &x[..10], 1, 10).is_err());
    assert!(q.quantize(ActFormat::Block32, &x[..64], 1, 32).is_err());
}

/// ggml's Q8_K rounding: one scale per 256 values, `max|x| / 127` of the
/// group, repeated for its 8 blocks; the same bits on every ISA; values
/// within half a step; rows not a multiple of 256 refused.
#[test]
fn super256_shares_one_scale_per_256_values() {
    let mut rng = StdRng::seed_from_u64(8);
    let (n, cols) = (4, 768);
    let mut x = random_acts(&mut rng, n, cols);
    x[300] = 40.0; // an outlier: its whole group gets the coarse scale
    let format = ActFormat::Super256;
    let mut first = None;
    for isa in available_isas() {
        let mut q = QuantizedActs::new();
        q.quantize_with_isa(isa, format, &x, n, cols).unwrap();
        let snap = snapshot(&q);
        match &first {
            None => first = Some(snap),
            Some(f) => assert!(f == &snap, "Super256: {isa} differs"),
        }
    }
    let mut q = QuantizedActs::new();
    q.quantize(format, &x, n, cols).unwrap();
    let mut deq = vec![0.0f32; cols];
    for i in 0..n {
        let r = q.row(i).unwrap();
        assert_eq!(r.d.len(), cols / 32);
        assert_eq!(r.bsums.len(), cols / 32);
        for (g, xg) in x[i * cols..(i + 1) * cols].chunks_exact(256).enumerate() {
            let amax = xg.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for b in 0..8 {
                assert_eq!(r.d[8 * g + b], amax / 127.0, "row {i} group {g} block {b}");
            }
        }
        for (s, run) in r.bsums.iter().zip(r.qs.chunks_exact(32)) {
            assert_eq!(*s as i32, run.iter().map(|&v| v as i32).sum::<i32>());
        }
        q.dequantize_row(i, &mut deq).unwrap();
        for (k, (a, c)) in x[i * cols..(i + 1) * cols].iter().zip(&deq).enumerate() {
            assert!((a - c).abs() <= 0.501 * r.d[k / 32] + 1e-30);
        }
    }
    assert_eq!(q.row(0).unwrap().d[8], 40.0 / 127.0);
    assert!(q.quantize(format, &x[..512], 2, 256).is_ok());
    assert!(q.quantize(format, &x[..640], 1, 640).is_err());
}

/// A large batch split over a pool's threads gives the bits of one thread
/// (and of the scalar path), for every format, with an odd row count so
/// the split is uneven.
#[test]
fn rows_split_over_threads_give_the_same_bits() {
    let mut rng = StdRng::seed_from_u64(9);
    let pool = spindle_kernels::ThreadPool::new(2);
    let (n, cols) = (301, 512);
    let x = random_acts(&mut rng, n, cols);
    for format in [
        ActFormat::Block32,
        ActFormat::Super256,
        ActFormat::Block32F16,
    ] {
        let mut reference = QuantizedActs::new();
        reference
            .quantize_with_isa(spindle_kernels::simd::Isa::Scalar, format, &x, n, cols)
            .unwrap();
        for isa in available_isas() {
            let mut q = QuantizedActs::new();
            q.quantize_on(isa, format, &x, n, cols, Some(&pool))
                .unwrap();
            assert!(snapshot(&q) == snapshot(&reference), "{format:?} {isa}");
        }
    }
}
