//! The report's measured sections, in the order it runs them: the matmul, the forward sweep,
//! the backward on the families the forward timed, and KV-cache decoding. Each goes through
//! the measuring code of the `bench` subcommands ([`crate::bench_cmd::matmul_record`],
//! [`crate::bench_cmd::attention_at`], [`crate::bench_backward::measure`],
//! [`crate::bench_decode::measure`]) into its section of `results.json`; a [`Budget`] keeps
//! the families other than `auto`'s to the sizes where a call stays under `--max-call-ms`.

use indicatif::ProgressBar;
use wgpu_attention::{Context, Dtype, Kernels, Result};

use super::json::{BackwardJson, DecodeJson, ForwardJson, MatmulJson};
use super::markdown::sig;
use super::Sizes;
use crate::bench_backward::{Outcome, Shape};
use crate::bench_cmd::Sweep;

/// The families the forward timed at each of its n, in increasing n.
pub(super) type TimedAt = Vec<(usize, Vec<Kernels>)>;

/// What every section is measured with.
pub(super) struct Run<'a> {
    pub ctx: &'a Context,
    /// The adapter's kernel families.
    pub families: &'a [Kernels],
    /// The family `Kernels::Auto` picks, timed at every size.
    pub auto: Kernels,
    pub sizes: &'a Sizes,
    /// The forward's and the backward's problem at each n, and the timing of every section.
    pub shape: Shape,
    /// `--max-call-ms`, for the [`Budget`].
    pub max_call_ms: f64,
    /// One step a measurement.
    pub progress: &'a ProgressBar,
}

impl Run<'_> {
    /// The forward's sweep: the CPU baselines, then each family fused and with the weights.
    fn forward_sweep(&self) -> Sweep {
        Sweep {
            shape: self.shape,
            fused_only: false,
            resident: false,
            no_cpu: false,
            // The report budgets each call instead (`--max-call-ms`).
            budget: None,
            cpu_flop_max: self.sizes.cpu_flop_max,
        }
    }

    /// The progress steps of the four sections, at most: the families the budget drops take
    /// theirs off as they go.
    pub(super) fn steps(&self) -> usize {
        let (sizes, families) = (self.sizes, self.families.len());
        sizes.matmul.len() * families
            + sizes.forward_n.len() * self.forward_sweep().steps(families)
            + sizes.backward_n.len() * families
            // GPU decode, whole-call sdpa and CPU decode at each (batch, cache length).
            + 3 * sizes.decode_n.len() * sizes.decode_batch.len()
    }

    /// Takes `k` steps off the progress bar's length.
    fn drop_steps(&self, k: usize) {
        let len = self.progress.length().unwrap_or(0);
        self.progress.set_length(len.saturating_sub(k as u64));
    }

    /// The square matmul at each size, on the families the budget keeps (a call's time
    /// projected as m³); `peak` is the FMA ceiling.
    pub(super) fn matmul(&self, peak: f64) -> Result<MatmulJson> {
        let mut budget = Budget::new(self.auto, self.max_call_ms, 3);
        let mut rows = Vec::new();
        for &m in &self.sizes.matmul {
            let timed = budget.families(self.families, m);
            self.drop_steps(self.families.len() - timed.len());
            for family in timed {
                let r = crate::bench_cmd::matmul_record(
                    self.ctx,
                    (family, wgpu_attention::Dtype::F32),
                    m,
                    (self.shape.warmup, self.shape.repeats),
                    peak,
                    self.progress,
                )?;
                budget.saw(family, m, r.stats.median_ms);
                rows.push(r);
            }
        }
        Ok(MatmulJson {
            sizes: self.sizes.matmul.clone(),
            rows,
            not_timed: budget.dropped,
        })
    }

    /// The forward at each n, on the families the budget keeps (a call's time projected as
    /// n², from the slowest of the family's paths), without PyTorch's rows yet; and the
    /// families it timed at each n.
    pub(super) fn forward(&self, peak: f64) -> Result<(ForwardJson, TimedAt)> {
        let sweep = self.forward_sweep();
        let mut forward = ForwardJson::new(&self.shape);
        let mut budget = Budget::new(self.auto, self.max_call_ms, 2);
        let mut timed_at = Vec::new();
        let per_family = sweep.steps(1) - sweep.steps(0);
        for &n in &self.sizes.forward_n {
            let timed = budget.families(self.families, n);
            self.drop_steps((self.families.len() - timed.len()) * per_family);
            let (rows, skipped) =
                crate::bench_cmd::attention_at(self.ctx, &sweep, n, &timed, peak, self.progress)?;
            for &family in &timed {
                let prefix = format!("gpu {family} ");
                let slowest = rows
                    .iter()
                    .filter(|r| r.path.starts_with(&prefix))
                    .map(|r| r.stats.median_ms)
                    .fold(0.0, f64::max);
                budget.saw(family, n, slowest);
            }
            timed_at.push((n, timed));
            forward.rows.extend(rows);
            forward.skipped.extend(skipped);
        }
        forward.not_timed = budget.dropped;
        Ok((forward, timed_at))
    }

    /// The fused backward at each n, on the families the forward timed there (or at the
    /// largest n it timed below), without PyTorch's rows yet.
    pub(super) fn backward(&self, timed_at: &TimedAt) -> Result<BackwardJson> {
        let mut backward = BackwardJson::new(&self.shape);
        for &n in &self.sizes.backward_n {
            let timed = timed_at
                .iter()
                .rev()
                .find(|(m, _)| *m <= n)
                .map_or_else(|| self.families.to_vec(), |(_, f)| f.clone());
            self.drop_steps(self.families.len() - timed.len());
            for f in self.families.iter().filter(|f| !timed.contains(f)) {
                backward.not_timed.push(format!(
                    "{f} at n = {n} (not timed by the forward at this size)"
                ));
            }
            let sweep = crate::bench_backward::Sweep {
                n: &[n],
                shape: self.shape,
            };
            self.progress.set_message(format!("backward n={n}"));
            let outcomes = crate::bench_backward::measure(self.ctx, &sweep, &timed, |_| {
                self.progress.inc(1);
            })?;
            for o in outcomes {
                match o {
                    Outcome::Row(r) => backward.rows.push(r),
                    Outcome::Skipped(family, n, e) => {
                        backward.skipped.push(format!("{family} n={n}: {e}"));
                    }
                }
            }
        }
        Ok(backward)
    }

    /// Decoding with an f32 KV cache at each (batch, cache length), three ways.
    pub(super) fn decode(&self) -> Result<DecodeJson> {
        let sizes = self.sizes;
        let decode_bench = crate::bench_decode::DecodeBench {
            lengths: &sizes.decode_n,
            batches: &sizes.decode_batch,
            heads: sizes.decode_heads,
            d: sizes.decode_d,
            block: None,
            dtype: Dtype::F32,
            warmup: self.shape.warmup,
            repeats: self.shape.repeats,
            no_cpu: false,
        };
        self.progress.set_message("decode");
        let rows = crate::bench_decode::measure(self.ctx, &decode_bench, |r| {
            self.progress
                .set_message(format!("decode batch {} S={}", r.batch, r.cache_len));
            self.progress.inc(1);
        })?;
        Ok(DecodeJson {
            heads: sizes.decode_heads,
            d: sizes.decode_d,
            dtype: Dtype::F32.to_string(),
            rows,
        })
    }
}

