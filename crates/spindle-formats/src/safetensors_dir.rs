//! A Hugging Face model directory: `config.json` plus safetensors weights,
//! either one `model.safetensors` or shards listed by
//! `model.safetensors.index.json`.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use crate::dtype::GgmlType;
use crate::error::FormatError;
use crate::file_kind::{self, entry_exists};
use crate::storage::{Storage, TensorBytes};

/// The model configuration file of a Hugging Face directory.
pub const CONFIG_FILE: &str = "config.json";
/// The weights file of an unsharded model.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The shard index of a sharded model.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Whether `path` is a directory holding a `config.json`. A `config.json`
/// that is not a regular file (a FIFO, a symlink loop) counts, so that
/// opening the directory reports what is wrong with it.
pub fn is_hf_dir(path: &Path) -> bool {
    path.is_dir() && entry_exists(&path.join(CONFIG_FILE))
}

/// A parsed `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct HfConfig {
    pub raw: Value,
}

impl HfConfig {
    /// Reads and parses a `config.json`, which must hold a JSON object.
    pub fn load(path: &Path) -> Result<HfConfig, FormatError> {
        let raw = read_json(path)?;
        if !raw.is_object() {
            return Err(FormatError::Safetensors {
                path: path.to_path_buf(),
                reason: format!(
                    "config.json must hold a JSON object, not {}: the file is corrupt, fetch \
                     the model again",
                    json_kind(&raw)
                ),
            });
        }
        Ok(HfConfig { raw })
    }

    /// Wraps a parsed JSON value.
    pub fn from_value(raw: Value) -> HfConfig {
        HfConfig { raw }
    }

    /// The top-level value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.raw.get(key)
    }

    /// `key` as a non-negative integer.
    pub fn get_usize(&self, key: &str) -> Option<usize> {
        self.get(key)
            .and_then(Value::as_u64)
            .and_then(|v| usize::try_from(v).ok())
    }

    /// `key` as a number.
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Value::as_f64)
    }

    /// `key` as a string.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// `key` as a boolean.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(Value::as_bool)
    }

    /// `model_type` ("llama", "gemma3_text", ...).
    pub fn model_type(&self) -> Option<&str> {
        self.get_str("model_type")
    }

    /// For multimodal configs, whose language-model parameters sit under
    /// `text_config`: that object merged over the top level (its keys win,
    /// `text_config` itself is dropped). Without a `text_config` object, a
    /// copy of the top level.
    pub fn text_config(&self) -> HfConfig {
        let (Some(top), Some(text)) = (
            self.raw.as_object(),
            self.raw.get("text_config").and_then(Value::as_object),
        ) else {
            return self.clone();
        };
        let mut merged = top.clone();
        merged.remove("text_config");
        for (k, v) in text {
            merged.insert(k.clone(), v.clone());
        }
        HfConfig {
            raw: Value::Object(merged),
        }
    }
}

/// One tensor of a safetensors model.
#[derive(Debug, Clone)]
pub struct SafetensorsTensor {
    pub name: String,
    /// F32, F16 or BF16.
    pub ty: GgmlType,
    /// Row-major, as in the file (the last dimension is contiguous).
    pub shape: Vec<usize>,
    pub bytes: TensorBytes,
}

/// A Hugging Face model directory with its weights memory-mapped.
#[derive(Debug)]
pub struct SafetensorsModel {
    dir: PathBuf,
    config: HfConfig,
    tensors: Vec<SafetensorsTensor>,
    index: HashMap<String, usize>,
    /// Tensors whose dtype Spindle cannot use: name to dtype name.
    unsupported: HashMap<String, String>,
}

