//! Autotuning: which kernel variant runs fastest on this adapter, measured on first use over a
//! small candidate set at an anchored shape, remembered per context and on disk.
//!
//! A choice is keyed by the adapter's name, driver and driver version, a hash of the kernels'
//! sources (so an edited kernel is measured again) and the shape's bucket (for the fused
//! kernel: per-head widths in vec4s and the caller's [`Bucket`] of `batch · heads` and `n`,
//! where the candidates are measured). Measuring on a call is bounded by the call's own
//! estimated time (see [`fastest_within`]) and resumes on later calls of the bucket until
//! every candidate is measured. The disk cache is a JSON map in
//! `$WGPU_ATTENTION_TUNE_CACHE` (a file path; `off` keeps choices in memory only), else
//! `$XDG_CACHE_HOME/wgpu-attention/tune.json`, else `~/.cache/wgpu-attention/tune.json`.
//! `WGPU_ATTENTION_TUNE=off` (or [`Context::with_tuning`]) skips measuring: remembered
//! choices are still used, anything else takes its family's default variant.

mod candidates;
pub(crate) mod sources;

pub use candidates::{
    default_flash, default_matmul, flash_candidates, matmul_candidates, COOP_TUNED,
};

use serde::{de::DeserializeOwned, Serialize};

use crate::context::Context;
use crate::dtype::Dtype;
use crate::error::Result;
use crate::gpu::buffer;
use crate::gpu::timing;
use crate::kernels::flash_tiled::Flash;
use crate::kernels::matmul::Matmul;
use crate::kernels::{KernelId, Strides};
use crate::phases::Phase;
use crate::variant::{self, FlashVariant, Kernels, MatmulVariant};

/// Problems with fewer rows are not worth measuring for: they take the remembered choice if
/// there is one, else the family's default.
pub const MIN_TUNED_N: usize = 256;
/// The largest row count of a fused-attention bucket (see [`Bucket`]).
pub const FLASH_MAX_BUCKET_N: usize = 4096;
/// The most `batch · heads` of a fused-attention bucket.
pub const FLASH_MAX_BUCKET_GROUPS: usize = 64;
/// Side of the anchored square matmul.
pub const MATMUL_ANCHOR: usize = 512;

/// FNV-1a of every kernel's source: a tuned choice is only reused for the same kernels.
/// Computed once per process (every call's plan looks a choice up).
fn kernels_hash() -> u64 {
    static HASH: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *HASH.get_or_init(|| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let sources = KernelId::ALL.iter().map(|id| id.info().source);
        for source in sources.chain([crate::kernels::wgsl::PRELUDE]) {
            for b in source.bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        h
    })
}

fn key(ctx: &Context, what: &str) -> String {
    let info = ctx.adapter_info();
    format!(
        "{} | {} {} | kernels {:016x} | {what}",
        info.name,
        info.driver,
        info.driver_info,
        kernels_hash()
    )
}

/// The fastest of `candidates` by `time` (the best of three runs after a warm-up, which
/// pays the compile: on a shared machine the minimum is the least disturbed figure). A
/// candidate whose first timed run is 5× slower than the best so far is dropped there.
#[cfg(test)]
fn fastest<T: Copy + std::fmt::Debug>(
    candidates: &[T],
    time: impl FnMut(T) -> Result<f64>,
) -> Result<Option<T>> {
    let mut clock = || 0.0;
    let progress = fastest_within(candidates, None, f64::INFINITY, &mut clock, time)?;
    Ok(progress.map(|p| p.best))
}

/// Where measuring a bucket stands: the best candidate so far, its time (ms per run at the
/// bucket), how many candidates (in order) have been measured and what measuring the last
/// one cost (ms, its compiling warm-up included). Remembered as it is, so a later call goes
/// on from `measured`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Progress<T> {
    pub best: T,
    pub ms: f64,
    pub measured: usize,
    pub cost: f64,
    /// Every candidate measured so far: its time and what compiling it cost (see
    /// [`sparse_flash`], which weighs the two for a block-sparse call); empty in a cache
    /// written before it was kept.
    #[serde(default = "Vec::new")]
    pub runs: Vec<Measured<T>>,
}

