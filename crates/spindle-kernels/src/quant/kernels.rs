//! The kernels of one weight type on one ISA, as a type's registry entry
//! ([`super::registry`]) hands them to `matmul`: the one-row kernel and the
//! multi-row kernel (with the activation format quantized weights are
//! multiplied with), and how a multi-row kernel wants its work cut. The
//! constructors below are the kernel families a type picks from.

use super::float::FloatRangeFn;
use super::multi_row::{self, MultiRow, PackActsFn, QuantRangeFn, MR};
use super::q8_act::{ActFormat, ActRow};
use crate::simd::Isa;

/// `k(w_rows, row_bytes, x_row, out)`: `out[j] = dot(row j of w_rows, x_row)`.
pub(crate) type FloatRowsFn = unsafe fn(&[u8], usize, &[f32], &mut [f32]);
/// Same with a quantized activation row.
pub(crate) type QuantRowsFn = unsafe fn(&[u8], usize, ActRow<'_>, &mut [f32]);

/// The multi-row kernel of a quantized type.
#[derive(Clone, Copy)]
pub(crate) struct QuantMulti {
    /// Packs the activations (AVX2 and up); `None`: the kernel reads them
    /// as they are (scalar).
    pub pack: Option<PackActsFn>,
    pub range: QuantRangeFn,
    /// How the kernel wants its work cut, for rows of `cols` values.
    pub grain: fn(usize) -> Grain,
}

/// A type's kernels on one ISA. Calling them is sound only on a CPU that
/// has the ISA (`matmul` checks it before it asks the registry).
#[derive(Clone, Copy)]
pub(crate) enum Kernel {
    Float(FloatRowsFn, FloatRangeFn),
    Quant(ActFormat, QuantRowsFn, QuantMulti),
}

/// How a multi-row kernel wants its work cut.
#[derive(Clone, Copy)]
pub(crate) struct Grain {
    /// Bytes of an activation row as the kernel reads it (chunks of
    /// activation rows are about L2-sized in these).
    pub act_row_bytes: usize,
    /// Chunks of activation rows start at multiples of this.
    pub act_rows: usize,
    /// Blocks of weight rows start at multiples of this (the kernel's tile).
    pub weight_rows: usize,
}

impl Grain {
    /// The register-tile kernels': activation rows in pairs, weight rows
    /// in tiles of [`MR`].
    pub(crate) fn of_rows(act_row_bytes: usize) -> Grain {
        Grain {
            act_row_bytes,
            act_rows: multi_row::NR,
            weight_rows: MR,
        }
    }
}

/// The grain of the kernels that read packed activation rows.
fn packed_grain(cols: usize) -> Grain {
    Grain::of_rows(multi_row::packed_row_bytes(cols))
}

/// A quantized type's one-row kernels, per ISA.
pub(crate) struct OneRow {
    pub scalar: QuantRowsFn,
    #[cfg(target_arch = "x86_64")]
    pub avx2: QuantRowsFn,
    /// What AVX-512 machines run (AVX2's where the type has no own).
    #[cfg(target_arch = "x86_64")]
    pub avx512: QuantRowsFn,
}

/// The kernels on `isa` of a type `T` multiplied with `Block32`
/// activations: its one-row kernels `one`, and the scalar, AVX2 and
/// `vpdpbusd zmm` multi-row kernels.
pub(crate) fn block32_act<T: MultiRow>(isa: Isa, one: OneRow) -> Option<Kernel> {
    let b32 = ActFormat::Block32;
    Some(match isa {
        Isa::Scalar => Kernel::Quant(b32, one.scalar, scalar_multi::<T>()),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Kernel::Quant(b32, one.avx2, avx2_multi::<T>()),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni | Isa::Amx => Kernel::Quant(b32, one.avx512, vnni_multi::<T>()),
        #[allow(unreachable_patterns)]
        _ => return None,
    })
}

/// The scalar multi-row kernel of quantized type `T`.
pub(crate) fn scalar_multi<T: MultiRow>() -> QuantMulti {
    QuantMulti {
        pack: None,
        range: multi_row::range_scalar::<T>,
        grain: packed_grain,
    }
}

/// The AVX2 multi-row kernel of quantized type `T`.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2_multi<T: MultiRow>() -> QuantMulti {
    QuantMulti {
        pack: Some(multi_row::pack_acts::<T>),
        range: multi_row::range_avx2::<T>,
        grain: packed_grain,
    }
}

/// The VNNI multi-row kernel of quantized type `T` (`vpdpbusd zmm`).
#[cfg(target_arch = "x86_64")]
pub(crate) fn vnni_multi<T: MultiRow>() -> QuantMulti {
    QuantMulti {
        pack: Some(multi_row::pack_acts_vnni::<T>),
        range: multi_row::range_vnni::<T>,
        grain: packed_grain,
    }
}

/// The kernels that read a type's vertical layout on `isa`, one row and
/// many: the VNNI ones on AVX-512 machines, the tile unit for many rows
/// where the machine has it; `None` elsewhere (other ISAs convert a
/// vertical matrix back first).
#[cfg(target_arch = "x86_64")]
pub(crate) fn vertical<T: super::vertical::simd::VerticalType>(
    isa: crate::simd::Isa,
) -> Option<(QuantMulti, QuantMulti)> {
    use super::vertical::simd::{pack_one_row, rows_vertical};
    if !isa.uses_avx512() {
        return None;
    }
    let one = QuantMulti {
        pack: Some(pack_one_row::<T>),
        range: rows_vertical::<T>,
        grain: packed_grain,
    };
    let many = if isa == crate::simd::Isa::Amx {
        QuantMulti {
            pack: Some(multi_row::pack_acts_amx::<T>),
            range: multi_row::range_amx::<T>,
            grain: |cols| Grain {
                act_row_bytes: multi_row::amx_chunk_row_bytes(cols),
                act_rows: multi_row::AMX_TILE_ROWS,
                weight_rows: multi_row::AMX_TILE_ROWS,
            },
        }
    } else {
        QuantMulti {
            pack: Some(multi_row::pack_acts_vnni::<T>),
            range: multi_row::range_vnni_vertical::<T>,
            grain: packed_grain,
        }
    };
    Some((one, many))
}

/// The kernel of a Q8_0 or Q5_0 matrix in panels of 16 rows
/// ([`super::panels`]), for one row and for many: it reads the activations
/// as they are quantized, in tiles of 2 panels x 6 rows.
#[cfg(target_arch = "x86_64")]
pub(crate) fn panels(
    ty: spindle_formats::GgmlType,
    isa: crate::simd::Isa,
) -> Option<(QuantMulti, QuantMulti)> {
    use super::panels::{range_vnni_panels, PanelQ5_0, PanelQ8_0};
    use spindle_formats::GgmlType;
    if !isa.uses_avx512() {
        return None;
    }
    let range = match ty {
        GgmlType::Q8_0 => range_vnni_panels::<PanelQ8_0>,
        GgmlType::Q5_0 => range_vnni_panels::<PanelQ5_0>,
        _ => return None,
    };
    let k = QuantMulti {
        pack: None,
        range,
        grain: |cols| Grain {
            act_row_bytes: cols,
            act_rows: 6,
            weight_rows: 2 * super::panels::PANEL_ROWS,
        },
    };
    Some((k, k))
}

/// No panel kernel off x86-64: such matrices are converted back first.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn panels(
    _ty: spindle_formats::GgmlType,
    _isa: crate::simd::Isa,
) -> Option<(QuantMulti, QuantMulti)> {
    None
}
