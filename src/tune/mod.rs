//! Autotuning: which kernel variant runs fastest on this adapter, measured on first use over a
//! small candidate set at an anchored shape, remembered per context and on disk.
//!
//! A choice is keyed by the adapter's name, driver and driver version, a hash of the kernels'
//! sources (so an edited kernel is measured again) and the anchored shape (for the fused
//! kernel: per-head widths in vec4s and the row count's power-of-two bucket). The disk cache is a JSON map in
//! `$WGPU_ATTENTION_TUNE_CACHE` (a file path; `off` keeps choices in memory only), else
//! `$XDG_CACHE_HOME/wgpu-attention/tune.json`, else `~/.cache/wgpu-attention/tune.json`.
//! `WGPU_ATTENTION_TUNE=off` (or [`Context::with_tuning`]) skips measuring: remembered
//! choices are still used, anything else takes its family's default variant.

mod cache;
pub(crate) mod sources;

use serde::{de::DeserializeOwned, Serialize};

pub use cache::TuneCache;

use crate::context::Context;
use crate::error::Result;
use crate::gpu::buffer;
use crate::kernels::flash_blocked::FlashBlockedConsts;
use crate::kernels::flash_tiled::Flash;
use crate::kernels::matmul::Matmul;
use crate::kernels::{KernelId, Strides};
use crate::phases::Phase;
use crate::timing;
use crate::variant::{self, FlashVariant, Kernels, MatmulVariant};

/// Problems with fewer rows are not worth measuring for: they take the remembered choice if
/// there is one, else the family's default.
pub const MIN_TUNED_N: usize = 256;
/// The largest anchored fused-attention problem: problems are measured at their row count
/// rounded up to a power of two, between [`MIN_TUNED_N`] and this.
pub const FLASH_MAX_ANCHOR_N: usize = 1024;
/// Side of the anchored square matmul.
pub const MATMUL_ANCHOR: usize = 512;

/// Whether measuring is on by default (`WGPU_ATTENTION_TUNE` is not `off`); see
/// [`Context::with_tuning`].
pub fn enabled() -> bool {
    !std::env::var("WGPU_ATTENTION_TUNE").is_ok_and(|v| v.eq_ignore_ascii_case("off"))
}

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

/// The fused kernel's default variant in `family` (used when measuring is off) on `ctx`,
/// for per-head widths in vec4s: see [`default_flash_on`].
pub fn default_flash(ctx: &Context, family: Kernels, widths4: (u32, u32)) -> FlashVariant {
    let device = ctx.adapter_info().device_type;
    default_flash_on(device, ctx.limits(), family, widths4)
}

/// The fused kernel's default variant in `family` on a device of type `device` with
/// `limits`, for per-head widths `(dk4, dv4)` in vec4s: the subgroup family's, or the
/// storage family's of [`storage_flash`].
pub fn default_flash_on(
    device: wgpu::DeviceType,
    limits: &wgpu::Limits,
    family: Kernels,
    widths4: (u32, u32),
) -> FlashVariant {
    match family {
        Kernels::Subgroup => FlashVariant::Subgroup { rows_per_lane: 2 },
        _ => storage_flash(device, limits, widths4).0,
    }
}

/// The storage family's fused-kernel variants on a device of type `device` with `limits`,
/// for per-head widths `(dk4, dv4)` in vec4s: the default and the tuner's candidates.
///
/// On a CPU adapter (lavapipe): `flash_tiled` (32 keys per tile by default, the tile sizes
/// whose memory fits as candidates). On anything else: `flash_blocked` alone, whose every
/// variant compiles without spills for RDNA3 where `flash_tiled` spills hundreds of
/// registers (README, "What a real GPU compiler says"); the default is the first of
/// [`BLOCKED_SHAPES`] that fits the workgroup memory, the threads and the output registers
/// per thread. Only when none fits (a head wider than 256, a small device) is `flash_tiled`
/// used there, and a log line says so once per width.
pub fn storage_flash(
    device: wgpu::DeviceType,
    limits: &wgpu::Limits,
    (dk4, dv4): (u32, u32),
) -> (FlashVariant, Vec<FlashVariant>) {
    const TILED: FlashVariant = FlashVariant::Tiled { keys: 32 };
    if device != wgpu::DeviceType::Cpu {
        let blocked = blocked_candidates(limits, dk4, dv4);
        if let Some(&first) = blocked.first() {
            return (first, blocked);
        }
        static WARNED: std::sync::Mutex<Vec<(u32, u32)>> = std::sync::Mutex::new(Vec::new());
        let mut warned = WARNED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !warned.contains(&(dk4, dv4)) {
            warned.push((dk4, dv4));
            log::warn!(
                "no flash_blocked variant fits d_k = {}, d_v = {} on this {device:?} \
                 (workgroup memory {} bytes, {} threads): using flash_tiled, which may \
                 spill registers",
                4 * dk4,
                4 * dv4,
                limits.max_compute_workgroup_storage_size,
                limits.max_compute_invocations_per_workgroup,
            );
        }
    }
    (TILED, tiled_candidates(limits, dk4, dv4))
}

