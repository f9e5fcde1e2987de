//! GGUF (versions 2 and 3, little-endian): metadata and tensor directory.
//!
//! Layout: magic `GGUF`, `u32` version, `u64` tensor count, `u64` metadata
//! count, the metadata entries (key string, `u32` value type, value), the
//! tensor infos (name string, `u32` dimension count, `u64` dimensions,
//! `u32` type, `u64` offset relative to the data section), padding to the
//! alignment, then the data section. Strings are a `u64` length and UTF-8
//! bytes.
//!
//! Parsing reads only the header (metadata and tensor infos); it never
//! touches the data section, so opening a memory-mapped multi-gigabyte file
//! loads only its first pages. Every count and length read from the file is
//! checked against the bytes that remain before anything is allocated from
//! it, and every tensor's byte range is checked to lie inside the file.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::dtype::{type_info, unsupported_type_name, GgmlType};
use crate::error::FormatError;
use crate::storage::{Storage, TensorBytes};

/// The magic bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of tensor offsets when the file does
/// not set `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The most dimensions a GGUF tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// How deeply arrays may nest inside arrays. Real files nest at most once;
/// the cap keeps a malicious file from exhausting the stack.
pub const MAX_ARRAY_DEPTH: u32 = 16;

const KEY_ALIGNMENT: &str = "general.alignment";
const KEY_ARCHITECTURE: &str = "general.architecture";

// Metadata value type ids.
const T_U8: u32 = 0;
const T_I8: u32 = 1;
const T_U16: u32 = 2;
const T_I16: u32 = 3;
const T_U32: u32 = 4;
const T_I32: u32 = 5;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;
const T_I64: u32 = 11;
const T_F64: u32 = 12;

/// Smallest encoding of one metadata entry: empty key (8), type (4), 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest encoding of one tensor info: empty name (8), dimension count (4),
/// type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// The smallest number of bytes one value of metadata type `ty` takes, or
/// `None` for an unknown type.
fn min_value_bytes(ty: u32) -> Option<u64> {
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

fn value_type_name(ty: u32) -> &'static str {
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

/// One entry of the tensor directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// GGUF order: `dims[0]` is the contiguous (innermost) dimension.
    pub dims: Vec<u64>,
    /// The ggml type id; see [`GgufTensorInfo::ty`].
    pub type_id: u32,
    /// Absolute offset of the tensor's bytes in the file.
    pub offset: u64,
    /// Size of the tensor's bytes, from its dimensions and type.
    pub n_bytes: u64,
}

impl GgufTensorInfo {
    /// The element type, or [`FormatError::UnsupportedType`] naming the
    /// tensor and type when Spindle cannot compute with it.
    pub fn ty(&self) -> Result<GgmlType, FormatError> {
        GgmlType::from_id(self.type_id).ok_or_else(|| FormatError::UnsupportedType {
            tensor: self.name.clone(),
            type_name: unsupported_type_name(self.type_id),
        })
    }

    /// The name of the element type, supported or not ("Q4_K", "IQ2_XS", ...).
    pub fn type_name(&self) -> String {
        match type_info(self.type_id) {
            Some(info) => info.name.to_string(),
            None => unsupported_type_name(self.type_id),
        }
    }

    /// Number of elements (the product of the dimensions; checked at parse).
    pub fn n_elements(&self) -> u64 {
        self.dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .unwrap_or(u64::MAX)
    }
}

/// A parsed GGUF file: its metadata, its tensor directory and its bytes.
pub struct GgufFile {
    storage: Arc<Storage>,
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl GgufFile {
    /// Memory-maps and parses `path`. Only the header pages are read.
    pub fn open(path: &Path) -> Result<GgufFile, FormatError> {
        GgufFile::from_storage(Arc::new(Storage::map(path)?))
    }

    /// The same as [`GgufFile::open`], for callers that want only metadata
    /// and the tensor directory: the file is memory-mapped and parsing reads
    /// only the header, so no tensor data is loaded from disk.
    pub fn open_header(path: &Path) -> Result<GgufFile, FormatError> {
        GgufFile::open(path)
    }

    /// Parses a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, FormatError> {
        GgufFile::from_storage(Arc::new(Storage::from_vec(bytes)))
    }

    /// Parses the bytes of `storage`.
    pub fn from_storage(storage: Arc<Storage>) -> Result<GgufFile, FormatError> {
        let header = Parser::new(&storage).parse()?;
        Ok(GgufFile {
            storage,
            version: header.version,
            metadata: header.metadata,
            meta_index: header.meta_index,
            tensors: header.tensors,
            tensor_index: header.tensor_index,
            alignment: header.alignment,
            data_offset: header.data_offset,
        })
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The metadata value of `key`.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        let &i = self.meta_index.get(key)?;
        self.metadata.get(i).map(|(_, v)| v)
    }

