//! `wgpu-attention bench --decode`: token-by-token decoding with a growing KV cache, three
//! ways side by side at each cache length: the device-resident [`KvCache`] and decode kernel,
//! the same step as a whole-call `sdpa` over the prefix (everything uploaded each time), and
//! a one-thread f32 CPU decode.

use ndarray::{s, Array4};
use serde::Serialize;
use wgpu_attention::bench::{self, Stats};
use wgpu_attention::decode::cpu::CpuKvCache;
use wgpu_attention::{Attention, Context, Decoder, Dtype, Inputs, KvCache, KvCacheSpec, Result};

/// What `--decode` measures.
pub struct DecodeBench<'a> {
    /// Cache lengths at which to measure (the largest is the capacity).
    pub lengths: &'a [usize],
    pub batches: &'a [usize],
    pub heads: usize,
    pub d: usize,
    /// Keys per block, when forced.
    pub block: Option<usize>,
    /// How the cache stores K and V (the whole-call sdpa uses the same; the CPU peer is f32).
    pub dtype: Dtype,
    pub warmup: usize,
    pub repeats: usize,
    pub no_cpu: bool,
}

/// Deterministic K, V `(batch, heads, n, d)` and Q of the same shape.
fn tokens(batch: usize, heads: usize, n: usize, d: usize) -> [Array4<f32>; 3] {
    let f = |salt: usize| {
        move |(b, h, t, c): (usize, usize, usize, usize)| {
            (((b * 131 + h * 17 + t * 7 + c) * (salt + 2)) as f32 * 0.0131).sin()
        }
    };
    [
        Array4::from_shape_fn((batch, heads, n, d), f(1)),
        Array4::from_shape_fn((batch, heads, n, d), f(2)),
        Array4::from_shape_fn((batch, heads, n, d), f(3)),
    ]
}

/// One path at one (batch, cache length).
#[derive(Serialize)]
pub struct Row {
    pub batch: usize,
    pub cache_len: usize,
    pub path: &'static str,
    #[serde(flatten)]
    pub stats: Stats,
    pub steps_per_s: f64,
    pub tokens_per_s: f64,
    /// The whole-call sdpa's median over this row's (above 1: this row is faster).
    pub vs_whole: Option<f64>,
    /// The CPU decode's median over this row's.
    pub vs_cpu: Option<f64>,
    pub kernels_ms: Vec<(String, f64)>,
    /// The KV-cache decode's read of K and V (the whole cache of every sequence and head,
    /// as the cache stores it) over its kernels' time, GB/s; `None` for the other paths.
    pub kv_read_gb_s: Option<f64>,
}

impl Row {
    fn new(
        (batch, cache_len): (usize, usize),
        path: &'static str,
        stats: Stats,
        (whole, cpu): (Option<f64>, Option<f64>),
        kernels_ms: Vec<(String, f64)>,
    ) -> Self {
        let ratio = |base: Option<f64>| base.map(|b| b / stats.median_ms);
        Row {
            batch,
            cache_len,
            path,
            stats,
            steps_per_s: 1e3 / stats.median_ms,
            tokens_per_s: batch as f64 * 1e3 / stats.median_ms,
            vs_whole: ratio(whole),
            vs_cpu: ratio(cpu),
            kernels_ms,
            kv_read_gb_s: None,
        }
    }

    /// With the K/V bytes a step reads: its read rate over its decode kernels' time (the
    /// step's wall time without per-kernel times).
    fn reading(mut self, kv_bytes: f64) -> Self {
        let decode: f64 = self
            .kernels_ms
            .iter()
            .filter(|(k, _)| k.starts_with("decode"))
            .map(|(_, ms)| ms)
            .sum();
        let ms = if decode > 0.0 {
            decode
        } else {
            self.stats.median_ms
        };
        self.kv_read_gb_s = Some(kv_bytes / (ms * 1e6));
        self
    }
}

fn print_row(r: &Row) {
    let ratio = |r: Option<f64>| r.map_or("-".into(), |r| format!("{r:.2}x"));
    let gb_s = r.kv_read_gb_s.map_or("-".into(), |g| format!("{g:.1}"));
    println!(
        "{:>5} {:>7}  {:<28} {:>9.3}  {:>8.3}-{:<8.3} {:>10.1} {:>10.1}  {:>9} {:>8} {:>9}  {}",
        r.batch,
        r.cache_len,
        r.path,
        r.stats.median_ms,
        r.stats.min_ms,
        r.stats.max_ms,
        r.steps_per_s,
        r.tokens_per_s,
        ratio(r.vs_whole),
        ratio(r.vs_cpu),
        gb_s,
        crate::bench_backward::kernels(&r.kernels_ms),
    );
}

/// Runs the decode benchmark and prints its table.
///
/// # Errors
/// As [`measure`].
pub fn run(ctx: &Context, b: &DecodeBench<'_>) -> Result<()> {
    println!(
        "decode: {} heads (= K/V heads), d = {}, {} K and V (the CPU peer f32); one new token \
         per sequence per step (append its K and V, attend its query to the whole cache, read \
         the output back)",
        b.heads, b.d, b.dtype
    );
    println!(
        "timing: median of {} steps after {} warm-up, cache length growing by one per step \
         up to the length shown; ms per step, steps/s, tokens/s = batch · steps/s",
        b.repeats, b.warmup
    );
    println!(
        "batch   cache  path                         ms/step   spread (min-max)    steps/s   tokens/s  vs whole   vs cpu  K/V GB/s  kernels (ms)"
    );
    measure(ctx, b, print_row)?;
    println!(
        "\nvs whole / vs cpu: that path's median over this row's (above 1: this row is faster); \
         the GPU decode's K/V block size is chosen per step (see the decode module; \
         --decode-block forces one). K/V GB/s: the K and V of the whole cache (batch · heads · \
         cache · 2d values, as stored) over the decode kernels' time."
    );
    Ok(())
}

