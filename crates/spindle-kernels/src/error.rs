//! Errors returned by the kernels. Kernels check shapes and sizes up front and
//! report a mismatch instead of panicking.

/// An error from a kernel: bad sizes, or a type/ISA combination that is not
/// supported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// A buffer or dimension does not have the size the operation needs.
    #[error("size mismatch for {what}: expected {expected}, got {got}")]
    SizeMismatch {
        what: String,
        expected: usize,
        got: usize,
    },
    /// A length is not a whole number of blocks of the element type.
    #[error("{what}: {len} values is not a multiple of the block length {block_len}")]
    NotBlockAligned {
        what: String,
        len: usize,
        block_len: usize,
    },
    /// The operation does not support this type, ISA or shape.
    #[error("unsupported: {what}")]
    Unsupported { what: String },
}

impl KernelError {
    pub(crate) fn size(what: impl Into<String>, expected: usize, got: usize) -> Self {
        KernelError::SizeMismatch {
            what: what.into(),
            expected,
            got,
        }
    }

    pub(crate) fn unsupported(what: impl Into<String>) -> Self {
        KernelError::Unsupported { what: what.into() }
    }
}
