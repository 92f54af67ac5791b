//! The report's first-call table, measured first: each first-call problem runs in a fresh
//! process of its own (this binary again, `report --first-call-child`), with the caches as
//! found and then cold, before the report opens a context of its own; the child prints its
//! [`FirstCall`] as JSON and the report reads it back.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use indicatif::ProgressBar;
use ndarray::{Array2, Array3};
use wgpu_attention::{Attention, Context, Dims, Error, Inputs, Projections, Result};

use super::json::{CallTime, FirstCall};
use super::{ReportArgs, Sizes};

/// The first-call problems: 0, the README's example; 1, a fused `(1, n, d)` call.
pub(super) const CALLS: usize = 2;

/// Runs each first-call problem in a process of its own (one `progress` step each), with the
/// caches as this machine has them, then with the tuning, pipeline and shader caches pointed
/// at an empty directory under `out` (removed after).
pub(super) fn measure(
    args: &ReportArgs,
    out: &Path,
    progress: &ProgressBar,
) -> Result<Vec<FirstCall>> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::invalid("report", format!("cannot find this binary: {e}")))?;
    let cold_dir = out.join(".first-call-caches");
    let mut runs = Vec::new();
    for cold in [false, true] {
        for which in 0..CALLS {
            let mut cmd = Command::new(&exe);
            cmd.args(["report", "--first-call-child", &which.to_string()]);
            if args.quick {
                cmd.arg("--quick");
            }
            if let Some(b) = args.adapter.adapter.backend {
                cmd.args(["--backend", &b.to_string()]);
            }
            if let Some(a) = &args.adapter.adapter.adapter {
                cmd.args(["--adapter", a]);
            }
            if let Some(f) = args.adapter.f16_arithmetic {
                cmd.args(["--f16-arithmetic", &f.to_string()]);
            }
            if cold {
                progress.set_message("first call, cold caches");
                let _ = std::fs::remove_dir_all(&cold_dir);
                // Mesa creates no parent directories for its cache.
                std::fs::create_dir_all(cold_dir.join("mesa"))
                    .map_err(|e| Error::io(&cold_dir, format!("cannot create: {e}")))?;
                cmd.env("WGPU_ATTENTION_TUNE_CACHE", cold_dir.join("tune.json"))
                    .env("MESA_SHADER_CACHE_DIR", cold_dir.join("mesa"))
                    .env("__GL_SHADER_DISK_CACHE_PATH", cold_dir.join("nvidia"));
            }
            let result = cmd.output();
            if cold {
                let _ = std::fs::remove_dir_all(&cold_dir);
            }
            let output =
                result.map_err(|e| Error::invalid("report", format!("cannot run: {e}")))?;
            if !output.status.success() {
                let err = String::from_utf8_lossy(&output.stderr);
                return Err(Error::invalid(
                    "report",
                    format!(
                        "the first-call process failed: {}",
                        err.lines().last().unwrap_or("")
                    ),
                ));
            }
            let mut run: FirstCall = serde_json::from_slice(&output.stdout)
                .map_err(|e| Error::invalid("report", format!("first-call output: {e}")))?;
            run.caches = if cold {
                "cold (empty tuning, pipeline and shader caches)".into()
            } else {
                "as found".into()
            };
            runs.push(run);
            progress.inc(1);
        }
    }
    Ok(runs)
}

/// One first-call measurement (`report --first-call-child WHICH`) in this fresh process:
/// `Context::new`, then the call twice; prints [`FirstCall`] as JSON.
pub(super) fn child(args: &ReportArgs, which: usize) -> Result<bool> {
    let t = Instant::now();
    let ctx = args.adapter.open()?;
    let context_new_ms = ms_since(t);
    let call = if which == 0 {
        let x = Array2::from_shape_fn((6, 16), |(i, j)| ((i * 16 + j) as f32).sin());
        let w_q = Array2::from_elem((16, 24), 0.1f32);
        let w_k = Array2::from_elem((16, 24), 0.2f32);
        let w_v = Array2::from_elem((16, 28), 0.3f32);
        let proj = Projections::new(w_q.view(), w_k.view(), w_v.view());
        let op = Attention::new().heads(4).causal(true);
        time_call(
            &ctx,
            "the README's example: X 6 × 16 projected to 24, 24, 28, 4 heads, causal, weights \
             returned",
            || op.run(&ctx, Inputs::x(&x).projections(&proj)).map(drop),
        )?
    } else {
        let (n, d) = Sizes::of(args).first_call;
        let x = Array3::from_shape_fn((1, n, d), |(_, i, j)| {
            ((i * 7 + j * 13) as f32 * 0.01).sin()
        });
        let op = Attention::new().return_weights(false);
        let mut call = time_call(&ctx, "", || op.run(&ctx, Inputs::x(&x)).map(drop))?;
        // The plan's family, for the row's name (after the calls: planning may compile).
        let plan = op.plan(&ctx, &Dims::new(&op, &Inputs::x(&x))?)?;
        call.call = format!("X 1 × {n} × {d}, one head, fused ({})", plan.family());
        call
    };
    let run = FirstCall {
        caches: String::new(),
        context_new_ms,
        call,
    };
    let text = serde_json::to_string(&run).map_err(|e| Error::invalid("report", e.to_string()))?;
    println!("{text}");
    Ok(true)
}

/// `call` twice: the first's time and phases, the second's time.
fn time_call(ctx: &Context, name: &str, mut call: impl FnMut() -> Result<()>) -> Result<CallTime> {
    ctx.reset_phase_times();
    let t = Instant::now();
    call()?;
    let first_ms = ms_since(t);
    let phases = ctx.phase_times();
    let t = Instant::now();
    call()?;
    let second_ms = ms_since(t);
    Ok(CallTime {
        call: name.to_string(),
        first_ms,
        second_ms,
        compile_ms: phases.compile.as_secs_f64() * 1e3,
        pipelines: phases.pipelines,
        tune_ms: phases.tune.as_secs_f64() * 1e3,
        dispatch_ms: phases.dispatch.as_secs_f64() * 1e3,
    })
}

/// Milliseconds since `t`.
fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