/// One candidate as [`fastest_within`] measured it: ms per run at the bucket, and the
/// compiling warm-up's time over a run's (the pipeline's creation and the driver's first
/// dispatch), ms.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Measured<T> {
    pub variant: T,
    pub ms: f64,
    pub compile_ms: f64,
}

/// `fastest` under a budget, from `from` (`None`: from the start; the first candidate, the
/// default the call would compile and run anyway, is measured and sets the estimate). The
/// call's own estimated time is the best time at the start × `scale` (the call's work over
/// the bucket's). Before each further candidate, its cost is predicted as the last measured
/// one's (compile included), and measuring stops, keeping the best so far, when the time
/// spent on further candidates (read from `clock`, in ms) plus that prediction would pass
/// the estimate: a call spends on the further candidates about its own time at most; the
/// rest waits for later calls of the bucket (or `wgpu-attention tune`, unbudgeted).
fn fastest_within<T: Copy + std::fmt::Debug>(
    candidates: &[T],
    from: Option<Progress<T>>,
    scale: f64,
    clock: &mut impl FnMut() -> f64,
    mut time: impl FnMut(T) -> Result<f64>,
) -> Result<Option<Progress<T>>> {
    let mut best = from.as_ref().map(|p| (p.best, p.ms));
    let mut measured = from.as_ref().map_or(0, |p| p.measured);
    let mut cost = from.as_ref().map_or(0.0, |p| p.cost);
    // Set once the default is measured: (estimate, when the further candidates began).
    let mut budget = from.as_ref().map(|p| (p.ms * scale, clock()));
    let mut runs = from.map_or_else(Vec::new, |p| p.runs);
    for &c in &candidates[measured.min(candidates.len())..] {
        if let Some((estimate, since)) = budget {
            let spent = clock() - since;
            if spent + cost > estimate {
                log::debug!(
                    "tune: {spent:.1} ms spent + {cost:.1} ms predicted passes the call's \
                     estimate {estimate:.1} ms: the rest later"
                );
                break;
            }
        }
        measured += 1;
        let began = clock();
        time(c)?; // the warm-up: compiles, so it says nothing about speed
        let warm_up = clock() - began;
        let first = time(c)?;
        let measured_as = |ms: f64| Measured {
            variant: c,
            ms,
            compile_ms: (warm_up - ms).max(0.0),
        };
        if best.is_some_and(|(_, b)| first > 5.0 * b) {
            log::debug!("tune: {c:?} {first:.2} ms, dropped");
            runs.push(measured_as(first));
            cost = clock() - began;
            continue;
        }
        let t = first.min(time(c)?).min(time(c)?);
        log::debug!(
            "tune: {c:?} {t:.2} ms, compiling {:.1} ms",
            (warm_up - t).max(0.0)
        );
        runs.push(measured_as(t));
        if best.is_none_or(|(_, b)| t < b) {
            best = Some((c, t));
        }
        cost = clock() - began;
        budget.get_or_insert_with(|| (t * scale, clock()));
    }
    Ok(best.map(|(best, ms)| Progress {
        best,
        ms,
        measured,
        cost,
        runs,
    }))
}

/// Whether a call's measuring is bounded by its own time (see [`fastest_within`]): yes unless
/// `WGPU_ATTENTION_TUNE=full` (what `wgpu-attention tune` sets: it measures every candidate).
fn budgeted(ctx: &Context) -> bool {
    // The GPU stand-in runs every candidate (its times mean nothing; see `choose`).
    !std::env::var("WGPU_ATTENTION_TUNE").is_ok_and(|v| v.eq_ignore_ascii_case("full"))
        && !ctx.hardware().is_stand_in()
}

