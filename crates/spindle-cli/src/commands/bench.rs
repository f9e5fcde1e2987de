//! `spindle bench`: prompt and generation speed like llama-bench, the bytes a
//! decode pass moves against the machine's measured bandwidth, and the cost
//! of one pass against its number of rows.

use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use spindle_engine::bench::{
    time_decode, time_decode_chosen, time_prefill, time_rows, time_rows_chosen,
    time_rows_every_chosen, Summary,
};
use spindle_engine::EngineError;
use spindle_kernels::int8_peak::int8_mac_peaks;
use spindle_kernels::membw::{handoff_round_trip, read_bandwidth};
use spindle_kernels::ThreadPool;
use spindle_model::{KvCache, Model};

use crate::options::{parse_ids, ModelArgs};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens processed in one pass (0: skip).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub prompt: usize,
    /// Tokens generated one pass at a time (0: skip).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub gen: usize,
    /// Repetitions of each test (after one warm-up).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Also time one pass of each of these row counts: "1,2,4,8,16,32,64".
    #[arg(long)]
    pub rows: Option<String>,
    /// Committed context before the rows of `--rows`.
    #[arg(long, default_value_t = 128)]
    pub rows_context: usize,
    /// Run pp and tg after this many committed tokens, like llama-bench's
    /// `-d`; a list ("0,4096,16384") runs each depth in turn.
    #[arg(short = 'd', long, default_value = "0")]
    pub depth: String,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Also print where the time of a prompt pass, a decode pass and (with
    /// `--rows`) each row count's pass goes, op by op.
    #[arg(long)]
    pub profile: bool,
}

/// How `spindle_engine::bench` times `n` tokens after `depth` committed ones.
type TimeTokens = fn(&Model, &mut KvCache, usize, usize, u64) -> Result<f64, EngineError>;

/// Tokens per second of `reps` timed runs of `n` tokens, after a warm-up run
/// of `warm` tokens (salts 1.. for the timed runs, 0 for the warm-up).
fn tokens_per_s(
    model: &Model,
    kv: &mut KvCache,
    time: TimeTokens,
    n: usize,
    warm: usize,
    depth: usize,
    reps: usize,
) -> Result<Summary> {
    time(model, kv, warm, depth, 0)?;
    let s: Vec<f64> = (0..reps)
        .map(|i| time(model, kv, n, depth, i as u64 + 1).map(|t| n as f64 / t))
        .collect::<Result<_, _>>()?;
    Ok(Summary::of(s))
}

pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

