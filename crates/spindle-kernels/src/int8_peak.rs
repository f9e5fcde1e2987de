//! The machine's own int8 multiply-accumulate ceiling, per instruction set:
//! a loop that only multiplies and accumulates in registers (no loads), so
//! what it reaches is what the cores can do. `spindle bench` prints it
//! beside the fraction of it a prompt pass reaches, as it prints memory
//! bandwidth beside the decode pass.
//!
//! The SIMD loops are inline assembly so that the instruction sequence is
//! exactly the one named (the compiler cannot hoist or fold a multiply of
//! constant registers out of the loop), and so that a path this toolchain
//! has no intrinsics for (AVX-512 VNNI, AVX-VNNI) is measured wherever the
//! CPU has it.

use std::time::Instant;

/// One instruction set's peak.
#[derive(Debug, Clone)]
pub struct MacPeak {
    /// The path's name, as `SPINDLE_ISA` spells it where it is one.
    pub path: &'static str,
    /// The instructions the loop runs.
    pub instructions: &'static str,
    /// Multiply-accumulates per second on one thread.
    pub one_thread: f64,
    /// Multiply-accumulates per second on `threads` threads at once.
    pub all_threads: f64,
    pub threads: usize,
}

/// A loop: runs `iterations` and returns the multiply-accumulates done.
type Loop = fn(u64) -> u64;

/// Every loop this CPU can run, with its name and instructions.
fn loops() -> Vec<(&'static str, &'static str, Loop)> {
    let mut v: Vec<(&'static str, &'static str, Loop)> =
        vec![("scalar", "i32 multiply-add (as compiled)", scalar_loop)];
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::Isa::Avx2.is_available() {
            v.push(("avx2", "vpmaddubsw + vpmaddwd + vpaddd ymm", x86::avx2_loop));
        }
        if std::is_x86_feature_detected!("avxvnni") {
            v.push(("avxvnni", "vpdpbusd ymm (VEX)", x86::avxvnni_loop));
        }
        if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vnni") {
            v.push(("avx512vnni", "vpdpbusd zmm", x86::avx512vnni_loop));
        }
        if crate::amx::available() {
            v.push(("amx", "tdpbssd 16x16x64", crate::amx::peak_loop));
        }
    }
    v
}

/// The peak of every path this CPU has, on one thread and on `threads`.
/// Each figure is the best of three runs of about `seconds`.
pub fn int8_mac_peaks(threads: usize, seconds: f64) -> Vec<MacPeak> {
    let threads = threads.max(1);
    loops()
        .into_iter()
        .map(|(path, instructions, run)| {
            // Size the run from a short one, so every path takes about as
            // long whatever its speed.
            let probe = 1 << 16;
            let t = Instant::now();
            run(probe);
            let per_iteration = t.elapsed().as_secs_f64().max(1e-9) / probe as f64;
            let iterations = ((seconds / 3.0 / per_iteration) as u64).max(1024);
            let rate = |n: usize| {
                (0..3)
                    .map(|_| {
                        let t = Instant::now();
                        let macs: u64 = std::thread::scope(|s| {
                            let handles: Vec<_> =
                                (0..n).map(|_| s.spawn(move || run(iterations))).collect();
                            handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
                        });
                        macs as f64 / t.elapsed().as_secs_f64()
                    })
                    .fold(0.0, f64::max)
            };
            MacPeak {
                path,
                instructions,
                one_thread: rate(1),
                all_threads: rate(threads),
                threads,
            }
        })
        .collect()
}

