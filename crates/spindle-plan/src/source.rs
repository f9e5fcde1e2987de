//! Reading weight sizes from headers only: GGUF tensor infos, and the
//! 8-byte length and JSON header of each safetensors file. Tensor data is
//! never read, so header-only copies of the files plan like the real ones.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Read;
use std::path::{Component, Path};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use spindle_formats::GgufFile;

use crate::error::PlanError;

/// The unsharded safetensors file of a Hugging Face directory.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The shard index of a sharded one.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Largest safetensors JSON header accepted (the format's own limit), so a
/// corrupt length cannot make us allocate gigabytes.
const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

/// Which file format the weights are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightFormat {
    Gguf,
    Safetensors,
    /// No weight files were read (a shape from `config.json` alone).
    None,
}

/// Weight sizes as the headers declare them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightStats {
    pub format: WeightFormat,
    /// Sum of every tensor's bytes.
    pub bytes: u64,
    /// Bytes per element type name ("Q4_K", "BF16", ...).
    pub by_type: BTreeMap<String, u64>,
    pub tensors: u64,
    /// Bytes of the token embedding matrix.
    pub embedding_bytes: u64,
    /// Bytes of a separate output head; 0 when the head is the embedding.
    pub output_head_bytes: u64,
    /// Element type of the output head (of the embedding when they are tied).
    #[serde(default)]
    pub head_type: Option<String>,
    /// Bytes of tensors a text decoder never reads (vision and audio towers
    /// of multimodal checkpoints).
    pub non_language_bytes: u64,
    /// Elements of the 2-D tensors inside decoder layers: the matmuls every
    /// token goes through (embedding and head excluded).
    pub layer_matmul_params: u64,
    /// Bytes of the experts' matrices of mixture-of-experts layers
    /// (GGUF's stacked `*_exps` tensors, Hugging Face's `.experts.`);
    /// part of `bytes`.
    #[serde(default)]
    pub expert_bytes: u64,
    /// Elements of those matrices (not in `layer_matmul_params`).
    #[serde(default)]
    pub expert_matmul_params: u64,
    /// Elements of 1-D tensors (norms, biases), which the engine keeps as
    /// f32 copies.
    pub vector_params: u64,
    /// Whether any decoder matmul has a quantized type: those multiply
    /// int8-quantized activations, which need their own scratch.
    pub quantized_matmuls: bool,
    /// File bytes that are not tensor data: headers and alignment padding
    /// (from the tensor offsets, so exact for header-only copies too).
    pub file_overhead_bytes: u64,
}

impl WeightStats {
    /// No weights (a shape read from `config.json` alone).
    pub fn empty() -> WeightStats {
        WeightStats {
            format: WeightFormat::None,
            bytes: 0,
            by_type: BTreeMap::new(),
            tensors: 0,
            embedding_bytes: 0,
            output_head_bytes: 0,
            head_type: None,
            non_language_bytes: 0,
            layer_matmul_params: 0,
            expert_bytes: 0,
            expert_matmul_params: 0,
            vector_params: 0,
            quantized_matmuls: false,
            file_overhead_bytes: 0,
        }
    }

    /// Whether the file holds a separate output head.
    pub fn has_output_head(&self) -> bool {
        self.output_head_bytes > 0
    }

    /// Weight bytes one decode step streams from memory: every decoder
    /// matrix and the output head once. An untied embedding is not counted
    /// (a step reads one row of it per token, negligible), and a tied one is
    /// counted once, as the head it also is.
    pub fn decode_read_bytes(&self) -> u64 {
        let unread_embedding = if self.has_output_head() {
            self.embedding_bytes
        } else {
            0
        };
        self.bytes
            .saturating_sub(unread_embedding)
            .saturating_sub(self.non_language_bytes)
    }

