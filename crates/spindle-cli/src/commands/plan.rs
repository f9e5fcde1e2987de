//! `spindle plan`: memory and speed ceiling from the model's headers, before
//! anything is loaded; `--measure` then runs the plan's worst-case passes on
//! this machine and compares the process's peak resident memory with it.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use spindle_engine::bench::run_peak_memory_passes;
use spindle_engine::generate::PREFILL_CHUNK;
use spindle_plan::{plan, Device, EngineProfile, KvType, ModelShape, Plan, PlanRequest};

use spindle_kernels::quant::q8_act::ActRounding;

use crate::options::ModelArgs;

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// A .gguf file (a header-only copy is enough) or a Hugging Face model
    /// directory (config.json + safetensors headers). Default: Gemma 3 270M.
    #[arg(value_name = "MODEL")]
    pub path: Option<PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 1)]
    pub batch: u64,
    /// cpu, h100, h200, a100, l4, rtx4090, m5 or custom:MEM_GiB,BW_GBps,TFLOPS.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Prompt tokens per prefill pass.
    #[arg(long = "prefill-chunk", default_value_t = PREFILL_CHUNK as u64)]
    pub prefill_chunk: u64,
    /// Count a server's cache of earlier outputs for speculative drafts at
    /// this bound (MiB; `serve --spec-cache-mb`, whose default is 16).
    #[arg(long = "spec-cache-mb")]
    pub spec_cache_mb: Option<u64>,
    /// Count a server's cache of decisions' content-free answers at this
    /// bound (MiB; `serve --decide-cache-mb`, whose default is 8).
    #[arg(long = "decide-cache-mb")]
    pub decide_cache_mb: Option<u64>,
    /// Plan for `spindle serve`: its caches at their default bounds unless
    /// given above.
    #[arg(long)]
    pub serve: bool,
    /// Also load the model, run the plan's largest passes and print the
    /// measured peak resident memory beside the prediction (CPU, f16 or f32 KV).
    #[arg(long)]
    pub measure: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: PlanArgs) -> Result<()> {
    crate::options::warn_ignored(
        "plan",
        &[
            (args.model.kv_memory.is_some(), "--kv-memory"),
            (args.model.check_weights, "--check-weights"),
            (
                args.model.act_rounding != ActRounding::Block32,
                "--act-rounding",
            ),
        ],
    );
    let path = match (&args.path, &args.model.model) {
        (Some(_), Some(_)) => bail!("give the model once: as MODEL or with -m"),
        (Some(p), None) | (None, Some(p)) => p.clone(),
        (None, None) => args.model.resolve()?,
    };
    let shape =
        ModelShape::from_path(&path).with_context(|| format!("cannot plan {}", path.display()))?;
    let ctx = args
        .model
        .ctx
        .map_or(shape.context_length, |c| c as u64)
        .max(1);
    let request = PlanRequest {
        prefill_chunk: args.prefill_chunk,
        spec_cache_bytes: mib_or_serve_default(
            args.spec_cache_mb,
            args.serve,
            spindle_engine::speculative::DEFAULT_TRAFFIC_CACHE_BYTES,
        ),
        decide_cache_bytes: mib_or_serve_default(
            args.decide_cache_mb,
            args.serve,
            spindle_engine::decide::DEFAULT_PRIOR_CACHE_BYTES,
        ),
        ..PlanRequest::new(
            ctx,
            args.batch,
            args.model.plan_kv_type()?,
            Device::parse(&args.device)?,
        )
    };
    request.validate()?;
    let threads = args.model.threads();
    let plan = plan(
        &shape,
        &request,
        &EngineProfile::cpu_with_threads(threads as u64),
    );

    let measured = if args.measure {
        Some(measure(&args, &path, &plan)?)
    } else {
        None
    };
    if args.json {
        let mut v: serde_json::Value = serde_json::from_str(&plan.to_json())?;
        if let Some(rss) = measured {
            v["measured"] = serde_json::json!({
                "peak_rss_bytes": rss,
                "relative_error": relative_error(plan.total_bytes, rss),
            });
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print!("{}", plan.render_table());
    if let Some(rss) = measured {
        println!(
            "\nmeasured peak resident memory: {} ({} bytes); predicted {} ({} bytes): {:+.2}%",
            spindle_plan::human_bytes(rss),
            rss,
            spindle_plan::human_bytes(plan.total_bytes),
            plan.total_bytes,
            100.0 * relative_error(plan.total_bytes, rss),
        );
    }
    Ok(())
}

/// A cache bound in bytes: `mib` as given, else the server's default when
/// planning for `serve`, else 0 (not counted).
fn mib_or_serve_default(mib: Option<u64>, serve: bool, default_bytes: usize) -> u64 {
    match mib {
        Some(m) => m << 20,
        None if serve => default_bytes as u64,
        None => 0,
    }
}

/// `(predicted - measured) / measured`.
fn relative_error(predicted: u64, measured: u64) -> f64 {
    (predicted as f64 - measured as f64) / measured.max(1) as f64
}

/// Loads the model, allocates the plan's KV cache, runs its largest passes
/// and returns the process's peak resident memory (VmHWM).
fn measure(args: &PlanArgs, path: &std::path::Path, plan: &Plan) -> Result<u64> {
    if plan.device.name != "cpu" {
        bail!("--measure runs on this CPU: drop --device or use --device cpu");
    }
    if plan.encoder {
        return measure_encoder(args, path);
    }
    let kv_type = match plan.kv_type {
        KvType::F16 => spindle_model::KvType::F16,
        KvType::F32 => spindle_model::KvType::F32,
        KvType::Q8_0 => spindle_model::KvType::Q8_0,
    };
    let loaded = spindle_model::load(path, args.model.threads())
        .with_context(|| format!("cannot load {}", path.display()))?;
    let (ctx, batch) = (plan.ctx as usize, plan.batch as usize);
    let model = &loaded.model;
    crate::options::check_kv_type(model, kv_type)?;
    let mut kv = model.new_kv_cache(kv_type, ctx, batch);
    if kv.layout().bytes() as u64 != plan.kv_bytes {
        bail!(
            "the plan's KV cache ({} bytes) is not the engine's ({} bytes): a bug in spindle-plan",
            plan.kv_bytes,
            kv.layout().bytes()
        );
    }
    run_peak_memory_passes(model, &mut kv, ctx, batch, plan.prefill_chunk as usize)?;
    peak_rss().context("cannot read this process's peak resident memory")
}

/// An encoder's worst case as its plan counts it: passes of
/// `ENCODER_PASS_TOKENS` tokens (texts of the longest length it takes) whose
/// ids go through the whole vocabulary, so every page of the file is read.
fn measure_encoder(args: &PlanArgs, path: &std::path::Path) -> Result<u64> {
    use spindle_model::encoder::{load_encoder, EncoderInput};
    let loaded = load_encoder(path, args.model.threads(), Default::default())
        .with_context(|| format!("cannot load {}", path.display()))?;
    let encoder = &loaded.encoder;
    let (vocab, pass) = (
        encoder.config.vocab,
        spindle_plan::ENCODER_PASS_TOKENS as usize,
    );
    let len = encoder.config.max_positions.clamp(1, pass);
    for start in (0..vocab).step_by(pass) {
        let texts: Vec<Vec<u32>> = (0..pass / len)
            .map(|t| {
                (0..len)
                    .map(|j| ((start + t * len + j) % vocab) as u32)
                    .collect()
            })
            .collect();
        let inputs: Vec<EncoderInput<'_>> = texts
            .iter()
            .map(|ids| EncoderInput {
                ids,
                type_ids: None,
            })
            .collect();
        encoder.embed(&inputs)?;
    }
    peak_rss().context("cannot read this process's peak resident memory")
}

/// Peak resident set size of this process, from `/proc/self/status`.
fn peak_rss() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .context("no VmHWM line (not Linux?)")?;
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib * 1024)
}