/// See [`default_flash`].
pub fn default_matmul(family: Kernels) -> MatmulVariant {
    match family {
        Kernels::Subgroup => MatmulVariant::Subgroup { rows_per_lane: 2 },
        _ => MatmulVariant::Tiled,
    }
}

/// The block shapes (query rows × keys) of `flash_blocked.wgsl` the tuner tries on GPUs.
pub const BLOCKED_SHAPES: [(u32, u32); 3] = [(64, 64), (64, 32), (32, 64)];

/// `flash_tiled.wgsl`'s candidates whose tiles fit `limits`.
pub(crate) fn tiled_candidates(limits: &wgpu::Limits, dk4: u32, dv4: u32) -> Vec<FlashVariant> {
    let limit = u64::from(limits.max_compute_workgroup_storage_size);
    [16u32, 32, 64]
        .into_iter()
        .filter(|&k| u64::from(k) * u64::from(dk4 + dv4) * 16 <= limit)
        .map(|keys| FlashVariant::Tiled { keys })
        .collect()
}

/// `flash_blocked.wgsl`'s candidates (of [`BLOCKED_SHAPES`]) that fit `limits`.
pub(crate) fn blocked_candidates(limits: &wgpu::Limits, dk4: u32, dv4: u32) -> Vec<FlashVariant> {
    BLOCKED_SHAPES
        .into_iter()
        .filter(|&s| FlashBlockedConsts::new(limits, s, (dk4, dv4)).is_ok())
        .map(|(rows, keys)| FlashVariant::Blocked { rows, keys })
        .collect()
}

/// The candidates of the fused kernel in `families`, for per-head widths in vec4s.
pub fn flash_candidates(
    ctx: &Context,
    families: &[Kernels],
    dk4: u32,
    dv4: u32,
) -> Vec<FlashVariant> {
    let mut v = Vec::new();
    if families.contains(&Kernels::Subgroup) && ctx.subgroup_size().is_some() {
        // More rows per lane share each loaded key: 4 is ~10% faster than 2 at d = 64 on
        // lavapipe, but LLVM takes ~4–5 s to compile 3 or 4 there (once: Mesa caches it).
        v.extend([1, 2, 3, 4].map(|r| FlashVariant::Subgroup { rows_per_lane: r }));
    }
    if families.contains(&Kernels::Storage) {
        // flash_tiled on a CPU adapter (lavapipe), flash_blocked on GPUs.
        let device = ctx.adapter_info().device_type;
        v.extend(storage_flash(device, ctx.limits(), (dk4, dv4)).1);
    }
    // Tensor cores where the device has them: timed like the others, kept if faster.
    let coop = families.contains(&Kernels::Storage) || families.contains(&Kernels::Coop);
    if coop && ctx.coop_shape().is_some() {
        v.push(FlashVariant::Coop);
    }
    v
}

/// The candidates of the matmul in `families`.
pub fn matmul_candidates(ctx: &Context, families: &[Kernels]) -> Vec<MatmulVariant> {
    let mut v = Vec::new();
    if families.contains(&Kernels::Subgroup) && ctx.subgroup_size().is_some() {
        v.extend([1, 2, 4].map(|t| MatmulVariant::Subgroup { rows_per_lane: t }));
    }
    let coop = families.contains(&Kernels::Coop);
    if families.contains(&Kernels::Storage) || coop {
        v.push(MatmulVariant::Tiled);
        // Tensor cores where the device has them: timed like the others, kept if faster.
        if ctx.coop_shape().is_some() {
            v.push(MatmulVariant::Coop);
        }
    }
    v
}

/// The fastest of `candidates` by `time` (the best of three runs after a warm-up, which
/// pays the compile: on a shared machine the minimum is the least disturbed figure). A
/// candidate whose first timed run is 5× slower than the best so far is dropped there.
fn fastest<T: Copy + std::fmt::Debug>(
    candidates: &[T],
    mut time: impl FnMut(T) -> Result<f64>,
) -> Result<Option<T>> {
    let mut best: Option<(T, f64)> = None;
    for &c in candidates {
        time(c)?; // the warm-up: compiles, so it says nothing about speed
        let first = time(c)?;
        if best.is_some_and(|(_, b)| first > 5.0 * b) {
            log::debug!("tune: {c:?} {first:.2} ms, dropped");
            continue;
        }
        let t = first.min(time(c)?).min(time(c)?);
        log::debug!("tune: {c:?} {t:.2} ms");
        if best.is_none_or(|(_, b)| t < b) {
            best = Some((c, t));
        }
    }
    Ok(best.map(|(c, _)| c))
}

