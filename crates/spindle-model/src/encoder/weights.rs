//! A BERT encoder's weights, by llama.cpp's GGUF names or Hugging Face's
//! (with or without the `bert.` prefix of task models).

use half::f16;
use spindle_formats::{GgmlType, GgufFile, SafetensorsModel, TensorBytes};
use spindle_kernels::float_panels::PanelMatrix;
use spindle_kernels::WeightLayout;

use super::config::EncoderConfig;
use crate::error::ModelError;
use crate::weights::Matrix;

/// A matrix as an encoder pass multiplies it: float weights (F32, F16,
/// BF16) widened to f32 and packed for `float_panels` (near the FMA peak at
/// an encoder's batch sizes, the same bits on every ISA), others as loaded
/// for the int8 kernels.
pub enum EncoderMatrix {
    Panels { from: GgmlType, m: PanelMatrix },
    Quantized(Matrix),
}

impl EncoderMatrix {
    /// `m` in its pass form.
    fn new(m: Matrix) -> Result<EncoderMatrix, ModelError> {
        if !matches!(m.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            return Ok(EncoderMatrix::Quantized(m));
        }
        let row_bytes = m.data.len() / m.rows.max(1);
        let packed = PanelMatrix::from_rows(m.rows, m.cols, |r, dst| {
            spindle_kernels::dequantize(m.ty, &m.data[r * row_bytes..(r + 1) * row_bytes], dst)
        })?;
        Ok(EncoderMatrix::Panels {
            from: m.ty,
            m: packed,
        })
    }

    /// The type the weights came in (or were converted to).
    pub fn ty(&self) -> GgmlType {
        match self {
            EncoderMatrix::Panels { from, .. } => *from,
            EncoderMatrix::Quantized(m) => m.ty,
        }
    }

    /// Outputs per row.
    pub fn rows(&self) -> usize {
        match self {
            EncoderMatrix::Panels { m, .. } => m.rows(),
            EncoderMatrix::Quantized(m) => m.rows,
        }
    }
}

/// One encoder layer. Q, K and V are one matrix (`qkv`: rows Q, then K,
/// then V), so a layer runs one matmul for all three.
pub struct EncoderLayer {
    pub qkv: EncoderMatrix,
    pub qkv_bias: Vec<f32>,
    pub out: EncoderMatrix,
    pub out_bias: Vec<f32>,
    pub attn_norm: (Vec<f32>, Vec<f32>),
    pub up: EncoderMatrix,
    pub up_bias: Vec<f32>,
    pub down: EncoderMatrix,
    pub down_bias: Vec<f32>,
    pub out_norm: (Vec<f32>, Vec<f32>),
}

/// A cross-encoder's head: BERT's pooler (`tanh(W · h_cls + b)`) and the
/// classifier over it. llama.cpp's converter drops BERT's pooler, so a GGUF
/// may have none: the classifier then reads the `[CLS]` row itself, as
/// llama.cpp computes it.
pub struct Classifier {
    pub pooler: Option<(EncoderMatrix, Vec<f32>)>,
    pub out: EncoderMatrix,
    pub out_bias: Vec<f32>,
}

pub struct EncoderWeights {
    /// `vocab x hidden`, in the file's type (rows dequantized on lookup).
    pub tokens: Matrix,
    pub positions: Vec<f32>,
    pub token_types: Vec<f32>,
    pub embed_norm: (Vec<f32>, Vec<f32>),
    pub layers: Vec<EncoderLayer>,
    pub classifier: Option<Classifier>,
}