    /// `key` as a non-negative integer of any width.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(MetaValue::as_u64)
    }

    /// `key` as an integer of any width that fits in an `i64`.
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key).and_then(MetaValue::as_i64)
    }

    /// `key` as a number of any type.
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(MetaValue::as_f64)
    }

    /// `key` as a boolean.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(MetaValue::as_bool)
    }

    /// `key` as a string.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(MetaValue::as_str)
    }

    /// `key` as an array.
    pub fn get_array(&self, key: &str) -> Option<&[MetaValue]> {
        self.get(key).and_then(MetaValue::as_array)
    }

    /// The value of `key`, or [`FormatError::MissingKey`].
    pub fn require(&self, key: &str) -> Result<&MetaValue, FormatError> {
        self.get(key)
            .ok_or_else(|| FormatError::MissingKey(key.to_string()))
    }

    /// `key` as a non-negative integer, or `MissingKey` / `WrongType`.
    pub fn require_u64(&self, key: &str) -> Result<u64, FormatError> {
        let v = self.require(key)?;
        v.as_u64()
            .ok_or_else(|| wrong_type(key, "a non-negative integer", v))
    }

    /// `key` as a number, or `MissingKey` / `WrongType`.
    pub fn require_f64(&self, key: &str) -> Result<f64, FormatError> {
        let v = self.require(key)?;
        v.as_f64().ok_or_else(|| wrong_type(key, "a number", v))
    }

    /// `key` as a string, or `MissingKey` / `WrongType`.
    pub fn require_str(&self, key: &str) -> Result<&str, FormatError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| wrong_type(key, "a string", v))
    }

    /// `key` as an array, or `MissingKey` / `WrongType`.
    pub fn require_array(&self, key: &str) -> Result<&[MetaValue], FormatError> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| wrong_type(key, "an array", v))
    }

    /// `general.architecture` ("llama", "gemma3", ...).
    pub fn architecture(&self) -> Option<&str> {
        self.get_str(KEY_ARCHITECTURE)
    }

    /// The tensor directory, in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        let &i = self.tensor_index.get(name)?;
        self.tensors.get(i)
    }

    /// The tensor called `name`, or [`FormatError::MissingTensor`].
    pub fn require_tensor(&self, name: &str) -> Result<&GgufTensorInfo, FormatError> {
        self.tensor(name)
            .ok_or_else(|| FormatError::MissingTensor(name.to_string()))
    }

    /// The bytes of tensor `t` (bounds-checked when the file was parsed).
    /// `t` must come from this file: for a tensor info this file does not
    /// hold, the result is empty.
    pub fn tensor_bytes(&self, t: &GgufTensorInfo) -> TensorBytes {
        let ours = match self.tensor(&t.name) {
            Some(ours) if ours.offset == t.offset && ours.n_bytes == t.n_bytes => ours,
            _ => return TensorBytes::empty(),
        };
        let range = usize::try_from(ours.offset).ok().and_then(|start| {
            let len = usize::try_from(ours.n_bytes).ok()?;
            Some(start..start.checked_add(len)?)
        });
        range
            .and_then(|r| TensorBytes::new(Arc::clone(&self.storage), r))
            .unwrap_or_else(TensorBytes::empty)
    }

    /// Size of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.storage.len() as u64
    }

    /// Absolute offset of the data section (tensor offsets are absolute
    /// already; this is where the section starts).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Alignment of the data section and tensor offsets.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The bytes of the whole file.
    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    /// The file's path, when it was opened from one.
    pub fn path(&self) -> Option<&Path> {
        self.storage.path()
    }
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path())
            .field("version", &self.version)
            .field("architecture", &self.architecture())
            .field("metadata_entries", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("file_len", &self.file_len())
            .finish()
    }
}

fn wrong_type(key: &str, expected: &'static str, found: &MetaValue) -> FormatError {
    FormatError::WrongType {
        key: key.to_string(),
        expected,
        found: found.type_name(),
    }
}

// ---------------------------------------------------------------------------
// Parsing.

/// Not enough bytes: `needed` bytes were wanted from `offset`.
#[derive(Clone, Copy)]
struct Short {
    offset: u64,
    needed: u64,
}

struct Header {
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

/// A tensor info as read, before its offset is made absolute.
struct RawTensor {
    info: GgufTensorInfo,
    name_at: u64,
    type_at: u64,
    offset_at: u64,
}

struct Parser<'a> {
    buf: &'a [u8],
    pos: usize,
}

type Name<'n> = &'n dyn Fn() -> String;

impl<'a> Parser<'a> {
    fn new(buf: &'a [u8]) -> Parser<'a> {
        Parser { buf, pos: 0 }
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

    fn parse(mut self) -> Result<Header, FormatError> {
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

        let file_len = self.file_len();
        let mut tensors = Vec::with_capacity(raw.len());
        for t in raw {
            tensors.push(place_tensor(t, data_offset, alignment, file_len)?);
        }

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

fn fixed_value(ty: u32, c: &[u8]) -> MetaValue {
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

fn bool_from(b: u8, at: u64, field: Name) -> Result<bool, FormatError> {
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

fn unknown_value_type(ty: u32, at: u64, field: Name) -> FormatError {
    FormatError::Invalid {
        field: field(),
        offset: at,
        reason: format!(
            "unknown metadata value type {ty} (GGUF defines types 0 to 12): the file is corrupt \
             or from a newer GGUF version, fetch the model again or upgrade Spindle"
        ),
    }
}

fn describe_value(v: &MetaValue) -> String {
    match v {
        MetaValue::Str(s) => format!("the string {s:?}"),
        MetaValue::Array(a) => format!("an array of {} elements", a.len()),
        other => format!("{other:?}"),
    }
}

fn align_up(x: u64, alignment: u64) -> Option<u64> {
    let rem = x % alignment;
    if rem == 0 {
        Some(x)
    } else {
        x.checked_add(alignment - rem)
    }
}
