//! Tensor element types as GGUF numbers them, with their block geometry.
//!
//! Formats only need the geometry (to bounds-check tensor sizes); the
//! arithmetic on these blocks lives in `spindle-kernels`.

use std::fmt;

/// A tensor element type. Quantized types store values in fixed-size blocks.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    IQ4_NL,
    MXFP4,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_XS,
    TQ1_0,
    TQ2_0,
    IQ2_XXS,
    IQ2_XS,
    IQ2_S,
    IQ3_XXS,
    IQ3_S,
    IQ1_S,
    IQ1_M,
    Q1_0,
    Q2_0,
}

impl GgmlType {
    /// All types Spindle can compute with.
    pub const ALL: [GgmlType; 27] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::IQ4_NL,
        GgmlType::MXFP4,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_XS,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ2_S,
        GgmlType::IQ3_XXS,
        GgmlType::IQ3_S,
        GgmlType::IQ1_S,
        GgmlType::IQ1_M,
        GgmlType::Q1_0,
        GgmlType::Q2_0,
    ];

    /// The type for a GGUF type id, or `None` when Spindle does not support it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2_K,
            11 => GgmlType::Q3_K,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            20 => GgmlType::IQ4_NL,
            23 => GgmlType::IQ4_XS,
            30 => GgmlType::BF16,
            34 => GgmlType::TQ1_0,
            35 => GgmlType::TQ2_0,
            39 => GgmlType::MXFP4,
            16 => GgmlType::IQ2_XXS,
            17 => GgmlType::IQ2_XS,
            22 => GgmlType::IQ2_S,
            18 => GgmlType::IQ3_XXS,
            21 => GgmlType::IQ3_S,
            19 => GgmlType::IQ1_S,
            29 => GgmlType::IQ1_M,
            41 => GgmlType::Q1_0,
            42 => GgmlType::Q2_0,
            _ => return None,
        })
    }

    /// The GGUF type id.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::BF16 => 30,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::IQ4_NL => 20,
            GgmlType::MXFP4 => 39,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::IQ4_XS => 23,
            GgmlType::TQ1_0 => 34,
            GgmlType::TQ2_0 => 35,
            GgmlType::IQ2_XXS => 16,
            GgmlType::IQ2_XS => 17,
            GgmlType::IQ2_S => 22,
            GgmlType::IQ3_XXS => 18,
            GgmlType::IQ3_S => 21,
            GgmlType::IQ1_S => 19,
            GgmlType::IQ1_M => 29,
            GgmlType::Q1_0 => 41,
            GgmlType::Q2_0 => 42,
        }
    }

    /// Number of values in one block.
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::IQ4_NL
            | GgmlType::MXFP4 => 32,
            GgmlType::Q2_0 => 64,
            GgmlType::Q1_0 => 128,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::IQ4_XS
            | GgmlType::TQ1_0
            | GgmlType::TQ2_0
            | GgmlType::IQ2_XXS
            | GgmlType::IQ2_XS
            | GgmlType::IQ2_S
            | GgmlType::IQ3_XXS
            | GgmlType::IQ3_S
            | GgmlType::IQ1_S
            | GgmlType::IQ1_M => 256,
        }
    }

    /// Bytes in one block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q8_0 => 34,
            GgmlType::Q4_0 | GgmlType::IQ4_NL | GgmlType::Q1_0 | GgmlType::Q2_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::MXFP4 => 17,
            GgmlType::Q2_K => 84,
            GgmlType::Q3_K | GgmlType::IQ3_S => 110,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
            GgmlType::IQ4_XS => 136,
            GgmlType::TQ1_0 => 54,
            GgmlType::TQ2_0 | GgmlType::IQ2_XXS => 66,
            GgmlType::IQ2_XS => 74,
            GgmlType::IQ2_S => 82,
            GgmlType::IQ3_XXS => 98,
            GgmlType::IQ1_S => 50,
            GgmlType::IQ1_M => 56,
        }
    }

    /// Bytes taken by `n` values, or `None` when `n` is not a whole number of
    /// blocks or the size overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let bl = self.block_len() as u64;
        if !n.is_multiple_of(bl) {
            return None;
        }
        (n / bl).checked_mul(self.block_bytes() as u64)
    }

    /// The name GGUF tools print for this type.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::IQ4_NL => "IQ4_NL",
            GgmlType::MXFP4 => "MXFP4",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::IQ4_XS => "IQ4_XS",
            GgmlType::TQ1_0 => "TQ1_0",
            GgmlType::TQ2_0 => "TQ2_0",
            GgmlType::IQ2_XXS => "IQ2_XXS",
            GgmlType::IQ2_XS => "IQ2_XS",
            GgmlType::IQ2_S => "IQ2_S",
            GgmlType::IQ3_XXS => "IQ3_XXS",
            GgmlType::IQ3_S => "IQ3_S",
            GgmlType::IQ1_S => "IQ1_S",
            GgmlType::IQ1_M => "IQ1_M",
            GgmlType::Q1_0 => "Q1_0",
            GgmlType::Q2_0 => "Q2_0",
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Block geometry of a ggml type id, including types Spindle cannot compute
/// with, so that files holding them can still be bounds-checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TypeInfo {
    /// The GGUF type id.
    pub id: u32,
    /// The name GGUF tools print for this type.
    pub name: &'static str,
    /// Number of values in one block.
    pub block_len: u64,
    /// Bytes in one block.
    pub block_bytes: u64,
}

