//! The machines a plan can target: memory, memory bandwidth and arithmetic
//! rate, each with where the figure comes from.

use serde::{Deserialize, Serialize};

use crate::error::PlanError;

const GIB: f64 = (1u64 << 30) as f64;

/// A device's memory, bandwidth and compute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// The name it was asked by ("cpu", "h100", "custom", ...).
    pub name: String,
    /// Memory the model may use, in bytes.
    pub memory_bytes: u64,
    /// Sustained memory read bandwidth, in GB/s (10^9 bytes per second).
    pub bandwidth_gb_s: f64,
    /// Dense arithmetic rate the matmuls run at, in TFLOPS.
    pub tflops: f64,
    /// Where each figure comes from: detected, measured or assumed.
    pub source: String,
}

/// Names [`Device::parse`] accepts, besides `custom:MEM_GiB,BW_GBps,TFLOPS`.
pub const DEVICE_NAMES: [&str; 7] = ["cpu", "h100", "h200", "a100", "l4", "rtx4090", "m5"];

/// The 2-thread DRAM read bandwidth measured on the project's CPU machine
/// (docs: ANCHORS.md, sum of int64 over a 2 GiB array).
pub const CPU_BANDWIDTH_GB_S: f64 = 26.9;
/// Int8-equivalent matmul rate assumed for 2 AVX2 cores (~2 x 3 GHz x 32
/// int8 multiply-adds per cycle, with headroom lost to quantizing).
pub const CPU_TFLOPS: f64 = 0.2;

impl Device {
    /// A device by name: `cpu`, `h100`, `h200`, `a100`, `l4`, `rtx4090`,
    /// `m5`, or `custom:MEM_GiB,BW_GBps,TFLOPS`.
    pub fn parse(spec: &str) -> Result<Device, PlanError> {
        let spec = spec.trim();
        if let Some(rest) = spec.strip_prefix("custom:") {
            return Device::parse_custom(rest);
        }
        let gpu = |name: &str, memory_bytes: u64, bw: f64, tflops: f64, source: &str| Device {
            name: name.into(),
            memory_bytes,
            bandwidth_gb_s: bw,
            tflops,
            source: source.into(),
        };
        Ok(match spec.to_ascii_lowercase().as_str() {
            "cpu" => Device::cpu()?,
            "h100" => gpu(
                "h100",
                80 << 30,
                3350.0,
                989.0,
                "NVIDIA H100 SXM datasheet: 80 GiB HBM3, 3.35 TB/s, 989 TFLOPS dense BF16",
            ),
            "h200" => gpu(
                "h200",
                141_000_000_000,
                4800.0,
                989.0,
                "NVIDIA H200 SXM datasheet: 141 GB HBM3e, 4.8 TB/s, 989 TFLOPS dense BF16",
            ),
            "a100" => gpu(
                "a100",
                80 << 30,
                2039.0,
                312.0,
                "NVIDIA A100 80GB SXM datasheet: 2,039 GB/s, 312 TFLOPS dense BF16",
            ),
            "l4" => gpu(
                "l4",
                24_000_000_000,
                300.0,
                121.0,
                "NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s, 121 TFLOPS dense BF16",
            ),
            "rtx4090" => gpu(
                "rtx4090",
                24 << 30,
                1008.0,
                165.0,
                "NVIDIA RTX 4090: 24 GiB GDDR6X, 1,008 GB/s, 165 TFLOPS dense BF16 tensor (FP32 accumulate)",
            ),
            "m5" => gpu(
                "m5",
                32_000_000_000,
                153.0,
                4.0,
                "Apple M5 (assumed): 32 GB unified memory configuration, 153 GB/s as announced, \
                 ~4 TFLOPS GPU FP32 (an estimate; the OS and other apps share the memory)",
            ),
            _ => {
                return Err(PlanError::Device(format!(
                    "unknown device '{spec}': use one of {} or custom:MEM_GiB,BW_GBps,TFLOPS \
                     (e.g. custom:48,400,30)",
                    DEVICE_NAMES.join(", ")
                )))
            }
        })
    }

    /// This machine: memory is `MemTotal` from /proc/meminfo; bandwidth and
    /// compute are the project's CPU figures (see [`CPU_BANDWIDTH_GB_S`]).
    pub fn cpu() -> Result<Device, PlanError> {
        let text = std::fs::read_to_string("/proc/meminfo").map_err(|e| {
            PlanError::Device(format!(
                "cannot read /proc/meminfo ({e}) to size the cpu device: give its figures with \
                 --device custom:MEM_GiB,BW_GBps,TFLOPS"
            ))
        })?;
        Device::cpu_from_meminfo(&text)
    }

