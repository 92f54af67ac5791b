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

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::{de::DeserializeOwned, Serialize};

use crate::attention::Kernels;
use crate::bench;
use crate::context::Context;
use crate::error::Result;
use crate::gpu::buffer;
use crate::gpu::pipeline::KernelId;
use crate::kernels::flash::{Flash, FlashVariant};
use crate::kernels::matmul::{MatmulVariant, Strides};

/// Problems with fewer rows are not worth measuring for: they take the remembered choice if
/// there is one, else the family's default.
pub const MIN_TUNED_N: usize = 256;
/// The largest anchored fused-attention problem: problems are measured at their row count
/// rounded up to a power of two, between [`MIN_TUNED_N`] and this.
pub const FLASH_MAX_ANCHOR_N: usize = 1024;
/// Side of the anchored square matmul.
pub const MATMUL_ANCHOR: usize = 512;

/// Remembered choices: in memory, and in a JSON file when there is one.
pub struct TuneCache {
    path: Option<PathBuf>,
    choices: Mutex<HashMap<String, serde_json::Value>>,
}

impl TuneCache {
    /// The cache at the default place (see the module docs), loaded if it exists.
    pub fn from_env() -> Self {
        let path = match std::env::var("WGPU_ATTENTION_TUNE_CACHE") {
            Ok(v) if v.eq_ignore_ascii_case("off") => None,
            Ok(v) if !v.is_empty() => Some(PathBuf::from(v)),
            _ => std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|d| d.join("wgpu-attention").join("tune.json")),
        };
        Self::at(path)
    }

    /// A cache stored at `path` (`None`: memory only).
    pub fn at(path: Option<PathBuf>) -> Self {
        let choices = path
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or_default();
        TuneCache {
            path,
            choices: Mutex::new(choices),
        }
    }

    fn get<T: DeserializeOwned>(&self, key: &str) -> Option<T> {
        let map = self.choices.lock().ok()?;
        serde_json::from_value(map.get(key)?.clone()).ok()
    }

    /// Remembers `value`; writing the file is best effort (a read-only home only costs a
    /// re-measure next time).
    fn put<T: Serialize>(&self, key: &str, value: &T) {
        let Ok(v) = serde_json::to_value(value) else {
            return;
        };
        let Ok(mut map) = self.choices.lock() else {
            return;
        };
        map.insert(key.to_string(), v);
        if let Some(path) = &self.path {
            // Merge with what other processes wrote meanwhile.
            let mut on_disk: HashMap<String, serde_json::Value> = std::fs::read_to_string(path)
                .ok()
                .and_then(|s| serde_json::from_str(&s).ok())
                .unwrap_or_default();
            on_disk.extend(map.iter().map(|(k, v)| (k.clone(), v.clone())));
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            if let Ok(text) = serde_json::to_string_pretty(&on_disk) {
                let tmp = path.with_extension("json.tmp");
                if std::fs::write(&tmp, text).is_ok() {
                    let _ = std::fs::rename(&tmp, path);
                }
            }
        }
    }
}

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
        for id in KernelId::ALL {
            for b in id.source().bytes() {
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

/// Each family's default variants, used when measuring is off.
pub fn default_flash(family: Kernels) -> FlashVariant {
    match family {
        Kernels::Subgroup => FlashVariant::Subgroup { rows_per_lane: 2 },
        _ => FlashVariant::Tiled { keys: 32 },
    }
}

/// See [`default_flash`].
pub fn default_matmul(family: Kernels) -> MatmulVariant {
    match family {
        Kernels::Subgroup => MatmulVariant::Subgroup { rows_per_lane: 2 },
        _ => MatmulVariant::Tiled,
    }
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
        let limit = u64::from(ctx.limits().max_compute_workgroup_storage_size);
        v.extend(
            [16u32, 32, 64]
                .into_iter()
                .filter(|&k| u64::from(k) * u64::from(dk4 + dv4) * 16 <= limit)
                .map(|keys| FlashVariant::Tiled { keys }),
        );
    }
    v
}

/// The candidates of the matmul in `families`.
pub fn matmul_candidates(ctx: &Context, families: &[Kernels]) -> Vec<MatmulVariant> {
    let mut v = Vec::new();
    if families.contains(&Kernels::Subgroup) && ctx.subgroup_size().is_some() {
        v.extend([1, 2, 4].map(|t| MatmulVariant::Subgroup { rows_per_lane: t }));
    }
    if families.contains(&Kernels::Storage) {
        v.push(MatmulVariant::Tiled);
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
    let best = measure(candidates)?.unwrap_or(fallback);
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
    let fallback = default_flash(families[0]);
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
                bench::timed_submit(ctx, |enc| {
                    op.record(ctx, enc, c, &q, &q, &v, &out, None, None)
                })
                .map(|t| t.0)
            })
        },
    )
}

/// The matmul among `families`: remembered, or measured now on the anchored square when the
/// caller's has at least [`MIN_TUNED_N`] `rows` (else the default, unremembered).
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
            fastest(candidates, |c| {
                bench::matmul(ctx, c, (m, m, m), 0, 1).map(|(s, _)| s.median_ms)
            })
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_round_trips_through_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("tune.json");
        let cache = TuneCache::at(Some(path.clone()));
        cache.put("k", &FlashVariant::Subgroup { rows_per_lane: 4 });
        let again = TuneCache::at(Some(path));
        assert_eq!(
            again.get::<FlashVariant>("k"),
            Some(FlashVariant::Subgroup { rows_per_lane: 4 })
        );
        assert_eq!(again.get::<FlashVariant>("missing"), None);
    }

    #[test]
    fn fastest_picks_the_lowest_time_and_drops_slow_candidates_early() {
        let times = std::cell::RefCell::new(HashMap::from([(1, 10.0), (2, 3.0), (3, 100.0)]));
        let mut calls = HashMap::new();
        let best = fastest(&[1, 2, 3], |c| {
            *calls.entry(c).or_insert(0) += 1;
            Ok(times.borrow()[&c])
        })
        .unwrap();
        assert_eq!(best, Some(2));
        assert_eq!(calls[&3], 2, "warm-up, then a 5x slower first run ends it");
        times.borrow_mut().clear();
    }
}
