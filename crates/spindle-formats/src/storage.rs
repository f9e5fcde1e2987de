//! Shared, immutable bytes of a model file: a memory map or an owned buffer.

use std::fmt;
use std::fs::File;
use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use crate::error::FormatError;
use crate::file_kind::require_file;

/// Alignment of owned buffers, so that tensor data inside them is aligned as
/// well as it would be in a memory map (GGUF aligns tensors to 32 bytes).
pub const OWNED_ALIGN: usize = 64;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Chunk([u8; OWNED_ALIGN]);

/// A heap buffer whose start is aligned to [`OWNED_ALIGN`] bytes.
struct AlignedBuf {
    chunks: Vec<Chunk>,
    len: usize,
}

impl AlignedBuf {
    fn copy_from(bytes: &[u8]) -> AlignedBuf {
        let mut chunks = vec![Chunk([0; OWNED_ALIGN]); bytes.len().div_ceil(OWNED_ALIGN)];
        for (chunk, src) in chunks.iter_mut().zip(bytes.chunks(OWNED_ALIGN)) {
            chunk.0[..src.len()].copy_from_slice(src);
        }
        AlignedBuf {
            chunks,
            len: bytes.len(),
        }
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: `Chunk` is `repr(C)` around a `[u8; 64]` with no padding
        // (size 64 == align 64), so `chunks` is `chunks.len() * 64` initialised
        // contiguous bytes, and `len <= chunks.len() * 64` by construction.
        unsafe { std::slice::from_raw_parts(self.chunks.as_ptr().cast::<u8>(), self.len) }
    }
}

enum Inner {
    Mmap(Mmap),
    Owned(AlignedBuf),
}

/// The bytes of a whole model file: either a read-only memory map of it or
/// an owned, 64-byte-aligned copy. Shared between tensors via `Arc`.
pub struct Storage {
    inner: Inner,
    path: Option<PathBuf>,
}

impl Storage {
    /// Memory-maps `path` read-only. Nothing is read yet: pages are loaded
    /// from disk only when their bytes are touched.
    pub fn map(path: &Path) -> Result<Storage, FormatError> {
        let io = |source| FormatError::Io {
            path: path.to_path_buf(),
            source,
        };
        // Checked first: open() on a FIFO blocks until a writer appears.
        require_file(path, "a model file")?;
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only. As with every memory-mapped reader,
        // the file must not be truncated or rewritten while it is mapped;
        // model files are not modified in place.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Ok(Storage {
            inner: Inner::Mmap(map),
            path: Some(path.to_path_buf()),
        })
    }

    /// A private, resident copy of `bytes` in anonymous memory that asks the
    /// kernel for transparent huge pages. Decoding streams every weight once
    /// per token; with 4 KiB file pages that costs a TLB miss every 4 KiB,
    /// with 2 MiB pages almost none (see docs/PERF.md).
    pub fn resident_copy(bytes: &[u8], path: Option<&Path>) -> Result<Storage, FormatError> {
        Storage::resident_copy_with(bytes, path, |_| {})
    }

    /// [`Storage::resident_copy`], with `rewrite` given the copy's bytes
    /// before they become read-only (a loader reorders weights there).
    pub fn resident_copy_with(
        bytes: &[u8],
        path: Option<&Path>,
        rewrite: impl FnOnce(&mut [u8]),
    ) -> Result<Storage, FormatError> {
        let io = |source| FormatError::Io {
            path: path.map_or_else(PathBuf::new, Path::to_path_buf),
            source,
        };
        let mut map = memmap2::MmapMut::map_anon(bytes.len().max(1)).map_err(io)?;
        #[cfg(target_os = "linux")]
        {
            // Advice only: without huge pages the copy still works.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        // Read from the file where there is one: copying from the map would
        // first fault every file page into this process, so its peak
        // resident memory would count the weights twice (the planner
        // predicts one copy). The page cache does not count.
        match path {
            Some(p) => {
                use std::io::Read;
                require_file(p, "a model file")?;
                File::open(p)
                    .and_then(|mut f| f.read_exact(&mut map[..bytes.len()]))
                    .map_err(io)?;
            }
            None => map[..bytes.len()].copy_from_slice(bytes),
        }
        rewrite(&mut map[..bytes.len()]);
        let map = map.make_read_only().map_err(io)?;
        Ok(Storage {
            inner: Inner::Mmap(map),
            path: path.map(Path::to_path_buf),
        })
    }

    /// Owned bytes (copied once into an aligned buffer).
    pub fn from_vec(bytes: Vec<u8>) -> Storage {
        Storage::from_slice(&bytes)
    }

    /// Owned copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> Storage {
        Storage {
            inner: Inner::Owned(AlignedBuf::copy_from(bytes)),
            path: None,
        }
    }

    /// The file this storage maps, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Whether the bytes are a memory map (rather than an owned buffer).
    pub fn is_mapped(&self) -> bool {
        matches!(self.inner, Inner::Mmap(_))
    }

    fn bytes(&self) -> &[u8] {
        match &self.inner {
            Inner::Mmap(m) => m,
            Inner::Owned(b) => b.as_slice(),
        }
    }
}

