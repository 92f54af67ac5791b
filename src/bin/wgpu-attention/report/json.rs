//! `results.json`: the report as data, every row of every section, and the facts about the
//! run it records (date, commit, load average). `results.md` is rendered from the same
//! [`Report`].

use std::process::Command;

use serde::{Deserialize, Serialize};
use wgpu_attention::bench;
use wgpu_attention::wgpu::AdapterInfo;

use crate::bench_backward::Shape;
use crate::bench_cmd::Record;
use crate::torch_peer::TorchRow;

/// The adapter as `results.json` names it.
#[derive(Serialize)]
pub(super) struct AdapterJson {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
    pub vendor: u32,
    pub device: u32,
}

impl AdapterJson {
    pub(super) fn of(info: &AdapterInfo) -> Self {
        AdapterJson {
            name: info.name.clone(),
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: info.driver.clone(),
            driver_info: info.driver_info.clone(),
            vendor: info.vendor,
            device: info.device,
        }
    }
}

/// This machine's CPU.
#[derive(Serialize)]
pub(super) struct CpuJson {
    pub model: String,
    pub threads: usize,
}

impl CpuJson {
    pub(super) fn here() -> Self {
        CpuJson {
            model: bench::cpu_model(),
            threads: bench::cpu_threads(),
        }
    }
}

#[derive(Serialize)]
pub(super) struct TorchJson {
    pub available: bool,
    pub version: Option<String>,
    /// Where it ran: `CPU`, or the GPU (`CUDA NVIDIA H100 80GB HBM3`).
    pub device: Option<String>,
    /// Why there is no PyTorch column, when there is none.
    pub note: Option<String>,
}

/// The forward's or the backward's section: its problem, a row per path (or family) and n,
/// the paths skipped for the device's limits, and PyTorch's rows on the same problems.
#[derive(Serialize)]
pub(super) struct SweepJson<R> {
    pub d: usize,
    pub heads: usize,
    pub batch: usize,
    pub causal: bool,
    pub rows: Vec<R>,
    pub skipped: Vec<String>,
    /// Families left out at larger sizes for the time a call would take (the backward: at
    /// the sizes where the forward left them out).
    pub not_timed: Vec<String>,
    pub pytorch: Vec<TorchRow>,
}

impl<R> SweepJson<R> {
    /// No rows yet, on `shape`'s problem.
    pub(super) fn new(shape: &Shape) -> Self {
        SweepJson {
            d: shape.d,
            heads: shape.heads,
            batch: shape.batch,
            causal: shape.causal,
            rows: Vec::new(),
            skipped: Vec::new(),
            not_timed: Vec::new(),
            pytorch: Vec::new(),
        }
    }
}

pub(super) type ForwardJson = SweepJson<Record>;
pub(super) type BackwardJson = SweepJson<crate::bench_backward::Row>;

#[derive(Serialize)]
pub(super) struct DecodeJson {
    pub heads: usize,
    pub d: usize,
    pub dtype: String,
    pub rows: Vec<crate::bench_decode::Row>,
}

#[derive(Serialize)]
pub(super) struct MatmulJson {
    pub sizes: Vec<usize>,
    pub rows: Vec<Record>,
    /// Families left out at larger sizes for the time a call would take.
    pub not_timed: Vec<String>,
}

/// One call timed twice in a fresh process, with its first time's phases.
#[derive(Serialize, Deserialize)]
pub(super) struct CallTime {
    pub call: String,
    pub first_ms: f64,
    pub second_ms: f64,
    pub compile_ms: f64,
    pub pipelines: usize,
    pub tune_ms: f64,
    pub dispatch_ms: f64,
}

/// A fresh process's `Context::new` and first call, under one state of the caches (the
/// first-call process prints it, the report reads it back and names the caches).
#[derive(Serialize, Deserialize)]
pub(super) struct FirstCall {
    pub caches: String,
    pub context_new_ms: f64,
    #[serde(flatten)]
    pub call: CallTime,
}

#[derive(Serialize)]
pub(super) struct Report {
    pub generator: &'static str,
    pub crate_version: &'static str,
    /// `git rev-parse HEAD` of the source tree at run time, `-dirty` with changes to tracked
    /// files; `None` outside a git checkout.
    pub git_commit: Option<String>,
    pub build_profile: &'static str,
    pub date_utc: String,
    pub quick: bool,
    pub warmup: usize,
    pub repeats: usize,
    pub timing: String,
    /// The family `Kernels::Auto` picks for the largest forward call.
    pub auto_family: String,
    pub max_call_ms: f64,
    pub duration_s: f64,
    /// The 1-minute load average (`/proc/loadavg`) when the report started and ended: above
    /// the CPU's threads, other work shared the machine.
    pub load_average: [Option<f64>; 2],
    pub adapter: AdapterJson,
    pub cpu: CpuJson,
    pub pytorch: TorchJson,
    pub fma_peak_gflops: f64,
    pub matmul: MatmulJson,
    pub forward: ForwardJson,
    pub backward: BackwardJson,
    pub decode: DecodeJson,
    pub first_call: Vec<FirstCall>,
}

/// The 1-minute load average from `/proc/loadavg`, where there is one.
pub(super) fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `git rev-parse HEAD` of the crate's source tree, with `-dirty` where tracked files have
/// changes; `None` where there is no git or no checkout.
pub(super) fn git_commit() -> Option<String> {
    let dir = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
    };
    let head = git(&["rev-parse", "HEAD"])?;
    let mut commit = String::from_utf8_lossy(&head.stdout).trim().to_string();
    if git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|o| !o.stdout.is_empty())
    {
        commit.push_str("-dirty");
    }
    Some(commit)
}

/// Now in UTC as `YYYY-MM-DDTHH:MM:SSZ`.
pub(super) fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_454), (2026, 1, 1));
    }
}