pub fn run(args: BenchArgs) -> Result<()> {
    crate::options::warn_ignored(
        "bench",
        &[
            (args.model.ctx.is_some(), "--ctx"),
            (args.model.kv_memory.is_some(), "--kv-memory"),
        ],
    );
    // Not even checked: the cache is sized from -p, -n, -d and --rows.
    let mut args = args;
    args.model.ctx = None;
    args.model.kv_memory = None;
    let rows: Vec<usize> = match &args.rows {
        Some(s) => parse_ids(s)?.into_iter().map(|r| r as usize).collect(),
        None => vec![],
    };
    if rows.contains(&0) {
        bail!("--rows takes positive row counts, like 1,2,4,8,16");
    }
    let depths: Vec<usize> = parse_ids(&args.depth)?
        .into_iter()
        .map(|d| d as usize)
        .collect();
    if depths.is_empty() {
        bail!("--depth takes committed token counts, like 0,4096,16384");
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let mut loaded = args.model.load()?;
    let model = &loaded.model;
    let threads = model.n_threads();
    let reps = args.reps.max(1);
    let max_depth = depths.iter().copied().max().unwrap_or(0);
    let max_len = (max_depth + args.prompt.max(args.gen + 1))
        .max(args.rows_context + rows.iter().copied().max().unwrap_or(0))
        + 1;
    // `--kv-type` chooses what the passes read (f16 unless the weights are f32).
    let kv_type = args.model.kv_type(model)?;
    let mut kv = model.new_kv_cache(kv_type, max_len, 1);

    let bandwidth = read_bandwidth(&ThreadPool::new(threads), 1 << 30, 3);
    let handoff = handoff_round_trip(&ThreadPool::new(threads), 20_000, 5);
    let mut peaks = int8_mac_peaks(threads, 0.3);
    let w = &model.weights;
    let bytes_per_pass =
        w.matrix_bytes(model.config.experts_per_token()) + w.embed.data.len() / w.embed.rows.max(1);

    // The planner's count of the KV bytes a decode pass reads.
    let shape = spindle_plan::ModelShape::from_path(&args.model.resolve()?)?;
    let plan_kv = spindle_plan::KvType::parse(kv_type.name())?;
    let mut at_depth = Vec::new();
    for &depth in &depths {
        let pp = (args.prompt > 0)
            .then(|| {
                tokens_per_s(
                    model,
                    &mut kv,
                    time_prefill,
                    args.prompt,
                    args.prompt,
                    depth,
                    reps,
                )
            })
            .transpose()?;
        let tg = (args.gen > 0)
            .then(|| {
                tokens_per_s(
                    model,
                    &mut kv,
                    time_decode,
                    args.gen,
                    args.gen.min(16),
                    depth,
                    reps,
                )
            })
            .transpose()?;
        // The same passes choosing their token as decoding does (the head's
        // screen), when the model screens its head.
        let tg_chosen = (args.gen > 0 && model.head_screen()?.is_some())
            .then(|| {
                tokens_per_s(
                    model,
                    &mut kv,
                    time_decode_chosen,
                    args.gen,
                    args.gen.min(16),
                    depth,
                    reps,
                )
            })
            .transpose()?;
        // A tg pass at the middle of its run sees this many positions.
        let seen = (depth + args.gen / 2 + 1) as u64;
        let kv_bytes = shape.kv_read_bytes_per_seq(seen, plan_kv) as usize;
        at_depth.push((depth, pp, tg, kv_bytes, tg_chosen));
    }
    let mut ops = Vec::new();
    if args.profile && args.prompt > 0 {
        loaded.model.set_profiling(true);
        let _ = loaded.model.take_op_times();
        time_prefill(&loaded.model, &mut kv, args.prompt, depths[0], 99)?;
        ops = loaded.model.take_op_times();
        loaded.model.set_profiling(false);
    }
    let mut decode_ops = Vec::new();
    if args.profile && args.gen > 0 {
        loaded.model.set_profiling(true);
        let _ = loaded.model.take_op_times();
        time_decode(&loaded.model, &mut kv, args.gen, depths[0], 99)?;
        // Per pass: the first (context) pass is included, hence gen + 1.
        decode_ops = loaded.model.take_op_times();
        decode_ops
            .iter_mut()
            .for_each(|o| o.1 /= (args.gen + 1) as f64);
        loaded.model.set_profiling(false);
    }
    // With --profile, the full-logits pass of each row count is timed op by
    // op as well (the chosen-token pass is not: its head is the screen).
    loaded.model.set_profiling(args.profile && !rows.is_empty());
    let model = &loaded.model;
    let mut curve = Vec::new();
    let mut rows_ops = Vec::new();
    for &r in &rows {
        let (full, ops) = time_rows(model, &mut kv, r, args.rows_context, reps)?;
        let chosen = time_rows_chosen(model, &mut kv, r, args.rows_context, reps)?;
        let every = time_rows_every_chosen(model, &mut kv, r, args.rows_context, reps)?;
        curve.push((r, full, chosen, every));
        if !ops.is_empty() {
            rows_ops.push((r, ops));
        }
    }
    let one_row = curve.iter().find(|c| c.0 == 1).map(|c| c.1.median);
    let one_row_chosen = curve.iter().find(|c| c.0 == 1).map(|c| c.2.median);
    let one_row_every = curve.iter().find(|c| c.0 == 1).map(|c| c.3.median);
    // The figures of the first depth keep the keys they had before `--depth`.
    let (_, pp, tg, _, tg_chosen) = at_depth[0].clone();
    // This VM's two vCPUs move between placements (SMT siblings of one
    // core, one die, two dies) within seconds, and a two-thread peak taken
    // on one core is half one taken on two: a prompt pass timed after a
    // move could read above "the peak". So after a prompt test the peaks
    // and the hand-off are measured again, the fractions use the larger
    // peak, and a moved placement is reported (docs/PERF.md §51).
    let mut handoff_after = None;
    if pp.is_some() {
        handoff_after = handoff_round_trip(&ThreadPool::new(threads), 20_000, 5);
        for (p, again) in peaks.iter_mut().zip(int8_mac_peaks(threads, 0.3)) {
            p.one_thread = p.one_thread.max(again.one_thread);
            p.all_threads = p.all_threads.max(again.all_threads);
        }
    }
    // Bytes a tg pass moves at a depth (weights and KV), and the fraction of
    // the measured bandwidth that its speed is.
    let depth_fraction = |tg: &Option<Summary>, kv_bytes: usize| {
        tg.as_ref()
            .map(|t| t.median * (bytes_per_pass + kv_bytes) as f64 / bandwidth)
    };
    let fraction = tg
        .as_ref()
        .map(|t| t.median * bytes_per_pass as f64 / bandwidth);
    // The layers' matrices are one int8 multiply-accumulate per weight per
    // prompt token (the head runs for the last token only; attention is
    // float and not counted).
    let macs_per_token = model
        .weights
        .layer_matrix_values(model.config.experts_per_token()) as f64;
    let pp_macs = pp.as_ref().map(|s| s.median * macs_per_token);
    let path_peak = peaks
        .iter()
        .find(|p| p.path == model.isa().name())
        .map(|p| p.all_threads);
    let best_peak = peaks.iter().map(|p| p.all_threads).fold(0.0, f64::max);
    // A pass of R rows with every row's logits: the layers' and the head's
    // multiply-accumulates for each row (attention is float, not counted).
    let head_macs = (model.weights.output.rows * model.weights.output.cols) as f64;
    let rows_rate =
        |rows: usize, s: &Summary| rows as f64 * (macs_per_token + head_macs) / s.median;

    let vertical = model.weights.vertical_layer_matrices();
    let panels = model.weights.panel_layer_matrices().0;
    if args.json {
        let stat = |s: &Summary| json!({"mean": s.mean, "sd": s.sd, "median": s.median});
        let v = json!({
            "command": command,
            "cpu": cpu_name(),
            "threads": threads,
            "isa": model.isa().name(),
            "vertical_layer_matrices": vertical.0,
            "layer_matrices": vertical.1,
            "panel_layer_matrices": panels,
            "model": loaded.name,
            "pp": pp.as_ref().map(|s| json!({"tokens": args.prompt, "tokens_per_s": stat(s)})),
            "tg": tg.as_ref().map(|s| json!({"tokens": args.gen, "tokens_per_s": stat(s)})),
            "tg_chosen_token": tg_chosen.as_ref().map(|s| json!({"tokens": args.gen, "tokens_per_s": stat(s)})),
            "bytes_per_decode_pass": bytes_per_pass,
            "memory_bandwidth_bytes_per_s": bandwidth,
            "thread_handoff_round_trip_ns": handoff.map(|s| s * 1e9),
            "thread_handoff_round_trip_ns_after": handoff_after.map(|s| s * 1e9),
            "bandwidth_fraction": fraction,
            "int8_mac_peaks": peaks.iter().map(|p| json!({
                "path": p.path,
                "instructions": p.instructions,
                "macs_per_s_one_thread": p.one_thread,
                "macs_per_s": p.all_threads,
                "threads": p.threads,
            })).collect::<Vec<_>>(),
            "prompt_macs_per_token": macs_per_token,
            "prompt_peak_fraction": pp_macs.zip(path_peak).map(|(m, p)| m / p),
            "prompt_best_peak_fraction": pp_macs.map(|m| m / best_peak),
            "prompt_pass_ops_s": ops.iter().map(|(op, s, _)| json!({"op": op, "seconds": s})).collect::<Vec<_>>(),
            "decode_pass_ops_s": decode_ops.iter().map(|(op, s, _)| json!({"op": op, "seconds": s})).collect::<Vec<_>>(),
            "rows_pass_ops_s": rows_ops.iter().map(|(r, ops)| json!({
                "rows": r,
                "context": args.rows_context,
                "ops": ops.iter().map(|(op, s, _)| json!({"op": op, "seconds": s})).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "kv_type": kv_type.name(),
            "depths": at_depth.iter().map(|(d, pp, tg, kv_bytes, tg_chosen)| json!({
                "depth": d,
                "pp": pp.as_ref().map(|s| json!({"tokens": args.prompt, "tokens_per_s": stat(s)})),
                "tg": tg.as_ref().map(|s| json!({"tokens": args.gen, "tokens_per_s": stat(s)})),
                "tg_chosen_token": tg_chosen.as_ref().map(|s| json!({"tokens": args.gen, "tokens_per_s": stat(s)})),
                "weight_bytes_per_decode_pass": bytes_per_pass,
                "kv_bytes_per_decode_pass": kv_bytes,
                "bandwidth_fraction": depth_fraction(tg, *kv_bytes),
            })).collect::<Vec<_>>(),
            "rows": curve.iter().map(|(r, s, c, e)| json!({
                "rows": r,
                "ms": {"mean": s.mean * 1e3, "sd": s.sd * 1e3, "median": s.median * 1e3},
                "ratio_to_one_row": one_row.map(|o| s.median / o),
                "ms_chosen_token": {"mean": c.mean * 1e3, "sd": c.sd * 1e3, "median": c.median * 1e3},
                "ratio_to_one_row_chosen_token": one_row_chosen.map(|o| c.median / o),
                "ms_every_row_chosen": {"mean": e.mean * 1e3, "sd": e.sd * 1e3, "median": e.median * 1e3},
                "ratio_to_one_row_every_row_chosen": one_row_every.map(|o| e.median / o),
                "macs_per_s": rows_rate(*r, s),
                "peak_fraction": path_peak.map(|p| rows_rate(*r, s) / p),
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("command: {command}");
    println!(
        "cpu: {} | threads: {threads} | isa: {} | model: {}",
        cpu_name(),
        model.isa().name(),
        loaded.name
    );
    println!(
        "layer matrices in the vertical layout: {} of {}, in panels of 16 rows: {panels} (SPINDLE_VERTICAL=0 keeps the file's order, SPINDLE_LAYER_PANELS=1 puts Q5_0 ones in panels; docs/PERF.md §39, §56)",
        vertical.0, vertical.1
    );
    println!(
        "memory read bandwidth (1 GiB, {threads} threads): {:.1} GB/s",
        bandwidth / 1e9
    );
    if let Some(s) = handoff {
        // Where the threads sit: tens of ns on cores sharing a cache,
        // hundreds across dies; numbers from the two differ (PERF.md §50).
        println!(
            "thread hand-off (a cache line between two pool threads and back): {:.0} ns",
            s * 1e9
        );
    }
    if let Some(after) = handoff_after {
        println!(
            "thread hand-off after the timed tests: {:.0} ns{}",
            after * 1e9,
            match handoff {
                Some(before) if after > 2.0 * before || before > 2.0 * after => {
                    " (the threads moved during the run: figures before and after it are from different placements)"
                }
                _ => "",
            }
        );
    }
    println!();
    println!(
        "int8 multiply-accumulate peak (register-only loop, best of 3{}):",
        if pp.is_some() {
            ", before and after the timed tests"
        } else {
            ""
        }
    );
    println!("| path | instructions | GMAC/s 1 thread | GMAC/s {threads} threads |");
    println!("|---|---|---|---|");
    for p in &peaks {
        println!(
            "| {} | {} | {:.1} | {:.1} |",
            p.path,
            p.instructions,
            p.one_thread / 1e9,
            p.all_threads / 1e9
        );
    }
    println!();
    println!("| test | tokens/s mean | sd | median |");
    println!("|---|---|---|---|");
    for (depth, pp, tg, _, tg_chosen) in &at_depth {
        let at = if *depth > 0 {
            format!(" @ d{depth}")
        } else {
            String::new()
        };
        if let Some(s) = pp {
            println!(
                "| pp{}{at} | {:.1} | {:.1} | {:.1} |",
                args.prompt, s.mean, s.sd, s.median
            );
        }
        if let Some(s) = tg {
            println!(
                "| tg{}{at} | {:.1} | {:.1} | {:.1} |",
                args.gen, s.mean, s.sd, s.median
            );
        }
        if let Some(s) = tg_chosen {
            println!(
                "| tg{}{at}, chosen token (head screen) | {:.1} | {:.1} | {:.1} |",
                args.gen, s.mean, s.sd, s.median
            );
        }
    }
    if at_depth.len() > 1 || depths[0] > 0 {
        println!();
        println!(
            "decode at depth: bytes one tg pass reads ({} KV, at the middle of tg{}) and the share of measured bandwidth it moves:",
            kv_type.name(),
            args.gen
        );
        println!("| depth | weights MB | KV MB | tokens/s | GB/s | of bandwidth |");
        println!("|---|---|---|---|---|---|");
        for (depth, _, tg, kv_bytes, _) in &at_depth {
            if let (Some(t), Some(f)) = (tg, depth_fraction(tg, *kv_bytes)) {
                println!(
                    "| {depth} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0}% |",
                    bytes_per_pass as f64 / 1e6,
                    *kv_bytes as f64 / 1e6,
                    t.median,
                    t.median * (bytes_per_pass + kv_bytes) as f64 / 1e9,
                    f * 100.0
                );
            }
        }
    }
    // At depth 0 the weights are nearly all a pass reads (the table above
    // covers deeper runs).
    if let (Some(s), Some(f), 0) = (&tg, fraction, depths[0]) {
        println!();
        println!(
            "decode pass reads {:.1} MB of weights: {:.1} tokens/s moves {:.1} GB/s = {:.0}% of measured bandwidth (ceiling {:.1} tokens/s)",
            bytes_per_pass as f64 / 1e6,
            s.median,
            s.median * bytes_per_pass as f64 / 1e9,
            f * 100.0,
            bandwidth / bytes_per_pass as f64
        );
    }
    if let Some(m) = pp_macs {
        println!();
        println!(
            "prompt pass: {:.1} M int8 multiply-accumulates per token in the layers' matrices: pp{} runs {:.1} GMAC/s = {} of the {} peak, {:.0}% of the best path's",
            macs_per_token / 1e6,
            args.prompt,
            m / 1e9,
            path_peak.map_or_else(|| "?".into(), |p| format!("{:.0}%", m / p * 100.0)),
            model.isa().name(),
            m / best_peak * 100.0
        );
    }
    let print_ops = |title: String, ops: &[(&str, f64, usize)]| {
        let total: f64 = ops.iter().map(|o| o.1).sum();
        println!();
        println!("{title}, op by op ({:.2} ms):", total * 1e3);
        println!("| op | ms | share |");
        println!("|---|---|---|");
        for (op, s, _) in ops {
            println!("| {op} | {:.2} | {:.0}% |", s * 1e3, s / total * 100.0);
        }
    };
    if !ops.is_empty() {
        print_ops(format!("one pp{} pass", args.prompt), &ops);
    }
    if !decode_ops.is_empty() {
        print_ops(
            format!("one decode pass (mean of tg{})", args.gen),
            &decode_ops,
        );
    }
    if !curve.is_empty() {
        println!();
        println!(
            "one pass of R rows (a chain after {} committed tokens):",
            args.rows_context
        );
        println!("every row's logits (full head); only the last row's chosen token (the head's screen where the model has one); every row's chosen token, picked as the head computes it (a verification pass):");
        println!(
            "| rows | ms mean | sd | median | x one row | last row's token: ms median | x one row | every row's token: ms median | x one row |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        let times = |o: Option<f64>, s: &Summary| {
            o.map_or(String::from("-"), |o| format!("{:.2}", s.median / o))
        };
        for (r, s, c, e) in &curve {
            println!(
                "| {r} | {:.2} | {:.2} | {:.2} | {} | {:.2} | {} | {:.2} | {} |",
                s.mean * 1e3,
                s.sd * 1e3,
                s.median * 1e3,
                times(one_row, s),
                c.median * 1e3,
                times(one_row_chosen, c),
                e.median * 1e3,
                times(one_row_every, e),
            );
        }
        println!();
        println!(
            "the full-logits passes in int8 multiply-accumulates ({:.1} M a row in the layers' matrices, {:.1} M in the head; attention not counted), against the {} peak:",
            macs_per_token / 1e6,
            head_macs / 1e6,
            model.isa().name()
        );
        println!("| rows | GMAC/s | of the peak |");
        println!("|---|---|---|");
        for (r, s, _, _) in &curve {
            let rate = rows_rate(*r, s);
            println!(
                "| {r} | {:.1} | {} |",
                rate / 1e9,
                path_peak.map_or_else(|| "?".into(), |p| format!("{:.0}%", rate / p * 100.0))
            );
        }
    }
    if let Some((_, last)) = rows_ops.last() {
        println!();
        println!(
            "one pass of R rows (every row's logits), op by op, ms (mean of {reps} passes after {} committed tokens):",
            args.rows_context
        );
        let header: String = rows_ops
            .iter()
            .map(|(r, _)| format!(" {r} rows |"))
            .collect();
        println!("| op |{header}");
        println!("|---|{}", "---|".repeat(rows_ops.len()));
        // Ops in the order of the largest row count's times.
        for (op, _, _) in last {
            let cells: String = rows_ops
                .iter()
                .map(|(_, ops)| {
                    let ms = ops.iter().find(|o| o.0 == *op).map_or(0.0, |o| o.1 * 1e3);
                    format!(" {ms:.2} |")
                })
                .collect();
            println!("| {op} |{cells}");
        }
        let totals: String = rows_ops
            .iter()
            .map(|(_, ops)| format!(" {:.2} |", ops.iter().map(|o| o.1).sum::<f64>() * 1e3))
            .collect();
        println!("| total |{totals}");
    }
    Ok(())
}