    fn add(&mut self, t: &TensorEntry<'_>) {
        self.bytes = self.bytes.saturating_add(t.bytes);
        *self.by_type.entry(t.type_name.to_string()).or_default() += t.bytes;
        self.tensors += 1;
        let elements = t.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let elements = elements.unwrap_or(u64::MAX);
        match t.role {
            Role::Embedding => {
                self.embedding_bytes += t.bytes;
                if self.output_head_bytes == 0 {
                    self.head_type = Some(t.type_name.to_string());
                }
            }
            Role::OutputHead => {
                self.output_head_bytes += t.bytes;
                self.head_type = Some(t.type_name.to_string());
            }
            Role::NonLanguage => self.non_language_bytes += t.bytes,
            Role::Expert if t.dims.len() >= 2 => {
                self.expert_bytes = self.expert_bytes.saturating_add(t.bytes);
                self.expert_matmul_params = self.expert_matmul_params.saturating_add(elements);
                self.quantized_matmuls |= !matches!(t.type_name, "F32" | "F16" | "BF16");
            }
            Role::Layer if t.dims.len() == 2 => {
                self.layer_matmul_params = self.layer_matmul_params.saturating_add(elements);
                self.quantized_matmuls |= !matches!(t.type_name, "F32" | "F16" | "BF16");
            }
            Role::Layer | Role::Expert | Role::Other => {}
        }
        if t.dims.len() == 1 && t.role != Role::NonLanguage {
            self.vector_params = self.vector_params.saturating_add(elements);
        }
    }
}

/// What a tensor is to the decoder, from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Embedding,
    OutputHead,
    Layer,
    /// A matrix of one or all experts of a layer.
    Expert,
    NonLanguage,
    Other,
}

struct TensorEntry<'a> {
    type_name: &'a str,
    dims: &'a [u64],
    bytes: u64,
    role: Role,
}

fn gguf_role(name: &str) -> Role {
    match name {
        "token_embd.weight" => Role::Embedding,
        "output.weight" => Role::OutputHead,
        _ if name.starts_with("blk.") && name.contains("_exps.") => Role::Expert,
        _ if name.starts_with("blk.") => Role::Layer,
        _ => Role::Other,
    }
}

fn hf_role(name: &str) -> Role {
    const NON_LANGUAGE: [&str; 6] = [
        "vision_tower",
        "vision_model",
        "multi_modal_projector",
        "audio_tower",
        "embed_vision",
        "visual.",
    ];
    if NON_LANGUAGE.iter().any(|p| name.contains(p)) {
        Role::NonLanguage
    } else if name.ends_with("embed_tokens.weight") {
        Role::Embedding
    } else if name.ends_with("lm_head.weight") {
        Role::OutputHead
    } else if name.contains(".layers.") && name.contains(".experts.") {
        Role::Expert
    } else if name.contains(".layers.") {
        Role::Layer
    } else {
        Role::Other
    }
}

/// Weight sizes from a GGUF header (tensor infos).
pub fn gguf_weights(gguf: &GgufFile) -> WeightStats {
    let mut stats = WeightStats {
        format: WeightFormat::Gguf,
        ..WeightStats::empty()
    };
    // Tensor offsets are absolute: the furthest end is the file's length.
    let mut file_end = gguf.data_offset();
    for t in gguf.tensors() {
        let type_name = t.type_name();
        stats.add(&TensorEntry {
            type_name: &type_name,
            dims: &t.dims,
            bytes: t.n_bytes,
            role: gguf_role(&t.name),
        });
        file_end = file_end.max(t.offset.saturating_add(t.n_bytes));
    }
    stats.file_overhead_bytes = file_end.saturating_sub(stats.bytes);
    stats
}

/// One tensor of a safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderTensor {
    pub name: String,
    pub dtype: String,
    /// Row-major, outermost first.
    pub shape: Vec<u64>,
    pub bytes: u64,
}

/// Bytes per element of a safetensors dtype, when the dtype is known.
fn dtype_bytes(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "F64" | "I64" | "U64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "I8" | "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => 1,
        _ => return None,
    })
}

