//! `wgpu-attention bench --sparse`: block sparsity (skipped key tiles) measured side by side in one
//! run. At each n, the fused forward with causal alone, then with a mask modifier on top
//! that leaves most key tiles empty (a sliding window of 512 keys, documents of 2,048
//! tokens): each one's median and its ratio to causal alone. The block map is made once per
//! modifiers and shape (in the warm-up); its cost is the first call's time over the median.

use ndarray::Array4;
use wgpu_attention::bench::{self, Timed};
use wgpu_attention::modifiers::{Modifiers, Preset};
use wgpu_attention::{Attention, Context, Kernels, Mask, Options, Result};

/// What `bench --sparse` measures.
pub struct SparseBench<'a> {
    pub lengths: &'a [usize],
    pub d: usize,
    pub heads: usize,
    pub batch: usize,
    pub kernels: Kernels,
    pub warmup: usize,
    pub repeats: usize,
}

/// Keys a window query sees (Mistral's W: `--window 511,0` with causal).
const WINDOW: u32 = 512;
/// Tokens per document.
const DOCUMENT: usize = 2048;

/// Runs the table.
///
/// # Errors
/// GPU errors and size limits.
pub fn run(ctx: &Context, b: &SparseBench<'_>) -> Result<()> {
    println!(
        "block sparsity: fused forward, causal, d = {}, heads = {}, batch = {}, {} family; \
         median of {} after {} warm-up (the block map is made in the warm-up)",
        b.d, b.heads, b.batch, b.kernels, b.repeats, b.warmup
    );
    println!(
        "{:<34} {:>6} {:>11} {:>10} {:>13}  time per kernel (ms)",
        "mask", "n", "median ms", "vs causal", "first call ms"
    );
    for &n in b.lengths {
        let e = b.d / b.heads.max(1);
        let f = |salt: usize| {
            move |(i, j, k, m): (usize, usize, usize, usize)| {
                (((i * 31 + j * 17 + k * 7 + m) * (salt + 2)) as f32 * 0.013).sin()
            }
        };
        let shape = (b.batch, b.heads, n, e);
        let (q, k, v) = (
            Array4::from_shape_fn(shape, f(1)),
            Array4::from_shape_fn(shape, f(2)),
            Array4::from_shape_fn(shape, f(3)),
        );
        let ids: Vec<i32> = (0..b.batch * n)
            .map(|p| ((p % n) / DOCUMENT) as i32)
            .collect();
        let cases = [
            ("causal".to_string(), Modifiers::new()),
            (
                format!("causal + window {}", WINDOW - 1),
                Modifiers::new().preset(Preset::Window {
                    left: WINDOW - 1,
                    right: 0,
                }),
            ),
            (
                format!("causal + {} documents", n.div_ceil(DOCUMENT)),
                Modifiers::new().preset(Preset::Documents {
                    ids: ids.clone(),
                    n: n as u32,
                }),
            ),
        ];
        let op = Attention::new()
            .causal(true)
            .options(Options::default().kernels(b.kernels));
        let mut causal_ms = None;
        for (name, mods) in &cases {
            let mask = Mask::none().with_modifiers(mods);
            // The first call alone (a map not made yet), then the timed ones.
            let t0 = std::time::Instant::now();
            bench::gpu_masked(ctx, &op, [q.view(), k.view(), v.view()], &mask, 0, 1)?;
            let first = t0.elapsed().as_secs_f64() * 1e3;
            let (stats, kernels): Timed = bench::gpu_masked(
                ctx,
                &op,
                [q.view(), k.view(), v.view()],
                &mask,
                b.warmup,
                b.repeats,
            )?;
            let base = *causal_ms.get_or_insert(stats.median_ms);
            println!(
                "{name:<34} {n:>6} {:>11.2} {:>10} {first:>13.1}  {}",
                stats.median_ms,
                format!("{:.3}", stats.median_ms / base),
                crate::bench_backward::kernels(&kernels)
            );
        }
    }
    println!(
        "\nvs causal: this row's median over causal alone's (the fused kernels skip the key \
         tiles the mask modifier leaves empty). The goals at n = 16384, d = 64: the \
         window at most 1/8, 8 documents at most 1/4."
    );
    Ok(())
}
