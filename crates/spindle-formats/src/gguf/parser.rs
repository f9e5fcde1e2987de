//! The byte-level GGUF header parser: reads the metadata and the tensor
//! directory, checking every count, length and tensor range against the file.
//!
//! One file over ~500 lines on purpose: the reader and every check it
//! makes are one concept (a malformed file must fail at the first byte that
//! is wrong, with its offset), and splitting the value reader from the
//! directory reader would scatter the offset bookkeeping they share.

use std::collections::HashMap;

use crate::dtype::type_info;
use crate::error::FormatError;

use super::metadata::{
    bool_from, describe_value, fixed_value, min_value_bytes, unknown_value_type, value_type_name,
    MetaValue, T_ARRAY, T_BOOL, T_F32, T_F64, T_I16, T_I32, T_I64, T_I8, T_STRING, T_U16, T_U32,
    T_U64, T_U8,
};
use super::{
    GgufTensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC, KEY_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS,
};

/// Smallest encoding of one metadata entry: empty key (8), type (4), 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest encoding of one tensor info: empty name (8), dimension count (4),
/// type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// Not enough bytes: `needed` bytes were wanted from `offset`.
#[derive(Clone, Copy)]
struct Short {
    offset: u64,
    needed: u64,
}

pub(super) struct Header {
    pub(super) version: u32,
    pub(super) metadata: Vec<(String, MetaValue)>,
    pub(super) meta_index: HashMap<String, usize>,
    pub(super) tensors: Vec<GgufTensorInfo>,
    pub(super) tensor_index: HashMap<String, usize>,
    pub(super) alignment: u64,
    pub(super) data_offset: u64,
}

/// A tensor info as read, before its offset is made absolute.
struct RawTensor {
    info: GgufTensorInfo,
    name_at: u64,
    type_at: u64,
    offset_at: u64,
}

pub(super) struct Parser<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Whether every tensor's bytes must lie inside `buf` (false for
    /// header-only copies, whose data section is absent).
    require_data: bool,
}

pub(super) type Name<'n> = &'n dyn Fn() -> String;

