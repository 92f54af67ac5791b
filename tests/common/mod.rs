//! Shared by the integration tests: one GPU context per test binary, and the CLI binary,
//! both kept from writing outside temporary directories.
//!
//! There is no silent skip: with no adapter the tests fail, naming the fix (CI installs
//! lavapipe, the software Vulkan driver).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Once, OnceLock};

use ndarray::Array4;
use wgpu_attention::modifiers::Preset;
use wgpu_attention::{reference, verify, Attention, Context, Inputs, Mask, Options};

/// Where the tests' autotuner cache lives: in Cargo's temporary directory for the tests
/// (`target/tmp`), never the user's `~/.cache/wgpu-attention`.
pub fn tune_cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("wgpu-attention-tune.json")
}

/// A committed case of `tests/data/<sub>`: its directory, name and `meta.json`.
pub struct Case {
    pub dir: PathBuf,
    pub name: String,
    pub meta: serde_json::Value,
}

/// The cases under `tests/data/<sub>` (the directories with a `meta.json`), sorted: those the
/// generators in `tests/python/` wrote. Panics with fewer than `at_least` (files missing).
pub fn cases(sub: &str, at_least: usize) -> Vec<Case> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(sub);
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("meta.json").exists())
        .collect();
    dirs.sort();
    assert!(
        dirs.len() >= at_least,
        "expected the {at_least} committed cases under {}, found {}",
        root.display(),
        dirs.len()
    );
    dirs.into_iter()
        .map(|dir| {
            let text = std::fs::read_to_string(dir.join("meta.json")).unwrap();
            Case {
                name: dir.file_name().unwrap().to_string_lossy().into_owned(),
                meta: serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{}: {e}", dir.display())),
                dir,
            }
        })
        .collect()
}

/// Points the autotuner's cache at [`tune_cache`] for every context this process makes from
/// now on (and the binaries it starts). [`ctx`] calls it; a test that makes its own tuning
/// context calls it first.
pub fn isolate() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| std::env::set_var("WGPU_ATTENTION_TUNE_CACHE", tune_cache()));
}

/// The `wgpu-attention` binary, its tuning cache at [`tune_cache`].
#[cfg(feature = "cli")]
pub fn bin() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_wgpu-attention"));
    command.env("WGPU_ATTENTION_TUNE_CACHE", tune_cache());
    command
}

/// Runs the binary (as [`bin`]) with `args`.
#[cfg(feature = "cli")]
pub fn cli(args: &[&str]) -> std::process::Output {
    bin().args(args).output().expect("binary runs")
}

/// The stdout of a run that must have succeeded (else its stdout and stderr in the panic).
pub fn ok(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

pub fn ctx() -> &'static Context {
    static CTX: OnceLock<Context> = OnceLock::new();
    isolate();
    // Measuring for the autotuner would only slow the suite: the tests force each variant
    // (tests/tune.rs measures on contexts of its own).
    CTX.get_or_init(|| match Context::new() {
        Ok(c) => c.with_tuning(false),
        Err(e) => panic!("GPU tests need an adapter and none could be opened: {e}"),
    })
}

/// An array of `shape` with smooth deterministic values in [-amp, amp], varied by `salt`.
pub fn smooth(shape: (usize, usize, usize, usize), salt: usize, amp: f32) -> Array4<f32> {
    Array4::from_shape_fn(shape, |(i, j, k, m)| {
        (((i * 31 + j * 17 + k * 7 + m) * (salt + 2)) as f32 * 0.013).sin() * amp
    })
}

/// One of each modifier preset for `b` sequences of `h` query heads over `n` positions: a
/// window of 5 back and 2 ahead, soft-capping at 1.5, ALiBi's standard slopes, documents of
/// 9 positions (offset by one per sequence), a prefix of 7, and T5's relative bias one way
/// and both ways.
pub fn every_preset(b: usize, h: usize, n: usize) -> Vec<Preset> {
    let ids: Vec<i32> = (0..b * n).map(|p| ((p % n) / 9 + p / n) as i32).collect();
    vec![
        Preset::Window { left: 5, right: 2 },
        Preset::Softcap(1.5),
        Preset::Alibi(Preset::alibi_slopes(h)),
        Preset::Documents { ids, n: n as u32 },
        Preset::PrefixLm(7),
        // T5's bias, its buckets saturating inside a few dozen positions, both ways.
        Preset::RelativeBias {
            table: (0..16 * h).map(|i| (i as f32 * 0.37).sin()).collect(),
            buckets: 16,
            max_distance: 20,
            bidirectional: true,
        },
        Preset::RelativeBias {
            table: (0..16 * h).map(|i| (i as f32 * 0.53).cos()).collect(),
            buckets: 16,
            max_distance: 12,
            bidirectional: false,
        },
    ]
}

