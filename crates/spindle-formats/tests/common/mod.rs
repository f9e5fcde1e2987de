//! A small GGUF writer for tests: builds valid (or deliberately broken)
//! GGUF bytes.

#![allow(dead_code)]

use spindle_formats::MetaValue;

// Metadata value type ids.
pub const T_U8: u32 = 0;
pub const T_I8: u32 = 1;
pub const T_U16: u32 = 2;
pub const T_I16: u32 = 3;
pub const T_U32: u32 = 4;
pub const T_I32: u32 = 5;
pub const T_F32: u32 = 6;
pub const T_BOOL: u32 = 7;
pub const T_STRING: u32 = 8;
pub const T_ARRAY: u32 = 9;
pub const T_U64: u32 = 10;
pub const T_I64: u32 = 11;
pub const T_F64: u32 = 12;

pub fn type_id_of(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => T_U8,
        MetaValue::I8(_) => T_I8,
        MetaValue::U16(_) => T_U16,
        MetaValue::I16(_) => T_I16,
        MetaValue::U32(_) => T_U32,
        MetaValue::I32(_) => T_I32,
        MetaValue::U64(_) => T_U64,
        MetaValue::I64(_) => T_I64,
        MetaValue::F32(_) => T_F32,
        MetaValue::F64(_) => T_F64,
        MetaValue::Bool(_) => T_BOOL,
        MetaValue::Str(_) => T_STRING,
        MetaValue::Array(_) => T_ARRAY,
    }
}

/// Little-endian byte sink.
#[derive(Default, Clone)]
pub struct W {
    pub buf: Vec<u8>,
}

impl W {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }
    /// A GGUF string: u64 length, bytes.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.raw_str(s.as_bytes())
    }
    pub fn raw_str(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).bytes(s)
    }
    /// The payload of a value (no type id).
    pub fn value(&mut self, v: &MetaValue) -> &mut Self {
        match v {
            MetaValue::U8(x) => self.bytes(&x.to_le_bytes()),
            MetaValue::I8(x) => self.bytes(&x.to_le_bytes()),
            MetaValue::U16(x) => self.bytes(&x.to_le_bytes()),
            MetaValue::I16(x) => self.bytes(&x.to_le_bytes()),
            MetaValue::U32(x) => self.bytes(&x.to_le_bytes()),
            MetaValue::I32(x) => self.bytes(&x.to_le_bytes()),
            MetaValue::U64(x) => self.bytes(&x.to_le_bytes()),
            MetaValue::I64(x) => self.bytes(&x.to_le_bytes()),
            MetaValue::F32(x) => self.bytes(&x.to_le_bytes()),
            MetaValue::F64(x) => self.bytes(&x.to_le_bytes()),
            MetaValue::Bool(x) => self.u8(*x as u8),
            MetaValue::Str(s) => self.str(s),
            MetaValue::Array(items) => {
                let ety = items.first().map_or(T_U8, type_id_of);
                self.u32(ety).u64(items.len() as u64);
                for it in items {
                    self.value(it);
                }
                self
            }
        }
    }
    /// A metadata entry: key, type id, value.
    pub fn kv(&mut self, key: &str, v: &MetaValue) -> &mut Self {
        self.str(key).u32(type_id_of(v)).value(v)
    }
    pub fn pad_to(&mut self, alignment: usize) -> &mut Self {
        while !self.buf.len().is_multiple_of(alignment) {
            self.buf.push(0);
        }
        self
    }
    pub fn len(&self) -> usize {
        self.buf.len()
    }
}

/// A tensor to write.
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
}

impl TensorSpec {
    pub fn new(name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> TensorSpec {
        TensorSpec {
            name: name.to_string(),
            dims: dims.to_vec(),
            type_id,
            data,
        }
    }
}

/// Byte offsets of the sections of a built file.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    /// Start of each metadata entry, then the end of the last.
    pub kv_starts: Vec<usize>,
    /// Start of each tensor info, then the end of the last.
    pub info_starts: Vec<usize>,
    pub data_offset: usize,
    /// Absolute offset of each tensor's data.
    pub tensor_offsets: Vec<usize>,
}

/// Builds GGUF files.
#[derive(Clone, Debug)]
pub struct GgufBuilder {
    pub version: u32,
    pub alignment: usize,
    pub kvs: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorSpec>,
}

