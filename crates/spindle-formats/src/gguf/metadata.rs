//! GGUF metadata values: the value type ids, [`MetaValue`] and the helpers
//! that decode, name and describe values.

use crate::error::FormatError;

use super::parser::Name;

// Metadata value type ids.
pub(super) const T_U8: u32 = 0;
pub(super) const T_I8: u32 = 1;
pub(super) const T_U16: u32 = 2;
pub(super) const T_I16: u32 = 3;
pub(super) const T_U32: u32 = 4;
pub(super) const T_I32: u32 = 5;
pub(super) const T_F32: u32 = 6;
pub(super) const T_BOOL: u32 = 7;
pub(super) const T_STRING: u32 = 8;
pub(super) const T_ARRAY: u32 = 9;
pub(super) const T_U64: u32 = 10;
pub(super) const T_I64: u32 = 11;
pub(super) const T_F64: u32 = 12;

/// The smallest number of bytes one value of metadata type `ty` takes, or
/// `None` for an unknown type.
pub(super) fn min_value_bytes(ty: u32) -> Option<u64> {
    Some(match ty {
        T_U8 | T_I8 | T_BOOL => 1,
        T_U16 | T_I16 => 2,
        T_U32 | T_I32 | T_F32 => 4,
        T_U64 | T_I64 | T_F64 => 8,
        T_STRING => 8,
        T_ARRAY => 4 + 8,
        _ => return None,
    })
}

pub(super) fn value_type_name(ty: u32) -> &'static str {
    match ty {
        T_U8 => "u8",
        T_I8 => "i8",
        T_U16 => "u16",
        T_I16 => "i16",
        T_U32 => "u32",
        T_I32 => "i32",
        T_F32 => "f32",
        T_BOOL => "bool",
        T_STRING => "string",
        T_ARRAY => "array",
        T_U64 => "u64",
        T_I64 => "i64",
        T_F64 => "f64",
        _ => "unknown",
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// Any non-negative integer, whatever its width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer that fits in an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Any number (integers are converted).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            MetaValue::U64(v) => Some(v as f64),
            MetaValue::I64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// A boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// A string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// An array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The GGUF name of this value's type ("u32", "string", "array", ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F32(_) => "f32",
            MetaValue::F64(_) => "f64",
            MetaValue::Bool(_) => "bool",
            MetaValue::Str(_) => "string",
            MetaValue::Array(_) => "array",
        }
    }
}

pub(super) fn fixed_value(ty: u32, c: &[u8]) -> MetaValue {
    fn arr<const N: usize>(c: &[u8]) -> [u8; N] {
        let mut a = [0u8; N];
        if let Some(src) = c.get(..N) {
            a.copy_from_slice(src);
        }
        a
    }
    match ty {
        T_U8 => MetaValue::U8(u8::from_le_bytes(arr(c))),
        T_I8 => MetaValue::I8(i8::from_le_bytes(arr(c))),
        T_U16 => MetaValue::U16(u16::from_le_bytes(arr(c))),
        T_I16 => MetaValue::I16(i16::from_le_bytes(arr(c))),
        T_U32 => MetaValue::U32(u32::from_le_bytes(arr(c))),
        T_I32 => MetaValue::I32(i32::from_le_bytes(arr(c))),
        T_F32 => MetaValue::F32(f32::from_le_bytes(arr(c))),
        T_U64 => MetaValue::U64(u64::from_le_bytes(arr(c))),
        T_I64 => MetaValue::I64(i64::from_le_bytes(arr(c))),
        _ => MetaValue::F64(f64::from_le_bytes(arr(c))),
    }
}

pub(super) fn bool_from(b: u8, at: u64, field: Name) -> Result<bool, FormatError> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(FormatError::Invalid {
            field: field(),
            offset: at,
            reason: format!(
                "a bool must be 0 or 1, not {b}: the file is corrupt, fetch the model again"
            ),
        }),
    }
}

pub(super) fn unknown_value_type(ty: u32, at: u64, field: Name) -> FormatError {
    FormatError::Invalid {
        field: field(),
        offset: at,
        reason: format!(
            "unknown metadata value type {ty} (GGUF defines types 0 to 12): the file is corrupt \
             or from a newer GGUF version, fetch the model again or upgrade Spindle"
        ),
    }
}

pub(super) fn describe_value(v: &MetaValue) -> String {
    match v {
        MetaValue::Str(s) => format!("the string {s:?}"),
        MetaValue::Array(a) => format!("an array of {} elements", a.len()),
        other => format!("{other:?}"),
    }
}

pub(super) fn wrong_type(key: &str, expected: &'static str, found: &MetaValue) -> FormatError {
    FormatError::WrongType {
        key: key.to_string(),
        expected,
        found: found.type_name(),
    }
}
