//! Planning mixture-of-experts models from header-only GGUF copies of
//! Qwen3-30B-A3B and gpt-oss-20b (scripts/make_plan_headers.py): weights
//! against gguf-py's sum of the tensor sizes, and a decode ceiling that
//! reads only the experts a step's rows choose.

use std::path::PathBuf;

use serde::Deserialize;
use spindle_plan::{plan, Device, EngineProfile, Family, KvType, ModelShape, PlanRequest};

#[derive(Deserialize)]
struct Expected {
    tensor_bytes: u64,
    expert_bytes: u64,
    n_experts: u64,
    n_used: u64,
    decode_read_bytes_one_token: u64,
}

fn fixture(name: &str) -> (ModelShape, Expected) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/moe");
    let shape = ModelShape::from_path(&dir.join(format!("{name}.gguf"))).unwrap();
    let text = std::fs::read_to_string(dir.join(format!("{name}.expected.json"))).unwrap();
    (shape, serde_json::from_str(&text).unwrap())
}

fn within(got: u64, want: u64, rel: f64, what: &str) {
    let err = (got as f64 - want as f64).abs() / want as f64;
    assert!(err <= rel, "{what}: {got} vs {want} ({err:.2e})");
}

fn request(batch: u64) -> PlanRequest {
    PlanRequest {
        ctx: 4096,
        batch,
        kv_type: KvType::F16,
        device: Device::parse("custom:256,100,10").unwrap(),
        prefill_chunk: 512,
        spec_cache_bytes: 0,
        decide_cache_bytes: 0,
    }
}

#[test]
fn weights_and_active_bytes_match_the_tensor_list() {
    for (name, family, layers) in [
        ("qwen3-30b-a3b", Family::Qwen3Moe, 48),
        ("gpt-oss-20b", Family::GptOss, 24),
    ] {
        let (s, want) = fixture(name);
        assert_eq!(s.family, family, "{name}");
        assert_eq!(s.n_layers, layers, "{name}");
        let x = s.experts.expect("experts");
        assert_eq!((x.n_experts, x.n_used), (want.n_experts, want.n_used));
        within(s.weights.bytes, want.tensor_bytes, 1e-3, name);
        within(s.weights.expert_bytes, want.expert_bytes, 1e-3, name);
        within(
            s.decode_read_bytes(1),
            want.decode_read_bytes_one_token,
            1e-3,
            name,
        );
        // A token of a 30B/20B model reads a few GB, not the whole file.
        assert!(s.decode_read_bytes(1) * 4 < s.weights.bytes, "{name}");

        // B rows read E x (1 - (1 - k/E)^B) distinct experts on average.
        let (e, k) = (want.n_experts as f64, want.n_used as f64);
        let shared = want.tensor_bytes - want.expert_bytes;
        for b in [1u64, 4, 16, 64, 512] {
            let distinct = e * (1.0 - (1.0 - k / e).powi(b as i32));
            let bytes = shared as f64 + want.expert_bytes as f64 * distinct / e;
            // The untied embedding is not read by decoding (one row a token).
            let embd = s.weights.embedding_bytes as f64;
            within(s.decode_read_bytes(b), (bytes - embd) as u64, 1e-3, name);
        }
        // Past a few hundred rows every expert is read.
        within(
            s.decode_read_bytes(4096),
            s.weights.decode_read_bytes(),
            1e-6,
            name,
        );

        // The plan's decode ceiling divides bandwidth by those bytes.
        let profile = EngineProfile::cpu_with_threads(2);
        let p = plan(&s, &request(1), &profile);
        let kv = s.kv_read_bytes_per_seq(4096, KvType::F16) as f64;
        let ceiling = 100e9 / (s.decode_read_bytes(1) as f64 + kv);
        let got = p.decode_tokens_per_s.batch_1;
        assert!(
            (got - ceiling).abs() <= 1e-9 * ceiling,
            "{name}: {got} vs {ceiling}"
        );
        assert_eq!(p.weights_bytes, s.weights.bytes);
        assert_eq!(p.weights_read_per_step_bytes, s.decode_read_bytes(1));
    }
}

#[test]
fn gpt_oss_alternates_sliding_and_full_layers() {
    let (s, _) = fixture("gpt-oss-20b");
    assert_eq!(s.sliding_window, Some(128));
    let want: Vec<bool> = (0..24).map(|l| l % 2 == 0).collect();
    assert_eq!(s.layer_sliding, want);
}

#[test]
fn dense_models_read_the_same_bytes_at_any_batch() {
    let (mut s, _) = fixture("qwen3-30b-a3b");
    s.experts = None;
    assert_eq!(s.decode_read_bytes(1), s.decode_read_bytes(64));
    assert_eq!(s.decode_read_bytes(1), s.weights.decode_read_bytes());
}
