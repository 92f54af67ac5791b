//! PyTorch's side of the report: its CPU SDPA on the forward's and the backward's problems
//! ([`crate::torch_peer::torch_peer`], where `python3` has `torch`), and what
//! `results.json` says of PyTorch when there are no rows (left out, not available, failed).

use indicatif::ProgressBar;

use super::json::TorchJson;
use crate::bench_backward::Shape;
use crate::torch_peer::{torch_peer, TorchPeer, TorchRow};

/// With `--no-torch`.
pub(super) fn left_out() -> TorchJson {
    without("left out (--no-torch)".into())
}

/// No PyTorch column, and why.
fn without(note: String) -> TorchJson {
    TorchJson {
        available: false,
        version: None,
        device: None,
        note: Some(note),
    }
}

/// PyTorch's forward alone (`torch.inference_mode()`) at each of `n` on `shape`, one
/// `progress` step: what `results.json` says of PyTorch, and its rows (none where it is not
/// available or failed).
pub(super) fn forward(
    n: &[usize],
    (shape, gpu): (&Shape, bool),
    progress: &ProgressBar,
) -> (TorchJson, Vec<TorchRow>) {
    progress.set_message("PyTorch forward");
    let peer = torch_peer(n, shape, true, gpu);
    progress.inc(1);
    match peer {
        TorchPeer::Rows(version, rows) => (
            TorchJson {
                available: true,
                version: Some(version),
                device: rows.first().map(|r| r.device.clone()),
                note: None,
            },
            rows,
        ),
        TorchPeer::Unavailable(why) => (
            without(if why.contains("no torch") {
                "not available: `python3` on PATH has no `torch` (install it there to \
                 compare)"
                    .into()
            } else {
                format!("not available ({why})")
            }),
            Vec::new(),
        ),
        TorchPeer::Failed(line) => (without(format!("failed: {line}")), Vec::new()),
    }
}

/// PyTorch's forward with autograd and its backward at each of `n` on `shape`; no rows where
/// it fails. The caller counts its `progress` step.
pub(super) fn backward(
    n: &[usize],
    (shape, gpu): (&Shape, bool),
    progress: &ProgressBar,
) -> Vec<TorchRow> {
    progress.set_message("PyTorch backward");
    match torch_peer(n, shape, false, gpu) {
        TorchPeer::Rows(_, rows) => rows,
        TorchPeer::Unavailable(_) | TorchPeer::Failed(_) => Vec::new(),
    }
}