/// Eight independent chains of i32 multiply-adds of i8 by u8 values, as
/// the scalar path computes block dots.
fn scalar_loop(iterations: u64) -> u64 {
    let mut acc = [0i32; 8];
    let w: [i8; 8] = std::hint::black_box([1, -2, 3, -4, 5, -6, 7, -8]);
    let mut x: u8 = 3;
    for _ in 0..iterations {
        x = std::hint::black_box(x);
        for (a, &w) in acc.iter_mut().zip(&w) {
            *a = a.wrapping_add(x as i32 * w as i32);
        }
    }
    std::hint::black_box(acc);
    iterations * 8
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;

    /// Six chains of `vpmaddubsw` (32 u8 x i8 products summed in pairs to
    /// i16), `vpmaddwd` by ones (to i32) and `vpaddd`: 192 per iteration.
    pub(super) fn avx2_loop(iterations: u64) -> u64 {
        if iterations == 0 {
            return 0;
        }
        // SAFETY: the caller listed this loop only where the CPU has AVX2.
        // The assembly touches only the registers it names as clobbered and
        // no memory.
        unsafe {
            asm!(
                "vpcmpeqb ymm0, ymm0, ymm0",
                "vpabsb ymm1, ymm0",
                "vpsrlw ymm2, ymm0, 15",
                "vpxor ymm3, ymm3, ymm3",
                "vpxor ymm4, ymm4, ymm4",
                "vpxor ymm5, ymm5, ymm5",
                "vpxor ymm6, ymm6, ymm6",
                "vpxor ymm7, ymm7, ymm7",
                "vpxor ymm8, ymm8, ymm8",
                "2:",
                "vpmaddubsw ymm9, ymm0, ymm1",
                "vpmaddubsw ymm10, ymm0, ymm1",
                "vpmaddubsw ymm11, ymm0, ymm1",
                "vpmaddubsw ymm12, ymm0, ymm1",
                "vpmaddubsw ymm13, ymm0, ymm1",
                "vpmaddubsw ymm14, ymm0, ymm1",
                "vpmaddwd ymm9, ymm9, ymm2",
                "vpmaddwd ymm10, ymm10, ymm2",
                "vpmaddwd ymm11, ymm11, ymm2",
                "vpmaddwd ymm12, ymm12, ymm2",
                "vpmaddwd ymm13, ymm13, ymm2",
                "vpmaddwd ymm14, ymm14, ymm2",
                "vpaddd ymm3, ymm3, ymm9",
                "vpaddd ymm4, ymm4, ymm10",
                "vpaddd ymm5, ymm5, ymm11",
                "vpaddd ymm6, ymm6, ymm12",
                "vpaddd ymm7, ymm7, ymm13",
                "vpaddd ymm8, ymm8, ymm14",
                "dec {n}",
                "jnz 2b",
                "vzeroupper",
                n = inout(reg) iterations => _,
                out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
                out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
                out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
                out("ymm12") _, out("ymm13") _, out("ymm14") _,
                options(nostack, nomem),
            );
        }
        iterations * 6 * 32
    }

    /// A loop of ten independent chains of `vpdpbusd` on registers
    /// `$r` (`ymm` or `zmm`; `$prefix` selects the VEX encoding), after
    /// `$setup` fills registers 0 and 1 and clears the ten accumulators:
    /// `$lanes` u8 x i8 products accumulated into i32 per instruction.
    macro_rules! vpdpbusd_loop {
        ($(#[$doc:meta])* $name:ident, $r:literal, $prefix:literal, $setup:literal, $lanes:literal) => {
            $(#[$doc])*
            pub(super) fn $name(iterations: u64) -> u64 {
                if iterations == 0 {
                    return 0;
                }
                // SAFETY: the caller listed this loop only where the CPU has
                // the instructions. Only the named registers are touched
                // (clobbered as zmm, which covers ymm), and no memory.
                unsafe {
                    asm!(
                        $setup,
                        "2:",
                        concat!($prefix, "vpdpbusd ", $r, "2, ", $r, "0, ", $r, "1"),
                        concat!($prefix, "vpdpbusd ", $r, "3, ", $r, "0, ", $r, "1"),
                        concat!($prefix, "vpdpbusd ", $r, "4, ", $r, "0, ", $r, "1"),
                        concat!($prefix, "vpdpbusd ", $r, "5, ", $r, "0, ", $r, "1"),
                        concat!($prefix, "vpdpbusd ", $r, "6, ", $r, "0, ", $r, "1"),
                        concat!($prefix, "vpdpbusd ", $r, "7, ", $r, "0, ", $r, "1"),
                        concat!($prefix, "vpdpbusd ", $r, "8, ", $r, "0, ", $r, "1"),
                        concat!($prefix, "vpdpbusd ", $r, "9, ", $r, "0, ", $r, "1"),
                        concat!($prefix, "vpdpbusd ", $r, "10, ", $r, "0, ", $r, "1"),
                        concat!($prefix, "vpdpbusd ", $r, "11, ", $r, "0, ", $r, "1"),
                        "dec {n}",
                        "jnz 2b",
                        "vzeroupper",
                        n = inout(reg) iterations => _,
                        out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                        out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                        out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                        options(nostack, nomem),
                    );
                }
                iterations * 10 * $lanes
            }
        };
    }

    vpdpbusd_loop!(
        /// VEX `vpdpbusd ymm` (AVX-VNNI): 320 per iteration.
        avxvnni_loop,
        "ymm",
        "{{vex}} ",
        "vpcmpeqb ymm0, ymm0, ymm0
         vpabsb ymm1, ymm0
         vpxor ymm2, ymm2, ymm2
         vpxor ymm3, ymm3, ymm3
         vpxor ymm4, ymm4, ymm4
         vpxor ymm5, ymm5, ymm5
         vpxor ymm6, ymm6, ymm6
         vpxor ymm7, ymm7, ymm7
         vpxor ymm8, ymm8, ymm8
         vpxor ymm9, ymm9, ymm9
         vpxor ymm10, ymm10, ymm10
         vpxor ymm11, ymm11, ymm11",
        32
    );

    vpdpbusd_loop!(
        /// `vpdpbusd zmm` (AVX-512 VNNI): 640 per iteration.
        avx512vnni_loop,
        "zmm",
        "",
        "vpternlogd zmm0, zmm0, zmm0, 0xff
         vpternlogd zmm1, zmm1, zmm1, 0xff
         vpxord zmm2, zmm2, zmm2
         vpxord zmm3, zmm3, zmm3
         vpxord zmm4, zmm4, zmm4
         vpxord zmm5, zmm5, zmm5
         vpxord zmm6, zmm6, zmm6
         vpxord zmm7, zmm7, zmm7
         vpxord zmm8, zmm8, zmm8
         vpxord zmm9, zmm9, zmm9
         vpxord zmm10, zmm10, zmm10
         vpxord zmm11, zmm11, zmm11",
        64
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path this CPU has runs and reports a positive rate; the SIMD
    /// paths beat the scalar one (a loop that was folded away would report
    /// an absurd rate, one that did not run a zero).
    #[test]
    fn every_path_this_cpu_has_runs() {
        let peaks = int8_mac_peaks(1, 0.03);
        assert_eq!(peaks[0].path, "scalar");
        for p in &peaks {
            assert!(p.one_thread > 1e6 && p.one_thread < 1e13, "{p:?}");
        }
        let names: Vec<_> = peaks.iter().map(|p| p.path).collect();
        let missing: Vec<_> = ["avx2", "avxvnni", "avx512vnni", "amx"]
            .into_iter()
            .filter(|n| !names.contains(n))
            .collect();
        if !missing.is_empty() {
            eprintln!("int8 peak loops this CPU cannot run: {missing:?}");
        }
    }
}
