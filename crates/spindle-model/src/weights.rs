//! A model's weights, read from GGUF or safetensors without copying matrices.
//!
//! Tensors are named as in GGUF (`blk.N.attn_q.weight`); a safetensors
//! directory is read through a map from those names to Hugging Face's.

use spindle_formats::{GgmlType, GgufFile, SafetensorsModel, TensorBytes};
use spindle_kernels::{WeightLayout, WeightView};

use crate::arch::Family;
use crate::config::ModelConfig;
use crate::error::ModelError;

/// A 2-D weight: `rows` output features of `cols` inputs, row-major.
#[derive(Clone)]
pub struct Matrix {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: TensorBytes,
    /// The order of `data`: the file's, or rewritten at load for the
    /// VNNI kernel (`spindle_kernels::quant::vertical`).
    pub layout: WeightLayout,
}

impl Matrix {
    pub fn view(&self) -> WeightView<'_> {
        WeightView {
            ty: self.ty,
            rows: self.rows,
            cols: self.cols,
            data: &self.data,
            layout: self.layout,
        }
    }

    pub fn n_bytes(&self) -> usize {
        self.data.len()
    }
}

/// The weights of one decoder layer (cheap to clone: matrices are ranges of
/// shared storage).
#[derive(Clone)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    /// Bias of the output projection (gpt-oss).
    pub bo: Option<Vec<f32>>,
    /// Per query head, a logit that joins every softmax of the layer's
    /// attention without a value (gpt-oss's attention sinks).
    pub attn_sinks: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn: FeedForward,
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// A layer's feed-forward block: one gated MLP, or a router over experts.
#[derive(Clone)]
pub enum FeedForward {
    Dense {
        gate: Matrix,
        up: Matrix,
        down: Matrix,
    },
    Experts(ExpertWeights),
}

/// The router and the experts of a mixture-of-experts layer; expert `j`'s
/// matrices are element `j` of each list (ranges of one stacked tensor in
/// GGUF, one tensor each in safetensors).
#[derive(Clone)]
pub struct ExpertWeights {
    /// `n_experts` rows: one router logit per expert.
    pub router: Matrix,
    pub router_bias: Option<Vec<f32>>,
    pub gate: Vec<Matrix>,
    pub up: Vec<Matrix>,
    pub down: Vec<Matrix>,
    /// Per expert, the biases of its projections (gpt-oss).
    pub gate_bias: Option<Vec<Vec<f32>>>,
    pub up_bias: Option<Vec<Vec<f32>>>,
    pub down_bias: Option<Vec<Vec<f32>>>,
}

/// Experts read from fused tensors, before the router joins them.
struct FusedExperts {
    gate: Vec<Matrix>,
    up: Vec<Matrix>,
    down: Vec<Matrix>,
    gate_bias: Option<Vec<Vec<f32>>>,
    up_bias: Option<Vec<Vec<f32>>>,
    down_bias: Option<Vec<Vec<f32>>>,
}

impl FusedExperts {
    fn with_router(self, router: Matrix, router_bias: Option<Vec<f32>>) -> ExpertWeights {
        let FusedExperts {
            gate,
            up,
            down,
            gate_bias,
            up_bias,
            down_bias,
        } = self;
        ExpertWeights {
            router,
            router_bias,
            gate,
            up,
            down,
            gate_bias,
            up_bias,
            down_bias,
        }
    }
}

impl FeedForward {
    /// The matrices one token reads: all of a dense block; the router and
    /// `n_used` experts (the first ones stand for any: experts are alike
    /// in size) of a mixture.
    pub fn matrices_per_token(&self, n_used: usize) -> Vec<&Matrix> {
        match self {
            FeedForward::Dense { gate, up, down } => vec![gate, up, down],
            FeedForward::Experts(x) => std::iter::once(&x.router)
                .chain(
                    (0..n_used.min(x.gate.len())).flat_map(|j| [&x.gate[j], &x.up[j], &x.down[j]]),
                )
                .collect(),
        }
    }

    /// Every matrix of the block.
    pub fn matrices(&self) -> Vec<&Matrix> {
        match self {
            FeedForward::Dense { gate, up, down } => vec![gate, up, down],
            FeedForward::Experts(x) => std::iter::once(&x.router)
                .chain(x.gate.iter())
                .chain(x.up.iter())
                .chain(x.down.iter())
                .collect(),
        }
    }
}