/// Reads the header of one safetensors file: the little-endian `u64`
/// length, then that many bytes of JSON. Nothing after it is read, and the
/// data it describes need not be in the file. Returns the tensors and the
/// header's size in bytes (length field included).
pub fn read_safetensors_header(path: &Path) -> Result<(Vec<HeaderTensor>, u64), PlanError> {
    let bad = |reason: String| PlanError::safetensors(path, reason);
    let mut file = File::open(path).map_err(|e| PlanError::io(path, e))?;
    let file_len = file.metadata().map_err(|e| PlanError::io(path, e))?.len();
    let mut len_bytes = [0u8; 8];
    if file_len < 8 {
        return Err(bad(format!(
            "the file has {file_len} bytes, fewer than the 8 of its header length: the download \
             is incomplete, fetch the model again"
        )));
    }
    file.read_exact(&mut len_bytes)
        .map_err(|e| PlanError::io(path, e))?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_SAFETENSORS_HEADER {
        return Err(bad(format!(
            "the header length field says {header_len} bytes, more than the format allows \
             ({MAX_SAFETENSORS_HEADER}): the file is corrupt or not safetensors"
        )));
    }
    if header_len > file_len - 8 {
        return Err(bad(format!(
            "the header is truncated: it declares {header_len} bytes but the file has only {} \
             after the length field; fetch the model again (a header-only copy must keep the \
             whole header)",
            file_len - 8
        )));
    }
    let mut json = vec![0u8; header_len as usize];
    file.read_exact(&mut json)
        .map_err(|e| PlanError::io(path, e))?;
    let value: Value = serde_json::from_slice(&json).map_err(|e| {
        bad(format!(
            "the JSON header does not parse ({e}): the file is corrupt, fetch the model again"
        ))
    })?;
    let Value::Object(entries) = value else {
        return Err(bad(
            "the JSON header is not an object: the file is corrupt, fetch the model again".into(),
        ));
    };
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, info) in &entries {
        if name == "__metadata__" {
            continue;
        }
        tensors.push(header_tensor(name, info).map_err(bad)?);
    }
    Ok((tensors, 8 + header_len))
}

/// One tensor entry: `{"dtype": "BF16", "shape": [..], "data_offsets": [s, e]}`.
fn header_tensor(name: &str, info: &Value) -> Result<HeaderTensor, String> {
    let broken = |what: &str| {
        format!("tensor '{name}' has {what}: the file is corrupt, fetch the model again")
    };
    let dtype = info
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| broken("no \"dtype\" string"))?;
    let shape = info
        .get("shape")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>())
        .ok_or_else(|| broken("no \"shape\" list of non-negative integers"))?;
    let offsets = info
        .get("data_offsets")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>())
        .filter(|o| o.len() == 2 && o[0] <= o[1])
        .ok_or_else(|| broken("no valid \"data_offsets\" [start, end]"))?;
    let bytes = offsets[1] - offsets[0];
    // The offsets give the size of any dtype; for known ones, check them.
    if let Some(size) = dtype_bytes(dtype) {
        let want = shape
            .iter()
            .try_fold(size, |a, &d| a.checked_mul(d))
            .ok_or_else(|| broken("a shape too large to count"))?;
        if want != bytes {
            return Err(broken(&format!(
                "shape {shape:?} of {dtype} ({want} bytes) but data offsets spanning {bytes} bytes"
            )));
        }
    }
    Ok(HeaderTensor {
        name: name.to_string(),
        dtype: dtype.to_string(),
        shape,
        bytes,
    })
}

