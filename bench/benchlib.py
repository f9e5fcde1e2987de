"""Shared by the benchmark scripts under bench/: the machine's CPU name and
SIMD extensions, a server process on a port, percentiles."""

import http.client
import os
import platform
import subprocess
import time


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


class Server:
    """A server process on a free port; `cmd` gets the port appended.
    With BENCH_SERVER_LOG=DIR set, each server's standard error goes to
    DIR/<program>-<port>.log (for pass logs: SPINDLE_LOG=spindle_engine=debug)."""

    def __init__(self, cmd, port, ready_path):
        self.port = port
        log_dir = os.environ.get("BENCH_SERVER_LOG")
        err = subprocess.DEVNULL
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
            name = os.path.basename(cmd[0])
            err = open(os.path.join(log_dir, f"{name}-{port}.log"), "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        if err is not subprocess.DEVNULL:
            err.close()  # the server holds its own copy
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", ready_path)
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{cmd[0]} did not start")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def simd_flags():
    """The SIMD extensions of this CPU that matter to the kernels."""
    flags = set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    keep = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
            "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"]
    return " ".join(f for f in keep if f in flags) or "none of AVX2/AVX-512/AMX"
