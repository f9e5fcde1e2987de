//! Instruction-set selection and the small SIMD helpers shared by the kernels.
//!
//! The ISA is detected once at run time. `SPINDLE_ISA=scalar|avx2|avx512vnni|amx|auto` overrides
//! the choice; asking for an ISA this CPU lacks (or an unknown name) prints one
//! warning on stderr and falls back to the best ISA available.
//!
//! # Reduction order
//!
//! Every kernel path (scalar or SIMD) reduces an output element in the same
//! fixed order, so results are bit-identical across ISAs, thread counts and
//! batch sizes:
//!
//! * float dots put element `k` in lane `k % 32`, accumulate each lane with a
//!   fused multiply-add, then reduce the lanes with [`tree32`];
//! * quantized dots compute each block's dot product exactly in integers, put
//!   block `b`'s scaled term in lane `b % 8` (fused multiply-add), and reduce
//!   the lanes with [`tree8`].

use std::sync::OnceLock;

/// An instruction set a kernel path is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Isa {
    /// Portable Rust; runs everywhere.
    Scalar,
    /// x86-64 with AVX2, FMA and F16C.
    Avx2,
    /// AVX2 plus AVX-512 F/BW/VL and VNNI: the multi-row quantized kernels
    /// multiply with `vpdpbusd zmm`; everything else runs the AVX2 code.
    Avx512Vnni,
    /// `Avx512Vnni` plus the AMX tile unit (`amx_tile`, `amx_int8`, and the
    /// operating system's permission): the multi-row quantized kernels of
    /// vertical matrices multiply with `tdpbssd`; everything else runs the
    /// `Avx512Vnni` code.
    Amx,
}

impl Isa {
    /// Lower-case name, as accepted by `SPINDLE_ISA`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512vnni",
            Isa::Amx => "amx",
        }
    }

    /// Whether the path runs the AVX2 kernels (where it has no wider ones of
    /// its own).
    pub fn uses_avx2(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::Avx512Vnni | Isa::Amx)
    }

    /// Whether the path runs the AVX-512 VNNI kernels (where it has no
    /// kernels of its own).
    pub fn uses_avx512(self) -> bool {
        matches!(self, Isa::Avx512Vnni | Isa::Amx)
    }

    /// Whether this CPU can run the path.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => has_avx2(),
            Isa::Avx512Vnni => has_avx2() && has_avx512vnni(),
            Isa::Amx => has_avx2() && has_avx512vnni() && has_bitalg() && crate::amx::available(),
        }
    }

    fn parse(s: &str) -> Option<Isa> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Some(Isa::Scalar),
            "avx2" => Some(Isa::Avx2),
            "avx512vnni" => Some(Isa::Avx512Vnni),
            "amx" => Some(Isa::Amx),
            _ => None,
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx2() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
fn has_avx512vnni() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx512vnni() -> bool {
    false
}

/// AVX-512 BITALG (`vpshufbitqmb`, which the AMX path's weight decoder
/// uses; every CPU with AMX has it).
#[cfg(target_arch = "x86_64")]
fn has_bitalg() -> bool {
    is_x86_feature_detected!("avx512bitalg")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_bitalg() -> bool {
    false
}

/// Every ISA path Spindle has, whether or not this CPU can run it.
pub const ALL_ISAS: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni, Isa::Amx];

/// Every ISA path this CPU can run, best last.
pub fn available_isas() -> Vec<Isa> {
    ALL_ISAS
        .into_iter()
        .filter(|isa| isa.is_available())
        .collect()
}

/// A line naming the ISA paths this CPU cannot run (so tests that iterate
/// [`available_isas`] did not check them here), or `None` when it runs all.
pub fn untested_isas_note() -> Option<String> {
    let missing: Vec<&str> = ALL_ISAS
        .into_iter()
        .filter(|isa| !isa.is_available())
        .map(Isa::name)
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "note: this CPU cannot run the {} path(s); they were not tested here",
            missing.join(", ")
        )
    })
}

fn best_isa() -> Isa {
    available_isas().pop().unwrap_or(Isa::Scalar)
}

/// The ISA the kernels use by default: the best this CPU supports, unless
/// `SPINDLE_ISA` names another. An unknown or unavailable name falls back to
/// the best ISA, with one warning on stderr. Decided once per process.
pub fn detected_isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let best = best_isa();
        let Ok(value) = std::env::var("SPINDLE_ISA") else {
            return best;
        };
        let value = value.trim();
        if value.is_empty() || value.eq_ignore_ascii_case("auto") {
            return best;
        }
        match Isa::parse(value) {
            Some(isa) if isa.is_available() => isa,
            Some(isa) => {
                eprintln!("warning: SPINDLE_ISA={value}: this CPU cannot run {isa}; using {best}");
                best
            }
            None => {
                eprintln!(
                    "warning: SPINDLE_ISA={value} is not one of scalar, avx2, avx512vnni, amx, auto; using {best}"
                );
                best
            }
        }
    })
}

