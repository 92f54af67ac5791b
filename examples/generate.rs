//! A two-layer causal model generating token by token, two ways: each layer with its weights
//! on the device and a KV cache (`Layer::decode_record`: one new token per step attends to
//! the cache; both layers' steps recorded into one submit, with one readback), and the array API called in a loop (the whole sequence so far through both layers
//! at every step, its last row kept). Both give the same tokens; the example prints the time
//! per token of each and the speed-up.
//!
//! ```text
//! cargo run --release --example generate -- [--prompt 128] [--tokens 64] [--d 256] [--heads 8]
//! ```

use std::time::Instant;

use ndarray::{s, Array2, Array3, Axis};
use wgpu_attention::{
    reference, Attention, Context, Dtype, Inputs, KvCache, KvCacheSpec, Layer, Projections,
    Recorder, Result, Tensor,
};

fn weight(d: usize, salt: usize) -> Array2<f32> {
    let s = 1.0 / (d as f32).sqrt();
    Array2::from_shape_fn((d, d), |(i, j)| {
        (((i * 31 + j * 17 + salt * 7) % 97) as f32 / 48.0 - 1.0) * s
    })
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut prompt, mut tokens, mut d, mut heads) = (128usize, 64usize, 256usize, 8usize);
    while let Some(a) = args.next() {
        let v: Option<usize> = args.next().and_then(|v| v.parse().ok());
        match (a.as_str(), v) {
            ("--prompt", Some(v)) => prompt = v,
            ("--tokens", Some(v)) => tokens = v,
            ("--d", Some(v)) => d = v,
            ("--heads", Some(v)) => heads = v,
            _ => {
                eprintln!("usage: generate [--prompt N] [--tokens N] [--d D] [--heads H]");
                std::process::exit(2);
            }
        }
    }
    let ctx = Context::new()?;
    let ws: Vec<[Array2<f32>; 4]> = (0..2)
        .map(|l| [0, 1, 2, 3].map(|i| weight(d, l * 4 + i)))
        .collect();
    let op = Attention::new()
        .heads(heads)
        .causal(true)
        .return_weights(false);
    let projections: Vec<Projections<'_>> = ws
        .iter()
        .map(|[q, k, v, o]| {
            Projections::new(q.view(), k.view(), v.view()).with_output(o.view(), None)
        })
        .collect();
    let layers = projections
        .iter()
        .map(|p| Layer::new(&ctx, op, p))
        .collect::<Result<Vec<_>>>()?;
    let x = Array3::from_shape_fn((1, prompt, d), |(_, i, j)| {
        ((i * 7 + j * 3) as f32 * 0.01).sin()
    });
    let total = prompt + tokens;

    // Resident weights and a KV cache per layer: the prompt once (prefill), then one token a
    // step, the last output row fed back as the next input.
    let spec = KvCacheSpec::new(total, 1, heads, d / heads, d / heads);
    let mut caches = [KvCache::new(&ctx, spec)?, KvCache::new(&ctx, spec)?];
    // Both layers' steps recorded into one encoder: the projections, the cache appends, the
    // decode kernels and W_O of both, one submit, one readback.
    let step = |caches: &mut [KvCache; 2], input: Array3<f32>| -> Result<Array3<f32>> {
        let x = Tensor::from_array(&ctx, input.view().into_dyn(), Dtype::F32)?;
        let mut rec = Recorder::new(&ctx);
        let [c0, c1] = caches;
        let h = layers[0].decode_record(&mut rec, c0, &x)?;
        let y = layers[1].decode_record(&mut rec, c1, &h)?;
        rec.submit()?;
        y.to_array(&ctx)?
            .into_dimensionality()
            .map_err(|e| wgpu_attention::Error::shape(e.to_string()))
    };
    let out = step(&mut caches, x.clone())?;
    let mut next = out.slice(s![.., -1.., ..]).to_owned();
    let mut cached = Vec::new();
    let t = Instant::now();
    for _ in 0..tokens {
        cached.push(next.clone());
        next = step(&mut caches, next)?;
    }
    let cache_ms = t.elapsed().as_secs_f64() * 1e3 / tokens as f64;

    // The array API in a loop: the whole sequence through both layers at every step.
    let mut seq = x.clone();
    let forward = |seq: &Array3<f32>| -> Result<Array3<f32>> {
        let h = op
            .run(&ctx, Inputs::x(seq).projections(&projections[0]))?
            .context;
        op.run(&ctx, Inputs::x(&h).projections(&projections[1]))?
            .context
            .into_dimensionality()
            .map_err(|e| wgpu_attention::Error::shape(e.to_string()))
    };
    let mut next_a = forward(&seq)?.slice(s![.., -1.., ..]).to_owned();
    let mut fed = Vec::new();
    let t = Instant::now();
    for _ in 0..tokens {
        fed.push(next_a.clone());
        seq = ndarray::concatenate(Axis(1), &[seq.view(), next_a.view()])
            .map_err(|e| wgpu_attention::Error::shape(e.to_string()))?;
        next_a = forward(&seq)?.slice(s![.., -1.., ..]).to_owned();
    }
    let array_ms = t.elapsed().as_secs_f64() * 1e3 / tokens as f64;

    let a = ndarray::concatenate(
        Axis(1),
        &cached.iter().map(|a| a.view()).collect::<Vec<_>>(),
    );
    let b = ndarray::concatenate(Axis(1), &fed.iter().map(|a| a.view()).collect::<Vec<_>>());
    let (a, b) = (a.expect("same shapes"), b.expect("same shapes"));
    let (rel, _) = reference::compare(&a, &b.mapv(f64::from));
    println!(
        "2 causal layers, d = {d}, {heads} heads: a {prompt}-token prompt, then {tokens} tokens \
         ({}), the two ways' tokens agree to {rel:.1e}",
        ctx.adapter_info().name
    );
    println!("KV cache, resident weights : {cache_ms:8.2} ms/token");
    println!("array API over the prefix   : {array_ms:8.2} ms/token");
    println!("speed-up                    : {:8.1}×", array_ms / cache_ms);
    if rel > 1e-3 {
        eprintln!("error: the two ways disagree");
        std::process::exit(1);
    }
    Ok(())
}