/// The remembered choice among `candidates` for `kind` (`detail` names the bucket), or the
/// one `measure` finds now (going on from where earlier calls stopped) when the caller's
/// problem has at least [`MIN_TUNED_N`] `rows` and tuning is on; else the best measured so
/// far, or `fallback`, unremembered. `candidates` start with `fallback` (the default, which
/// sets the budget's estimate); `scale` is the call's work over the measured problem's.
#[allow(clippy::too_many_arguments)]
fn choose<T>(
    ctx: &Context,
    (families, dtype): (&[Kernels], Dtype),
    kind: &str,
    detail: &str,
    candidates: &[T],
    fallback: T,
    rows: usize,
    scale: f64,
    measure: impl FnOnce(&[T], Option<Progress<T>>) -> Result<Option<Progress<T>>>,
) -> Result<T>
where
    T: Copy + PartialEq + std::fmt::Debug + Serialize + DeserializeOwned,
{
    if candidates.len() < 2 {
        return Ok(candidates.first().copied().unwrap_or(fallback));
    }
    let mut ordered = vec![fallback];
    ordered.extend(candidates.iter().copied().filter(|&c| c != fallback));
    let key = choice_key(ctx, families, kind, detail, dtype);
    // A remembered choice this context cannot run (tensor cores turned off since) is none.
    let known: Option<Progress<T>> = ctx
        .tune_cache()
        .get(&key)
        .filter(|p: &Progress<T>| ordered.contains(&p.best));
    // Measured to the end, or the next candidate alone would cost more than this call's
    // estimated time (so measuring would stop before it: skip making the tuning problem).
    let done = known
        .as_ref()
        .is_some_and(|p| p.measured >= ordered.len() || (budgeted(ctx) && p.cost > p.ms * scale));
    // Under the WGSL sanitizer nothing is measured (its times mean nothing, and it would
    // interpret every candidate): the default, the same in every run.
    if ctx.sanitized_lanes().is_some() {
        return Ok(fallback);
    }
    if done || rows < MIN_TUNED_N || !ctx.tuning() {
        return Ok(known.map_or(fallback, |p| p.best));
    }
    let progress = {
        let _tune = ctx.phases.enter(Phase::Tune);
        measure(&ordered, known)?
    };
    // The GPU stand-in's times mean nothing: it ran every candidate (so each compiles and
    // runs as a GPU's tuner would make it) and keeps the default, the same in every run.
    let progress = match ctx.hardware().is_stand_in() {
        true => progress.map(|p| Progress {
            best: fallback,
            ..p
        }),
        false => progress,
    };
    let Some(progress) = progress else {
        return Ok(fallback);
    };
    log::info!(
        "tuned [{key}]: {:?} ({} of {} candidates measured)",
        progress.best,
        progress.measured,
        ordered.len()
    );
    ctx.tune_cache().put(&key, &progress);
    Ok(progress.best)
}

/// The tuning cache's key of a choice of `kind` among `families` for the bucket `detail` of
/// a call with operands of `dtype`: an f16 call never takes a choice measured for f32, nor
/// the other way round (their candidates differ, see [`same_numerics`]).
pub(crate) fn choice_key(
    ctx: &Context,
    families: &[Kernels],
    kind: &str,
    detail: &str,
    dtype: Dtype,
) -> String {
    let names: Vec<String> = families.iter().map(|f| f.to_string()).collect();
    // f16 operands multiplied in f16 (flash-blocked's `f16_arithmetic`) are other numerics
    // and other times than f16 operands multiplied in f32.
    let hmul = dtype == Dtype::F16 && ctx.blocked_options().f16_products(ctx);
    let dtype = if hmul {
        "f16-products".to_string()
    } else {
        dtype.to_string()
    };
    key(
        ctx,
        format!("{kind} {dtype} {} {detail}", names.join("+")).trim_end(),
    )
}

/// A tuning bucket of the fused kernel: the caller's `batch · heads` and `n`, each rounded
/// down to a power of two (at most [`FLASH_MAX_BUCKET_GROUPS`] and [`FLASH_MAX_BUCKET_N`]), so
/// the problem measured is never larger than the call; `scale` is the call's work over it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    /// `batch · heads`, a power of two.
    pub groups: usize,
    /// Query (and key) rows, a power of two.
    pub n: usize,
    /// The call's work over the bucket's (≥ 1): `groups · n²` each.
    pub scale: f64,
}

