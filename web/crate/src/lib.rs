//! What the page calls: a [`Session`] on the browser's WebGPU adapter with the demo, the
//! verify sweep case by case, the benchmark point by point, one attention call on the
//! caller's Q, K, V with score and mask modifiers ([`Session::sdpa`]), and the adapter's
//! description.
//! Every result crosses to JavaScript as a JSON string; every GPU call is a `Promise`.

mod bench;
mod sdpa;

use std::rc::Rc;

use serde::Serialize;
use wasm_bindgen::prelude::*;
use wgpu_attention::verify::{self, Case};
use wgpu_attention::{
    demo, ndarray, reference, wgpu, Attention, Context, Dtype, Inputs, Projections,
};

/// The verify sweep's random cases and seed: the CLI's defaults (`verify --trials 20 --seed 0`).
const TRIALS: usize = 20;
const SEED: u64 = 0;

/// An open WebGPU device and the verify sweep drawn for it.
#[wasm_bindgen]
pub struct Session {
    ctx: Rc<Context>,
    cases: Rc<Vec<Case>>,
}

/// Opens the browser's WebGPU adapter with its full limits, or, with `default_limits`, with
/// WebGPU's defaults (256 invocations per workgroup, 16 KiB of workgroup memory, 128 MiB per
/// storage binding), the least any browser gives. Rejects with the library's error message
/// (no adapter, a refused device) when the browser has none to give.
///
/// # Errors
/// The error's text, as a JavaScript error.
#[wasm_bindgen]
pub async fn open(default_limits: bool) -> Result<Session, JsError> {
    let ctx = if default_limits {
        with_default_limits().await?
    } else {
        Context::new_async().await.map_err(js)?
    };
    let mut cases = verify::standard_cases();
    cases.extend(verify::random_cases(TRIALS, SEED));
    let cases = verify::on_every_path(&ctx, &cases);
    Ok(Session {
        ctx: Rc::new(ctx),
        cases: Rc::new(cases),
    })
}

/// A context on a device made with WebGPU's default limits and the features the kernels use.
async fn with_default_limits() -> Result<Context, JsError> {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::BROWSER_WEBGPU;
    let adapter = wgpu::Instance::new(desc)
        .request_adapter(&wgpu::RequestAdapterOptions::default())
        .await
        .map_err(js)?;
    let wanted =
        wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::SHADER_F16;
    let (device, queue) = adapter
        .request_device(&wgpu::DeviceDescriptor {
            label: Some("wgpu-attention, default limits"),
            required_features: adapter.features() & wanted,
            required_limits: wgpu::Limits::default(),
            ..Default::default()
        })
        .await
        .map_err(js)?;
    Ok(Context::from_parts(adapter, device, queue))
}

/// Whether this build's JavaScript glue can see `navigator.gpu` at all.
#[wasm_bindgen]
pub fn has_webgpu() -> bool {
    let gpu = js_sys::Reflect::get(&js_sys::global(), &"navigator".into())
        .and_then(|n| js_sys::Reflect::get(&n, &"gpu".into()));
    matches!(gpu, Ok(g) if !g.is_undefined() && !g.is_null())
}

