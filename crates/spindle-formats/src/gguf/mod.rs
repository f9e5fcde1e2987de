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

mod metadata;
mod parser;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::dtype::{type_info, unsupported_type_name, GgmlType};
use crate::error::FormatError;
use crate::storage::{Storage, TensorBytes};

pub use metadata::MetaValue;

use metadata::wrong_type;
use parser::Parser;

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
    /// Tensors whose bytes a loader reordered ([`GgufFile::make_resident_with`]).
    rewritten: HashSet<String>,
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

    /// Parses the header of `path` without requiring the data section: for
    /// header-only copies (a file cut after the tensor infos), so a model can
    /// be planned without its weights. Tensor sizes and offsets are checked
    /// as in [`GgufFile::open`], but not that their bytes are in the file;
    /// [`GgufFile::tensor_bytes`] is empty for a tensor whose bytes are not.
    pub fn open_header_only(path: &Path) -> Result<GgufFile, FormatError> {
        let storage = Arc::new(Storage::map(path)?);
        let header = Parser::header_only(&storage).parse()?;
        Ok(GgufFile::from_header(storage, header))
    }

    /// Parses a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, FormatError> {
        GgufFile::from_storage(Arc::new(Storage::from_vec(bytes)))
    }

    /// Moves the file's bytes into a resident, huge-page backed copy (see
    /// [`Storage::resident_copy`]); tensor ranges stay the same.
    pub fn make_resident(&mut self) -> Result<(), FormatError> {
        self.make_resident_with(|_, _| false)
    }

    /// [`GgufFile::make_resident`], offering each tensor's bytes in the copy
    /// to `rewrite`, which may reorder them in place and says whether it
    /// did ([`GgufFile::is_rewritten`] remembers).
    pub fn make_resident_with(
        &mut self,
        rewrite: impl Fn(&GgufTensorInfo, &mut [u8]) -> bool,
    ) -> Result<(), FormatError> {
        let mut rewritten = HashSet::new();
        let tensors = &self.tensors;
        let copy = Storage::resident_copy_with(&self.storage, self.storage.path(), |bytes| {
            for t in tensors {
                let range = usize::try_from(t.offset).ok().and_then(|start| {
                    let end = start.checked_add(usize::try_from(t.n_bytes).ok()?)?;
                    (end <= bytes.len()).then_some(start..end)
                });
                if let Some(range) = range {
                    if rewrite(t, &mut bytes[range]) {
                        rewritten.insert(t.name.clone());
                    }
                }
            }
        })?;
        self.storage = Arc::new(copy);
        self.rewritten = rewritten;
        Ok(())
    }

    /// Whether the loader reordered tensor `name`'s bytes.
    pub fn is_rewritten(&self, name: &str) -> bool {
        self.rewritten.contains(name)
    }

    /// Parses the bytes of `storage`.
    pub fn from_storage(storage: Arc<Storage>) -> Result<GgufFile, FormatError> {
        let header = Parser::new(&storage).parse()?;
        Ok(GgufFile::from_header(storage, header))
    }

    fn from_header(storage: Arc<Storage>, header: parser::Header) -> GgufFile {
        GgufFile {
            storage,
            version: header.version,
            metadata: header.metadata,
            meta_index: header.meta_index,
            tensors: header.tensors,
            tensor_index: header.tensor_index,
            alignment: header.alignment,
            data_offset: header.data_offset,
            rewritten: HashSet::new(),
        }
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

#[cfg(test)]
mod header_only_tests {
    use super::*;

    /// A GGUF file with one metadata entry and one Q8_0 tensor of 2 rows of
    /// 32 values (68 bytes), and the length of its header with padding.
    fn file() -> (Vec<u8>, usize) {
        let mut b = Vec::new();
        let s = |b: &mut Vec<u8>, x: &str| {
            b.extend_from_slice(&(x.len() as u64).to_le_bytes());
            b.extend_from_slice(x.as_bytes());
        };
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes()); // tensors
        b.extend_from_slice(&1u64.to_le_bytes()); // metadata entries
        s(&mut b, KEY_ARCHITECTURE);
        b.extend_from_slice(&8u32.to_le_bytes()); // string
        s(&mut b, "llama");
        s(&mut b, "t");
        b.extend_from_slice(&2u32.to_le_bytes());
        b.extend_from_slice(&32u64.to_le_bytes());
        b.extend_from_slice(&2u64.to_le_bytes());
        b.extend_from_slice(&GgmlType::Q8_0.id().to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.resize(b.len().next_multiple_of(DEFAULT_ALIGNMENT as usize), 0);
        let header_len = b.len();
        b.resize(header_len + 68, 7);
        (b, header_len)
    }

    fn write(bytes: &[u8]) -> tempfile::NamedTempFile {
        use std::io::Write;
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(bytes).expect("write");
        f
    }

    #[test]
    fn header_only_copy_parses_with_sizes_but_no_bytes() {
        let (bytes, header_len) = file();
        let cut = write(&bytes[..header_len]);
        // The full parser insists on the data; the header-only one does not.
        assert!(matches!(
            GgufFile::open(cut.path()),
            Err(FormatError::Truncated { .. })
        ));
        let g = GgufFile::open_header_only(cut.path()).expect("header-only parse");
        assert_eq!(g.architecture(), Some("llama"));
        let t = g.tensor("t").expect("tensor");
        assert_eq!((t.n_bytes, t.offset), (68, header_len as u64));
        assert!(g.tensor_bytes(t).is_empty());

        // On a whole file it is the same as `open`.
        let whole = write(&bytes);
        let g = GgufFile::open_header_only(whole.path()).expect("whole file");
        let t = g.tensor("t").expect("tensor");
        assert_eq!(g.tensor_bytes(t).as_slice(), &[7u8; 68][..]);
    }

    #[test]
    fn header_only_still_rejects_a_cut_header() {
        let (bytes, header_len) = file();
        // Cut in the counts, the metadata, and the tensor's offset field
        // (which ends at byte 110; padding follows up to `header_len`).
        assert_eq!(header_len, 128);
        for len in [4, 30, 105] {
            let cut = write(&bytes[..len]);
            assert!(
                matches!(
                    GgufFile::open_header_only(cut.path()),
                    Err(FormatError::Truncated { .. })
                ),
                "cut at {len}"
            );
        }
    }
}