/// Where an encoder's tensors come from.
pub enum EncoderSource<'a> {
    Gguf(&'a GgufFile),
    Safetensors(&'a SafetensorsModel),
}

struct Found {
    ty: GgmlType,
    /// Outermost first.
    shape: Vec<usize>,
    data: TensorBytes,
}

impl EncoderSource<'_> {
    fn find(&self, gguf: &str, hf: &str) -> Result<Found, ModelError> {
        let found = match self {
            EncoderSource::Gguf(g) => match g.tensor(gguf) {
                Some(t) => Some(Found {
                    ty: t.ty()?,
                    shape: t.dims.iter().rev().map(|&d| d as usize).collect(),
                    data: g.tensor_bytes(t),
                }),
                None => None,
            },
            EncoderSource::Safetensors(st) => [hf.to_string(), format!("bert.{hf}")]
                .iter()
                .find_map(|name| st.tensor(name))
                .map(|t| Found {
                    ty: t.ty,
                    shape: t.shape.clone(),
                    data: t.bytes.clone(),
                }),
        };
        found.ok_or_else(|| ModelError::MissingTensor {
            name: match self {
                EncoderSource::Gguf(_) => gguf.into(),
                EncoderSource::Safetensors(_) => hf.into(),
            },
            arch: "bert".into(),
        })
    }

    fn matrix(&self, gguf: &str, hf: &str, rows: usize, cols: usize) -> Result<Matrix, ModelError> {
        let f = self.find(gguf, hf)?;
        if f.shape != [rows, cols] {
            return Err(ModelError::BadShape {
                name: gguf.into(),
                got: f.shape,
                want: vec![rows, cols],
            });
        }
        Ok(Matrix {
            name: gguf.into(),
            ty: f.ty,
            rows,
            cols,
            data: f.data,
            layout: WeightLayout::Gguf,
        })
    }

    /// A float tensor of `len` values (any shape), as f32.
    fn values(&self, gguf: &str, hf: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let f = self.find(gguf, hf)?;
        if f.shape.iter().product::<usize>() != len {
            return Err(ModelError::BadShape {
                name: gguf.into(),
                got: f.shape,
                want: vec![len],
            });
        }
        let mut out = vec![0.0; len];
        spindle_kernels::dequantize(f.ty, &f.data, &mut out)?;
        if let Some(index) = out.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::NonFinite {
                name: gguf.into(),
                index,
                value: out[index],
            });
        }
        Ok(out)
    }

    fn norm(&self, gguf: &str, hf: &str, len: usize) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        Ok((
            self.values(&format!("{gguf}.weight"), &format!("{hf}.weight"), len)?,
            self.values(&format!("{gguf}.bias"), &format!("{hf}.bias"), len)?,
        ))
    }
}

impl EncoderWeights {
    /// Reads every tensor; `quantize` converts the layer matrices to that
    /// type (Q8_0) on the way.
    pub fn load(
        src: &EncoderSource<'_>,
        c: &EncoderConfig,
        quantize: Option<GgmlType>,
    ) -> Result<EncoderWeights, ModelError> {
        let h = c.hidden;
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let g = |s: &str| format!("blk.{i}.{s}");
            let f = |s: &str| format!("encoder.layer.{i}.{s}");
            let q = src.matrix(&g("attn_q.weight"), &f("attention.self.query.weight"), h, h)?;
            let k = src.matrix(&g("attn_k.weight"), &f("attention.self.key.weight"), h, h)?;
            let v = src.matrix(&g("attn_v.weight"), &f("attention.self.value.weight"), h, h)?;
            let mut qkv_bias = src.values(&g("attn_q.bias"), &f("attention.self.query.bias"), h)?;
            qkv_bias.extend(src.values(&g("attn_k.bias"), &f("attention.self.key.bias"), h)?);
            qkv_bias.extend(src.values(&g("attn_v.bias"), &f("attention.self.value.bias"), h)?);
            let prep = |m: Matrix| EncoderMatrix::new(convert(m, quantize)?);
            layers.push(EncoderLayer {
                qkv: prep(stack(&g("attn_qkv.weight"), &[q, k, v])?)?,
                qkv_bias,
                out: prep(src.matrix(
                    &g("attn_output.weight"),
                    &f("attention.output.dense.weight"),
                    h,
                    h,
                )?)?,
                out_bias: src.values(
                    &g("attn_output.bias"),
                    &f("attention.output.dense.bias"),
                    h,
                )?,
                attn_norm: src.norm(&g("attn_output_norm"), &f("attention.output.LayerNorm"), h)?,
                up: prep(src.matrix(
                    &g("ffn_up.weight"),
                    &f("intermediate.dense.weight"),
                    c.ffn,
                    h,
                )?)?,
                up_bias: src.values(&g("ffn_up.bias"), &f("intermediate.dense.bias"), c.ffn)?,
                down: prep(src.matrix(
                    &g("ffn_down.weight"),
                    &f("output.dense.weight"),
                    h,
                    c.ffn,
                )?)?,
                down_bias: src.values(&g("ffn_down.bias"), &f("output.dense.bias"), h)?,
                out_norm: src.norm(&g("layer_output_norm"), &f("output.LayerNorm"), h)?,
            });
        }
        let classifier = match c.classifier_labels {
            None => None,
            Some(labels) => Some(Classifier {
                pooler: match src {
                    EncoderSource::Gguf(g) if g.tensor("cls.weight").is_none() => None,
                    _ => Some((
                        EncoderMatrix::new(src.matrix(
                            "cls.weight",
                            "pooler.dense.weight",
                            h,
                            h,
                        )?)?,
                        src.values("cls.bias", "pooler.dense.bias", h)?,
                    )),
                },
                out: EncoderMatrix::new(src.matrix(
                    "cls.output.weight",
                    "classifier.weight",
                    labels,
                    h,
                )?)?,
                out_bias: src.values("cls.output.bias", "classifier.bias", labels)?,
            }),
        };
        let tokens = src.matrix(
            "token_embd.weight",
            "embeddings.word_embeddings.weight",
            c.vocab,
            h,
        )?;
        Ok(EncoderWeights {
            tokens,
            positions: src.values(
                "position_embd.weight",
                "embeddings.position_embeddings.weight",
                c.max_positions * h,
            )?,
            token_types: src.values(
                "token_types.weight",
                "embeddings.token_type_embeddings.weight",
                c.type_vocab.max(1) * h,
            )?,
            embed_norm: src.norm("token_embd_norm", "embeddings.LayerNorm", h)?,
            layers,
            classifier,
        })
    }
}