/// Which kernel families to time at each size of a sweep: `auto`'s family always; another
/// while its time at the size before, scaled by `(size / that size)^power`, stays under
/// `max_ms` per call (once over, it is left out of the larger sizes, and `dropped` says so).
struct Budget {
    auto: Kernels,
    max_ms: f64,
    power: i32,
    /// Each family's last (size, ms per call).
    last: Vec<(Kernels, usize, f64)>,
    dropped: Vec<String>,
}

impl Budget {
    fn new(auto: Kernels, max_ms: f64, power: i32) -> Self {
        Budget {
            auto,
            max_ms,
            power,
            last: Vec::new(),
            dropped: Vec::new(),
        }
    }

    /// The families of `all` to time at `size`.
    fn families(&mut self, all: &[Kernels], size: usize) -> Vec<Kernels> {
        let mut timed = Vec::new();
        for &family in all {
            let last = self.last.iter().find(|(f, _, _)| *f == family);
            match last {
                Some(&(_, at, ms)) if family != self.auto => {
                    let projected = ms * (size as f64 / at as f64).powi(self.power);
                    if projected <= self.max_ms {
                        timed.push(family);
                    } else {
                        // Dropped for good: forget it, and say so once.
                        self.last.retain(|(f, _, _)| *f != family);
                        self.dropped.push(format!(
                            "{family} from {size} on: {} ms a call at {at} projects to {} ms \
                             (over {} ms)",
                            sig(ms),
                            sig(projected),
                            sig(self.max_ms)
                        ));
                    }
                }
                None if family != self.auto
                    && self
                        .dropped
                        .iter()
                        .any(|d| d.starts_with(&format!("{family} "))) => {}
                _ => timed.push(family),
            }
        }
        timed
    }

    /// Notes `family`'s time per call at `size`.
    fn saw(&mut self, family: Kernels, size: usize, ms: f64) {
        self.last.retain(|(f, _, _)| *f != family);
        self.last.push((family, size, ms));
    }
}