impl TypeInfo {
    /// Bytes taken by `n` values, or `None` when `n` is not a whole number of
    /// blocks or the size overflows.
    pub fn bytes_for(&self, n: u64) -> Option<u64> {
        if !n.is_multiple_of(self.block_len) {
            return None;
        }
        (n / self.block_len).checked_mul(self.block_bytes)
    }

    /// The type as Spindle computes with it, or `None` when unsupported.
    pub fn supported(&self) -> Option<GgmlType> {
        GgmlType::from_id(self.id)
    }
}

/// Every ggml type id that can appear in a GGUF file, with its geometry
/// (ggml's `type_traits`: `blck_size` and `type_size`). Ids 4, 5 and 31..=33,
/// 36..=38 were removed from ggml and are not listed.
const TYPE_TABLE: &[TypeInfo] = &[
    t(0, "F32", 1, 4),
    t(1, "F16", 1, 2),
    t(2, "Q4_0", 32, 18),
    t(3, "Q4_1", 32, 20),
    t(6, "Q5_0", 32, 22),
    t(7, "Q5_1", 32, 24),
    t(8, "Q8_0", 32, 34),
    t(9, "Q8_1", 32, 36),
    t(10, "Q2_K", 256, 84),
    t(11, "Q3_K", 256, 110),
    t(12, "Q4_K", 256, 144),
    t(13, "Q5_K", 256, 176),
    t(14, "Q6_K", 256, 210),
    t(15, "Q8_K", 256, 292),
    t(16, "IQ2_XXS", 256, 66),
    t(17, "IQ2_XS", 256, 74),
    t(18, "IQ3_XXS", 256, 98),
    t(19, "IQ1_S", 256, 50),
    t(20, "IQ4_NL", 32, 18),
    t(21, "IQ3_S", 256, 110),
    t(22, "IQ2_S", 256, 82),
    t(23, "IQ4_XS", 256, 136),
    t(24, "I8", 1, 1),
    t(25, "I16", 1, 2),
    t(26, "I32", 1, 4),
    t(27, "I64", 1, 8),
    t(28, "F64", 1, 8),
    t(29, "IQ1_M", 256, 56),
    t(30, "BF16", 1, 2),
    t(34, "TQ1_0", 256, 54),
    t(35, "TQ2_0", 256, 66),
    t(39, "MXFP4", 32, 17),
    t(40, "NVFP4", 64, 36),
    t(41, "Q1_0", 128, 18),
    t(42, "Q2_0", 64, 18),
];

const fn t(id: u32, name: &'static str, block_len: u64, block_bytes: u64) -> TypeInfo {
    TypeInfo {
        id,
        name,
        block_len,
        block_bytes,
    }
}

/// Geometry of any known ggml type id, or `None` for ids ggml never defined
/// (or removed), whose size cannot be computed.
pub fn type_info(id: u32) -> Option<TypeInfo> {
    TYPE_TABLE.iter().find(|t| t.id == id).copied()
}

/// The name of a GGUF type id Spindle does not support, for error messages.
pub fn unsupported_type_name(id: u32) -> String {
    match type_info(id) {
        Some(info) => format!("{} (type id {id})", info.name),
        None => format!("type id {id}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_agrees_with_supported_types() {
        for ty in GgmlType::ALL {
            let info = type_info(ty.id()).expect("supported type in table");
            assert_eq!(info.name, ty.name());
            assert_eq!(info.block_len, ty.block_len() as u64);
            assert_eq!(info.block_bytes, ty.block_bytes() as u64);
            assert_eq!(info.supported(), Some(ty));
            assert_eq!(GgmlType::from_id(ty.id()), Some(ty));
        }
    }

    #[test]
    fn table_ids_are_unique_and_removed_ids_unknown() {
        for (i, a) in TYPE_TABLE.iter().enumerate() {
            for b in &TYPE_TABLE[i + 1..] {
                assert_ne!(a.id, b.id);
            }
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 1000, u32::MAX] {
            assert!(type_info(id).is_none(), "id {id}");
        }
        assert_eq!(unsupported_type_name(16), "IQ2_XXS (type id 16)");
        assert_eq!(unsupported_type_name(4), "type id 4");
    }
}