impl Bucket {
    /// The bucket of a call of `groups = batch · heads` heads of `n` rows.
    pub fn of(groups: usize, n: usize) -> Self {
        let floor = |x: usize, cap: usize| {
            let x = x.clamp(1, cap);
            if x.is_power_of_two() {
                x
            } else {
                x.next_power_of_two() / 2
            }
        };
        let (g, m) = (
            floor(groups, FLASH_MAX_BUCKET_GROUPS),
            floor(n, FLASH_MAX_BUCKET_N),
        );
        let work = |g: usize, n: usize| g as f64 * (n as f64) * (n as f64);
        Bucket {
            groups: g,
            n: m,
            scale: (work(groups.max(1), n.max(1)) / work(g, m)).max(1.0),
        }
    }
}

/// The fused kernel's bucket of a call ([`Bucket`]) and its name in the tuning cache's key.
pub(crate) fn flash_bucket(
    (dk_h, dv_h): (usize, usize),
    (groups, n): (usize, usize),
) -> (Bucket, String) {
    let (dk4, dv4) = (dk_h.div_ceil(4), dv_h.div_ceil(4));
    let bucket = Bucket::of(groups, n);
    let detail = format!("dk4={dk4} dv4={dv4} g~{} n~{}", bucket.groups, bucket.n);
    (bucket, detail)
}

/// Compiling time already weighed against running time per bucket in this process (see
/// [`sparse_flash`]): the ms its calls have run slower than the fastest measured candidate
/// would have.
fn regret() -> &'static std::sync::Mutex<std::collections::HashMap<String, f64>> {
    static REGRET: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, f64>>> =
        std::sync::OnceLock::new();
    REGRET.get_or_init(Default::default)
}

/// The fused kernel of a block-sparse call, weighing compile time against running time:
/// `planned` (what [`flash`] chose for the call's bucket, timed on dense attention) unless
/// another candidate of its family, measured at the bucket, costs less for this call, where
/// a candidate costs its time at the bucket × the call's work over the bucket's × `density`
/// (the fraction of the call's key blocks its block map leaves to visit), plus, when
/// `built(candidate)` is false, its compiling time less what earlier calls of the bucket in
/// this process lost by not having the fastest candidate (so a faster kernel is compiled once
/// the time it would have saved has paid for its compiling: the rent-or-buy rule). A one-shot
/// call over a narrow window thus takes a kernel that compiles in a fifth of the time and
/// runs about as fast there; a dense call keeps the tuner's choice. Without remembered
/// measurements, `planned`.
pub(crate) fn sparse_flash(
    ctx: &Context,
    (families, dtype): (&[Kernels], Dtype),
    (widths, shape): ((usize, usize), (usize, usize)),
    planned: FlashVariant,
    density: f64,
    built: impl Fn(FlashVariant) -> bool,
) -> FlashVariant {
    let (bucket, detail) = flash_bucket(widths, shape);
    let key = choice_key(ctx, families, "flash", &detail, dtype);
    let Some(known) = ctx.tune_cache().get::<Progress<FlashVariant>>(&key) else {
        return planned;
    };
    let runs: Vec<_> = known
        .runs
        .iter()
        .filter(|r| r.variant.family() == planned.family())
        .collect();
    if runs.is_empty() || !(density > 0.0 && density < 1.0) {
        return planned;
    }
    let run_ms = |r: &Measured<FlashVariant>| r.ms * bucket.scale * density;
    let fastest = runs.iter().map(|r| run_ms(r)).fold(f64::INFINITY, f64::min);
    let mut regret = regret().lock().unwrap_or_else(|e| e.into_inner());
    let paid = regret.get(&key).copied().unwrap_or(0.0);
    let cost = |r: &Measured<FlashVariant>| {
        let compile = match built(r.variant) {
            true => 0.0,
            false => (r.compile_ms - paid).max(0.0),
        };
        run_ms(r) + compile
    };
    let Some(best) = runs
        .iter()
        .min_by(|a, b| cost(a).total_cmp(&cost(b)))
        .copied()
    else {
        return planned;
    };
    *regret.entry(key).or_insert(0.0) += run_ms(best) - fastest;
    log::info!(
        "block-sparse call (density {density:.3}): {:?}, est. {:.1} ms with compiling (the \
         tuner's {planned:?} for dense calls)",
        best.variant,
        cost(best)
    );
    best.variant
}

