//! The AMX tile unit (Intel Sapphire Rapids and later): whether this CPU and
//! operating system let the process use it, the tile configuration, and the
//! instructions the kernels use, as inline assembly (Rust has no stable AMX
//! intrinsics; `asm!` assembles them on stable).
//!
//! A tile register holds up to 16 rows of up to 64 bytes. `tdpbssd c, a, b`
//! adds to each int32 `c[m][n]` the dot of row `m` of `a` (signed bytes)
//! with column `n` of `b`, whose rows hold 4 consecutive bytes of the `k`
//! dimension per column (`b[k / 4][n][k % 4]`). The sums are exact.
//!
//! Linux hands out the tile state only on request
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, once per process,
//! for all its threads); without it the first tile instruction kills the
//! process. [`available`] asks once, and says no where the answer is no.
//!
//! The configuration is 64 bytes read by `ldtilecfg` through a pointer the
//! compiler sees the whole of (gcc 12's intrinsic declared 8 bytes, so the
//! stores that filled it were dropped: `shared/ANCHORS.md`); a kernel loads
//! it before its first tile instruction and releases the state
//! ([`release`]) when done, so threads that never use tiles carry none.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The default of [`min_rows`]: below it, decoding a weight tile for the
/// tile unit costs more than its products save (docs/PERF.md §42).
pub const DEFAULT_MIN_ROWS: usize = 64;

static MIN_ROWS: AtomicUsize = AtomicUsize::new(0);

/// From this many activation rows on, a matmul on the AMX path multiplies
/// with the tile unit; fewer take the AVX-512 VNNI kernels (the same bits).
/// [`DEFAULT_MIN_ROWS`], or `SPINDLE_AMX_MIN_ROWS`, or what
/// [`set_min_rows`] set.
pub fn min_rows() -> usize {
    match MIN_ROWS.load(Ordering::Relaxed) {
        0 => {
            let v = std::env::var("SPINDLE_AMX_MIN_ROWS")
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(DEFAULT_MIN_ROWS)
                .max(2);
            MIN_ROWS.store(v, Ordering::Relaxed);
            v
        }
        v => v,
    }
}

/// Sets [`min_rows`] for this process (tests and benchmarks: every path
/// gives the same bits, so this changes only speed).
pub fn set_min_rows(rows: usize) {
    MIN_ROWS.store(rows.max(2), Ordering::Relaxed);
}

/// Whether the CPU has AMX-TILE and AMX-INT8 with the palette the kernels
/// use (8 tiles of 16 rows x 64 bytes), and the operating system gave this
/// process the tile state. Decided once per process.
pub fn available() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| cpu_has_amx_int8() && request_permission())
}

#[cfg(target_arch = "x86_64")]
fn cpu_has_amx_int8() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // `cpuid` exists on every x86-64 CPU.
    let max = __cpuid(0).eax;
    if max < 0x1D {
        return false;
    }
    let leaf7 = __cpuid_count(7, 0);
    let (tile, int8) = (leaf7.edx & (1 << 24) != 0, leaf7.edx & (1 << 25) != 0);
    if !(tile && int8) {
        return false;
    }
    // Leaf 0x1D: palette 1 must have 8 tiles of 16 rows of 64 bytes.
    let palette = __cpuid_count(0x1D, 1);
    let bytes_per_row = palette.ebx & 0xFFFF;
    let names = palette.ebx >> 16;
    let max_rows = palette.ecx & 0xFFFF;
    bytes_per_row >= 64 && names >= 8 && max_rows >= 16
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_has_amx_int8() -> bool {
    false
}

/// Asks Linux for the tile data state (`ARCH_REQ_XCOMP_PERM` for
/// `XFEATURE_XTILEDATA`); true when granted.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_permission() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: the `arch_prctl` system call with these arguments only
    // changes which extended states the process may use; it reads and
    // writes no memory of ours. `syscall` clobbers rcx and r11.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn request_permission() -> bool {
    false
}

/// A tile configuration (palette 1): the rows and bytes per row of each of
/// the 8 tile registers; unused ones stay empty.
#[repr(C, align(64))]
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct TileConfig {
    bytes: [u8; 64],
}

impl TileConfig {
    /// Every tile empty.
    pub(crate) const fn new() -> Self {
        let mut bytes = [0u8; 64];
        bytes[0] = 1; // palette 1
        TileConfig { bytes }
    }

    /// Tile `t` as `rows` rows of `colsb` bytes (at most 16 and 64).
    pub(crate) fn set(&mut self, t: usize, rows: usize, colsb: usize) {
        assert!(
            t < 8 && rows <= 16 && colsb <= 64,
            "tile shape out of range"
        );
        self.bytes[16 + 2 * t..18 + 2 * t].copy_from_slice(&(colsb as u16).to_le_bytes());
        self.bytes[48 + t] = rows as u8;
    }

    /// Loads the configuration into the tile unit (zeroing every tile).
    ///
    /// # Safety
    /// [`available`] returned true.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    pub(crate) unsafe fn load(&self) {
        // SAFETY: the caller's promise; `ldtilecfg` reads the 64 bytes
        // behind the pointer, which the asm block may read (no `nomem`).
        unsafe {
            std::arch::asm!("ldtilecfg [{}]", in(reg) self.bytes.as_ptr(), options(nostack, readonly))
        }
    }
}

