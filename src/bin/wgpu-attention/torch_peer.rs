//! PyTorch beside us in the same run (`benches/torch_peer.py`): its SDPA timed on the shapes
//! `bench` and `report` time, on the CPU where our adapter is a CPU and on torch's GPU (CUDA,
//! ROCm, MPS) where our adapter is a GPU, so that every ratio compares like with like.

use serde::Serialize;

use crate::bench_backward::Shape;
use crate::bench_cmd::Record;

/// The CPU peers (ndarray, the f64 reference, PyTorch's CPU SDPA) time a GPU-sized problem
/// only up to this many FLOP a forward call: past it one CPU call takes minutes.
pub const CPU_FLOP_MAX: f64 = 2e10;

/// PyTorch's SDPA on one n: forward and autograd backward medians, the device it ran on and
/// its CPU thread count.
#[derive(Serialize)]
pub struct TorchRow {
    pub n: usize,
    pub forward_ms: f64,
    /// `None` when only the forward was timed.
    pub backward_ms: Option<f64>,
    pub threads: usize,
    /// `CPU`, or the GPU: `CUDA NVIDIA H100 80GB HBM3`, `MPS Apple GPU`.
    pub device: String,
}

impl TorchRow {
    /// `PyTorch CPU SDPA, 2 threads` or `PyTorch CUDA … SDPA`: `what` after the device.
    pub fn label(&self, what: &str) -> String {
        match self.device.as_str() {
            "CPU" => format!("PyTorch CPU {what}, {} threads", self.threads),
            gpu => format!("PyTorch {gpu} {what}"),
        }
    }
}

/// What `benches/torch_peer.py` gave.
pub enum TorchPeer {
    /// PyTorch's version, and a row per n.
    Rows(String, Vec<TorchRow>),
    /// No `python3`, or no `torch` in it: why.
    Unavailable(String),
    /// The script failed: its last line of stderr.
    Failed(String),
}

/// PyTorch's SDPA at each of `n` on `shape` (its heads, their width, batch, mask and
/// `repeats` timed calls after one untimed one; `shape.warmup` is not used), when `python3`
/// has `torch` (`benches/torch_peer.py`): the forward with autograd recording and the
/// backward, or with `forward_only` the forward alone under `torch.inference_mode()`. With
/// `gpu` (our adapter is a GPU) on torch's GPU where it has one (CUDA, ROCm, MPS), so that
/// a ratio compares the same kind of device; else on the CPU.
pub fn torch_peer(n: &[usize], shape: &Shape, forward_only: bool, gpu: bool) -> TorchPeer {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/torch_peer.py");
    let n: Vec<String> = n.iter().map(|n| n.to_string()).collect();
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(script)
        .args(["--n", &n.join(",")])
        .args(["--heads", &shape.heads.to_string()])
        .args(["--e", &(shape.d / shape.heads).to_string()])
        .args(["--batch", &shape.batch.to_string()])
        .args(["--repeats", &shape.repeats.to_string()]);
    if shape.causal {
        cmd.arg("--causal");
    }
    if forward_only {
        cmd.arg("--forward-only");
    }
    if shape.dtype == wgpu_attention::Dtype::F16 {
        cmd.args(["--dtype", "float16"]);
    }
    cmd.args(["--device", if gpu { "auto" } else { "cpu" }]);
    if gpu {
        // GPU-sized problems on a torch without a GPU: only what the CPU finishes.
        cmd.args(["--cpu-flop-max", &CPU_FLOP_MAX.to_string()]);
    }
    let out = match cmd.output() {
        Ok(out) if out.status.success() => out,
        Ok(out) if out.status.code() == Some(3) => {
            return TorchPeer::Unavailable("python3 has no torch".into());
        }
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            return TorchPeer::Failed(err.lines().last().unwrap_or("").to_string());
        }
        Err(e) => return TorchPeer::Unavailable(e.to_string()),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let version = stdout
        .lines()
        .find_map(|l| l.strip_prefix("# torch "))
        .unwrap_or("?")
        .trim()
        .to_string();
    let device = stdout
        .lines()
        .find_map(|l| l.strip_prefix("# device "))
        .map_or("CPU".to_string(), |d| {
            let (kind, name) = d.trim().split_once(' ').unwrap_or((d.trim(), ""));
            match kind {
                "cpu" => "CPU".to_string(),
                other => format!("{} {}", other.to_uppercase(), name.replace('_', " ")),
            }
        });
    let rows = stdout
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [n, fwd, bwd, threads] = f[..] else {
                return None;
            };
            Some(TorchRow {
                n: n.parse().ok()?,
                forward_ms: fwd.parse().ok()?,
                backward_ms: bwd.parse().ok(),
                threads: threads.parse().ok()?,
                device: device.clone(),
            })
        })
        .collect();
    TorchPeer::Rows(version, rows)
}

/// On a GPU adapter: PyTorch's SDPA forward on the same shapes on torch's GPU (CUDA, ROCm,
/// MPS), in the same run, each n against our fastest fused path's kernel time (or its call
/// time without per-kernel times): `ours / torch` above 1 is slower than PyTorch. Nothing
/// but a line when torch has no GPU (its CPU at these sizes would take minutes).
pub fn on_the_gpu(n: &[usize], shape: &Shape, records: &[Record]) {
    let rows = match torch_peer(n, shape, true, true) {
        TorchPeer::Rows(_, rows) => rows,
        TorchPeer::Unavailable(why) => return println!("\npytorch: not available ({why})"),
        TorchPeer::Failed(line) => return println!("\npytorch: failed: {line}"),
    };
    let rows: Vec<_> = rows.into_iter().filter(|r| r.device != "CPU").collect();
    if rows.is_empty() {
        return println!("\npytorch: python3's torch has no GPU here: left out");
    }
    println!(
        "\nPyTorch on the same shapes (same run, {}, {}):",
        rows[0].label("SDPA"),
        match shape.dtype {
            wgpu_attention::Dtype::F16 => "float16",
            wgpu_attention::Dtype::F32 => "float32",
        }
    );
    for r in &rows {
        let flop = 4.0 * (r.n * r.n) as f64 * shape.d as f64 * shape.batch as f64;
        // Our fastest fused path at this n: its kernels' time where measured.
        let ours = records
            .iter()
            .filter(|x| x.n == r.n && x.path.starts_with("gpu ") && !x.path.ends_with("+weights"))
            .map(|x| match x.kernels_ms.is_empty() {
                true => x.stats.median_ms,
                false => x.kernels_ms.iter().map(|(_, ms)| ms).sum(),
            })
            .fold(f64::INFINITY, f64::min);
        println!(
            "{:<32} {:>6} {:>11.3}   {:>8.1} GFLOP/s   ours / torch {}",
            "pytorch sdpa",
            r.n,
            r.forward_ms,
            flop / (r.forward_ms * 1e6),
            if ours.is_finite() {
                format!("{:.2}", ours / r.forward_ms)
            } else {
                "-".into()
            }
        );
    }
}
