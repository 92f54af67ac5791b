//! What ran under the sanitizer and what it found: each device's tally and the process's,
//! and the one line a command ends with.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

/// What ran under the sanitizer on one device so far, and what it found: the line `verify`
/// ends with ([`crate::Context::sanitizer_summary`]).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct SanitizerSummary {
    /// The subgroup width (0: the sanitizer is off).
    pub lanes: u32,
    /// Dispatches interpreted, per kernel file.
    pub dispatches: BTreeMap<&'static str, u64>,
    /// The most schedules (seeds) one dispatch ran under (`WGPU_ATTENTION_SANITIZE_SEEDS`,
    /// [`crate::Context::with_sanitizer_seeds`]).
    pub seeds: u32,
    /// Lane-operations interpreted.
    pub lane_ops: u64,
    /// Time spent interpreting.
    pub time: Duration,
    /// Time spent parsing and validating kernels (once per pipeline) and moving the bound
    /// resources to and from the device.
    pub overhead: Duration,
    /// Errors found (distinct kind and place per dispatch), per kernel file.
    pub errors: BTreeMap<&'static str, u64>,
    /// Warnings (NaN or infinity from finite operands), per kernel file.
    pub warnings: BTreeMap<&'static str, u64>,
    /// Dispatches the interpreter could not run (an unsupported construct, a bad binding).
    pub failed: u64,
    /// The most loop iterations one invocation ran (all its loops together) in any dispatch,
    /// with that dispatch's kernel file and its stated bound (`Kernel::loops`, the count
    /// lavapipe's loop-cap guard trusts: `src/kernels/loops.rs`).
    pub loops: LoopPeak,
    /// Dispatches that ran more loop iterations than their kernel's stated bound (each also
    /// counted in `errors`: the guard against lavapipe's cap is then unsafe), per kernel file.
    pub over_bound: BTreeMap<&'static str, u64>,
}

/// The dispatch whose invocation ran the most loop iterations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoopPeak {
    /// Loop iterations of its busiest invocation (what the interpreter counted).
    pub iterations: u64,
    /// What its kernel states as the bound.
    pub bound: u64,
    /// Its kernel file.
    pub kernel: &'static str,
}

impl SanitizerSummary {
    /// Dispatches interpreted, all kernels together.
    pub fn total_dispatches(&self) -> u64 {
        self.dispatches.values().sum()
    }

    /// Errors found, all kernels together.
    pub fn total_errors(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Warnings, all kernels together.
    pub fn total_warnings(&self) -> u64 {
        self.warnings.values().sum()
    }
}

impl fmt::Display for SanitizerSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lanes == 0 {
            return f.write_str("sanitizer: off");
        }
        let secs = self.time.as_secs_f64();
        write!(
            f,
            "sanitizer ({}-lane subgroups): {} dispatches of {} kernels ({}), {:.3e} lane-ops \
             in {secs:.1} s ({:.0} M/s; {:.1} s more parsing kernels and moving buffers){}; ",
            self.lanes,
            self.total_dispatches(),
            self.dispatches.len(),
            list(&self.dispatches),
            self.lane_ops as f64,
            self.lane_ops as f64 / secs.max(1e-9) / 1e6,
            self.overhead.as_secs_f64(),
            match self.seeds {
                0 | 1 => String::new(),
                n => format!(", each dispatch under {n} seeds"),
            },
        )?;
        match (self.total_errors(), self.total_warnings(), self.failed) {
            (0, 0, 0) => f.write_str("found nothing")?,
            (e, w, x) => {
                write!(f, "found {e} errors")?;
                if e > 0 {
                    write!(f, " ({})", list(&self.errors))?;
                }
                write!(f, ", {w} warnings")?;
                if w > 0 {
                    write!(f, " ({})", list(&self.warnings))?;
                }
                if x > 0 {
                    write!(f, ", {x} dispatches it could not run")?;
                }
            }
        }
        let peak = &self.loops;
        write!(
            f,
            "; loop iterations per invocation at most {} ({}, stated bound {}; lavapipe's cap {})",
            grouped(peak.iterations),
            peak.kernel.trim_end_matches(".wgsl"),
            grouped(peak.bound),
            grouped(crate::gpu::hardware::LLVMPIPE_LOOP_CAP),
        )?;
        if !self.over_bound.is_empty() {
            write!(
                f,
                ", past the stated bound in {} dispatches ({})",
                self.over_bound.values().sum::<u64>(),
                list(&self.over_bound)
            )?;
        }
        Ok(())
    }
}

/// `n` with its digits grouped by three: `65,535`.
pub(super) fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Every device's tally together: what [`SanitizerSummary::process`] gives.
pub(super) static PROCESS: Mutex<SanitizerSummary> = Mutex::new(SanitizerSummary {
    lanes: 0,
    dispatches: BTreeMap::new(),
    seeds: 0,
    lane_ops: 0,
    time: Duration::ZERO,
    overhead: Duration::ZERO,
    errors: BTreeMap::new(),
    warnings: BTreeMap::new(),
    failed: 0,
    loops: LoopPeak {
        iterations: 0,
        bound: 0,
        kernel: "",
    },
    over_bound: BTreeMap::new(),
});

/// One dispatch for the tally.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
pub(super) struct Noted<'a> {
    pub(super) label: &'static str,
    pub(super) lanes: u32,
    /// What it found (`None`: the interpreter could not run it).
    pub(super) report: Option<&'a wgsl_sanitizer::Report>,
    /// Its kernel's stated loop bound.
    pub(super) loop_bound: u64,
    /// Time spent interpreting it.
    pub(super) time: Duration,
}

impl SanitizerSummary {
    /// What ran under the sanitizer in this process so far, on every context together, and
    /// what it found (the line a command ends with under `WGPU_ATTENTION_SANITIZE`); `lanes`
    /// is 0 when nothing ran.
    pub fn process() -> SanitizerSummary {
        PROCESS.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Counts one dispatch: an invocation past the stated loop bound is an error.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub(super) fn note(&mut self, d: &Noted<'_>) {
        self.lanes = d.lanes;
        self.time += d.time;
        let Some(report) = d.report else {
            self.failed += 1;
            return;
        };
        *self.dispatches.entry(d.label).or_default() += 1;
        self.seeds = self.seeds.max(report.seeds_run);
        self.lane_ops += report.lane_ops;
        let over = report.max_loop_iterations > d.loop_bound;
        let errors = report.errors().count() as u64 + u64::from(over);
        let warnings = report.findings.len() as u64 + u64::from(over) - errors;
        if over {
            *self.over_bound.entry(d.label).or_default() += 1;
        }
        if report.max_loop_iterations > self.loops.iterations || self.loops.kernel.is_empty() {
            self.loops = LoopPeak {
                iterations: report.max_loop_iterations,
                bound: d.loop_bound,
                kernel: d.label,
            };
        }
        if errors > 0 {
            *self.errors.entry(d.label).or_default() += errors;
        }
        if warnings > 0 {
            *self.warnings.entry(d.label).or_default() += warnings;
        }
    }
}

/// `name ×count, …`.
fn list(counts: &BTreeMap<&'static str, u64>) -> String {
    counts
        .iter()
        .map(|(k, n)| format!("{} x{n}", k.trim_end_matches(".wgsl")))
        .collect::<Vec<_>>()
        .join(", ")
}