impl<'a> Parser<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Parser<'a> {
        Parser {
            buf,
            pos: 0,
            require_data: true,
        }
    }

    /// A parser that accepts tensors whose bytes lie past the end of `buf`:
    /// sizes and offsets are still checked, only their presence is not.
    pub(super) fn header_only(buf: &'a [u8]) -> Parser<'a> {
        Parser {
            require_data: false,
            ..Parser::new(buf)
        }
    }

    fn file_len(&self) -> u64 {
        self.buf.len() as u64
    }

    fn at(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        self.buf.len().saturating_sub(self.pos) as u64
    }

    fn truncated(&self, s: Short, field: String) -> FormatError {
        FormatError::Truncated {
            field,
            offset: s.offset,
            needed: s.needed,
            file_len: self.file_len(),
        }
    }

    fn take_raw(&mut self, n: u64) -> Result<&'a [u8], Short> {
        let start = self.pos;
        let short = Short {
            offset: start as u64,
            needed: n,
        };
        let len = usize::try_from(n).map_err(|_| short)?;
        let end = start.checked_add(len).ok_or(short)?;
        let bytes = self.buf.get(start..end).ok_or(short)?;
        self.pos = end;
        Ok(bytes)
    }

    fn take(&mut self, n: u64, field: Name) -> Result<&'a [u8], FormatError> {
        self.take_raw(n).map_err(|s| self.truncated(s, field()))
    }

    fn array_of<const N: usize>(&mut self, field: Name) -> Result<[u8; N], FormatError> {
        let bytes = self.take(N as u64, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u8(&mut self, field: Name) -> Result<u8, FormatError> {
        Ok(self.array_of::<1>(field)?[0])
    }

    fn u32(&mut self, field: Name) -> Result<u32, FormatError> {
        self.array_of(field).map(u32::from_le_bytes)
    }

    fn u64(&mut self, field: Name) -> Result<u64, FormatError> {
        self.array_of(field).map(u64::from_le_bytes)
    }

    /// A GGUF string's bytes: `u64` length, then the bytes.
    fn string_bytes(&mut self, field: Name) -> Result<&'a [u8], FormatError> {
        let len = self.u64(&|| format!("length of {}", field()))?;
        self.take(len, field)
    }

    /// A string that must be valid UTF-8 (keys and tensor names).
    fn strict_string(&mut self, field: Name) -> Result<String, FormatError> {
        let start = self.at();
        let bytes = self.string_bytes(field)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(FormatError::Invalid {
                field: field(),
                offset: start,
                reason: format!(
                    "not valid UTF-8 (bad byte at position {} of the string): the file is corrupt, \
                     fetch the model again",
                    e.valid_up_to()
                ),
            }),
        }
    }

    /// A metadata string value. Invalid UTF-8 is replaced with U+FFFD rather
    /// than failing the file: some converters write raw vocabulary bytes.
    fn value_string(&mut self, field: Name) -> Result<String, FormatError> {
        let bytes = self.string_bytes(field)?;
        Ok(match std::str::from_utf8(bytes) {
            Ok(s) => s.to_owned(),
            Err(_) => String::from_utf8_lossy(bytes).into_owned(),
        })
    }

    /// Checks that `count` items of at least `min_bytes` each can fit in what
    /// is left of the file, so that `count` can size an allocation. `what`
    /// names the items for the error.
    fn check_count(&self, count: u64, min_bytes: u64, what: Name) -> Result<usize, FormatError> {
        match count.checked_mul(min_bytes) {
            Some(need) if need <= self.remaining() => Ok(usize::try_from(count).unwrap_or(0)),
            need => Err(FormatError::Truncated {
                field: format!(
                    "{} ({count} declared, at least {min_bytes} bytes each)",
                    what()
                ),
                offset: self.at(),
                needed: need.unwrap_or(u64::MAX),
                file_len: self.file_len(),
            }),
        }
    }

    pub(super) fn parse(mut self) -> Result<Header, FormatError> {
        let magic: [u8; 4] = self.array_of(&|| "magic (file header)".to_string())?;
        if magic != GGUF_MAGIC {
            return Err(FormatError::BadMagic { found: magic });
        }
        let version = self.u32(&|| "GGUF version".to_string())?;
        if version != 2 && version != 3 {
            return Err(FormatError::UnsupportedVersion(version));
        }
        let tensor_count = self.u64(&|| "tensor count".to_string())?;
        let kv_count = self.u64(&|| "metadata entry count".to_string())?;

        // Both sections follow; each entry needs a minimum number of bytes.
        self.check_count(tensor_count, MIN_TENSOR_INFO_BYTES, &|| {
            "tensor infos".to_string()
        })?;
        let kv_cap =
            self.check_count(kv_count, MIN_KV_BYTES, &|| "metadata entries".to_string())?;

        // Metadata.
        let mut metadata = Vec::with_capacity(kv_cap);
        let mut meta_index = HashMap::with_capacity(kv_cap);
        let mut alignment_at = None;
        for i in 0..kv_count {
            let key_at = self.at();
            let key = self.strict_string(&|| format!("key of metadata entry #{i}"))?;
            let type_at = self.at();
            let ty = self.u32(&|| format!("value type of metadata '{key}'"))?;
            let value_at = self.at();
            let value = self.value(ty, type_at, &|| format!("metadata '{key}'"), 0)?;
            if key == KEY_ALIGNMENT {
                alignment_at = Some(value_at);
            }
            if meta_index.contains_key(&key) {
                return Err(FormatError::Invalid {
                    field: format!("metadata key '{key}'"),
                    offset: key_at,
                    reason: "the key appears twice: the file is corrupt, fetch the model again"
                        .to_string(),
                });
            }
            meta_index.insert(key.clone(), metadata.len());
            metadata.push((key, value));
        }

        let alignment = match (meta_index.get(KEY_ALIGNMENT), alignment_at) {
            (Some(&i), Some(at)) => {
                let value = metadata.get(i).map(|(_, v)| v);
                match value.and_then(MetaValue::as_u64) {
                    Some(a) if a != 0 && a.is_power_of_two() => a,
                    _ => {
                        return Err(FormatError::Invalid {
                            field: format!("metadata '{KEY_ALIGNMENT}'"),
                            offset: at,
                            reason: format!(
                                "the alignment must be a nonzero power of two, but it is {}: \
                                 the file is corrupt, fetch the model again",
                                value.map_or_else(String::new, describe_value)
                            ),
                        })
                    }
                }
            }
            _ => DEFAULT_ALIGNMENT,
        };

        // Tensor infos. The count was checked against the whole rest of the
        // file; check it again against what the metadata left.
        let tensor_cap = self.check_count(tensor_count, MIN_TENSOR_INFO_BYTES, &|| {
            "tensor infos".to_string()
        })?;
        let mut raw = Vec::with_capacity(tensor_cap);
        let mut tensor_index = HashMap::with_capacity(tensor_cap);
        for i in 0..tensor_count {
            let t = self.tensor_info(i)?;
            if tensor_index.contains_key(&t.info.name) {
                return Err(FormatError::Invalid {
                    field: format!("name of tensor #{i}"),
                    offset: t.name_at,
                    reason: format!(
                        "tensor '{}' appears twice: the file is corrupt, fetch the model again",
                        t.info.name
                    ),
                });
            }
            tensor_index.insert(t.info.name.clone(), raw.len());
            raw.push(t);
        }

        // The data section starts at the next multiple of the alignment.
        // Its padding may be missing when no tensor has data there; every
        // tensor's range is checked below.
        let infos_end = self.at();
        let data_offset = align_up(infos_end, alignment).ok_or_else(|| FormatError::Invalid {
            field: "data section offset".to_string(),
            offset: infos_end,
            reason: "aligning it overflows: the file is corrupt, fetch the model again".to_string(),
        })?;

        // Header-only: any end that does not overflow is accepted.
        let file_len = if self.require_data {
            self.file_len()
        } else {
            u64::MAX
        };
        let mut tensors = Vec::with_capacity(raw.len());
        let mut offsets_at = Vec::with_capacity(raw.len());
        for t in raw {
            offsets_at.push(t.offset_at);
            tensors.push(place_tensor(t, data_offset, alignment, file_len)?);
        }
        check_overlaps(&tensors, &offsets_at)?;

        Ok(Header {
            version,
            metadata,
            meta_index,
            tensors,
            tensor_index,
            alignment,
            data_offset,
        })
    }

    fn value(
        &mut self,
        ty: u32,
        type_at: u64,
        name: Name,
        depth: u32,
    ) -> Result<MetaValue, FormatError> {
        let field = || format!("value of {}", name());
        Ok(match ty {
            T_U8 => MetaValue::U8(self.u8(&field)?),
            T_I8 => MetaValue::I8(i8::from_le_bytes(self.array_of(&field)?)),
            T_U16 => MetaValue::U16(u16::from_le_bytes(self.array_of(&field)?)),
            T_I16 => MetaValue::I16(i16::from_le_bytes(self.array_of(&field)?)),
            T_U32 => MetaValue::U32(u32::from_le_bytes(self.array_of(&field)?)),
            T_I32 => MetaValue::I32(i32::from_le_bytes(self.array_of(&field)?)),
            T_F32 => MetaValue::F32(f32::from_le_bytes(self.array_of(&field)?)),
            T_U64 => MetaValue::U64(u64::from_le_bytes(self.array_of(&field)?)),
            T_I64 => MetaValue::I64(i64::from_le_bytes(self.array_of(&field)?)),
            T_F64 => MetaValue::F64(f64::from_le_bytes(self.array_of(&field)?)),
            T_BOOL => {
                let at = self.at();
                MetaValue::Bool(bool_from(self.u8(&field)?, at, &field)?)
            }
            T_STRING => MetaValue::Str(self.value_string(&field)?),
            T_ARRAY => MetaValue::Array(self.array(name, depth)?),
            _ => {
                return Err(unknown_value_type(ty, type_at, &|| {
                    format!("type of {}", name())
                }))
            }
        })
    }

    fn array(&mut self, name: Name, depth: u32) -> Result<Vec<MetaValue>, FormatError> {
        let type_at = self.at();
        if depth >= MAX_ARRAY_DEPTH {
            return Err(FormatError::Invalid {
                field: format!("array {}", name()),
                offset: type_at,
                reason: format!(
                    "arrays nest more than {MAX_ARRAY_DEPTH} deep: the file is corrupt, fetch \
                     the model again"
                ),
            });
        }
        let ety = self.u32(&|| format!("element type of array {}", name()))?;
        let Some(min) = min_value_bytes(ety) else {
            return Err(unknown_value_type(ety, type_at, &|| {
                format!("element type of array {}", name())
            }));
        };
        let count = self.u64(&|| format!("length of array {}", name()))?;
        let cap = self.check_count(count, min, &|| {
            format!("{} elements of array {}", value_type_name(ety), name())
        })?;
        let elem = |j: usize| move || format!("{}[{j}]", name());
        let mut out = Vec::with_capacity(cap);

        // Fixed-size elements: one bounds check for the whole array.
        if !matches!(ety, T_STRING | T_ARRAY | T_BOOL) {
            let bytes = self.take(count.saturating_mul(min), &|| {
                format!("elements of array {}", name())
            })?;
            let min = min as usize;
            out.extend(bytes.chunks_exact(min).map(|c| fixed_value(ety, c)));
            return Ok(out);
        }
        for j in 0..cap {
            let e = elem(j);
            let v = match ety {
                T_STRING => MetaValue::Str(self.value_string(&|| format!("value of {}", e()))?),
                T_BOOL => {
                    let at = self.at();
                    let field = || format!("value of {}", e());
                    MetaValue::Bool(bool_from(self.u8(&field)?, at, &field)?)
                }
                _ => MetaValue::Array(self.array(&e, depth + 1)?),
            };
            out.push(v);
        }
        Ok(out)
    }

    fn tensor_info(&mut self, i: u64) -> Result<RawTensor, FormatError> {
        let name_at = self.at();
        let name = self.strict_string(&|| format!("name of tensor #{i}"))?;
        let n_dims_at = self.at();
        let n_dims = self.u32(&|| format!("dimension count of tensor '{name}'"))?;
        if n_dims > MAX_DIMS {
            return Err(FormatError::Invalid {
                field: format!("dimension count of tensor '{name}'"),
                offset: n_dims_at,
                reason: format!(
                    "{n_dims} dimensions, but GGUF tensors have at most {MAX_DIMS}: the file is \
                     corrupt, fetch the model again"
                ),
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(self.u64(&|| format!("dimension {d} of tensor '{name}'"))?);
        }
        let type_at = self.at();
        let type_id = self.u32(&|| format!("type of tensor '{name}'"))?;
        let offset_at = self.at();
        let offset = self.u64(&|| format!("data offset of tensor '{name}'"))?;
        Ok(RawTensor {
            info: GgufTensorInfo {
                name,
                dims,
                type_id,
                offset,
                n_bytes: 0,
            },
            name_at,
            type_at,
            offset_at,
        })
    }
}

/// Sizes `t` from its dimensions and type, makes its offset absolute and
/// checks that its bytes lie inside the file.
/// Tensors whose byte ranges overlap: one of their offsets is wrong (a
/// flipped bit in the header), and the loader would read one tensor's bytes
/// as another's.
fn check_overlaps(tensors: &[GgufTensorInfo], offsets_at: &[u64]) -> Result<(), FormatError> {
    let mut order: Vec<usize> = (0..tensors.len())
        .filter(|&i| tensors[i].n_bytes > 0)
        .collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        if a.offset + a.n_bytes > b.offset {
            return Err(FormatError::Invalid {
                field: format!("data offset of tensor '{}'", b.name),
                offset: offsets_at[w[1]],
                reason: format!(
                    "its bytes {}..{} overlap those of tensor '{}' ({}..{}): the header is corrupt, fetch the model again",
                    b.offset,
                    b.offset + b.n_bytes,
                    a.name,
                    a.offset,
                    a.offset + a.n_bytes
                ),
            });
        }
    }
    Ok(())
}