/// The fused kernel for per-head widths `dk_h`, `dv_h` and a call of `groups = batch ·
/// heads` heads of `n` rows among `families`: remembered for the call's [`Bucket`], or
/// measured now at the bucket (within the call's budget, see [`fastest_within`]) when `n` is
/// at least [`MIN_TUNED_N`] (else the default, unremembered).
///
/// # Errors
/// GPU errors while measuring.
pub fn flash(
    ctx: &Context,
    (families, dtype): (&[Kernels], Dtype),
    (dk_h, dv_h): (usize, usize),
    (groups, n): (usize, usize),
) -> Result<FlashVariant> {
    let (dk4, dv4) = (dk_h.div_ceil(4) as u32, dv_h.div_ceil(4) as u32);
    let (bucket, detail) = flash_bucket((dk_h, dv_h), (groups, n));
    let f16 = dtype == Dtype::F16;
    let op = bucket_op(&bucket, (dk4, dv4), f16);
    // A candidate that would run as another kernel at the bucket (past a loop cap, say) is
    // not timed under its name: it is left out.
    let candidates: Vec<FlashVariant> = flash_candidates(ctx, families, dk4, dv4, dtype)
        .into_iter()
        .filter(|&c| {
            crate::kernels::flash::runs_as(ctx, &op, c, false).is_ok_and(|(ran, _)| ran == c)
        })
        .collect();
    let fallback = default_flash(ctx, families[0], (dk4, dv4));
    choose(
        ctx,
        (families, dtype),
        "flash",
        &detail,
        &candidates,
        fallback,
        n,
        bucket.scale,
        |candidates, from| {
            let (dk, dv) = (op.dk_h, op.dv_h);
            let (g, m) = (bucket.groups, bucket.n);
            let data = |len: usize| -> Vec<f32> {
                (0..len).map(|i| ((i % 23) as f32 - 11.0) / 11.0).collect()
            };
            // In the call's element type: an f16 call's candidates are timed in f16.
            let q = buffer::upload_as(ctx, "tune Q", &data(g * m * dk), f16)?;
            let v = buffer::upload_as(ctx, "tune V", &data(g * m * dv), f16)?;
            // Every fused kernel writes f32, whatever its operands (an f16-sized output had
            // flash_blocked, unchecked, store past its end while an f16 call was tuned).
            let out = buffer::output(ctx, "tune O", g * m * dv, false)?;
            let start = std::time::Instant::now();
            let mut clock = || start.elapsed().as_secs_f64() * 1e3;
            let scale = if budgeted(ctx) {
                bucket.scale
            } else {
                f64::INFINITY
            };
            fastest_within(candidates, from, scale, &mut clock, |c| {
                timing::gpu_time(ctx, |enc| {
                    variant::record_flash(ctx, enc, &op, c, (&q, &q, &v), &out, None, None)
                        .map(|_| ())
                })
            })
        },
    )
}

/// The fused pass the tuner times at `bucket` for per-head widths `(dk4, dv4)` in vec4s: Q
/// (= K) and V of `bucket.groups` heads of `bucket.n` rows, heads side by side in a row, as
/// the calls lay them out.
fn bucket_op(bucket: &Bucket, (dk4, dv4): (u32, u32), f16: bool) -> Flash {
    let (dk, dv) = (4 * dk4 as usize, 4 * dv4 as usize);
    let (g, m) = (bucket.groups, bucket.n);
    let u = |x: usize| x as u32;
    let qs = Strides::row_major(u(g * dk), u(dk), u(m * g * dk));
    let vs = Strides::row_major(u(g * dv), u(dv), u(m * g * dv));
    Flash {
        batch: 1,
        heads: g,
        n_q: m,
        n_kv: m,
        dk_h: dk,
        dv_h: dv,
        q: qs,
        k: qs,
        v: vs,
        o: vs,
        causal: false,
        scale: 0.125,
        kv_ratio: 1,
        f16,
        skip_zero: false,
        key_split: crate::variant::KeySplit::Auto,
    }
}

