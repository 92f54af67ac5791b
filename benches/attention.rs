//! Criterion benches: the kernels on their own and the whole forward pass, GPU against CPU.
//!
//! - `matmul_512`: every matmul variant the autotuner may pick (operands on the GPU);
//!   throughput in FLOPs (2·m·n·k).
//! - `attention_d64`: the forward pass (upload, kernels, readback) with `Q = K = V = X` on
//!   every fused variant, the weights path, the CPU f32 ndarray baseline and the f64
//!   reference; throughput in attention FLOPs (2·n·n·(d_k + d_v)).
//!
//! `cargo bench` — the adapter is printed first. Shader compilation happens in warm-up.
//! `wgpu-attention bench` prints the same comparison as one table, with per-kernel times.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ndarray::Array3;
use wgpu_attention::{bench, reference, Attention, Context, Dims, Dtype, Inputs, Kernels, Options};

fn open() -> Context {
    let ctx = Context::new().expect("benches need an adapter");
    let info = ctx.adapter_info();
    eprintln!(
        "adapter: {} ({:?}, {:?}); cpu: {}",
        info.name,
        info.backend,
        info.device_type,
        bench::cpu_name()
    );
    ctx
}

fn matmul(c: &mut Criterion) {
    let ctx = open();
    let m = 512;
    let mut group = c.benchmark_group("matmul_512");
    group.sample_size(10);
    group.throughput(Throughput::Elements(2 * (m * m * m) as u64));
    for variant in bench::matmul_candidates(&ctx, &Kernels::available(&ctx), Dtype::F32) {
        group.bench_function(BenchmarkId::from_parameter(variant), |b| {
            b.iter(|| bench::matmul(&ctx, (variant, Dtype::F32), (m, m, m), 0, 1).unwrap())
        });
    }
    group.finish();
}

fn attention(c: &mut Criterion) {
    let ctx = open();
    let d = 64;
    let mut group = c.benchmark_group("attention_d64");
    group.sample_size(10);
    for &n in &[256usize, 1024] {
        let x = Array3::from_shape_fn((1, n, d), |(_, i, j)| ((i * d + j) as f32 * 0.013).sin());
        let op = Attention::new();
        let dims = Dims::new(&op, &Inputs::x(&x)).unwrap();
        group.throughput(Throughput::Elements(dims.attention_flops() as u64));
        let fused = op.return_weights(false);
        for variant in bench::flash_candidates(&ctx, &Kernels::available(&ctx), 16, 16, Dtype::F32)
        {
            let op = fused.options(Options::default().flash_variant(variant));
            // The storage kernels are ~40x slower on lavapipe: keep them to the small size.
            if n > 256
                && matches!(
                    variant,
                    wgpu_attention::internals::FlashVariant::Tiled { .. }
                )
                && ctx.adapter_info().device_type == wgpu::DeviceType::Cpu
            {
                continue;
            }
            group.bench_with_input(BenchmarkId::new(format!("gpu {variant}"), n), &x, |b, x| {
                b.iter(|| op.run(&ctx, Inputs::x(x)).unwrap())
            });
        }
        group.bench_with_input(BenchmarkId::new("gpu auto +weights", n), &x, |b, x| {
            b.iter(|| op.run(&ctx, Inputs::x(x)).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("cpu f32 ndarray", n), &x, |b, x| {
            b.iter(|| bench::cpu_attention_f32(x.view(), 1, false))
        });
        if n <= 256 {
            group.bench_with_input(BenchmarkId::new("cpu f64 reference", n), &x, |b, x| {
                b.iter(|| reference::run(&op, &Inputs::x(x)).unwrap())
            });
        }
    }
    group.finish();
}

criterion_group!(benches, matmul, attention);
criterion_main!(benches);
