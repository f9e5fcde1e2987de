"""Prints llama-bench and spindle bench results side by side, with ratios."""
import json
import os
import platform
import sys

llama_path, spindle_path, command = sys.argv[1], sys.argv[2], sys.argv[3]
with open(llama_path) as f:
    llama = json.load(f)
with open(spindle_path) as f:
    spindle = json.load(f)

cpu = spindle.get("cpu") or platform.processor()
print(f"command: {command}")
print(f"cpu: {cpu} | threads: {spindle['threads']} | spindle isa: {spindle['isa']} | model: {spindle['model']}")
print(f"memory read bandwidth: {spindle['memory_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s")
if spindle.get("thread_handoff_round_trip_ns") is not None:
    # Where the threads sat during spindle's run: ~60 ns on one die of this
    # VM's host, ~330 across two (docs/PERF.md §50).
    print(f"thread hand-off (cache line round trip): {spindle['thread_handoff_round_trip_ns']:.0f} ns")
    if spindle.get("thread_handoff_round_trip_ns_after") is not None:
        # Measured again after the timed tests: the vCPUs can move mid-run
        # (PERF.md §51), and the peak fractions below use the larger peak.
        print(f"thread hand-off after spindle's tests: {spindle['thread_handoff_round_trip_ns_after']:.0f} ns")
for r in llama:
    version = os.environ.get("LLAMA_VERSION") or f"build {r.get('build_commit', '?')} ({r.get('build_number', '?')})"
    print(f"llama.cpp: {version}, backend {r.get('backends', r.get('backend', '?'))}, threads {r.get('n_threads')}")
    break
print()
# Spindle's figures per depth (`depths`), falling back to the top-level
# pp/tg of a build without `--depth`.
ours_at = {d["depth"]: d for d in spindle.get("depths", [])} or {0: spindle}
print("| test | llama.cpp tok/s | spindle tok/s (median) | spindle / llama.cpp |")
print("|---|---|---|---|")
for r in llama:
    n_prompt, n_gen, depth = r.get("n_prompt", 0), r.get("n_gen", 0), r.get("n_depth", 0)
    at = ours_at.get(depth, {})
    if n_prompt and not n_gen:
        name, ours = f"pp{n_prompt}", at.get("pp")
    elif n_gen and not n_prompt:
        name, ours = f"tg{n_gen}", at.get("tg")
    else:
        continue
    if depth:
        name += f" @ d{depth}"
    theirs = r["avg_ts"]
    mine = ours["tokens_per_s"]["median"] if ours else float("nan")
    print(f"| {name} | {theirs:.1f} ± {r.get('stddev_ts', 0):.1f} | {mine:.1f} ± {ours['tokens_per_s']['sd'] if ours else 0:.1f} | {mine / theirs:.2f}x |")
depths = spindle.get("depths", [])
if len(depths) > 1 or (depths and depths[0]["depth"]):
    bw = spindle["memory_bandwidth_bytes_per_s"]
    print()
    print(f"spindle decode at depth ({spindle.get('kv_type', '?')} KV): bytes a tg pass reads and the share of measured bandwidth")
    print("| depth | weights MB | KV MB | spindle tg tok/s | GB/s | of bandwidth |")
    print("|---|---|---|---|---|---|")
    for d in depths:
        if not d.get("tg"):
            continue
        t = d["tg"]["tokens_per_s"]["median"]
        b = d["weight_bytes_per_decode_pass"] + d["kv_bytes_per_decode_pass"]
        print(f"| {d['depth']} | {d['weight_bytes_per_decode_pass'] / 1e6:.1f} | "
              f"{d['kv_bytes_per_decode_pass'] / 1e6:.1f} | {t:.1f} | {t * b / 1e9:.1f} | {t * b / bw * 100:.0f}% |")
frac = spindle.get("bandwidth_fraction")
if frac:
    print()
    print(f"spindle decode moves {frac * 100:.0f}% of the measured bandwidth "
          f"({spindle['bytes_per_decode_pass'] / 1e6:.1f} MB of weights per pass)")
for peak in spindle.get("int8_mac_peaks", []):
    print(f"int8 multiply-accumulate peak, {peak['path']} ({peak['instructions']}): "
          f"{peak['macs_per_s_one_thread'] / 1e9:.1f} GMAC/s on 1 thread, "
          f"{peak['macs_per_s'] / 1e9:.1f} on {peak['threads']}")
pf = spindle.get("prompt_peak_fraction")
if pf:
    print(f"spindle's prompt pass reaches {pf * 100:.0f}% of its path's int8 peak "
          f"({spindle['prompt_macs_per_token'] / 1e6:.1f} M multiply-accumulates per token)")