/// The remembered choice among `candidates` for `kind` (`detail` names the anchored shape),
/// or the one `measure` finds now when the caller's problem has at least [`MIN_TUNED_N`]
/// `rows` and tuning is on; else `fallback`, unremembered.
#[allow(clippy::too_many_arguments)]
fn choose<T>(
    ctx: &Context,
    families: &[Kernels],
    kind: &str,
    detail: &str,
    candidates: &[T],
    fallback: T,
    rows: usize,
    measure: impl FnOnce(&[T]) -> Result<Option<T>>,
) -> Result<T>
where
    T: Copy + std::fmt::Debug + Serialize + DeserializeOwned,
{
    if candidates.len() < 2 {
        return Ok(candidates.first().copied().unwrap_or(fallback));
    }
    let names: Vec<String> = families.iter().map(|f| f.to_string()).collect();
    let key = key(
        ctx,
        format!("{kind} {} {detail}", names.join("+")).trim_end(),
    );
    if let Some(v) = ctx.tune_cache().get(&key) {
        return Ok(v);
    }
    if rows < MIN_TUNED_N || !ctx.tuning() {
        return Ok(fallback);
    }
    let best = {
        let _tune = ctx.phases.enter(Phase::Tune);
        measure(candidates)?.unwrap_or(fallback)
    };
    log::info!("tuned [{key}]: {best:?}");
    ctx.tune_cache().put(&key, &best);
    Ok(best)
}

/// The fused kernel for per-head widths `dk_h`, `dv_h` and `n` rows among `families`:
/// remembered, or measured now on the anchored problem (`n` rounded up to a power of two,
/// at most [`FLASH_MAX_ANCHOR_N`]) when `n` is at least [`MIN_TUNED_N`] (else the default,
/// unremembered).
///
/// # Errors
/// GPU errors while measuring.
pub fn flash(
    ctx: &Context,
    families: &[Kernels],
    (dk_h, dv_h): (usize, usize),
    n: usize,
) -> Result<FlashVariant> {
    let (dk4, dv4) = (dk_h.div_ceil(4) as u32, dv_h.div_ceil(4) as u32);
    let candidates = flash_candidates(ctx, families, dk4, dv4);
    let anchor = n.next_power_of_two().clamp(MIN_TUNED_N, FLASH_MAX_ANCHOR_N);
    let detail = format!("dk4={dk4} dv4={dv4} n~{anchor}");
    let fallback = default_flash(ctx, families[0], (dk4, dv4));
    choose(
        ctx,
        families,
        "flash",
        &detail,
        &candidates,
        fallback,
        n,
        |candidates| {
            let (dk, dv) = (4 * dk4 as usize, 4 * dv4 as usize);
            let data = |len: usize| -> Vec<f32> {
                (0..len).map(|i| ((i % 23) as f32 - 11.0) / 11.0).collect()
            };
            let q = buffer::upload(ctx, "tune Q", &data(anchor * dk))?;
            let v = buffer::upload(ctx, "tune V", &data(anchor * dv))?;
            let out = buffer::output(ctx, "tune O", anchor * dv, false)?;
            let qs = Strides::row_major(dk as u32, 0, 0);
            let vs = Strides::row_major(dv as u32, 0, 0);
            let op = Flash {
                batch: 1,
                heads: 1,
                n_q: anchor,
                n_kv: anchor,
                dk_h: dk,
                dv_h: dv,
                q: qs,
                k: qs,
                v: vs,
                o: vs,
                causal: false,
                scale: 0.125,
                kv_ratio: 1,
                f16: false,
                skip_zero: false,
            };
            fastest(candidates, |c| {
                timing::timed_submit(ctx, |enc| {
                    variant::record_flash(ctx, enc, &op, c, (&q, &q, &v), &out, None, None)
                })
                .map(|t| t.0)
            })
        },
    )
}

/// The matmul among `families`: remembered, or measured now on the anchored square when the
/// caller's has at least 256 `rows` (else the default, unremembered).
///
/// # Errors
/// GPU errors while measuring.
pub fn matmul(ctx: &Context, families: &[Kernels], rows: usize) -> Result<MatmulVariant> {
    let candidates = matmul_candidates(ctx, families);
    let fallback = default_matmul(families[0]);
    choose(
        ctx,
        families,
        "matmul",
        "",
        &candidates,
        fallback,
        rows,
        |candidates| {
            let m = MATMUL_ANCHOR;
            let problem = MatmulProblem::new(ctx, (m, m, m))?;
            fastest(candidates, |c| {
                timing::measure(0, 1, || problem.run(ctx, c)).map(|(s, _)| s.median_ms)
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
    /// `(m, k)·(k, n)` with fixed operands uploaded.
    pub(crate) fn new(ctx: &Context, (m, n, k): (usize, usize, usize)) -> Result<Self> {
        let a: Vec<f32> = (0..m * k).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i % 13) as f32 - 6.0) / 6.0).collect();
        Ok(MatmulProblem {
            mm: Matmul::plain(m, n, k, false, 0)?,
            a: buffer::upload(ctx, "A", &a)?,
            b: buffer::upload(ctx, "B", &b)?,
            c: buffer::output(ctx, "C", m * n, false)?,
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
            variant::record_matmul(ctx, enc, &p.mm, variant, &p.a, &p.b, &p.a, &p.c)
        })
        .map(|(_, t)| t)
    }
}

#[cfg(test)]
mod tests;
