//! The output head's exact shortcut: bounds on every logit from the head
//! screen (`spindle_kernels::head_screen`), and exact logits of chosen
//! tokens only, bit-identical to the full head's.
//!
//! A row that needs only the token its sampler chooses (greedy, or sampling
//! with no cut of the candidates) reads the screen, a quarter-bit copy of
//! the head, and then the exact rows of the few tokens whose bound can
//! still win; the engine's sampler does that search
//! (`spindle_engine::sampler::choose_bounded`).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

use spindle_kernels::head_screen::{HeadScreen, ScreenBounds};
use spindle_kernels::matmul::WeightView;
use spindle_kernels::quant::panels::panel_row;
use spindle_kernels::{GgmlType, WeightLayout};

use super::{Hidden, Model};
use crate::batch::Batch;
use crate::error::ModelError;
use crate::kv_cache::KvType;

/// Text whose hidden states calibrate the screen's basis: prose, code,
/// lists and JSON, the kinds of text the model will be asked to continue.
pub const CALIBRATION_TEXT: &str = "The history of the bicycle begins in the early \
nineteenth century, when inventors in Germany and France built wooden machines pushed \
along by the rider's feet. Over the next decades, pedals, chains and pneumatic tires \
made cycling fast, cheap and popular.\n\nfn main() {\n    let numbers = vec![1, 2, 3, 4];\n    \
let total: i32 = numbers.iter().sum();\n    println!(\"total = {}\", total);\n}\n\n\
{\"name\": \"Ada Lovelace\", \"born\": 1815, \"fields\": [\"mathematics\", \"computing\"], \
\"city\": \"London\"}\n\nQuestion: What is the capital of France?\nAnswer: Paris.\n\n\
1. Preheat the oven to 200 degrees.\n2. Mix the flour, sugar and butter.\n3. Bake for \
twenty minutes.\n\nUser: Can you summarise this report in two sentences?\nAssistant: \
Revenue grew by 12% in the third quarter, driven by strong sales in Europe. Costs rose \
more slowly, so the operating margin improved.";

/// Whether and how this model screens its head.
#[derive(Default)]
pub(super) struct ScreenSlot {
    /// Token ids of the calibration text; `None`: no screen.
    calibration: Option<Vec<u32>>,
    built: OnceLock<Option<HeadScreen>>,
    /// Whether the screen has been paying: see [`Model::record_screen`].
    misses: AtomicU32,
    /// Rows left to run on the full head before the screen is tried again.
    resting: AtomicU32,
    /// Rows the screen chose for, rows it screened in vain, and rows that
    /// skipped it while it rested ([`Model::screen_counts`]).
    paid: AtomicU64,
    missed: AtomicU64,
    rested: AtomicU64,
}

/// How the head's screen has fared since the model was loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScreenCounts {
    /// Rows whose chosen token came from the screen.
    pub paid: u64,
    /// Rows screened that still took the full head.
    pub missed: u64,
    /// Rows that took the full head because the screen was resting.
    pub rested: u64,
}

/// A screened row costs the screen plus the exact logits of its
/// candidates; when too many tokens stay candidates (text unlike anything
/// the basis was calibrated on, such as random tokens) the row takes the
/// full head as well and the screen was wasted. After this many such rows
/// in a row...
const MISSES_TO_REST: u32 = 4;
/// ...the full head alone runs for this many rows, then the screen is
/// tried again. The chosen token is exact either way; only time differs.
const REST_ROWS: u32 = 256;

impl Model {
    /// Screens the head from now on (when it is a Q8_0 matrix and the model
    /// has no final soft cap), calibrated by the hidden states of
    /// `calibration` (token ids, such as [`CALIBRATION_TEXT`] encoded). The
    /// screen is built on first use. `None` turns it off.
    pub fn set_head_screen(&mut self, calibration: Option<Vec<u32>>) {
        self.screen = ScreenSlot {
            calibration,
            ..ScreenSlot::default()
        };
    }

    /// The screen, built now if it was not yet (a pass over the calibration
    /// tokens, then a scan of the head: about a second for a 262k-token head
    /// on 2 cores); `None` when this model does not screen its head.
    pub fn head_screen(&self) -> Result<Option<&HeadScreen>, ModelError> {
        if let Some(built) = self.screen.built.get() {
            return Ok(built.as_ref());
        }
        let screen = self.build_screen()?;
        // The build's transient copies (hundreds of MB for a 262k head)
        // are freed by now; the server builds it after loading's trim.
        crate::heap::release_freed_memory();
        Ok(self.screen.built.get_or_init(|| screen).as_ref())
    }

    /// Bytes the screen holds: 0 until it is built, and for heads it does
    /// not screen.
    pub(super) fn head_screen_bytes(&self) -> usize {
        match self.screen.built.get() {
            Some(Some(s)) => s.bytes(),
            _ => 0,
        }
    }