impl SafetensorsModel {
    /// Opens `dir`: parses `config.json` and maps the weights
    /// (`model.safetensors`, or the shards named by
    /// `model.safetensors.index.json`). Only file headers are read.
    ///
    /// Tensors of dtypes other than F32, F16 and BF16 do not fail the open
    /// (checkpoints often carry integer buffers the model never uses); they
    /// are absent from [`SafetensorsModel::tensor`], and
    /// [`SafetensorsModel::require_tensor`] reports them as
    /// [`FormatError::UnsupportedType`].
    pub fn open(dir: &Path) -> Result<SafetensorsModel, FormatError> {
        match file_kind::metadata(dir) {
            Ok(meta) if meta.is_dir() => {}
            // A FIFO, socket or device: name the kind.
            Ok(meta) if !meta.is_file() => {
                return Err(FormatError::WrongFileKind {
                    path: dir.to_path_buf(),
                    found: file_kind::kind_name(meta.file_type()),
                    expected: "a model directory",
                });
            }
            Err(e @ FormatError::SymlinkLoop { .. }) => return Err(e),
            _ => {
                return Err(FormatError::Safetensors {
                    path: dir.to_path_buf(),
                    reason: "not a directory: pass a Hugging Face model directory (holding \
                             config.json and *.safetensors) or a .gguf file"
                        .to_string(),
                })
            }
        }
        let config = HfConfig::load(&dir.join(CONFIG_FILE))?;

        let index_path = dir.join(INDEX_FILE);
        let single_path = dir.join(SINGLE_FILE);
        let mut model = SafetensorsModel {
            dir: dir.to_path_buf(),
            config,
            tensors: Vec::new(),
            index: HashMap::new(),
            unsupported: HashMap::new(),
        };

        // Present in any form: a FIFO or symlink loop in their place is
        // reported when read, not taken for a missing file.
        if entry_exists(&index_path) {
            let weight_map = read_weight_map(&index_path)?;
            let shards: BTreeSet<&str> = weight_map.values().map(String::as_str).collect();
            let mut shard_of = HashMap::new();
            for shard in shards {
                let path = shard_path(dir, shard, &index_path)?;
                match file_kind::require_file(&path, "a safetensors file") {
                    Err(FormatError::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        return Err(FormatError::Safetensors {
                            path,
                            reason: format!(
                                "this shard, listed in {INDEX_FILE}, is missing: the download \
                                 is incomplete, fetch the model again"
                            ),
                        });
                    }
                    r => r.map(drop)?,
                }
                for name in model.add_file(&path)? {
                    shard_of.insert(name, shard);
                }
            }
            // Every tensor the index lists must be in the shard it names.
            let mut listed: Vec<(&String, &String)> = weight_map.iter().collect();
            listed.sort();
            for (name, shard) in listed {
                if shard_of.get(name.as_str()) != Some(&shard.as_str()) {
                    return Err(FormatError::Safetensors {
                        path: dir.join(shard),
                        reason: format!(
                            "{INDEX_FILE} places tensor '{name}' in this shard, but the shard \
                             does not hold it: the download is incomplete or mixes two \
                             versions, fetch the model again"
                        ),
                    });
                }
            }
        } else if entry_exists(&single_path) {
            model.add_file(&single_path)?;
        } else {
            return Err(FormatError::Safetensors {
                path: dir.to_path_buf(),
                reason: format!(
                    "the directory has neither {SINGLE_FILE} nor {INDEX_FILE}: download the \
                     model's safetensors weights into it"
                ),
            });
        }
        Ok(model)
    }

    /// Maps and parses one safetensors file, adding its tensors. Returns the
    /// names of all tensors in it.
    fn add_file(&mut self, path: &Path) -> Result<Vec<String>, FormatError> {
        let storage = Arc::new(Storage::map(path)?);
        let bad = |reason: String| FormatError::Safetensors {
            path: path.to_path_buf(),
            reason,
        };
        let (header_len, metadata) = SafeTensors::read_metadata(&storage).map_err(|e| {
            bad(format!(
                "cannot parse the safetensors header ({e}): the file is corrupt or incomplete, \
                 fetch the model again"
            ))
        })?;
        let data_start = header_len
            .checked_add(8)
            .ok_or_else(|| bad("header length overflows".to_string()))?;

        let names = metadata.offset_keys();
        for name in &names {
            let Some(info) = metadata.info(name) else {
                continue;
            };
            if self.index.contains_key(name) || self.unsupported.contains_key(name) {
                return Err(bad(format!(
                    "tensor '{name}' is also in another shard: the directory mixes files from \
                     different downloads, fetch the model again"
                )));
            }
            let (s, e) = info.data_offsets;
            let range = data_start
                .checked_add(s)
                .zip(data_start.checked_add(e))
                .map(|(s, e)| s..e);
            let Some(bytes) = range.and_then(|r| TensorBytes::new(Arc::clone(&storage), r)) else {
                return Err(bad(format!(
                    "tensor '{name}' has data offsets {s}..{e} outside the file: the file is \
                     corrupt or incomplete, fetch the model again"
                )));
            };
            let ty = match info.dtype {
                Dtype::F32 => GgmlType::F32,
                Dtype::F16 => GgmlType::F16,
                Dtype::BF16 => GgmlType::BF16,
                other => {
                    self.unsupported.insert(name.clone(), other.to_string());
                    continue;
                }
            };
            self.index.insert(name.clone(), self.tensors.len());
            self.tensors.push(SafetensorsTensor {
                name: name.clone(),
                ty,
                shape: info.shape.clone(),
                bytes,
            });
        }
        Ok(names)
    }