fn js(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

fn json(v: &impl Serialize) -> Result<String, JsError> {
    serde_json::to_string(v).map_err(js)
}

#[derive(Serialize)]
struct Info {
    name: String,
    backend: String,
    device_type: String,
    driver: String,
    features: Vec<String>,
    limits: Vec<(String, u64)>,
    subgroup_size: Option<u32>,
    families: Vec<String>,
}

#[derive(Serialize)]
struct DemoResult {
    words: Vec<String>,
    vocab: Vec<String>,
    indices: Vec<usize>,
    weights: Vec<f32>,
    context_shape: Vec<usize>,
    weights_max: f64,
    weights_rel: f64,
    context_max: f64,
    context_rel: f64,
    ms: f64,
}

#[derive(Serialize)]
struct CaseOut {
    case: String,
    passed: bool,
    context_max: f64,
    context_rel: f64,
    // Absent for the fused path, which returns no weights.
    #[serde(skip_serializing_if = "Option::is_none")]
    weights_max: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    weights_rel: Option<f64>,
    tolerance: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[wasm_bindgen]
impl Session {
    /// The adapter: name, backend, device type, driver, features, the limits the kernels
    /// depend on, the subgroup size and the kernel families it runs (JSON).
    ///
    /// # Errors
    /// Never in practice (serialising plain values).
    pub fn info(&self) -> Result<String, JsError> {
        let i = self.ctx.adapter_info();
        let l = self.ctx.limits();
        let features = self.ctx.device().features();
        let limits = [
            (
                "max_compute_invocations_per_workgroup",
                u64::from(l.max_compute_invocations_per_workgroup),
            ),
            (
                "max_compute_workgroup_storage_size",
                u64::from(l.max_compute_workgroup_storage_size),
            ),
            (
                "max_compute_workgroup_size_x",
                u64::from(l.max_compute_workgroup_size_x),
            ),
            (
                "max_compute_workgroups_per_dimension",
                u64::from(l.max_compute_workgroups_per_dimension),
            ),
            (
                "max_storage_buffer_binding_size",
                l.max_storage_buffer_binding_size,
            ),
            ("max_buffer_size", l.max_buffer_size),
            (
                "max_storage_buffers_per_shader_stage",
                u64::from(l.max_storage_buffers_per_shader_stage),
            ),
            (
                "max_texture_dimension_2d",
                u64::from(l.max_texture_dimension_2d),
            ),
        ];
        json(&Info {
            name: i.name,
            backend: format!("{:?}", i.backend),
            device_type: format!("{:?}", i.device_type),
            driver: format!("{} {}", i.driver, i.driver_info).trim().to_string(),
            features: features.iter_names().map(|(n, _)| n.to_string()).collect(),
            limits: limits.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
            subgroup_size: self.ctx.subgroup_size(),
            families: wgpu_attention::Kernels::available(&self.ctx)
                .iter()
                .map(|k| format!("{k:?}"))
                .collect(),
        })
    }

    /// The demo of `demo` (the CLI's): `sentence`'s words, vocabulary and indices, the
    /// attention weights `(n, n)` row-major, and the largest differences of the weights
    /// and the context from the f64 CPU reference (JSON, as a promise).
    pub fn demo(&self, sentence: String, seed: u32) -> js_sys::Promise {
        let ctx = Rc::clone(&self.ctx);
        wasm_bindgen_futures::future_to_promise(async move {
            let r = run_demo(&ctx, &sentence, u64::from(seed)).await;
            r.map(|s| JsValue::from_str(&s)).map_err(JsValue::from)
        })
    }

    /// What a small f16 call does here: `"runs"`, or the library's error (an adapter without
    /// `shader-f16`, as every browser's SwiftShader, is told so, not crashed). As a promise.
    pub fn f16_status(&self) -> js_sys::Promise {
        let ctx = Rc::clone(&self.ctx);
        wasm_bindgen_futures::future_to_promise(async move {
            let x = ndarray::Array2::from_shape_fn((5, 8), |(i, j)| (i * 8 + j) as f32 * 0.05);
            let op = Attention::new().dtype(Dtype::F16);
            let text = match op.run_async(&ctx, Inputs::x(&x)).await {
                Ok(out) if out.context.iter().all(|v| v.is_finite()) => "runs".to_string(),
                Ok(_) => "ran, but returned non-finite values".to_string(),
                Err(e) => e.to_string(),
            };
            Ok(JsValue::from_str(&text))
        })
    }

    /// How many cases the verify sweep has.
    pub fn verify_len(&self) -> usize {
        self.cases.len()
    }

    /// Runs case `i` of the verify sweep (the CLI's: the fixed sweep and 20 random cases,
    /// seed 0, on every kernel family and with and without weights) on the GPU and the CPU
    /// reference (JSON, as a promise). A case whose GPU call fails resolves with its error.
    pub fn verify_case(&self, i: usize) -> js_sys::Promise {
        let ctx = Rc::clone(&self.ctx);
        let cases = Rc::clone(&self.cases);
        wasm_bindgen_futures::future_to_promise(async move {
            let r = run_verify_case(&ctx, &cases, i).await;
            r.map(|s| JsValue::from_str(&s)).map_err(JsValue::from)
        })
    }

    /// One attention call, `softmax(scale·Q·Kᵀ + modifiers)·V`, on the caller's arrays
    /// with the library's score and mask modifiers. `request` is JSON:
    ///
    /// ```text
    /// { "q": {"shape": [batch, heads, L, E], "data": [...]},      (row-major f32)
    ///   "k": {"shape": [batch, kv_heads, S, E], "data": [...]},   (kv_heads < heads: GQA)
    ///   "v": {"shape": [batch, kv_heads, S, E_v], "data": [...]},
    ///   "causal": false, "scale": 0.125, "dtype": "f32", "kernels": "auto",
    ///   "weights": false,      (return the attention weights too)
    ///   "reference": false,    (compare with the f64 CPU reference)
    ///   "score_mod": {"origin": "my.wgsl", "wgsl": "fn score_mod(score: f32, b: u32, h: u32,
    ///                 q: u32, kv: u32) -> f32 {...}"},
    ///   "mask_mod": {"origin": "my.wgsl", "wgsl": "fn mask_mod(b: u32, h: u32, q: u32,
    ///                kv: u32) -> bool {...}"},
    ///   "buffers": [{"name": "doc", "i32": [...]}, {"name": "slope", "f32": [...]}],
    ///   "presets": [{"window": [left, right]}, {"softcap": 30}, {"alibi": [slope per head]},
    ///               {"documents": [[id per position] per batch index]}, {"prefix_lm": p},
    ///               {"relative_bias": {"table": [...], "buckets": 32, "max_distance": 128,
    ///                                  "bidirectional": true}}] }
    /// ```
    ///
    /// Only `q`, `k` and `v` are required. Resolves with JSON `{"shape": [batch, heads, L,
    /// E_v], "output": [...], "ms": …}`, plus `"weights"` (`(batch, heads, L, S)`) when
    /// asked, and with `reference` either `"reference": {"output_rel", "output_max",
    /// "weights_rel", "weights_max"}` or, for a caller's own WGSL (which has no CPU form in
    /// the reference), `"reference_skipped"` with the reference's reason. Rejects with the
    /// library's one-line message: a WGSL error in a modifier names its origin, line and
    /// column (`my.wgsl:2:5: …`); a refused declaration (a binding, an entry point) or a
    /// wrong shape says what.
    pub fn sdpa(&self, request: String) -> js_sys::Promise {
        let ctx = Rc::clone(&self.ctx);
        wasm_bindgen_futures::future_to_promise(async move {
            let r = sdpa::run(&ctx, &request).await;
            r.map(|s| JsValue::from_str(&s))
                .map_err(|e| JsValue::from(JsError::new(&e)))
        })
    }

    /// One benchmark point: `kind` `"attention"` (fused, `Q = K = V = X`, d = 64) or
    /// `"layer"` (the projected layer with `W_O`, d = 64, 4 heads) at sequence length `n`,
    /// WebGPU against the CPU f32 path compiled to wasm, medians over `repeats` (JSON with
    /// milliseconds and GFLOP/s, as a promise).
    pub fn bench(&self, kind: String, n: usize, repeats: usize) -> js_sys::Promise {
        let ctx = Rc::clone(&self.ctx);
        wasm_bindgen_futures::future_to_promise(async move {
            let r = bench::point(&ctx, &kind, n, repeats.max(1)).await;
            r.map(|s| JsValue::from_str(&s)).map_err(JsValue::from)
        })
    }
}

async fn run_demo(ctx: &Context, sentence: &str, seed: u64) -> Result<String, JsError> {
    let inputs = demo::inputs(sentence, seed).map_err(js)?;
    let proj = Projections::new(inputs.w_q.view(), inputs.w_k.view(), inputs.w_v.view());
    let op = Attention::new();
    let x = Inputs::x(&inputs.x).projections(&proj);
    let t = web_time::Instant::now();
    let out = op.run_async(ctx, x.clone()).await.map_err(js)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let cpu = reference::run(&op, &x).map_err(js)?;
    let (Some(w), Some(cw)) = (&out.weights, &cpu.weights) else {
        return Err(JsError::new("the demo returned no weights"));
    };
    let (weights_rel, weights_max) = reference::compare(w, cw);
    let (context_rel, context_max) = reference::compare(&out.context, &cpu.context);
    json(&DemoResult {
        words: inputs.words,
        vocab: inputs.vocab,
        indices: inputs.indices,
        weights: w.iter().copied().collect(),
        context_shape: out.context.shape().to_vec(),
        weights_max,
        weights_rel,
        context_max,
        context_rel,
        ms,
    })
}

async fn run_verify_case(ctx: &Context, cases: &[Case], i: usize) -> Result<String, JsError> {
    let case = cases
        .get(i)
        .ok_or_else(|| JsError::new(&format!("no case {i}: the sweep has {}", cases.len())))?;
    let out = match verify::run_case_async(ctx, case, SEED.wrapping_add(i as u64)).await {
        Ok(r) => CaseOut {
            case: case.to_string(),
            passed: r.passed(),
            context_max: r.context_max,
            context_rel: r.context_rel,
            weights_max: (!case.fused).then_some(r.weights_max),
            weights_rel: (!case.fused).then_some(r.weights_rel),
            tolerance: r.tolerance,
            error: None,
        },
        Err(e) => CaseOut {
            case: case.to_string(),
            passed: false,
            context_max: f64::NAN,
            context_rel: f64::NAN,
            weights_max: None,
            weights_rel: None,
            tolerance: 0.0,
            error: Some(e.to_string()),
        },
    };
    json(&out)
}