/// Releases the tile state of this thread (back to its initial, empty
/// state), so that context switches no longer save it.
///
/// # Safety
/// [`available`] returned true.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) unsafe fn release() {
    // SAFETY: the caller's promise; `tilerelease` touches no memory.
    unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) }
}

/// Loads tile `T` from `rows` rows of its configured width at `base`,
/// `stride` bytes apart.
///
/// # Safety
/// A configuration is loaded in which tile `T` is configured; every byte
/// of the rows it reads is readable.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn load<const T: u8>(base: *const u8, stride: usize) {
    // SAFETY: the caller's promise.
    unsafe {
        std::arch::asm!(
            "tileloadd tmm{t}, [{base} + {stride}*1]",
            t = const T,
            base = in(reg) base,
            stride = in(reg) stride,
            options(nostack, readonly),
        )
    }
}

/// Stores tile `T` as its rows at `base`, `stride` bytes apart.
///
/// # Safety
/// A configuration is loaded in which tile `T` is configured; every byte
/// of the rows it writes is writable and not otherwise borrowed.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn store<const T: u8>(base: *mut u8, stride: usize) {
    // SAFETY: the caller's promise.
    unsafe {
        std::arch::asm!(
            "tilestored [{base} + {stride}*1], tmm{t}",
            t = const T,
            base = in(reg) base,
            stride = in(reg) stride,
            options(nostack),
        )
    }
}

/// Zeroes tile `T`.
///
/// # Safety
/// A configuration is loaded in which tile `T` is configured.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn zero<const T: u8>() {
    // SAFETY: the caller's promise.
    unsafe { std::arch::asm!("tilezero tmm{t}", t = const T, options(nostack, nomem)) }
}

/// `C += A · B` on signed bytes into int32 (`tdpbssd`), tiles `C`, `A`, `B`.
///
/// # Safety
/// A configuration is loaded in which the three tiles have compatible
/// shapes (A: M x 4K bytes, B: K x 4N, C: M x 4N).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn dot_ss<const C: u8, const A: u8, const B: u8>() {
    // SAFETY: the caller's promise.
    unsafe {
        std::arch::asm!(
            "tdpbssd tmm{c}, tmm{a}, tmm{b}",
            c = const C,
            a = const A,
            b = const B,
            options(nostack, nomem),
        )
    }
}

/// The tile unit's int8 ceiling for [`crate::int8_peak`]: `iterations` of
/// six independent `tdpbssd` on full tiles (16 x 16 x 64, 16,384
/// multiply-accumulates each), no loads; returns the multiply-accumulates
/// done. Only called where [`available`] is true.
#[cfg(target_arch = "x86_64")]
pub(crate) fn peak_loop(iterations: u64) -> u64 {
    if !available() {
        return 0;
    }
    let mut cfg = TileConfig::new();
    for t in 0..8 {
        cfg.set(t, 16, 64);
    }
    // SAFETY: AMX is available (checked above) and configured; the loop
    // touches only tile registers.
    unsafe {
        cfg.load();
        for _ in 0..iterations {
            dot_ss::<2, 0, 1>();
            dot_ss::<3, 0, 1>();
            dot_ss::<4, 0, 1>();
            dot_ss::<5, 0, 1>();
            dot_ss::<6, 0, 1>();
            dot_ss::<7, 0, 1>();
        }
        release();
    }
    iterations * 6 * 16 * 16 * 64
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// One `tdpbssd` of a 16 x 64 by 16 x 64 tile against the plain sums.
    #[test]
    fn a_tile_product_equals_the_scalar_sums() {
        if !available() {
            eprintln!("note: no AMX on this CPU; the tile unit was not tested here");
            return;
        }
        let mut a = [0i8; 16 * 64];
        let mut b = [0i8; 16 * 64];
        let mut x = 0x1234_5678u32;
        for v in a.iter_mut().chain(b.iter_mut()) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *v = x as i8;
        }
        let mut c = [0i32; 16 * 16];
        let mut cfg = TileConfig::new();
        cfg.set(0, 16, 64);
        cfg.set(1, 16, 64);
        cfg.set(2, 16, 64);
        // SAFETY: AMX is available; the tiles are configured and the
        // buffers hold 16 rows of 64 bytes each.
        unsafe {
            cfg.load();
            load::<0>(a.as_ptr().cast(), 64);
            load::<1>(b.as_ptr().cast(), 64);
            zero::<2>();
            dot_ss::<2, 0, 1>();
            store::<2>(c.as_mut_ptr().cast(), 64);
            release();
        }
        for m in 0..16 {
            for n in 0..16 {
                let want: i32 = (0..64)
                    .map(|k| a[64 * m + k] as i32 * b[64 * (k / 4) + 4 * n + k % 4] as i32)
                    .sum();
                assert_eq!(c[16 * m + n], want, "c[{m}][{n}]");
            }
        }
    }
}