/// Documents over `b` sequences of `n` positions, different per sequence (a block map per
/// batch index): batch 0 in documents of 100 positions, every later batch of 37.
pub fn uneven_documents(b: usize, n: usize) -> Preset {
    Preset::Documents {
        ids: (0..b * n)
            .map(|p| ((p % n) / if p < n { 100 } else { 37 }) as i32)
            .collect(),
        n: n as u32,
    }
}

/// Q, K, V of `(b, h, L, E)`, `(b, h, S, E)`, `(b, h, S, E_v)` with smooth deterministic
/// values in [-1.5, 1.5].
pub fn sdpa_arrays(
    b: usize,
    h: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
) -> [Array4<f32>; 3] {
    [
        smooth((b, h, l, e), 1, 1.5),
        smooth((b, h, s, e), 2, 1.5),
        smooth((b, h, s, ev), 3, 1.5),
    ]
}

/// Runs `base` with `mask` on every path (each family, with weights and fused) and compares
/// it with the reference, outputs NaN-prefilled; returns one line per path that disagrees
/// (relative error over 1e-5), prefixed with `label`, with its relative and max absolute
/// errors. `base`'s own [`Options`] are replaced by each path's.
pub fn sdpa_failures(
    base: Attention,
    [q, k, v]: &[Array4<f32>; 3],
    mask: &Mask<'_>,
    label: &str,
) -> Vec<String> {
    let ctx = ctx();
    let (b, h, l, _) = q.dim();
    let (s, ev) = (k.dim().2, v.dim().3);
    let inputs = Inputs::qkv(q, k, v).mask(mask);
    let want = reference::run(&base, &inputs).unwrap();
    let mut failures = Vec::new();
    for (kernels, fused) in verify::paths(ctx) {
        let op = base
            .options(Options::default().kernels(kernels).nan_fill(true))
            .return_weights(!fused);
        let got = op.run(ctx, inputs.clone()).unwrap();
        assert_eq!(got.context.shape(), &[b, h, l, ev]);
        let (rel, max) = reference::compare(&got.context, &want.context);
        let (wrel, wmax) = match &got.weights {
            Some(w) => {
                assert_eq!(w.shape(), &[b, h, l, s]);
                reference::compare(w, want.weights.as_ref().unwrap())
            }
            None => (0.0, 0.0),
        };
        if rel > 1e-5 || wrel > 1e-5 || got.weights.is_some() == fused {
            failures.push(format!(
                "{label} {kernels} fused={fused}: context rel {rel:e} (max abs {max:e}), \
                 weights rel {wrel:e} (max abs {wmax:e})"
            ));
        }
    }
    failures
}

/// A context on the default adapter whose device has `lower` applied to its limits.
pub fn context_with(lower: impl FnOnce(&mut wgpu_attention::wgpu::Limits)) -> Context {
    use wgpu_attention::wgpu;
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let adapter = pollster::block_on(instance.request_adapter(&Default::default()))
        .expect("tests need an adapter");
    let mut limits = adapter.limits();
    lower(&mut limits);
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        required_features: adapter.features()
            & (wgpu::Features::SUBGROUP | wgpu::Features::SHADER_F16),
        required_limits: limits,
        ..Default::default()
    }))
    .expect("a device with lowered limits");
    Context::from_parts(adapter, device, queue).with_tuning(false)
}

/// The kernels (WGSL file names) of the passes `call` records on `ctx`, in order: profiling
/// keeps those of whichever call ran last on a context, so `ctx` is the test's own.
pub fn passes(ctx: &Context, call: impl FnOnce()) -> Vec<&'static str> {
    ctx.set_profiling(true);
    call();
    let kernels = ctx.kernel_times().into_iter().map(|t| t.kernel).collect();
    ctx.set_profiling(false);
    kernels
}

/// How many of `passes` run a kernel whose name starts with `prefix`.
pub fn count(passes: &[&str], prefix: &str) -> usize {
    passes.iter().filter(|k| k.starts_with(prefix)).count()
}
