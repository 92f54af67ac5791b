//! The plan a call logs (what `-v` prints) names the fused kernel that ran, and a fallback
//! is a warning naming why: `flash_coop` forced on a call it cannot take (NaN/Inf let
//! through, modifiers) runs `flash_blocked`, and a variant past lavapipe's loop cap runs
//! `flash_blocked` with its keys split. The cooperative matrices are emulated on lavapipe
//! (the test hook `WGPU_ATTENTION_COOP_EMULATE`, as tests/coop_emulated.rs), so the coop
//! plans are made here without tensor cores.

mod common;

use std::sync::{Mutex, OnceLock};

use ndarray::Array4;
use wgpu_attention::internals::FlashVariant;
use wgpu_attention::{Attention, Context, Inputs, Kernels, Mask, Modifiers, Options, Preset};

/// Every log line of the process, as `LEVEL message`.
struct Lines(Mutex<Vec<String>>);

impl log::Log for Lines {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Info
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let line = format!("{} {}", r.level(), r.args());
            self.0.lock().unwrap().push(line);
        }
    }

    fn flush(&self) {}
}

fn lines() -> &'static Lines {
    static LINES: OnceLock<&'static Lines> = OnceLock::new();
    LINES.get_or_init(|| {
        let lines: &'static Lines = Box::leak(Box::new(Lines(Mutex::new(Vec::new()))));
        log::set_logger(lines).expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Info);
        lines
    })
}

/// The lines logged so far that hold `needle`.
fn logged(needle: &str) -> Vec<String> {
    let all = lines().0.lock().unwrap();
    all.iter().filter(|l| l.contains(needle)).cloned().collect()
}

/// A context whose adapter reports 8 × 8 cooperative matrices (emulated).
fn coop_context() -> &'static Context {
    static CTX: OnceLock<Context> = OnceLock::new();
    CTX.get_or_init(|| {
        common::isolate();
        // Before the context: it reads the hook when asked for its shape.
        std::env::set_var("WGPU_ATTENTION_COOP_EMULATE", "8");
        let ctx = Context::new().unwrap().with_tuning(false);
        assert!(ctx.coop_shape().is_some(), "the hook reports a shape");
        ctx
    })
}

fn smooth(shape: (usize, usize, usize, usize), salt: usize) -> Array4<f32> {
    common::smooth(shape, salt, 1.0)
}

/// Runs `op` on Q, K, V of `n_kv` keys (`n_q` queries, width `d`) with `mask`, and returns
/// the kernels that ran and the plan line it logged (the one naming `n_kv`).
fn run(
    ctx: &Context,
    op: &Attention,
    (n_q, n_kv, d): (usize, usize, usize),
    mask: &Mask<'_>,
) -> (Vec<&'static str>, String) {
    lines();
    let (q, k, v) = (
        smooth((1, 1, n_q, d), 1),
        smooth((1, 1, n_kv, d), 2),
        smooth((1, 1, n_kv, d), 3),
    );
    let passes = common::passes(ctx, || {
        op.run(ctx, Inputs::qkv(&q, &k, &v).mask(mask)).unwrap();
    });
    let planned = logged(&format!("n={n_q} n_kv={n_kv} "));
    assert_eq!(planned.len(), 1, "one plan line for the call: {planned:?}");
    (passes, planned[0].clone())
}

/// Asserts that `flash_blocked` ran in place of `asked` (its kernel file and its name in a
/// plan): the passes, the plan line, and a warning that names `asked` over `n_kv` keys and
/// holds `why`.
fn ran_blocked(
    (passes, plan): (Vec<&'static str>, String),
    (asked_file, asked): (&str, &str),
    n_kv: usize,
    why: &str,
) {
    assert!(passes.contains(&"flash_blocked.wgsl"), "{passes:?}");
    assert!(!passes.contains(&asked_file), "{passes:?}");
    assert!(
        plan.contains("flash-blocked(") && !plan.contains(asked),
        "{plan}"
    );
    let warned = logged(&format!("{asked} over {n_kv} keys does not run"));
    assert!(
        warned
            .iter()
            .any(|w| w.starts_with("WARN") && w.contains(why)),
        "{warned:?}"
    );
}

const COOP: (&str, &str) = ("flash_coop.wgsl", "flash-coop");

#[test]
fn coop_forced_on_non_finite_values_runs_flash_blocked_and_the_plan_says_so() {
    let ctx = coop_context();
    let op = Attention::new().return_weights(false).options(
        Options::default()
            .kernels(Kernels::Coop)
            .propagate_non_finite(true),
    );
    let ran = run(ctx, &op, (5, 11, 16), &Mask::none());
    ran_blocked(ran, COOP, 11, "NaN/Inf");
}

#[test]
fn coop_forced_with_modifiers_runs_flash_blocked_and_the_plan_says_so() {
    let ctx = coop_context();
    let op = Attention::new()
        .return_weights(false)
        .options(Options::default().kernels(Kernels::Coop));
    let mods = Modifiers::new().preset(Preset::Softcap(20.0));
    let mask = Mask::none().with_modifiers(&mods);
    let ran = run(ctx, &op, (6, 13, 16), &mask);
    ran_blocked(ran, COOP, 13, "modifiers");
}

#[test]
fn a_variant_past_the_loop_cap_runs_flash_blocked_and_the_plan_says_so() {
    let ctx = common::ctx();
    if !ctx.adapter_info().name.contains("llvmpipe") {
        return; // No loop cap: flash_tiled runs as asked.
    }
    // flash_tiled with 32-key tiles at d 64 passes the cap past 24,672 keys.
    let op = Attention::new().return_weights(false).options(
        Options::default()
            .kernels(Kernels::Storage)
            .flash_variant(FlashVariant::Tiled { keys: 32 }),
    );
    let ran = run(ctx, &op, (4, 30_000, 64), &Mask::none());
    let tiled = ("flash_tiled.wgsl", "flash-tiled(bk=32)");
    ran_blocked(ran, tiled, 30_000, "loop cap");
}