    /// The parsed `config.json`.
    pub fn config(&self) -> &HfConfig {
        &self.config
    }

    /// The model directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The F32/F16/BF16 tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&SafetensorsTensor> {
        let &i = self.index.get(name)?;
        self.tensors.get(i)
    }

    /// The tensor called `name`, or [`FormatError::UnsupportedType`] when it
    /// has a dtype Spindle cannot use, or [`FormatError::MissingTensor`].
    pub fn require_tensor(&self, name: &str) -> Result<&SafetensorsTensor, FormatError> {
        if let Some(t) = self.tensor(name) {
            return Ok(t);
        }
        match self.unsupported.get(name) {
            Some(dtype) => Err(FormatError::UnsupportedType {
                tensor: name.to_string(),
                type_name: dtype.clone(),
            }),
            None => Err(FormatError::MissingTensor(name.to_string())),
        }
    }

    /// All F32/F16/BF16 tensors, shard by shard in file order.
    pub fn tensors(&self) -> impl Iterator<Item = &SafetensorsTensor> {
        self.tensors.iter()
    }

    /// Tensors skipped for their dtype: (name, dtype name).
    pub fn unsupported_tensors(&self) -> impl Iterator<Item = (&str, &str)> {
        self.unsupported
            .iter()
            .map(|(n, d)| (n.as_str(), d.as_str()))
    }
}

fn read_json(path: &Path) -> Result<Value, FormatError> {
    // fs::read of a FIFO would block.
    file_kind::require_file(path, "a JSON file")?;
    let text = fs::read(path).map_err(|source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&text).map_err(|source| FormatError::Json {
        path: path.to_path_buf(),
        source,
    })
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The `weight_map` of a shard index: tensor name to shard file name.
fn read_weight_map(path: &Path) -> Result<HashMap<String, String>, FormatError> {
    let raw = read_json(path)?;
    let bad = |reason: String| FormatError::Safetensors {
        path: path.to_path_buf(),
        reason,
    };
    let Some(map) = raw.get("weight_map").and_then(Value::as_object) else {
        return Err(bad(
            "it has no \"weight_map\" object: the file is corrupt, fetch the model again"
                .to_string(),
        ));
    };
    let mut out = HashMap::with_capacity(map.len());
    for (name, shard) in map {
        let Some(shard) = shard.as_str() else {
            return Err(bad(format!(
                "weight_map entry '{name}' is {}, not a file name: the file is corrupt, fetch \
                 the model again",
                json_kind(shard)
            )));
        };
        out.insert(name.clone(), shard.to_string());
    }
    Ok(out)
}

/// The path of shard `name`, which must stay inside `dir`.
fn shard_path(dir: &Path, name: &str, index_path: &Path) -> Result<PathBuf, FormatError> {
    let rel = Path::new(name);
    let inside = !name.is_empty() && rel.components().all(|c| matches!(c, Component::Normal(_)));
    if !inside {
        return Err(FormatError::Safetensors {
            path: index_path.to_path_buf(),
            reason: format!(
                "shard name {name:?} is not a file inside the model directory: the index is \
                 corrupt or malicious, fetch the model again"
            ),
        });
    }
    Ok(dir.join(rel))
}