/// Defines `fn NAME(isa: Isa, args...) [-> R]` that runs `BODY(args...)`
/// compiled three times: as is, and inside functions that enable AVX2 or
/// AVX-512, where the compiler vectorises it. `BODY` must be
/// `#[inline(always)]` and use plain float operations only (no `mul_add`;
/// Rust never fuses on its own), so every path gives the same bits.
macro_rules! compiled_per_isa {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? = $body:path;) => {
        $(#[$meta])*
        $vis fn $name(isa: $crate::simd::Isa, $($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                /// # Safety
                /// AVX2 and AVX-512F/BW/VL available.
                #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
                unsafe fn with_avx512($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                /// # Safety
                /// AVX2 available.
                #[target_feature(enable = "avx2")]
                unsafe fn with_avx2($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                if isa.uses_avx512() {
                    // SAFETY: Avx512Vnni and Amx are chosen only on CPUs
                    // with AVX2 and AVX-512F/BW/VL.
                    return unsafe { with_avx512($($arg),*) };
                }
                if isa.uses_avx2() {
                    // SAFETY: an AVX2 path is chosen only on CPUs with AVX2.
                    return unsafe { with_avx2($($arg),*) };
                }
            }
            let _ = isa;
            $body($($arg),*)
        }
    };
}
pub(crate) use compiled_per_isa;

/// Reduces 8 lane accumulators in the fixed order every path uses:
/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
#[inline]
pub(crate) fn tree8(l: &[f32; 8]) -> f32 {
    let h = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    let q = [h[0] + h[2], h[1] + h[3]];
    q[0] + q[1]
}

/// Reduces 32 lane accumulators: lanes `j, j+8, j+16, j+24` are summed as
/// `(l[j] + l[j+8]) + (l[j+16] + l[j+24])`, then [`tree8`].
#[inline]
pub(crate) fn tree32(l: &[f32; 32]) -> f32 {
    let mut v = [0.0f32; 8];
    for (j, v) in v.iter_mut().enumerate() {
        *v = (l[j] + l[j + 8]) + (l[j + 16] + l[j + 24]);
    }
    tree8(&v)
}

/// AVX2 helpers. Every function here requires AVX2, FMA and F16C; callers
/// check [`Isa::Avx2`] availability first.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    // Loads go through `lddqu` (a plain unaligned load on every AVX2 CPU):
    // unlike `loadu`, whose std implementation is a `copy_nonoverlapping`,
    // it compiles to one instruction even with debug assertions on.

    /// Loads 32 bytes from `p`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `p..p + 32` readable (any alignment).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn load_256(p: *const u8) -> __m256i {
        unsafe { _mm256_lddqu_si256(p.cast()) }
    }

    /// Loads 16 bytes from `p`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `p..p + 16` readable (any alignment).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn load_128(p: *const u8) -> __m128i {
        unsafe { _mm_lddqu_si128(p.cast()) }
    }

    /// Loads 8 floats from `p`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; the 8 floats `p..p + 8` readable
    /// (any alignment).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn load_ps(p: *const f32) -> __m256 {
        unsafe { _mm256_castsi256_ps(_mm256_lddqu_si256(p.cast())) }
    }

    /// Reads a little-endian u16 from `p` (any alignment).
    ///
    /// # Safety
    /// `p..p + 2` readable (any alignment).
    #[inline(always)]
    pub(crate) unsafe fn read_u16(p: *const u8) -> u16 {
        unsafe { u16::from_le_bytes([*p, *p.add(1)]) }
    }

    /// The 8 lanes of a float vector.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn lanes_ps(v: __m256) -> [f32; 8] {
        unsafe {
            let mut out = [0.0f32; 8];
            _mm256_storeu_ps(out.as_mut_ptr(), v);
            out
        }
    }

    /// [`super::tree8`] of the 8 lanes, in registers: the same additions in
    /// the same order (float addition is commutative bit for bit).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn tree8_ps(v: __m256) -> f32 {
        // [l0+l4, l1+l5, l2+l6, l3+l7]
        let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        // [h0+h2, h1+h3, ..]
        let q = _mm_add_ps(h, _mm_movehl_ps(h, h));
        // q0 + q1
        _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)))
    }

    /// Dot products of 32 signed bytes `w` with 32 signed bytes `a`, as 8
    /// int32 partial sums (exact). `a` must not contain -128 (the sign trick
    /// would overflow); `w` may.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot_i8_i8(w: __m256i, a: __m256i) -> __m256i {
        // |w| as unsigned bytes (|-128| = 128 as u8), and a with w's sign.
        let w_abs = _mm256_sign_epi8(w, w);
        let a_signed = _mm256_sign_epi8(a, w);
        // Pairs of u8*i8 products fit in i16: 2 * 128 * 127 < 32768.
        let pairs = _mm256_maddubs_epi16(w_abs, a_signed);
        _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
    }

    /// Dot products of 32 unsigned bytes `u` (each at most 63) with 32 signed
    /// bytes `a`, as 16 int16 pair sums (exact: 2 * 63 * 128 < 32768).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot_u8_i8_pairs(u: __m256i, a: __m256i) -> __m256i {
        _mm256_maddubs_epi16(u, a)
    }

    /// Horizontal sum of 8 int32 lanes (exact, wrapping never happens for the
    /// ranges the kernels produce).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn hsum_i32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }

    /// Given 8 vectors of 8 int32 each, returns one vector whose lane `k` is
    /// the sum of the lanes of `v_k` (exact integer adds).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn transpose_sum_8(
        v0: __m256i,
        v1: __m256i,
        v2: __m256i,
        v3: __m256i,
        v4: __m256i,
        v5: __m256i,
        v6: __m256i,
        v7: __m256i,
    ) -> __m256i {
        // After two rounds of hadd, lane k of the low half holds the low-half
        // sum of v_k and lane k of the high half its high-half sum (k < 4;
        // likewise for v4..v7).
        let h01 = _mm256_hadd_epi32(v0, v1);
        let h23 = _mm256_hadd_epi32(v2, v3);
        let h45 = _mm256_hadd_epi32(v4, v5);
        let h67 = _mm256_hadd_epi32(v6, v7);
        let h0123 = _mm256_hadd_epi32(h01, h23);
        let h4567 = _mm256_hadd_epi32(h45, h67);
        let lo = _mm256_permute2x128_si256(h0123, h4567, 0x20);
        let hi = _mm256_permute2x128_si256(h0123, h4567, 0x31);
        _mm256_add_epi32(lo, hi)
    }

    /// An f16 bit pattern as f32 (exact).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn half_to_f32(bits: u16) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }

    /// Expands 32 bits into 32 bytes: byte `j` is 0xFF when bit `j` of `bits`
    /// is set, else 0.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn bits_to_bytes(bits: u32) -> __m256i {
        // Byte j takes byte j / 8 of `bits`, then tests bit j % 8 of it.
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(bits as i32),
            _mm256_setr_epi64x(
                0x0000_0000_0000_0000,
                0x0101_0101_0101_0101,
                0x0202_0202_0202_0202,
                0x0303_0303_0303_0303,
            ),
        );
        let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select)
    }

    /// Splits 16 packed bytes into 32 nibbles: bytes 0..16 are the low
    /// nibbles, bytes 16..32 the high nibbles.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn nibbles_16(packed: __m128i) -> __m256i {
        let hi = _mm_srli_epi16(packed, 4);
        let both = _mm256_set_m128i(hi, packed);
        _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_always_available() {
        assert!(available_isas().contains(&Isa::Scalar));
        assert!(detected_isa().is_available());
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn tree8_ps_matches_tree8() {
        if !Isa::Avx2.is_available() {
            return;
        }
        let mut x = 0x1234_5678u32;
        for _ in 0..1000 {
            let mut l = [0.0f32; 8];
            for v in &mut l {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *v = (x as f32 / u32::MAX as f32 - 0.5) * 10f32.powi((x % 9) as i32 - 4);
            }
            // SAFETY: AVX2 checked above; the array bounds the load.
            let got = unsafe { avx2::tree8_ps(std::arch::x86_64::_mm256_loadu_ps(l.as_ptr())) };
            assert_eq!(got.to_bits(), tree8(&l).to_bits());
        }
    }

    #[test]
    fn trees_sum_everything() {
        let l: [f32; 8] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        assert_eq!(tree8(&l), 36.0);
        let mut m = [0.0f32; 32];
        for (i, m) in m.iter_mut().enumerate() {
            *m = i as f32;
        }
        assert_eq!(tree32(&m), 496.0);
    }
}
