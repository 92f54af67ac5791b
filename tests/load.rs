//! Under load: thousands of forward passes on one context keep memory flat, and one context
//! shared by several threads gives each its right answer.

mod common;

use ndarray::Array3;
use wgpu_attention::{reference, Attention, Context, Inputs};

fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn ten_thousand_forward_passes_keep_memory_flat() {
    let ctx = common::ctx();
    let x = Array3::from_shape_fn((2, 16, 8), |(b, i, j)| {
        ((b * 5 + i * 3 + j) as f32 * 0.21).sin()
    });
    let ops = [
        Attention::new().heads(2).causal(true),
        Attention::new().return_weights(false),
    ];
    let run = |count: usize| {
        for i in 0..count {
            ops[i % 2].run(ctx, Inputs::x(&x)).unwrap();
        }
    };
    run(500); // warm-up: pipelines, allocator pools
    let Some(before) = rss_kib() else {
        eprintln!("no /proc/self/status here: counting passes only");
        run(10_000);
        return;
    };
    run(10_000);
    let after = rss_kib().unwrap();
    let grown_mib = after.saturating_sub(before) as f64 / 1024.0;
    eprintln!("RSS {before} → {after} KiB over 10,000 passes");
    // Every pass allocates ~20 KiB of buffers: a leak would be ~200 MiB.
    assert!(
        grown_mib < 32.0,
        "RSS grew {grown_mib:.1} MiB over 10,000 passes ({before} → {after} KiB)"
    );
}

#[test]
fn one_context_from_several_threads_gives_each_its_answer() {
    let ctx: &Context = common::ctx();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                s.spawn(move || {
                    let x = Array3::from_shape_fn((1, 50 + 7 * t, 12), |(_, i, j)| {
                        ((i * 12 + j + 100 * t) as f32 * 0.05).cos()
                    });
                    let op = Attention::new().heads(3).causal(t % 2 == 0);
                    for _ in 0..20 {
                        let gpu = op.run(ctx, Inputs::x(&x)).unwrap();
                        let cpu = reference::run(&op, &Inputs::x(&x)).unwrap();
                        let (rel, _) = reference::compare(&gpu.context, &cpu.context);
                        assert!(rel < 1e-5, "thread {t}: rel {rel}");
                        let (wrel, _) = reference::compare(
                            gpu.weights.as_ref().unwrap(),
                            cpu.weights.as_ref().unwrap(),
                        );
                        assert!(wrel < 1e-5, "thread {t}: weights rel {wrel}");
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
}