/// Measures the three paths at each batch and cache length: the rows in order (KV-cache
/// decode, whole-call sdpa, then the CPU decode unless `no_cpu`), each also given to `each`
/// as soon as its (batch, length) is measured.
///
/// # Errors
/// GPU errors, and sizes the device cannot hold.
pub fn measure(ctx: &Context, b: &DecodeBench<'_>, mut each: impl FnMut(&Row)) -> Result<Vec<Row>> {
    let steps = b.warmup + b.repeats.max(1);
    let capacity = b.lengths.iter().max().unwrap_or(&1) + steps;
    let scale = 1.0 / (b.d as f32).sqrt();
    let mut rows = Vec::new();
    for &batch in b.batches {
        let [q, k, v] = tokens(batch, b.heads, capacity, b.d);
        let spec = KvCacheSpec::new(capacity, batch, b.heads, b.d, b.d).dtype(b.dtype);
        let mut cache = KvCache::new(ctx, spec)?;
        // An f16 cache takes f16 arrays: the same values, rounded once.
        let (k16, v16) = (k.mapv(half::f16::from_f32), v.mapv(half::f16::from_f32));
        let append = |cache: &mut KvCache, r: std::ops::Range<usize>| -> Result<()> {
            let r = s![.., .., r, ..];
            match b.dtype {
                Dtype::F32 => cache.append(ctx, k.slice(r), v.slice(r)),
                Dtype::F16 => cache.append(ctx, k16.slice(r), v16.slice(r)),
            }
        };
        let mut dec = Decoder::new();
        if let Some(block) = b.block {
            dec = dec.block(block);
        }
        let whole_op = Attention::new().return_weights(false).dtype(b.dtype);
        for &len in b.lengths {
            // Prefill (untimed) up to where the steps start: the last step leaves `len` tokens
            // (or `steps` when `len` is shorter).
            let start = len.saturating_sub(steps);
            cache.clear();
            append(&mut cache, 0..start)?;
            let mut t = start;
            let (gpu, _) = bench::measure(b.warmup, b.repeats, || {
                append(&mut cache, t..t + 1)?;
                dec.step(ctx, &cache, q.slice(s![.., .., t..t + 1, ..]))?;
                t += 1;
                Ok(())
            })?;
            // The kernels' share: the last step again (m = 1 ≤ len, the cache unchanged),
            // each kernel submitted alone and timed.
            ctx.set_profiling(true);
            let profiled = bench::measure(0, b.repeats, || {
                dec.step(ctx, &cache, q.slice(s![.., .., t - 1..t, ..]))?;
                Ok(ctx.kernel_times())
            });
            ctx.set_profiling(false);
            let kernels = bench::kernel_medians(&profiled?.1);
            // The same step as one whole call at the full length: Q of the last token against
            // all `len` keys (uploaded each time; bottom-right causal needs no mask for it).
            let last = s![.., .., len - 1..len, ..];
            let prefix = s![.., .., ..len, ..];
            let (whole, _) = bench::measure(b.warmup, b.repeats, || {
                let qkv = Inputs::qkv(q.slice(last), k.slice(prefix), v.slice(prefix));
                whole_op.run(ctx, qkv)?;
                Ok(())
            })?;
            let cpu_stats = if b.no_cpu {
                None
            } else {
                let mut cpu = CpuKvCache::new(capacity, batch, b.heads, b.d, b.d);
                cpu.append(
                    k.slice(s![.., .., ..start, ..]),
                    v.slice(s![.., .., ..start, ..]),
                );
                let mut t = start;
                let (stats, _) = bench::measure(b.warmup, b.repeats, || {
                    let r = s![.., .., t..t + 1, ..];
                    cpu.append(k.slice(r), v.slice(r));
                    std::hint::black_box(cpu.step(q.slice(r), scale));
                    t += 1;
                    Ok(())
                })?;
                Some(stats)
            };
            let (w, c) = (Some(whole.median_ms), cpu_stats.map(|s| s.median_ms));
            let at = (batch, len);
            let elem = match b.dtype {
                Dtype::F16 => 2.0,
                Dtype::F32 => 4.0,
            };
            let kv_bytes = |len: usize| (batch * b.heads * len * 2 * b.d) as f64 * elem;
            let mut here = vec![
                Row::new(at, "gpu kv-cache decode", gpu, (w, c), kernels).reading(kv_bytes(len)),
                Row::new(at, "gpu whole-call sdpa", whole, (None, c), Vec::new()),
            ];
            if let Some(cs) = cpu_stats {
                here.push(Row::new(
                    at,
                    "cpu f32 one thread",
                    cs,
                    (w, None),
                    Vec::new(),
                ));
            }
            here.iter().for_each(&mut each);
            rows.extend(here);
        }
    }
    Ok(rows)
}