impl GgufBuilder {
    pub fn new() -> GgufBuilder {
        GgufBuilder {
            version: 3,
            alignment: 32,
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }

    pub fn kv(mut self, key: &str, v: MetaValue) -> Self {
        self.kvs.push((key.to_string(), v));
        self
    }

    pub fn tensor(mut self, t: TensorSpec) -> Self {
        self.tensors.push(t);
        self
    }

    pub fn build(&self) -> Vec<u8> {
        self.build_with_layout().0
    }

    pub fn build_with_layout(&self) -> (Vec<u8>, Layout) {
        let mut w = W::default();
        let mut layout = Layout::default();
        w.bytes(b"GGUF")
            .u32(self.version)
            .u64(self.tensors.len() as u64)
            .u64(self.kvs.len() as u64);
        for (k, v) in &self.kvs {
            layout.kv_starts.push(w.len());
            w.kv(k, v);
        }
        layout.kv_starts.push(w.len());
        // Relative offsets: each tensor's data padded to the alignment.
        let mut rel = 0usize;
        let mut rels = Vec::new();
        for t in &self.tensors {
            rels.push(rel);
            rel += t.data.len().div_ceil(self.alignment) * self.alignment;
        }
        for (t, &r) in self.tensors.iter().zip(&rels) {
            layout.info_starts.push(w.len());
            w.str(&t.name).u32(t.dims.len() as u32);
            for &d in &t.dims {
                w.u64(d);
            }
            w.u32(t.type_id).u64(r as u64);
        }
        layout.info_starts.push(w.len());
        w.pad_to(self.alignment);
        layout.data_offset = w.len();
        for (t, &r) in self.tensors.iter().zip(&rels) {
            layout.tensor_offsets.push(layout.data_offset + r);
            w.bytes(&t.data);
            w.pad_to(self.alignment);
        }
        (w.buf, layout)
    }
}

impl Default for GgufBuilder {
    fn default() -> Self {
        GgufBuilder::new()
    }
}

fn s(v: &str) -> MetaValue {
    MetaValue::Str(v.to_string())
}

/// Deterministic filler bytes.
pub fn filler(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Every metadata value type, nested arrays included.
pub fn all_kinds_metadata() -> Vec<(String, MetaValue)> {
    use MetaValue::*;
    vec![
        ("general.architecture".into(), s("testarch")),
        ("general.name".into(), s("tiny ✓ model")),
        ("t.u8".into(), U8(200)),
        ("t.i8".into(), I8(-100)),
        ("t.u16".into(), U16(65000)),
        ("t.i16".into(), I16(-30000)),
        ("t.u32".into(), U32(4_000_000_000)),
        ("t.i32".into(), I32(-2_000_000_000)),
        ("t.u64".into(), U64(u64::MAX)),
        ("t.i64".into(), I64(i64::MIN)),
        ("t.f32".into(), F32(1.5)),
        ("t.f64".into(), F64(-2.25e100)),
        ("t.bool_t".into(), Bool(true)),
        ("t.bool_f".into(), Bool(false)),
        ("t.empty_str".into(), s("")),
        ("t.arr_u8".into(), Array(vec![U8(1), U8(2), U8(3)])),
        ("t.arr_i32".into(), Array(vec![I32(-1), I32(7)])),
        (
            "t.arr_f32".into(),
            Array(vec![F32(0.5), F32(-0.25), F32(3.0)]),
        ),
        ("t.arr_f64".into(), Array(vec![F64(1e-300)])),
        ("t.arr_u64".into(), Array(vec![U64(1), U64(u64::MAX)])),
        ("t.arr_i64".into(), Array(vec![I64(-5)])),
        ("t.arr_u16".into(), Array(vec![U16(9)])),
        ("t.arr_i16".into(), Array(vec![I16(-9)])),
        ("t.arr_u32".into(), Array(vec![U32(42)])),
        ("t.arr_i8".into(), Array(vec![I8(-1), I8(1)])),
        ("t.arr_bool".into(), Array(vec![Bool(true), Bool(false)])),
        (
            "t.arr_str".into(),
            Array(vec![s("a"), s(""), s("<0x0A>"), s("é")]),
        ),
        ("t.arr_empty".into(), Array(vec![])),
        (
            "t.arr_nested".into(),
            Array(vec![
                Array(vec![U32(1), U32(2)]),
                Array(vec![]),
                Array(vec![U32(3)]),
            ]),
        ),
        (
            "t.arr_nested_str".into(),
            Array(vec![Array(vec![Array(vec![s("deep")])])]),
        ),
    ]
}

// ggml type ids used in tests.
pub const GGML_F32: u32 = 0;
pub const GGML_F16: u32 = 1;
pub const GGML_Q4_0: u32 = 2;
pub const GGML_Q8_1: u32 = 9;
pub const GGML_Q8_0: u32 = 8;
pub const GGML_Q4_K: u32 = 12;
pub const GGML_Q6_K: u32 = 14;
pub const GGML_BF16: u32 = 30;

/// A small valid file: all metadata kinds and tensors of several types.
pub fn sample_builder() -> GgufBuilder {
    let mut b = GgufBuilder::new();
    b.kvs = all_kinds_metadata();
    b.tensor(TensorSpec::new(
        "f32.weight",
        &[4, 2],
        GGML_F32,
        filler(32, 1),
    ))
    .tensor(TensorSpec::new("f16.weight", &[8], GGML_F16, filler(16, 2)))
    .tensor(TensorSpec::new(
        "q8.weight",
        &[32, 2],
        GGML_Q8_0,
        filler(68, 3),
    ))
    .tensor(TensorSpec::new(
        "q4k.weight",
        &[256],
        GGML_Q4_K,
        filler(144, 4),
    ))
    .tensor(TensorSpec::new(
        "q81.weight",
        &[32],
        GGML_Q8_1,
        filler(36, 5),
    ))
    .tensor(TensorSpec::new("bf16.bias", &[3], GGML_BF16, filler(6, 6)))
}

/// Tiny deterministic PRNG (xorshift64*).
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}
