//! Criterion benches of the whole forward pass (upload, kernels, readback), GPU against the
//! f64 CPU reference, with throughput in attention FLOPs (2·n·n·(d_k + d_v) per batch).
//!
//! `cargo bench` — the adapter is printed first. Shader compilation happens in warm-up.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ndarray::Array2;
use wgpu_attention::{reference, Attention, Context};

fn forward(c: &mut Criterion) {
    let ctx = Context::new().expect("benches need an adapter");
    let info = ctx.adapter_info();
    eprintln!(
        "adapter: {} ({:?}, {:?})",
        info.name, info.backend, info.device_type
    );
    let d = 64;
    let mut group = c.benchmark_group("attention_forward_d64");
    group.sample_size(10);
    for &n in &[256usize, 1024] {
        let x = Array2::from_shape_fn((n, d), |(i, j)| ((i * d + j) as f32 * 0.013).sin());
        let op = Attention::new();
        let dims = op.dims(x.shape(), None).unwrap();
        group.throughput(Throughput::Elements(dims.attention_flops() as u64));
        for (name, op) in [
            ("gpu_with_weights", op),
            ("gpu_context_only", op.return_weights(false)),
        ] {
            group.bench_with_input(BenchmarkId::new(name, n), &x, |b, x| {
                b.iter(|| op.forward(&ctx, x.view().into_dyn(), None).unwrap())
            });
        }
        if n <= 256 {
            group.bench_with_input(BenchmarkId::new("cpu_reference_f64", n), &x, |b, x| {
                b.iter(|| reference::attention(&op, x.view().into_dyn(), None).unwrap())
            });
        }
    }
    group.finish();
}

criterion_group!(benches, forward);
criterion_main!(benches);