fn place_tensor(
    t: RawTensor,
    data_offset: u64,
    alignment: u64,
    file_len: u64,
) -> Result<GgufTensorInfo, FormatError> {
    let RawTensor {
        mut info,
        name_at,
        type_at,
        offset_at,
    } = t;
    let invalid = |field: String, offset: u64, reason: String| FormatError::Invalid {
        field,
        offset,
        reason,
    };
    let Some(ty) = type_info(info.type_id) else {
        return Err(invalid(
            format!("type of tensor '{}'", info.name),
            type_at,
            format!(
                "unknown ggml type id {}: the file is corrupt or was made for a newer ggml; \
                 fetch the model again or use a file quantized to a common type",
                info.type_id
            ),
        ));
    };
    let dims_at = name_at; // dimensions follow the name; point at the tensor info.
    let Some(n_elements) = info
        .dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
    else {
        return Err(invalid(
            format!("dimensions of tensor '{}'", info.name),
            dims_at,
            format!(
                "{:?} has more elements than can be counted: the file is corrupt, fetch the \
                 model again",
                info.dims
            ),
        ));
    };
    let row = info.dims.first().copied().unwrap_or(1);
    if !row.is_multiple_of(ty.block_len) {
        return Err(invalid(
            format!("dimensions of tensor '{}'", info.name),
            dims_at,
            format!(
                "its row length {row} is not a multiple of the {} block size {}: the file is \
                 corrupt, fetch the model again",
                ty.name, ty.block_len
            ),
        ));
    }
    let Some(n_bytes) = ty.bytes_for(n_elements) else {
        return Err(invalid(
            format!("dimensions of tensor '{}'", info.name),
            dims_at,
            format!(
                "{:?} of type {} is too large: the file is corrupt, fetch the model again",
                info.dims, ty.name
            ),
        ));
    };
    if !info.offset.is_multiple_of(alignment) {
        return Err(invalid(
            format!("data offset of tensor '{}'", info.name),
            offset_at,
            format!(
                "{} is not a multiple of the alignment {alignment}: the file is corrupt, fetch \
                 the model again",
                info.offset
            ),
        ));
    }
    let Some(start) = data_offset.checked_add(info.offset) else {
        return Err(invalid(
            format!("data offset of tensor '{}'", info.name),
            offset_at,
            format!(
                "{} is past any possible file end: the file is corrupt, fetch the model again",
                info.offset
            ),
        ));
    };
    if start.checked_add(n_bytes).is_none_or(|end| end > file_len) {
        return Err(FormatError::Truncated {
            field: format!("data of tensor '{}'", info.name),
            offset: start,
            needed: n_bytes,
            file_len,
        });
    }
    info.offset = start;
    info.n_bytes = n_bytes;
    Ok(info)
}

fn align_up(x: u64, alignment: u64) -> Option<u64> {
    let rem = x % alignment;
    if rem == 0 {
        Some(x)
    } else {
        x.checked_add(alignment - rem)
    }
}
