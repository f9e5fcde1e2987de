//! The plan as a table for people (`spindle plan` without `--json`).

use std::fmt::Write;

use crate::plan::Plan;

/// Bytes with a binary unit: B, KiB, MiB or GiB.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if bytes >= size {
            return format!("{:.2} {unit}", bytes as f64 / size as f64);
        }
    }
    format!("{bytes} B")
}

fn rate(tokens_per_s: f64) -> String {
    if tokens_per_s >= 100.0 {
        format!("{tokens_per_s:.0} tok/s")
    } else {
        format!("{tokens_per_s:.1} tok/s")
    }
}

impl Plan {
    /// The plan as an aligned text table with units.
    pub fn render_table(&self) -> String {
        let window = match self.sliding_window {
            Some(w) if self.sliding_layers > 0 => format!(
                ", {} of {} layers sliding (window {w})",
                self.sliding_layers, self.n_layers
            ),
            _ => format!(", {} layers", self.n_layers),
        };
        let mut out = format!(
            "Plan for {} ({}{window}, context {})\n",
            self.model, self.architecture, self.context_length
        );
        let _ = writeln!(
            out,
            "  on {}: {} memory, {} GB/s, {} TFLOPS\n  ({})",
            self.device.name,
            human_bytes(self.device.memory_bytes),
            self.device.bandwidth_gb_s,
            self.device.tflops,
            self.device.source
        );
        let _ = writeln!(
            out,
            "  ctx {}, batch {}, KV {}, prefill chunk {}\n",
            self.ctx, self.batch, self.kv_type, self.prefill_chunk
        );
        out.push_str("Memory\n");

        row(&mut out, "weights", human_bytes(self.weights_bytes));
        for (ty, bytes) in &self.weights_by_type {
            row(&mut out, &format!("  {ty}"), human_bytes(*bytes));
        }
        row(
            &mut out,
            "KV cache",
            format!(
                "{} ({} per token at full attention)",
                human_bytes(self.kv_bytes),
                human_bytes(self.kv_bytes_per_token)
            ),
        );
        row(
            &mut out,
            "activations and workspace",
            human_bytes(self.activation_bytes),
        );
        row(
            &mut out,
            "runtime overhead",
            human_bytes(self.overhead_bytes),
        );
        if self.spec_cache_bytes > 0 || self.decide_cache_bytes > 0 {
            row(
                &mut out,
                "server caches (bounds)",
                format!(
                    "{} earlier outputs (--spec-cache-mb), {} decision priors (--decide-cache-mb)",
                    human_bytes(self.spec_cache_bytes),
                    human_bytes(self.decide_cache_bytes)
                ),
            );
        }
        let verdict = if self.fits { "fits" } else { "DOES NOT FIT" };
        row(
            &mut out,
            "total",
            format!(
                "{} of {}: {verdict}",
                human_bytes(self.total_bytes),
                human_bytes(self.device.memory_bytes)
            ),
        );
        row(
            &mut out,
            &format!("largest ctx at batch {}", self.batch),
            count(self.max_ctx),
        );
        if self.encoder {
            row(
                &mut out,
                &format!("largest batch at ctx {}", self.ctx),
                format!(
                    "any (texts run in passes of at most {} tokens)",
                    crate::memory::ENCODER_PASS_TOKENS
                ),
            );
            out.push_str("\nSpeed ceiling\n");
            row(
                &mut out,
                &format!("encoder pass ({} tokens)", self.prefill_chunk.min(self.ctx)),
                rate(self.prefill_tokens_per_s),
            );
            self.push_notes(&mut out);
            return out;
        }
        row(
            &mut out,
            &format!("largest batch at ctx {}", self.ctx),
            count(self.max_batch),
        );

        out.push_str("\nSpeed ceiling\n");
        row(
            &mut out,
            "decode, batch 1",
            rate(self.decode_tokens_per_s.batch_1),
        );
        if self.batch > 1 {
            row(
                &mut out,
                &format!("decode, batch {}", self.batch),
                format!("{} in all", rate(self.decode_tokens_per_s.batch_b)),
            );
        }
        row(
            &mut out,
            &format!("prefill ({} tokens)", self.prefill_chunk.min(self.ctx)),
            rate(self.prefill_tokens_per_s),
        );
        row(
            &mut out,
            "bytes read per decode step",
            format!(
                "{} weights + {} KV per sequence",
                human_bytes(self.weights_read_per_step_bytes),
                human_bytes(self.kv_read_per_seq_bytes)
            ),
        );
        let cross = |c: Option<u64>, batch: u64| match c {
            Some(ctx) if ctx > self.context_length => {
                format!("{ctx} (batch {batch}, past the context length)")
            }
            Some(ctx) => format!("{ctx} (batch {batch})"),
            None => format!("never (batch {batch})"),
        };
        let c = &self.kv_crossover_ctx;
        row(
            &mut out,
            "KV reads overtake weights at",
            format!(
                "ctx {}, {}, {}",
                cross(c.batch_1, 1),
                cross(c.batch_8, 8),
                cross(c.batch_32, 32)
            ),
        );
        let gain = if self.batch > 1 {
            format!(
                "x{:.2} at batch 1, x{:.2} at batch {}",
                self.q8_kv_gain.batch_1, self.q8_kv_gain.batch_b, self.batch
            )
        } else {
            format!("x{:.2} at batch 1", self.q8_kv_gain.batch_1)
        };
        row(&mut out, "q8_0 KV over f16 KV (decode)", gain);
        self.push_notes(&mut out);
        out
    }

    fn push_notes(&self, out: &mut String) {
        if !self.notes.is_empty() {
            out.push_str("\nNotes\n");
            for n in &self.notes {
                let _ = writeln!(out, "  - {n}");
            }
        }
    }
}

/// One labelled row of the table.
fn row(out: &mut String, label: &str, value: String) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "  {label:<28} {value}");
}

fn count(n: u64) -> String {
    if n == 0 {
        "none fits".to_string()
    } else {
        n.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(18_432), "18.00 KiB");
        assert_eq!(human_bytes(171_966_464), "164.00 MiB");
        assert_eq!(human_bytes(80 << 30), "80.00 GiB");
    }
}