    fn build_screen(&self) -> Result<Option<HeadScreen>, ModelError> {
        let out = &self.weights.output;
        let Some(tokens) = &self.screen.calibration else {
            return Ok(None);
        };
        if out.ty != GgmlType::Q8_0 || self.config.final_softcap.is_some() || tokens.is_empty() {
            return Ok(None);
        }
        let tokens = &tokens[..tokens.len().min(1024)];
        let mut kv = self.new_kv_cache(KvType::F16, tokens.len(), 1);
        let seq = kv.add_sequence()?;
        let mut batch = Batch::new();
        batch.push_chain(seq, 0, tokens, |_| true);
        let hidden = self.forward_hidden(&batch, &mut kv)?;
        Ok(Some(HeadScreen::build(
            &out.view(),
            &hidden.data,
            &self.pool,
        )?))
    }

    /// Scales the screen's Cauchy-Schwarz slack (1: sound). Below 1 the
    /// bounds may fall under logits: only for tests that show the
    /// exactness checks catch an unsound bound.
    pub fn set_head_screen_slack(&mut self, scale: f32) -> Result<(), ModelError> {
        self.head_screen()?;
        if let Some(Some(s)) = self.screen.built.get_mut() {
            s.set_slack_scale(scale);
        }
        Ok(())
    }

    /// Upper bounds on every logit of batch rows `rows` (each in
    /// `hidden.rows`), or `None` when the head is not screened.
    pub fn head_bounds(
        &self,
        hidden: &Hidden,
        rows: &[usize],
    ) -> Result<Option<ScreenBounds>, ModelError> {
        let Some(screen) = self.head_screen()? else {
            return Ok(None);
        };
        let resting = &self.screen.resting;
        if resting.load(Ordering::Relaxed) > 0 {
            resting.fetch_sub(1, Ordering::Relaxed);
            self.screen.rested.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        let x = self.gather_hidden(hidden, rows)?;
        let bounds = screen.bounds(self.isa, self.act_rounding, &x, rows.len(), &self.pool)?;
        Ok(Some(bounds))
    }

    /// Tells the screen whether a row it screened found its token (`paid`)
    /// or had to take the full head too; a run of misses rests the screen
    /// for a while (see [`MISSES_TO_REST`]).
    pub fn record_screen(&self, paid: bool) {
        let s = &self.screen;
        let n = if paid { &s.paid } else { &s.missed };
        n.fetch_add(1, Ordering::Relaxed);
        if paid {
            s.misses.store(0, Ordering::Relaxed);
        } else if s.misses.fetch_add(1, Ordering::Relaxed) + 1 >= MISSES_TO_REST {
            s.misses.store(0, Ordering::Relaxed);
            s.resting.store(REST_ROWS, Ordering::Relaxed);
        }
    }

    /// How the screen has fared so far (all zero without a screen).
    pub fn screen_counts(&self) -> ScreenCounts {
        let s = &self.screen;
        ScreenCounts {
            paid: s.paid.load(Ordering::Relaxed),
            missed: s.missed.load(Ordering::Relaxed),
            rested: s.rested.load(Ordering::Relaxed),
        }
    }

    /// The logits of `tokens` for batch row `row`, in that order:
    /// bit-identical to those [`Model::logits`] gives (each output of the
    /// head is computed alone, by the same code, whatever else is asked).
    pub fn logits_of(
        &self,
        hidden: &Hidden,
        row: usize,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        let out = &self.weights.output;
        let x = self.gather_hidden(hidden, &[row])?;
        let row_bytes = out.view().row_bytes();
        let mut rows = vec![0u8; tokens.len() * row_bytes];
        for (&t, dst) in tokens.iter().zip(rows.chunks_exact_mut(row_bytes)) {
            let t = t as usize;
            if t >= out.rows {
                return Err(ModelError::InvalidBatch(format!(
                    "logit of token {t} asked, vocabulary is {}",
                    out.rows
                )));
            }
            match out.layout {
                // A head in panels: each row as the file has it.
                WeightLayout::Panels => panel_row(out.ty, out.cols, &out.data, t, dst)?,
                _ => dst.copy_from_slice(&out.data[t * row_bytes..(t + 1) * row_bytes]),
            }
        }
        // Whole rows, so still in the head's own layout (the file's, for
        // rows gathered from panels).
        let layout = match out.layout {
            WeightLayout::Panels => WeightLayout::Gguf,
            other => other,
        };
        let view = WeightView::new(out.ty, tokens.len(), out.cols, &rows)?.with_layout(layout);
        let mut data = vec![0f32; tokens.len()];
        if !tokens.is_empty() {
            spindle_kernels::matmul::matmul_with(
                self.isa,
                self.act_rounding,
                &view,
                &x,
                1,
                &mut data,
                &self.pool,
            )?;
        }
        if let Some(cap) = self.config.final_softcap {
            spindle_kernels::activation::soft_cap(&mut data, cap);
        }
        Ok(data)
    }

    /// The hidden states of `rows`, one after another.
    pub(super) fn gather_hidden(
        &self,
        hidden: &Hidden,
        rows: &[usize],
    ) -> Result<Vec<f32>, ModelError> {
        let e = hidden.n_embd;
        let mut x = Vec::with_capacity(rows.len() * e);
        for &row in rows {
            let h = hidden.row(row).ok_or(ModelError::InvalidBatch(format!(
                "logits asked for batch row {row}, which did not ask for them in the pass"
            )))?;
            x.extend_from_slice(h);
        }
        Ok(x)
    }
}