/// All weights of a model.
#[derive(Clone)]
pub struct Weights {
    pub embed: Matrix,
    pub output: Matrix,
    pub output_norm: Vec<f32>,
    pub layers: Vec<LayerWeights>,
    /// Llama 3 per-frequency divisors as the GGUF converter stored them.
    pub rope_freqs: Option<Vec<f32>>,
}

impl Weights {
    /// Bytes of every distinct matrix (a head tied to the embedding, or
    /// any matrix shared between slots, counted once).
    pub fn distinct_bytes(&self) -> usize {
        let mut seen = std::collections::HashSet::new();
        [&self.embed, &self.output]
            .into_iter()
            .chain(self.layers.iter().flat_map(|l| {
                [&l.wq, &l.wk, &l.wv, &l.wo]
                    .into_iter()
                    .chain(l.ffn.matrices())
            }))
            .filter(|m| seen.insert((m.data.as_ptr(), m.data.len())))
            .map(Matrix::n_bytes)
            .sum()
    }
}

/// Where tensors come from.
pub enum TensorSource<'a> {
    Gguf(&'a GgufFile),
    Safetensors(&'a SafetensorsModel),
}

struct Raw {
    ty: GgmlType,
    /// Row-major shape, outermost first.
    shape: Vec<usize>,
    data: TensorBytes,
    layout: WeightLayout,
}

impl Raw {
    /// The first block whose f16 scale is not finite, in a tensor in the
    /// file's order (a rewritten one was checked before its rewrite).
    fn bad_scale(&self) -> Option<(usize, f32)> {
        match self.layout {
            WeightLayout::Gguf => spindle_kernels::first_bad_scale(self.ty, &self.data),
            WeightLayout::Vertical | WeightLayout::Panels => None,
        }
    }
}

impl TensorSource<'_> {
    fn raw(&self, name: &str) -> Result<Option<Raw>, ModelError> {
        match self {
            TensorSource::Gguf(g) => {
                let Some(t) = g.tensor(name) else {
                    return Ok(None);
                };
                let ty = t.ty()?;
                let shape: Vec<usize> = t.dims.iter().rev().map(|&d| d as usize).collect();
                // The loader rewrites layer matrices and the output head
                // (`output.weight`, or the embeddings it is tied to).
                let head = name == "output.weight" || name == "token_embd.weight";
                let layout = match (g.is_rewritten(name), &shape[..]) {
                    (false, _) => WeightLayout::Gguf,
                    (true, &[rows, cols])
                        if head && crate::loader::head_in_panels(ty, rows, cols) =>
                    {
                        WeightLayout::Panels
                    }
                    (true, &[rows, cols])
                        if !head && crate::loader::layer_in_panels(ty, rows, cols) =>
                    {
                        WeightLayout::Panels
                    }
                    (true, _) => WeightLayout::Vertical,
                };
                Ok(Some(Raw {
                    ty,
                    shape,
                    data: g.tensor_bytes(t),
                    layout,
                }))
            }
            TensorSource::Safetensors(st) => {
                for hf in hf_names(name) {
                    if let Some(t) = st.tensor(&hf) {
                        return Ok(Some(Raw {
                            ty: t.ty,
                            shape: t.shape.clone(),
                            data: t.bytes.clone(),
                            layout: WeightLayout::Gguf,
                        }));
                    }
                }
                Ok(None)
            }
        }
    }

    fn arch(&self) -> String {
        match self {
            TensorSource::Gguf(g) => g.architecture().unwrap_or("?").to_string(),
            TensorSource::Safetensors(_) => "safetensors".into(),
        }
    }

    fn missing(&self, name: &str) -> ModelError {
        ModelError::MissingTensor {
            name: name.into(),
            arch: self.arch(),
        }
    }

    fn matrix_opt(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Option<Matrix>, ModelError> {
        let Some(raw) = self.raw(name)? else {
            return Ok(None);
        };
        if raw.shape != [rows, cols] {
            return Err(ModelError::BadShape {
                name: name.into(),
                got: raw.shape,
                want: vec![rows, cols],
            });
        }
        // Two bytes a block: cheap beside the load's own copy of the file,
        // and a corrupt scale would make every logit it touches NaN. (A
        // rewritten matrix was checked before its rewrite.)
        if let Some((block, value)) = raw.bad_scale() {
            return Err(ModelError::NonFiniteScale {
                name: name.into(),
                block,
                value,
            });
        }
        Ok(Some(Matrix {
            name: name.into(),
            ty: raw.ty,
            rows,
            cols,
            data: raw.data,
            layout: raw.layout,
        }))
    }

    /// The `n` experts' `rows x cols` matrices of layer `layer`'s
    /// `stem` (`ffn_gate_exps`, ...): slices of GGUF's stacked tensor, or
    /// one safetensors tensor each.
    fn expert_matrices(
        &self,
        layer: usize,
        stem: &str,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<Matrix>, ModelError> {
        let name = format!("blk.{layer}.{stem}.weight");
        match self {
            TensorSource::Gguf(_) => {
                let Some(raw) = self.raw(&name)? else {
                    return Err(self.missing(&name));
                };
                if raw.shape != [n, rows, cols] || raw.data.len() % n != 0 {
                    return Err(ModelError::BadShape {
                        name,
                        got: raw.shape,
                        want: vec![n, rows, cols],
                    });
                }
                if let Some((block, value)) = raw.bad_scale() {
                    return Err(ModelError::NonFiniteScale { name, block, value });
                }
                let per = raw.data.len() / n;
                (0..n)
                    .map(|j| {
                        let data = raw.data.slice(j * per..(j + 1) * per).ok_or_else(|| {
                            ModelError::BadShape {
                                name: name.clone(),
                                got: vec![raw.data.len()],
                                want: vec![n, rows, cols],
                            }
                        })?;
                        Ok(Matrix {
                            name: format!("{name}[{j}]"),
                            ty: raw.ty,
                            rows,
                            cols,
                            data,
                            layout: raw.layout,
                        })
                    })
                    .collect()
            }
            TensorSource::Safetensors(_) => (0..n)
                .map(|j| self.matrix(&format!("blk.{layer}.{stem}.{j}.weight"), rows, cols))
                .collect(),
        }
    }

    /// Per expert, `len` bias values from a stacked `[n, len]` tensor.
    fn expert_biases(
        &self,
        name: &str,
        n: usize,
        len: usize,
    ) -> Result<Option<Vec<Vec<f32>>>, ModelError> {
        Ok(self
            .vector_opt(name, n * len, 0.0)?
            .map(|all| all.chunks_exact(len).map(<[f32]>::to_vec).collect()))
    }

    /// gpt-oss's experts as transformers stores them: `gate_up_proj`
    /// `[n, cols, 2 x rows]` with gate and up interleaved (even and odd
    /// outputs) and `down_proj` `[n, rows, cols]`, both input-major, so
    /// they are transposed into f32 matrices of their own here. `None` for
    /// a GGUF file or a checkpoint without them.
    fn fused_hf_experts(
        &self,
        layer: usize,
        n: usize,
        ff: usize,
        cols: usize,
    ) -> Result<Option<FusedExperts>, ModelError> {
        let TensorSource::Safetensors(st) = self else {
            return Ok(None);
        };
        let find = |stem: &str| {
            ["model.", "model.language_model."]
                .iter()
                .map(|p| format!("{p}layers.{layer}.mlp.experts.{stem}"))
                .find_map(|name| st.tensor(&name).map(|t| (name, t)))
        };
        let Some((gu_name, gate_up)) = find("gate_up_proj") else {
            return Ok(None);
        };
        if find("gate_up_proj_blocks").is_some() {
            return Err(ModelError::Unsupported(format!(
                "{gu_name} is stored as MXFP4 blocks in safetensors; convert the model \
                 to GGUF (llama.cpp's convert_hf_to_gguf.py keeps MXFP4) and load that"
            )));
        }
        let (dn_name, down) = find("down_proj").ok_or_else(|| self.missing("down_proj"))?;
        let values = |name: &str, t: &spindle_formats::SafetensorsTensor, want: [usize; 3]| {
            if t.shape != want {
                return Err(ModelError::BadShape {
                    name: name.into(),
                    got: t.shape.clone(),
                    want: want.to_vec(),
                });
            }
            let mut out = vec![0.0f32; want.iter().product()];
            spindle_kernels::dequantize(t.ty, &t.bytes, &mut out)?;
            Ok(out)
        };
        let gu = values(&gu_name, gate_up, [n, cols, 2 * ff])?;
        let dn = values(&dn_name, down, [n, ff, cols])?;
        let f32_matrix = |name: String, rows: usize, cols: usize, v: Vec<f32>| Matrix {
            name,
            ty: GgmlType::F32,
            rows,
            cols,
            data: TensorBytes::from_vec(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            layout: WeightLayout::Gguf,
        };
        let (mut gate, mut up, mut down) = (Vec::new(), Vec::new(), Vec::new());
        for j in 0..n {
            let gu = &gu[j * cols * 2 * ff..(j + 1) * cols * 2 * ff];
            let pick = |odd: usize| -> Vec<f32> {
                (0..ff)
                    .flat_map(|r| (0..cols).map(move |c| gu[c * 2 * ff + 2 * r + odd]))
                    .collect()
            };
            gate.push(f32_matrix(
                format!("{gu_name}[{j}].gate"),
                ff,
                cols,
                pick(0),
            ));
            up.push(f32_matrix(format!("{gu_name}[{j}].up"), ff, cols, pick(1)));
            let dn = &dn[j * ff * cols..(j + 1) * ff * cols];
            let t: Vec<f32> = (0..cols)
                .flat_map(|r| (0..ff).map(move |c| dn[c * cols + r]))
                .collect();
            down.push(f32_matrix(format!("{dn_name}[{j}]"), cols, ff, t));
        }
        let bias = |stem: &str, len: usize| -> Result<Option<Vec<f32>>, ModelError> {
            let Some((name, t)) = find(stem) else {
                return Ok(None);
            };
            if t.shape != [n, len] {
                return Err(ModelError::BadShape {
                    name,
                    got: t.shape.clone(),
                    want: vec![n, len],
                });
            }
            let mut out = vec![0.0f32; n * len];
            spindle_kernels::dequantize(t.ty, &t.bytes, &mut out)?;
            Ok(Some(out))
        };
        let gu_bias = bias("gate_up_proj_bias", 2 * ff)?;
        let split = |odd: usize| {
            gu_bias.as_ref().map(|b| {
                b.chunks_exact(2 * ff)
                    .map(|e| e.iter().skip(odd).step_by(2).copied().collect())
                    .collect()
            })
        };
        Ok(Some(FusedExperts {
            gate,
            up,
            down,
            gate_bias: split(0),
            up_bias: split(1),
            down_bias: bias("down_proj_bias", cols)?
                .map(|b| b.chunks_exact(cols).map(<[f32]>::to_vec).collect()),
        }))
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix, ModelError> {
        self.matrix_opt(name, rows, cols)?
            .ok_or_else(|| self.missing(name))
    }

    /// A 1-D tensor as f32, plus `offset` (Gemma norms from safetensors).
    pub(crate) fn vector_opt(
        &self,
        name: &str,
        len: usize,
        offset: f32,
    ) -> Result<Option<Vec<f32>>, ModelError> {
        let Some(raw) = self.raw(name)? else {
            return Ok(None);
        };
        if raw.shape.iter().product::<usize>() != len {
            return Err(ModelError::BadShape {
                name: name.into(),
                got: raw.shape,
                want: vec![len],
            });
        }
        let mut out = vec![0.0f32; len];
        spindle_kernels::dequantize(raw.ty, &raw.data, &mut out)?;
        // Norms and biases are small: a NaN or an infinity in one would turn
        // every logit into NaN and the output into one repeated token.
        if let Some(i) = out.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::NonFinite {
                name: name.into(),
                index: i,
                value: out[i],
            });
        }
        if offset != 0.0 {
            out.iter_mut().for_each(|v| *v += offset);
        }
        Ok(Some(out))
    }

    fn vector(&self, name: &str, len: usize, offset: f32) -> Result<Vec<f32>, ModelError> {
        self.vector_opt(name, len, offset)?
            .ok_or_else(|| self.missing(name))
    }

    /// The first tensor whose name contains one of `parts`.
    fn first_name_containing(&self, parts: &[&str]) -> Option<String> {
        let hit = |n: &str| parts.iter().any(|p| n.contains(p));
        match self {
            TensorSource::Gguf(g) => g
                .tensors()
                .iter()
                .map(|t| &t.name)
                .find(|n| hit(n))
                .cloned(),
            TensorSource::Safetensors(st) => {
                st.tensors().map(|t| &t.name).find(|n| hit(n)).cloned()
            }
        }
    }

    fn is_safetensors(&self) -> bool {
        matches!(self, TensorSource::Safetensors(_))
    }
}

impl Weights {
    pub fn load(src: &TensorSource<'_>, cfg: &ModelConfig) -> Result<Self, ModelError> {
        if let Some(name) = src.first_name_containing(&["_shexp", "shared_expert"]) {
            return Err(ModelError::Unsupported(format!(
                "tensor '{name}' is a shared expert, which Spindle does not run yet \
                 (Qwen2-MoE, DeepSeek and Llama 4 style mixtures)"
            )));
        }
        let arch = &cfg.arch;
        let norm_offset = if src.is_safetensors() {
            arch.hf_norm_offset
        } else {
            0.0
        };
        let (e, q, kv, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        let embed = src.matrix("token_embd.weight", cfg.vocab_size, e)?;
        let output = match src.matrix_opt("output.weight", cfg.vocab_size, e)? {
            Some(m) => m,
            None => embed.clone(),
        };
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{l}.{s}");
            let norm = |s: &str| src.vector(&n(s), e, norm_offset);
            let sandwich = |s: &str| -> Result<Option<Vec<f32>>, ModelError> {
                if arch.sandwich_norms {
                    norm(s).map(Some)
                } else {
                    Ok(None)
                }
            };
            let bias = |s: &str, len: usize| src.vector_opt(&n(s), len, 0.0);
            let head_norm = |s: &str| -> Result<Option<Vec<f32>>, ModelError> {
                if arch.qk_norm {
                    src.vector(&n(s), cfg.head_dim, norm_offset).map(Some)
                } else {
                    Ok(None)
                }
            };
            // Phi-3 fuses q, k and v into one matrix, and gate and up into
            // another: their rows are the parts in order, so each part is a
            // range of the fused bytes.
            let fused = arch.family == Family::Phi3;
            let [wq, wk, wv] = if fused {
                split_rows(
                    src.matrix(&n("attn_qkv.weight"), q + 2 * kv, e)?,
                    [q, kv, kv],
                )?
            } else {
                [
                    src.matrix(&n("attn_q.weight"), q, e)?,
                    src.matrix(&n("attn_k.weight"), kv, e)?,
                    src.matrix(&n("attn_v.weight"), kv, e)?,
                ]
            };
            layers.push(LayerWeights {
                attn_norm: norm("attn_norm.weight")?,
                wq,
                wk,
                wv,
                wo: src.matrix(&n("attn_output.weight"), e, q)?,
                bq: bias("attn_q.bias", q)?,
                bk: bias("attn_k.bias", kv)?,
                bv: bias("attn_v.bias", kv)?,
                bo: bias("attn_output.bias", e)?,
                attn_sinks: bias("attn_sinks.weight", cfg.n_head)?,
                q_norm: head_norm("attn_q_norm.weight")?,
                k_norm: head_norm("attn_k_norm.weight")?,
                // Only sandwich-norm families have these; for Llama the Hugging Face
                // name `post_attention_layernorm` means the pre-FFN norm.
                post_attn_norm: sandwich("post_attention_norm.weight")?,
                // llama.cpp names gpt-oss's pre-FFN norm after its place.
                ffn_norm: norm(if arch.family == Family::GptOss && !src.is_safetensors() {
                    "post_attention_norm.weight"
                } else {
                    "ffn_norm.weight"
                })?,
                ffn: match &cfg.moe {
                    None if fused => {
                        let [gate, up] =
                            split_rows(src.matrix(&n("ffn_up.weight"), 2 * ff, e)?, [ff, ff])?;
                        FeedForward::Dense {
                            gate,
                            up,
                            down: src.matrix(&n("ffn_down.weight"), e, ff)?,
                        }
                    }
                    None => FeedForward::Dense {
                        gate: src.matrix(&n("ffn_gate.weight"), ff, e)?,
                        up: src.matrix(&n("ffn_up.weight"), ff, e)?,
                        down: src.matrix(&n("ffn_down.weight"), e, ff)?,
                    },
                    Some(moe) => {
                        let (x, xff) = (moe.n_experts, moe.n_ff);
                        let router = src.matrix(&n("ffn_gate_inp.weight"), x, e)?;
                        let router_bias = bias("ffn_gate_inp.bias", x)?;
                        FeedForward::Experts(match src.fused_hf_experts(l, x, xff, e)? {
                            Some(fused) => fused.with_router(router, router_bias),
                            None => ExpertWeights {
                                router,
                                router_bias,
                                gate: src.expert_matrices(l, "ffn_gate_exps", x, xff, e)?,
                                up: src.expert_matrices(l, "ffn_up_exps", x, xff, e)?,
                                down: src.expert_matrices(l, "ffn_down_exps", x, e, xff)?,
                                gate_bias: src.expert_biases(&n("ffn_gate_exps.bias"), x, xff)?,
                                up_bias: src.expert_biases(&n("ffn_up_exps.bias"), x, xff)?,
                                down_bias: src.expert_biases(&n("ffn_down_exps.bias"), x, e)?,
                            },
                        })
                    }
                },
                post_ffn_norm: sandwich("post_ffw_norm.weight")?,
            });
        }
        let rope_freqs = if matches!(
            cfg.arch.family,
            Family::Llama | Family::Mistral | Family::Mixtral
        ) {
            src.vector_opt("rope_freqs.weight", cfg.head_dim / 2, 0.0)?
        } else {
            None
        };
        Ok(Weights {
            embed,
            output,
            output_norm: src.vector("output_norm.weight", e, norm_offset)?,
            layers,
            rope_freqs,
        })
    }

    /// Bytes of every matrix read once per decode pass (the output head once).
    /// Weights in the layers' matrices (not the embedding or the head):
    /// one multiply-accumulate each per prompt token.
    /// For a mixture of experts, the router and the `n_used` experts a
    /// token reads.
    pub fn layer_matrix_values(&self, n_used: usize) -> usize {
        self.layer_matrices_per_token(n_used)
            .map(|m| m.rows * m.cols)
            .sum()
    }

    /// Bytes one token's pass reads from the matrices: the layers' (the
    /// router and `n_used` experts of a mixture) and the head's.
    pub fn matrix_bytes(&self, n_used: usize) -> usize {
        self.layer_matrices_per_token(n_used)
            .map(Matrix::n_bytes)
            .sum::<usize>()
            + self.output.n_bytes()
    }

    /// How many of the layers' matrices the loader rewrote into the
    /// vertical layout, and how many there are (benchmarks print it).
    pub fn vertical_layer_matrices(&self) -> (usize, usize) {
        self.layer_matrices_in(WeightLayout::Vertical)
    }

    /// How many of the layers' matrices the loader rewrote into panels of
    /// 16 rows, and how many there are.
    pub fn panel_layer_matrices(&self) -> (usize, usize) {
        self.layer_matrices_in(WeightLayout::Panels)
    }

    fn layer_matrices_in(&self, layout: WeightLayout) -> (usize, usize) {
        let all: Vec<&Matrix> = self
            .layers
            .iter()
            .flat_map(|l| {
                [&l.wq, &l.wk, &l.wv, &l.wo]
                    .into_iter()
                    .chain(l.ffn.matrices())
            })
            .collect();
        let count = all.iter().filter(|m| m.layout == layout).count();
        (count, all.len())
    }

    fn layer_matrices_per_token(&self, n_used: usize) -> impl Iterator<Item = &Matrix> {
        self.layers.iter().flat_map(move |l| {
            [&l.wq, &l.wk, &l.wv, &l.wo]
                .into_iter()
                .chain(l.ffn.matrices_per_token(n_used))
        })
    }
}

/// The row ranges `parts` of a fused matrix, in order, as matrices of
/// their own (no copy: each is a range of the fused bytes).
fn split_rows<const N: usize>(m: Matrix, parts: [usize; N]) -> Result<[Matrix; N], ModelError> {
    let row_bytes = m.data.len() / m.rows.max(1);
    let mut start = 0;
    let mut out = Vec::with_capacity(N);
    for (i, rows) in parts.into_iter().enumerate() {
        let bytes = start * row_bytes..(start + rows) * row_bytes;
        let data = m.data.slice(bytes).ok_or_else(|| ModelError::BadShape {
            name: m.name.clone(),
            got: vec![m.rows, m.cols],
            want: vec![parts.iter().sum(), m.cols],
        })?;
        out.push(Matrix {
            name: format!("{}[part {i}]", m.name),
            ty: m.ty,
            rows,
            cols: m.cols,
            data,
            layout: m.layout,
        });
        start += rows;
    }
    Ok(out
        .try_into()
        .unwrap_or_else(|_| unreachable!("N parts were pushed")))
}

/// Hugging Face names for a GGUF tensor name, most likely first.
fn hf_names(gguf_name: &str) -> Vec<String> {
    const PREFIXES: [&str; 3] = ["model.", "model.language_model.", "language_model.model."];
    let with_prefixes = |rest: &str| {
        PREFIXES
            .iter()
            .map(|p| format!("{p}{rest}"))
            .collect::<Vec<_>>()
    };
    match gguf_name {
        "token_embd.weight" => with_prefixes("embed_tokens.weight"),
        "output_norm.weight" => with_prefixes("norm.weight"),
        "output.weight" => vec![
            "lm_head.weight".into(),
            "language_model.lm_head.weight".into(),
        ],
        _ => {
            let Some(rest) = gguf_name.strip_prefix("blk.") else {
                return vec![];
            };
            let Some((layer, tail)) = rest.split_once('.') else {
                return vec![];
            };
            let (stem, suffix) = tail.rsplit_once('.').unwrap_or((tail, "weight"));
            let hf: &[&str] = match stem {
                "attn_norm" => &["input_layernorm"],
                "attn_q" => &["self_attn.q_proj"],
                "attn_k" => &["self_attn.k_proj"],
                "attn_v" => &["self_attn.v_proj"],
                "attn_output" => &["self_attn.o_proj"],
                "attn_q_norm" => &["self_attn.q_norm"],
                "attn_k_norm" => &["self_attn.k_norm"],
                // Gemma: a norm after attention; Llama's `post_attention_layernorm` is its pre-FFN norm.
                "post_attention_norm" => &["post_attention_layernorm"],
                "ffn_norm" => &["pre_feedforward_layernorm", "post_attention_layernorm"],
                "post_ffw_norm" => &["post_feedforward_layernorm"],
                "ffn_gate" => &["mlp.gate_proj"],
                // Phi-3 fuses gate and up (GGUF's ffn_up holds both).
                "ffn_up" => &["mlp.up_proj", "mlp.gate_up_proj"],
                "attn_qkv" => &["self_attn.qkv_proj"],
                "ffn_down" => &["mlp.down_proj"],
                "ffn_gate_inp" => &["mlp.gate", "block_sparse_moe.gate", "mlp.router"],
                // gpt-oss: the sinks have no `.weight` suffix.
                "attn_sinks" => {
                    return with_prefixes(&format!("layers.{layer}.self_attn.sinks"));
                }
                _ => return hf_expert_names(layer, stem, suffix, &with_prefixes),
            };
            hf.iter()
                .flat_map(|h| with_prefixes(&format!("layers.{layer}.{h}.{suffix}")))
                .collect()
        }
    }
}

/// Hugging Face names of one expert's matrix, from Spindle's per-expert
/// name `ffn_{gate,up,down}_exps.{j}` (GGUF stacks the experts in one
/// tensor; Hugging Face checkpoints keep one per expert).
fn hf_expert_names(
    layer: &str,
    stem: &str,
    suffix: &str,
    with_prefixes: &dyn Fn(&str) -> Vec<String>,
) -> Vec<String> {
    let Some((kind, j)) = stem.split_once('.') else {
        return vec![];
    };
    let names: [&str; 2] = match kind {
        // Qwen3-MoE's names, then Mixtral's.
        "ffn_gate_exps" => ["gate_proj", "w1"],
        "ffn_up_exps" => ["up_proj", "w3"],
        "ffn_down_exps" => ["down_proj", "w2"],
        _ => return vec![],
    };
    let mut out = with_prefixes(&format!(
        "layers.{layer}.mlp.experts.{j}.{}.{suffix}",
        names[0]
    ));
    out.extend(with_prefixes(&format!(
        "layers.{layer}.block_sparse_moe.experts.{j}.{}.{suffix}",
        names[1]
    )));
    out
}
