//! Every weight type the kernels know, one entry each. A type declares its
//! entry in its own file (`q8_0::TYPE`, `q4_k::TYPE`, ...): its scalar
//! reference dequantizer, where its block scales lie, the activations it is
//! multiplied with, and its kernels on each ISA (one-row and multi-row, and
//! those that read the vertical layout where it has one). `matmul`,
//! `dequantize`, the weight checks and the activation rounding read the
//! entry; only the vertical layout's plane arithmetic (`vertical.rs`)
//! names types besides.
//!
//! Adding a type: its file with its blocks, dequantizer and kernels (the
//! families in [`super::kernels`] and [`super::decoded`] give most types
//! every ISA for a `BlockDecode` impl), its `TYPE`, and one line in
//! [`TYPES`]. Adding an ISA path: the family's kernel for it and one arm in
//! each family's `kernels` function.

use spindle_formats::GgmlType;

use super::kernels::{Kernel, QuantMulti};
use super::q8_act::ActFormat;
use super::{
    float, iq1_m, iq1_s, iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs, iq4_nl, iq4_xs, mxfp4, q1_0, q2_0,
    q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0, tq1_0, tq2_0,
};
use crate::simd::Isa;

/// The kernels that read a type's vertical layout on an ISA (one row,
/// many rows), or `None` where that ISA has none.
pub(crate) type VerticalFn = fn(Isa) -> Option<(QuantMulti, QuantMulti)>;

/// One weight type as the kernels know it.
pub(crate) struct QuantType {
    pub ty: GgmlType,
    /// The scalar reference: `dst` (whole blocks) from `src`, exactly
    /// `ty.bytes_for(dst.len())` bytes (checked by the caller).
    pub dequantize: fn(&[u8], &mut [f32]),
    /// Byte offsets in a block of its f16 scales (`d`, `dmin`), checked at
    /// load for NaN and infinity; empty when the values are their own
    /// (floats) or the scale is not a plain f16.
    pub scale_offsets: &'static [usize],
    /// The activations Spindle multiplies the weights with (`None`: float
    /// weights, f32 activations).
    pub act: Option<ActFormat>,
    /// Those ggml's CPU backend uses (its `vec_dot_type`), for
    /// `ActRounding::Ggml`.
    pub ggml_act: Option<ActFormat>,
    /// The kernels on an ISA, or `None` where it has none.
    pub kernels: fn(Isa) -> Option<Kernel>,
    /// The kernels that read the vertical layout, for the types that have
    /// one ([`super::vertical`]).
    pub vertical: Option<VerticalFn>,
}

impl QuantType {
    /// A quantized type multiplied with one int8 scale per 32 activations
    /// (ggml: an f16 scale per 32, or Q8_K's one per 256 when `q8_k`), with
    /// no vertical layout; the fields a type sets itself follow.
    pub(crate) const fn quantized(
        ty: GgmlType,
        dequantize: fn(&[u8], &mut [f32]),
        scale_offsets: &'static [usize],
        q8_k: bool,
        kernels: fn(Isa) -> Option<Kernel>,
    ) -> QuantType {
        QuantType {
            ty,
            dequantize,
            scale_offsets,
            act: Some(ActFormat::Block32),
            ggml_act: Some(if q8_k {
                ActFormat::Super256
            } else {
                ActFormat::Block32F16
            }),
            kernels,
            vertical: None,
        }
    }
}

/// The registry, in [`GgmlType::ALL`]'s order.
const TYPES: [&QuantType; 27] = [
    &float::F32_TYPE,
    &float::F16_TYPE,
    &float::BF16_TYPE,
    &q8_0::TYPE,
    &q4_0::TYPE,
    &q4_1::TYPE,
    &q5_0::TYPE,
    &q5_1::TYPE,
    &iq4_nl::TYPE,
    &mxfp4::TYPE,
    &q2_k::TYPE,
    &q3_k::TYPE,
    &q4_k::TYPE,
    &q5_k::TYPE,
    &q6_k::TYPE,
    &iq4_xs::TYPE,
    &tq1_0::TYPE,
    &tq2_0::TYPE,
    &iq2_xxs::TYPE,
    &iq2_xs::TYPE,
    &iq2_s::TYPE,
    &iq3_xxs::TYPE,
    &iq3_s::TYPE,
    &iq1_s::TYPE,
    &iq1_m::TYPE,
    &q1_0::TYPE,
    &q2_0::TYPE,
];

// The table is in the enum's order, a line for every type: checked when
// the crate compiles.
const _: () = {
    assert!(TYPES.len() == GgmlType::ALL.len());
    let mut i = 0;
    while i < TYPES.len() {
        assert!(TYPES[i].ty as usize == i, "TYPES is in GgmlType's order");
        i += 1;
    }
};

/// The entry of `ty`.
pub(crate) fn of(ty: GgmlType) -> &'static QuantType {
    TYPES[ty as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One entry per type, in `GgmlType::ALL`'s order, each with a kernel
    /// on the scalar path, and quantized types with activations.
    #[test]
    fn every_type_has_one_entry() {
        for (entry, ty) in TYPES.iter().zip(GgmlType::ALL) {
            assert_eq!(entry.ty, ty);
            assert_eq!(of(ty).ty, ty);
            assert!(
                (entry.kernels)(Isa::Scalar).is_some(),
                "{ty}: no scalar kernel"
            );
            let float = matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
            assert_eq!(entry.act.is_none(), float, "{ty}");
            assert_eq!(entry.ggml_act.is_none(), float, "{ty}");
        }
        assert_eq!(TYPES.len(), GgmlType::ALL.len());
    }
}