/// Matrices of one type and width, one under the other.
fn stack(name: &str, parts: &[Matrix]) -> Result<Matrix, ModelError> {
    let first = &parts[0];
    if parts
        .iter()
        .any(|m| m.ty != first.ty || m.cols != first.cols)
    {
        return Err(ModelError::Unsupported(format!(
            "{name}: Q, K and V in different types or widths"
        )));
    }
    let mut bytes = Vec::with_capacity(parts.iter().map(Matrix::n_bytes).sum());
    for m in parts {
        bytes.extend_from_slice(&m.data);
    }
    Ok(Matrix {
        name: name.into(),
        ty: first.ty,
        rows: parts.iter().map(|m| m.rows).sum(),
        cols: first.cols,
        data: TensorBytes::from_vec(bytes),
        layout: WeightLayout::Gguf,
    })
}

/// `m` in `to` (only Q8_0 is offered: blocks of 32 rounded as GGUF's
/// quantizer rounds them); unchanged without `to` or when already so.
fn convert(m: Matrix, to: Option<GgmlType>) -> Result<Matrix, ModelError> {
    let Some(to) = to else { return Ok(m) };
    if to == m.ty {
        return Ok(m);
    }
    if to != GgmlType::Q8_0 || !m.cols.is_multiple_of(32) {
        return Err(ModelError::Unsupported(format!(
            "converting {} ({} x {}) to {to}: encoders convert float matrices to q8_0",
            m.name, m.rows, m.cols
        )));
    }
    let mut row = vec![0.0f32; m.cols];
    let src_row = m.data.len() / m.rows.max(1);
    let mut bytes = Vec::with_capacity(m.rows * m.cols / 32 * 34);
    for r in 0..m.rows {
        spindle_kernels::dequantize(m.ty, &m.data[r * src_row..(r + 1) * src_row], &mut row)?;
        for block in row.chunks_exact(32) {
            let b = spindle_kernels::attention::BlockQ8::quantize(block);
            bytes.extend_from_slice(&f16::to_le_bytes(b.d));
            bytes.extend(b.qs.iter().map(|&q| q as u8));
        }
    }
    Ok(Matrix {
        name: m.name,
        ty: GgmlType::Q8_0,
        rows: m.rows,
        cols: m.cols,
        data: TensorBytes::from_vec(bytes),
        layout: WeightLayout::Gguf,
    })
}