    /// The cpu device with memory from the text of a /proc/meminfo.
    pub fn cpu_from_meminfo(meminfo: &str) -> Result<Device, PlanError> {
        let kb = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                PlanError::Device(
                    "/proc/meminfo has no readable 'MemTotal: N kB' line: give the cpu's \
                     figures with --device custom:MEM_GiB,BW_GBps,TFLOPS"
                        .into(),
                )
            })?;
        Ok(Device {
            name: "cpu".into(),
            memory_bytes: kb.saturating_mul(1024),
            bandwidth_gb_s: CPU_BANDWIDTH_GB_S,
            tflops: CPU_TFLOPS,
            source: format!(
                "memory: MemTotal from /proc/meminfo (detected); bandwidth: {CPU_BANDWIDTH_GB_S} \
                 GB/s, 2-thread DRAM read measured on the project machine (assumed, docs \
                 ANCHORS.md); compute: {CPU_TFLOPS} TFLOPS int8-equivalent for 2 AVX2 cores \
                 (assumed)"
            ),
        })
    }

    /// `MEM_GiB,BW_GBps,TFLOPS`, each a positive number.
    fn parse_custom(rest: &str) -> Result<Device, PlanError> {
        let usage = "expected custom:MEM_GiB,BW_GBps,TFLOPS with three positive numbers, e.g. \
                     custom:48,400,30 for 48 GiB, 400 GB/s and 30 TFLOPS";
        let parts: Vec<&str> = rest.split(',').map(str::trim).collect();
        let [mem, bw, tflops] = parts[..] else {
            return Err(PlanError::Device(format!(
                "custom device '{rest}' has {} fields: {usage}",
                parts.len()
            )));
        };
        let num = |field: &str, what: &str| -> Result<f64, PlanError> {
            match field.parse::<f64>() {
                Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
                _ => Err(PlanError::Device(format!(
                    "custom device {what} '{field}' is not a positive number: {usage}"
                ))),
            }
        };
        let mem_gib = num(mem, "memory")?;
        let bandwidth_gb_s = num(bw, "bandwidth")?;
        let tflops = num(tflops, "TFLOPS")?;
        // Past 2^34 GiB the byte count would not fit; no device is that large.
        if mem_gib > (1u64 << 33) as f64 {
            return Err(PlanError::Device(format!(
                "custom device memory {mem_gib} GiB is implausibly large: {usage}"
            )));
        }
        Ok(Device {
            name: "custom".into(),
            memory_bytes: (mem_gib * GIB).round() as u64,
            bandwidth_gb_s,
            tflops,
            source: format!("given: {mem_gib} GiB, {bandwidth_gb_s} GB/s, {tflops} TFLOPS"),
        })
    }

    /// Bandwidth in bytes per second.
    pub fn bandwidth_bytes_s(&self) -> f64 {
        self.bandwidth_gb_s * 1e9
    }

    /// Arithmetic rate in FLOP per second.
    pub fn flops(&self) -> f64 {
        self.tflops * 1e12
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_devices() {
        let h100 = Device::parse("h100").unwrap();
        assert_eq!(h100.memory_bytes, 85_899_345_920);
        assert_eq!((h100.bandwidth_gb_s, h100.tflops), (3350.0, 989.0));
        assert_eq!(Device::parse("H200").unwrap().memory_bytes, 141_000_000_000);
        assert_eq!(Device::parse("a100").unwrap().bandwidth_gb_s, 2039.0);
        assert_eq!(Device::parse("l4").unwrap().memory_bytes, 24_000_000_000);
        assert_eq!(Device::parse("rtx4090").unwrap().memory_bytes, 24 << 30);
        let m5 = Device::parse("m5").unwrap();
        assert!(m5.source.contains("assumed"));
        assert_eq!(m5.bandwidth_gb_s, 153.0);
    }

    #[test]
    fn cpu_memory_is_memtotal() {
        let info = "MemTotal:       24684092 kB\nMemFree:        1000 kB\n";
        let cpu = Device::cpu_from_meminfo(info).unwrap();
        assert_eq!(cpu.memory_bytes, 24_684_092 * 1024);
        assert_eq!(cpu.bandwidth_gb_s, 26.9);
        assert!(cpu.source.contains("detected") && cpu.source.contains("assumed"));
        let err = Device::cpu_from_meminfo("MemFree: 1 kB\n").unwrap_err();
        assert!(err.to_string().contains("custom:"), "{err}");
    }

    #[test]
    fn custom_devices() {
        let d = Device::parse("custom:48,400,30").unwrap();
        assert_eq!(d.memory_bytes, 48 << 30);
        assert_eq!((d.bandwidth_gb_s, d.tflops), (400.0, 30.0));
        let d = Device::parse("custom: 0.5 , 26.9, 0.2").unwrap();
        assert_eq!(d.memory_bytes, 1 << 29);
        for bad in [
            "custom:",
            "custom:1,2",
            "custom:1,2,3,4",
            "custom:x,2,3",
            "custom:1,-2,3",
            "custom:1,2,0",
            "custom:1,2,inf",
            "custom:nan,2,3",
            "custom:1e30,2,3",
        ] {
            let err = Device::parse(bad).unwrap_err().to_string();
            assert!(
                err.contains("custom:MEM_GiB,BW_GBps,TFLOPS"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn unknown_device_lists_the_known_ones() {
        let err = Device::parse("tpu").unwrap_err().to_string();
        assert!(err.contains("unknown device 'tpu'"), "{err}");
        assert!(err.contains("h100") && err.contains("custom:"), "{err}");
    }
}
