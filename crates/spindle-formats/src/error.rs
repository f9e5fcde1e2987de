//! The one error type of this crate. Every message says what is wrong and
//! what the user can do about it.

use std::path::PathBuf;

use crate::header_shape::HeaderSource;

/// An error reading a model file or directory.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The file or directory could not be read.
    #[error("cannot read {}: {source}; check that the path exists and is readable", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A symbolic link on the path leads back to itself.
    #[error(
        "{} is a symlink loop (too many levels of symbolic links): a link on this path points \
         back to itself; point it at the model file",
        path.display()
    )]
    SymlinkLoop { path: PathBuf },

    /// The path exists but is the wrong kind of entry: a FIFO, socket or
    /// device (which cannot be memory-mapped, and a FIFO would block the
    /// open), or a directory where a file belongs.
    #[error(
        "{} is {found}, not {expected}: pass a .gguf file or a Hugging Face model directory \
         (config.json + *.safetensors)",
        path.display()
    )]
    WrongFileKind {
        path: PathBuf,
        found: &'static str,
        expected: &'static str,
    },

    /// The file ends before a field it declares. `offset` is where the field
    /// starts and `needed` how many bytes it takes from there.
    #[error(
        "file is truncated at byte {offset} while reading {field} (needs {needed} bytes from there, \
         file has {file_len} bytes, {} left): the download is incomplete or the file is corrupt, \
         fetch the model again",
        file_len.saturating_sub(*offset)
    )]
    Truncated {
        field: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },

    /// The file does not start with `GGUF`.
    #[error(
        "not a GGUF file: it starts with bytes {:02x} {:02x} {:02x} {:02x} ({:?}) instead of \"GGUF\"; \
         pass a .gguf model file or a Hugging Face model directory",
        found[0], found[1], found[2], found[3], String::from_utf8_lossy(found)
    )]
    BadMagic { found: [u8; 4] },

    /// A GGUF version other than 2 or 3.
    #[error("{}", version_message(*.0))]
    UnsupportedVersion(u32),

    /// A field holds a value that breaks the format's rules.
    #[error("invalid {field} at byte {offset}: {reason}")]
    Invalid {
        field: String,
        offset: u64,
        reason: String,
    },

    /// A tensor uses an element type Spindle cannot compute with.
    #[error(
        "tensor '{tensor}' has type {type_name}, which Spindle cannot compute with; \
         supported types are F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K to Q6_K, \
         IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, \
         Q1_0, Q2_0 and MXFP4: use a model quantized to one of these (e.g. Q4_K_M or Q8_0)"
    )]
    UnsupportedType { tensor: String, type_name: String },

    /// A tensor the model needs is not in the file.
    #[error(
        "tensor '{0}' is missing from the model file: the file is incomplete or is for a \
         different architecture than its metadata says"
    )]
    MissingTensor(String),

    /// A metadata key the model needs is not in the file.
    #[error(
        "metadata key '{0}' is missing: the file was made by an incompatible converter, \
         re-convert it with a current llama.cpp or fetch another copy"
    )]
    MissingKey(String),

    /// A metadata key holds a value of the wrong type.
    #[error(
        "metadata key '{key}' holds {found} but {expected} was expected: the file was made by an \
         incompatible converter, re-convert it with a current llama.cpp"
    )]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },

    /// A JSON file (config.json, the safetensors index) is malformed.
    #[error("cannot parse {}: {source}; the file is corrupt, fetch the model again", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// A hyper-parameter the model's shape needs is missing from a GGUF
    /// header or `config.json`, or holds a value of another type.
    #[error("key '{key}' in {origin}: it is missing or not {expected}{}", missing_hint(*origin))]
    MissingHeaderKey {
        key: String,
        origin: HeaderSource,
        expected: &'static str,
    },

    /// A hyper-parameter in a GGUF header or `config.json` holds a value no
    /// model can have.
    #[error("key '{key}' in {origin}: {reason}")]
    BadHeaderValue {
        key: String,
        origin: HeaderSource,
        reason: String,
    },

    /// A safetensors file or model directory is malformed or incomplete.
    #[error("bad safetensors model at {}: {reason}", path.display())]
    Safetensors { path: PathBuf, reason: String },
}

fn missing_hint(origin: HeaderSource) -> &'static str {
    match origin {
        HeaderSource::Gguf => ": re-convert the model with a current llama.cpp",
        HeaderSource::HfConfig => {
            "; the config is incomplete or for a model that is not a decoder-only language model"
        }
    }
}

fn version_message(v: u32) -> String {
    match v {
        0 | 1 => format!(
            "GGUF version {v} is no longer supported (Spindle reads versions 2 and 3): \
             re-convert the model with a current llama.cpp or download a newer file"
        ),
        _ if matches!(v.swap_bytes(), 2 | 3) => format!(
            "GGUF version field reads {v}, which looks like a big-endian GGUF file; Spindle reads \
             only little-endian GGUF: download the little-endian version of the model"
        ),
        _ => format!(
            "GGUF version {v} is not supported (Spindle reads versions 2 and 3): the file is \
             newer than this Spindle or corrupt; upgrade Spindle or fetch the model again"
        ),
    }
}