/// The matmul among `families`: remembered, or measured now on the anchored square when the
/// caller's has at least 256 `rows` (else the default, unremembered).
///
/// # Errors
/// GPU errors while measuring.
pub fn matmul(
    ctx: &Context,
    (families, dtype): (&[Kernels], Dtype),
    rows: usize,
) -> Result<MatmulVariant> {
    let candidates = matmul_candidates(ctx, families, dtype);
    let fallback = default_matmul(families[0]);
    choose(
        ctx,
        (families, dtype),
        "matmul",
        "",
        &candidates,
        fallback,
        rows,
        1.0,
        |candidates, from| {
            let m = MATMUL_ANCHOR;
            let problem = MatmulProblem::new(ctx, (m, m, m), dtype)?;
            let start = std::time::Instant::now();
            let mut clock = || start.elapsed().as_secs_f64() * 1e3;
            // The budget as for the fused kernel, the anchor's time standing in for the call's.
            let scale = if budgeted(ctx) { 1.0 } else { f64::INFINITY };
            fastest_within(candidates, from, scale, &mut clock, |c| {
                problem.time(ctx, c)
            })
        },
    )
}

/// A square-ish matmul on the device, for measuring the matmul variants (the tuner's anchor
/// and `bench`'s matmul rows).
pub(crate) struct MatmulProblem {
    mm: Matmul,
    a: wgpu::Buffer,
    b: wgpu::Buffer,
    c: crate::gpu::buffer::Buf,
}

impl MatmulProblem {
    /// `(m, k)·(k, n)` with fixed operands uploaded in `dtype` (f16: A, B and C, as the
    /// projections of an f16 call).
    pub(crate) fn new(
        ctx: &Context,
        (m, n, k): (usize, usize, usize),
        dtype: Dtype,
    ) -> Result<Self> {
        use crate::kernels::matmul::{F16_A, F16_B, F16_C};
        let a: Vec<f32> = (0..m * k).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i % 13) as f32 - 6.0) / 6.0).collect();
        let f16 = dtype == Dtype::F16;
        let bits = if f16 { F16_A | F16_B | F16_C } else { 0 };
        Ok(MatmulProblem {
            mm: Matmul::plain(m, n, k, false, bits)?,
            a: buffer::upload_as(ctx, "A", &a, f16)?,
            b: buffer::upload_as(ctx, "B", &b, f16)?,
            c: match f16 {
                true => buffer::output_f16(ctx, "C", m * n)?,
                false => buffer::output(ctx, "C", m * n, false)?,
            },
        })
    }

    /// One dispatch with `variant`, timed as the tuner compares candidates
    /// ([`timing::gpu_time`]: GPU timestamps where there are, else the wall clock).
    fn time(&self, ctx: &Context, variant: MatmulVariant) -> Result<f64> {
        let p = self;
        timing::gpu_time(ctx, |enc| {
            variant::record_matmul(ctx, enc, &p.mm, variant, &p.a, &p.b, &p.a, &p.c).map(|_| ())
        })
    }

    /// One dispatch with `variant`, submitted and waited for: its wall time in milliseconds
    /// and the kernels' times (empty without profiling).
    pub(crate) fn run(
        &self,
        ctx: &Context,
        variant: MatmulVariant,
    ) -> Result<Vec<timing::KernelTime>> {
        let p = self;
        timing::timed_submit(ctx, |enc| {
            variant::record_matmul(ctx, enc, &p.mm, variant, &p.a, &p.b, &p.a, &p.c).map(|_| ())
        })
        .map(|(_, t)| t)
    }
}

#[cfg(test)]
mod tests;