/// The safetensors files of a Hugging Face directory: the shards named by
/// `model.safetensors.index.json`, or `model.safetensors`.
pub fn safetensors_files(dir: &Path) -> Result<Vec<std::path::PathBuf>, PlanError> {
    let index = dir.join(INDEX_FILE);
    if index.is_file() {
        let text = std::fs::read(&index).map_err(|e| PlanError::io(&index, e))?;
        let bad = |reason: String| PlanError::safetensors(&index, reason);
        let value: Value = serde_json::from_slice(&text).map_err(|e| {
            bad(format!(
                "the index does not parse ({e}): the file is corrupt, fetch the model again"
            ))
        })?;
        let map = value
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("the index has no \"weight_map\" object".into()))?;
        let mut shards = BTreeSet::new();
        for (tensor, shard) in map {
            let shard = shard
                .as_str()
                .ok_or_else(|| bad(format!("weight_map entry '{tensor}' is not a file name")))?;
            let plain = Path::new(shard)
                .components()
                .all(|c| matches!(c, Component::Normal(_)));
            if shard.is_empty() || !plain {
                return Err(bad(format!(
                    "shard name {shard:?} is not a file inside the model directory"
                )));
            }
            shards.insert(shard.to_string());
        }
        let mut files = Vec::with_capacity(shards.len());
        for shard in shards {
            let path = dir.join(&shard);
            if !path.is_file() {
                return Err(PlanError::safetensors(
                    &path,
                    format!(
                        "this shard, listed in {INDEX_FILE}, is missing: download it (its header \
                         alone is enough to plan)"
                    ),
                ));
            }
            files.push(path);
        }
        return Ok(files);
    }
    let single = dir.join(SINGLE_FILE);
    if single.is_file() {
        return Ok(vec![single]);
    }
    Err(PlanError::NoWeights {
        dir: dir.to_path_buf(),
    })
}

/// Weight sizes from the headers of `files`.
pub fn safetensors_weights(files: &[std::path::PathBuf]) -> Result<WeightStats, PlanError> {
    let mut stats = WeightStats {
        format: WeightFormat::Safetensors,
        ..WeightStats::empty()
    };
    let mut seen = BTreeSet::new();
    for path in files {
        let (tensors, header_bytes) = read_safetensors_header(path)?;
        stats.file_overhead_bytes += header_bytes;
        for t in &tensors {
            if !seen.insert(t.name.clone()) {
                return Err(PlanError::safetensors(
                    path,
                    format!(
                        "tensor '{}' is also in another shard: the directory mixes files of \
                         different downloads, fetch the model again",
                        t.name
                    ),
                ));
            }
            stats.add(&TensorEntry {
                type_name: &t.dtype,
                dims: &t.shape,
                bytes: t.bytes,
                role: hf_role(&t.name),
            });
        }
    }
    Ok(stats)
}

/// Rows of the token embedding in safetensors headers (its vocabulary
/// size), for configs that leave `vocab_size` to a default.
pub fn safetensors_vocab(files: &[std::path::PathBuf]) -> Option<u64> {
    files.iter().find_map(|path| {
        let (tensors, _) = read_safetensors_header(path).ok()?;
        tensors
            .iter()
            .find(|t| hf_role(&t.name) == Role::Embedding)
            .and_then(|t| t.shape.first().copied())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_from_names() {
        assert_eq!(gguf_role("token_embd.weight"), Role::Embedding);
        assert_eq!(gguf_role("output.weight"), Role::OutputHead);
        assert_eq!(gguf_role("blk.3.ffn_up.weight"), Role::Layer);
        assert_eq!(gguf_role("output_norm.weight"), Role::Other);
        assert_eq!(hf_role("model.embed_tokens.weight"), Role::Embedding);
        assert_eq!(
            hf_role("model.language_model.embed_tokens.weight"),
            Role::Embedding
        );
        assert_eq!(hf_role("lm_head.weight"), Role::OutputHead);
        assert_eq!(
            hf_role("model.layers.0.self_attn.q_proj.weight"),
            Role::Layer
        );
        assert_eq!(
            hf_role("vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"),
            Role::NonLanguage
        );
    }

    #[test]
    fn decode_reads_a_tied_embedding_once_and_skips_an_untied_one() {
        let mut s = WeightStats::empty();
        s.bytes = 1000;
        s.embedding_bytes = 300;
        assert_eq!(s.decode_read_bytes(), 1000);
        s.bytes = 1300;
        s.output_head_bytes = 300;
        assert_eq!(s.decode_read_bytes(), 1000);
    }
}
