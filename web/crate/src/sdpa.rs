//! `Session::sdpa`: one scaled dot-product attention call from JavaScript, on Q, K and V
//! with the options and score and mask modifiers (a caller's WGSL, the buffers it reads,
//! presets) the library takes. The request and the result are JSON; see [`Request`] and
//! [`Response`] (and docs/browser.md) for the fields.

use serde::{Deserialize, Serialize};
use wgpu_attention::modifiers::{BufferSpec, ModifierSpec, Modifiers, PresetSpec, SourceSpec};
use wgpu_attention::ndarray::Array4;
use wgpu_attention::{reference, Attention, Context, Dtype, Inputs, Kernels, Mask, Options};

/// What the page asks for. Every field but `q`, `k` and `v` may be left out; an unknown one
/// is an error (a misspelt option would otherwise be ignored).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Request {
    /// `(batch, heads, L, E)`.
    q: Tensor,
    /// `(batch, kv_heads, S, E)`: fewer heads than Q is grouped-query attention.
    k: Tensor,
    /// `(batch, kv_heads, S, E_v)`.
    v: Tensor,
    /// Query `i` sees keys `j ≤ i` (top-left aligned).
    #[serde(default)]
    causal: bool,
    /// The factor on `Q·Kᵀ` (default `1/sqrt(E)`).
    #[serde(default)]
    scale: Option<f32>,
    /// `"f32"` (default) or `"f16"` operands.
    #[serde(default)]
    dtype: Option<String>,
    /// `"auto"` (default), `"storage"`, `"subgroup"` (or `"coop"`).
    #[serde(default)]
    kernels: Option<String>,
    /// Return the attention weights too (the non-fused path).
    #[serde(default)]
    weights: bool,
    /// Compare the output with the library's f64 CPU reference.
    #[serde(default)]
    reference: bool,
    /// A caller's `fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32`.
    #[serde(default)]
    score_mod: Option<SourceSpec>,
    /// A caller's `fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool` (true = attend).
    #[serde(default)]
    mask_mod: Option<SourceSpec>,
    /// Named read-only buffers the caller's WGSL indexes.
    #[serde(default)]
    buffers: Vec<BufferSpec>,
    /// Presets, applied after the caller's own modifiers in this order.
    #[serde(default)]
    presets: Vec<PresetSpec>,
}

/// An array: its shape and its elements, row-major.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Tensor {
    shape: Vec<usize>,
    data: Vec<f32>,
}

/// What comes back.
#[derive(Serialize, Debug)]
pub(crate) struct Response {
    /// The output's shape, `(batch, heads, L, E_v)`.
    pub shape: Vec<usize>,
    /// The output, row-major.
    pub output: Vec<f32>,
    /// With `weights`: `(batch, heads, L, S)` row-major.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weights: Option<Vec<f32>>,
    /// The GPU call's wall-clock milliseconds (upload, kernels, readback).
    pub ms: f64,
    /// With `reference`: the output (and weights) against the f64 reference.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<Comparison>,
    /// With `reference` where the reference cannot compute the call (a caller's own WGSL
    /// has no CPU form there): why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference_skipped: Option<String>,
}

/// Relative (‖gpu − ref‖₂ / ‖ref‖₂) and largest absolute errors.
#[derive(Serialize, Debug)]
pub(crate) struct Comparison {
    pub output_rel: f64,
    pub output_max: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weights_rel: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weights_max: Option<f64>,
}

impl Tensor {
    /// The array, its elements taken out of the request.
    fn take(&mut self, name: &str) -> Result<Array4<f32>, String> {
        let &[b, h, n, e] = &self.shape[..] else {
            return Err(format!(
                "{name}: expected a shape of 4 axes (batch, heads, rows, width), got {:?}",
                self.shape
            ));
        };
        let len = self.data.len();
        Array4::from_shape_vec((b, h, n, e), std::mem::take(&mut self.data)).map_err(|_| {
            format!(
                "{name}: shape {:?} has {} elements, data has {len}",
                self.shape,
                b * h * n * e
            )
        })
    }
}

impl Request {
    /// The modifiers the request names: its fields are the library's [`ModifierSpec`]'s,
    /// which builds and checks them.
    fn modifiers(&mut self) -> Result<Modifiers, String> {
        let mut spec = ModifierSpec::new();
        spec.score_mod = self.score_mod.take();
        spec.mask_mod = self.mask_mod.take();
        spec.buffers = std::mem::take(&mut self.buffers);
        spec.presets = std::mem::take(&mut self.presets);
        spec.modifiers().map_err(|e| e.to_string())
    }

    fn op(&self) -> Result<Attention, String> {
        let mut op = Attention::new()
            .causal(self.causal)
            .return_weights(self.weights);
        if let Some(s) = self.scale {
            op = op.scale(s);
        }
        if let Some(d) = &self.dtype {
            op = op.dtype(d.parse::<Dtype>().map_err(|e| e.to_string())?);
        }
        if let Some(k) = &self.kernels {
            op = op.options(
                Options::default().kernels(k.parse::<Kernels>().map_err(|e| e.to_string())?),
            );
        }
        Ok(op)
    }
}

/// Runs the request (JSON) on `ctx`; the result as JSON, or the one-line error message
/// (the library's, for anything it refuses).
pub(crate) async fn run(ctx: &Context, request: &str) -> Result<String, String> {
    let r = run_parsed(ctx, request).await?;
    serde_json::to_string(&r).map_err(|e| e.to_string())
}

pub(crate) async fn run_parsed(ctx: &Context, request: &str) -> Result<Response, String> {
    let mut req: Request =
        serde_json::from_str(request).map_err(|e| format!("sdpa request: {e}"))?;
    let (q, k, v) = (req.q.take("q")?, req.k.take("k")?, req.v.take("v")?);
    let op = req.op()?;
    let mods = req.modifiers()?;
    let mask = Mask::none().with_modifiers(&mods);
    let (b, h, l, _) = q.dim();
    mask.check([b, h, l, k.dim().2])
        .map_err(|e| e.to_string())?;
    let inputs = Inputs::qkv(&q, &k, &v).mask(&mask);
    let t = web_time::Instant::now();
    let out = op
        .run_async(ctx, inputs.clone())
        .await
        .map_err(|e| e.to_string())?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let (mut reference, mut reference_skipped) = (None, None);
    if req.reference {
        let own = mods.has_own_score_mod() || mods.has_own_mask_mod();
        match reference::run(&op, &inputs) {
            Ok(cpu) => {
                let (output_rel, output_max) = reference::compare(&out.context, &cpu.context);
                let w = match (&out.weights, &cpu.weights) {
                    (Some(g), Some(c)) => Some(reference::compare(g, c)),
                    _ => None,
                };
                reference = Some(Comparison {
                    output_rel,
                    output_max,
                    weights_rel: w.map(|w| w.0),
                    weights_max: w.map(|w| w.1),
                });
            }
            Err(e) if own => reference_skipped = Some(e.to_string()),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(Response {
        shape: out.context.shape().to_vec(),
        output: out.context.iter().copied().collect(),
        weights: out.weights.map(|w| w.iter().copied().collect()),
        ms,
        reference,
        reference_skipped,
    })
}

#[cfg(test)]
mod tests;
