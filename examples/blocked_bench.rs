//! Times the GPU family's fused kernel (`flash-blocked`, forced) with each inner-loop option
//! of [`BlockedOptions`] off and on, X resident on the device (the forward on a `Tensor`).
//!
//! `cargo run --release --example blocked_bench -- [n] [d] [rounds]` (default 1024 64 3).
//! Rounds interleave the variants, so a busy machine slows them alike; the table gives
//! each variant's fastest run over all rounds and the median of its per-round medians.

use ndarray::{Array3, ArrayView3};
use wgpu_attention::internals::{BlockedOptions, FlashVariant};
use wgpu_attention::{Attention, Context, Dtype, Inputs, Kernels, Options, Result, Tensor};

/// Three runs of `op` on X resident in the op's dtype (after `warmup` untimed ones), in ms:
/// the forward's kernels and launch, waited for with `Context::synchronize`.
fn time(
    ctx: &Context,
    (op, dtype): (&Attention, Dtype),
    x: ArrayView3<'_, f32>,
    warmup: usize,
) -> Result<Vec<f64>> {
    let x = Tensor::from_array(ctx, x.into_dyn(), dtype)?;
    let mut ms = Vec::new();
    for i in 0..warmup + 3 {
        let t = std::time::Instant::now();
        op.run(ctx, Inputs::x(&x))?;
        ctx.synchronize()?;
        if i >= warmup {
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(ms)
}

fn main() -> Result<()> {
    let arg = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let (n, d, rounds) = (arg(1, 1024), arg(2, 64), arg(3, 3));
    let x = Array3::from_shape_fn((1, n, d), |(_, i, j)| ((i * d + j) as f32 * 0.013).sin());
    let off = BlockedOptions::plain();
    let on = Some(true);
    let vec = off.vector_loads(on);
    let qres = vec.resident_queries(on);
    let mut rows = Vec::new();
    for (rows_, keys) in [(64, 64), (64, 32)] {
        let v = FlashVariant::Blocked { rows: rows_, keys };
        let mut opts = vec![
            ("plain", off, Dtype::F32),
            ("vec", vec, Dtype::F32),
            ("vec+qres", qres, Dtype::F32),
            ("dbuf", off.double_buffer(on), Dtype::F32),
            ("f16 plain", off, Dtype::F16),
            ("f16 vec", vec, Dtype::F16),
            ("f16 vec+qres", qres, Dtype::F16),
            ("f16 dbuf", off.double_buffer(on), Dtype::F16),
            ("f16 hmul", off.f16_arithmetic(on), Dtype::F16),
        ];
        if keys == 32 {
            opts.push(("sgr", off.subgroups(on), Dtype::F32));
            let both = off.double_buffer(on).subgroups(on);
            opts.push(("dbuf+sgr", both, Dtype::F32));
        }
        for (name, o, dtype) in opts {
            let ctx = Context::new()?.with_tuning(false).with_blocked_options(o);
            let op = Attention::new()
                .return_weights(false)
                .options(
                    Options::default()
                        .kernels(Kernels::Storage)
                        .flash_variant(v),
                )
                .dtype(dtype);
            rows.push((
                format!("{v} {name}"),
                ctx,
                (op, dtype),
                Vec::new(),
                Vec::new(),
            ));
        }
    }
    for round in 0..rounds {
        for (name, ctx, op, mins, medians) in &mut rows {
            match time(ctx, (&op.0, op.1), x.view(), usize::from(round == 0)) {
                Ok(mut ms) => {
                    ms.sort_by(f64::total_cmp);
                    mins.push(ms[0]);
                    medians.push(ms[ms.len() / 2]);
                }
                Err(e) => eprintln!("{name}: {e}"),
            }
        }
    }
    println!("n = {n}, d = {d}, {rounds} rounds of 3 runs (ms)");
    println!("{:<36} {:>9} {:>9}", "variant", "min", "median");
    for (name, _, _, mins, medians) in &mut rows {
        if mins.is_empty() {
            continue;
        }
        medians.sort_by(f64::total_cmp);
        let min = mins.iter().copied().fold(f64::INFINITY, f64::min);
        println!("{name:<36} {min:>9.1} {:>9.1}", medians[medians.len() / 2]);
    }
    Ok(())
}