impl Deref for Storage {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.bytes()
    }
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Storage")
            .field("mapped", &self.is_mapped())
            .field("path", &self.path)
            .field("len", &self.len())
            .finish()
    }
}

/// The bytes of one tensor: a range of a shared [`Storage`]. Cheap to clone.
#[derive(Clone)]
pub struct TensorBytes {
    storage: Arc<Storage>,
    range: Range<usize>,
}

impl TensorBytes {
    /// The bytes `range` of `storage`, or `None` when the range is not inside
    /// it.
    pub fn new(storage: Arc<Storage>, range: Range<usize>) -> Option<TensorBytes> {
        if range.start > range.end || range.end > storage.len() {
            return None;
        }
        Some(TensorBytes { storage, range })
    }

    /// Owned bytes not backed by a file (for tests and converted tensors).
    pub fn from_vec(bytes: Vec<u8>) -> TensorBytes {
        let len = bytes.len();
        TensorBytes {
            storage: Arc::new(Storage::from_vec(bytes)),
            range: 0..len,
        }
    }

    /// No bytes.
    pub fn empty() -> TensorBytes {
        TensorBytes::from_vec(Vec::new())
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // In bounds: checked when constructed, and storage never shrinks.
        self.storage.get(self.range.clone()).unwrap_or(&[])
    }

    /// The sub-range `range` (relative to these bytes), or `None` when it is
    /// not inside them.
    pub fn slice(&self, range: Range<usize>) -> Option<TensorBytes> {
        if range.start > range.end || range.end > self.len() {
            return None;
        }
        Some(TensorBytes {
            storage: Arc::clone(&self.storage),
            range: self.range.start + range.start..self.range.start + range.end,
        })
    }

    /// The storage these bytes live in.
    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    /// Where these bytes sit in their storage.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }
}

impl Deref for TensorBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for TensorBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl fmt::Debug for TensorBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorBytes")
            .field("range", &self.range)
            .field("storage", &self.storage)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_storage_is_aligned_and_exact() {
        for n in [0usize, 1, 63, 64, 65, 1000] {
            let v: Vec<u8> = (0..n).map(|i| i as u8).collect();
            let s = Storage::from_vec(v.clone());
            assert_eq!(&s[..], &v[..]);
            assert_eq!(s.as_ptr() as usize % OWNED_ALIGN, 0);
        }
    }

    #[test]
    fn tensor_bytes_ranges_are_checked() {
        let s = Arc::new(Storage::from_vec((0..10).collect()));
        assert!(TensorBytes::new(s.clone(), 0..11).is_none());
        #[allow(clippy::reversed_empty_ranges)]
        let bad = 5..4;
        assert!(TensorBytes::new(s.clone(), bad).is_none());
        let t = TensorBytes::new(s, 2..8).unwrap();
        assert_eq!(&t[..], &[2, 3, 4, 5, 6, 7]);
        let u = t.slice(1..3).unwrap();
        assert_eq!(&u[..], &[3, 4]);
        assert!(t.slice(0..7).is_none());
        assert_eq!(TensorBytes::empty().len(), 0);
    }
}
