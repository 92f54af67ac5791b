//! `wgpu_attention._native`: the thin native half of the Python package. It takes NumPy
//! arrays as they are (float32, any strides: read in place, no copy before the upload),
//! runs the crate's API with the GIL released, and hands results back as NumPy arrays.
//! Shapes, dtypes, broadcasting and torch live in the Python half (`wgpu_attention/`).
//!
//! Every crate error becomes one Python exception of one line (`ValueError` for bad input,
//! `NotImplementedError` for what an adapter or the crate does not support, `RuntimeError`
//! for device faults), and a Rust panic becomes a `RuntimeError`, never a dead interpreter.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use numpy::{IntoPyArray, PyArrayDyn, PyReadonlyArrayDyn};
use pyo3::exceptions::{
    PyNotImplementedError, PyOSError, PyOverflowError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use wgpu_attention::half::f16;
use wgpu_attention::modifiers::{BufferSpec, ModifierSpec, PresetSpec, SourceSpec};
use wgpu_attention::ndarray::{Array1, ArrayD, ArrayView4, ArrayViewD, Ix1, Ix2, Ix4};
use wgpu_attention::{
    list_adapters, Attention, Backend, BufferData, Context, ContextOptions, Decoder, Dtype, Error,
    Inputs, KvCache, KvCacheSpec, Layer, Mask, Modifiers, Preset, Projections, Saved,
};

/// A crate error as the Python exception its kind calls for, on one line.
fn py_err(e: Error) -> PyErr {
    let msg = one_line(&e.to_string());
    match e {
        Error::InvalidArgument { .. }
        | Error::ShapeMismatch { .. }
        | Error::NonFinite { .. }
        | Error::LimitExceeded { .. } => PyValueError::new_err(msg),
        Error::Unsupported { .. } => PyNotImplementedError::new_err(msg),
        Error::Overflow { .. } => PyOverflowError::new_err(msg),
        Error::Io { .. } => PyOSError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

fn one_line(s: &str) -> String {
    s.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `f`, turning its error into a Python exception and a panic into a `RuntimeError`.
fn guarded<T>(f: impl FnOnce() -> Result<T, Error>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(py_err(e)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            Err(PyRuntimeError::new_err(format!(
                "internal error in wgpu-attention (a Rust panic; please report it): {}",
                one_line(&what)
            )))
        }
    }
}

/// The process's context: opened on first use (the best adapter, or what [`use_device`]
/// chose), shared by every call.
static CONTEXT: Mutex<Option<Arc<Context>>> = Mutex::new(None);

fn context() -> Result<Arc<Context>, Error> {
    let mut slot = CONTEXT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(ctx) = slot.as_ref() {
        return Ok(ctx.clone());
    }
    let ctx = Arc::new(Context::new()?);
    *slot = Some(ctx.clone());
    Ok(ctx)
}

fn options(backend: Option<&str>, name: Option<String>) -> Result<ContextOptions, Error> {
    Ok(ContextOptions::default()
        .backend(backend.map(str::parse::<Backend>).transpose()?)
        .adapter_name(name))
}

fn adapter_dict<'py>(
    py: Python<'py>,
    info: &wgpu_attention::wgpu::AdapterInfo,
    limits: &wgpu_attention::wgpu::Limits,
    features: wgpu_attention::wgpu::Features,
) -> PyResult<Bound<'py, PyDict>> {
    use wgpu_attention::wgpu::Features;
    let d = PyDict::new(py);
    d.set_item("name", &info.name)?;
    d.set_item("backend", format!("{:?}", info.backend).to_lowercase())?;
    d.set_item("device_type", format!("{:?}", info.device_type))?;
    d.set_item("driver", &info.driver)?;
    d.set_item("driver_info", &info.driver_info)?;
    d.set_item("vendor", info.vendor)?;
    d.set_item("device", info.device)?;
    d.set_item("f16", features.contains(Features::SHADER_F16))?;
    d.set_item("subgroups", features.contains(Features::SUBGROUP))?;
    d.set_item(
        "max_storage_buffer_binding_size",
        limits.max_storage_buffer_binding_size,
    )?;
    d.set_item("max_buffer_size", limits.max_buffer_size)?;
    d.set_item(
        "max_compute_workgroup_storage_size",
        limits.max_compute_workgroup_storage_size,
    )?;
    Ok(d)
}

/// Every adapter wgpu finds, best first, as dicts.
#[pyfunction]
#[pyo3(signature = (backend=None))]
fn devices<'py>(py: Python<'py>, backend: Option<&str>) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let opts = guarded(|| options(backend, None))?;
    let found = py.detach(|| guarded(|| list_adapters(&opts)))?;
    found
        .iter()
        .map(|a| adapter_dict(py, &a.info, &a.limits, a.features))
        .collect()
}

/// Opens the adapter that matches (backend, a part of its name) for every later call.
#[pyfunction]
#[pyo3(signature = (backend=None, name=None))]
fn use_device<'py>(
    py: Python<'py>,
    backend: Option<&str>,
    name: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let opts = guarded(|| options(backend, name))?;
    let ctx = py.detach(|| guarded(|| Context::with_options(&opts).map(Arc::new)))?;
    *CONTEXT.lock().unwrap_or_else(|e| e.into_inner()) = Some(ctx.clone());
    adapter_dict(
        py,
        &ctx.adapter_info(),
        ctx.limits(),
        ctx.device().features(),
    )
}

/// The adapter calls run on (opening the default one if none is open yet).
#[pyfunction]
fn device<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
    let ctx = py.detach(|| guarded(context))?;
    adapter_dict(
        py,
        &ctx.adapter_info(),
        ctx.limits(),
        ctx.device().features(),
    )
}

/// An f32 NumPy array, or None when the caller passed None.
type Arr<'py> = PyReadonlyArrayDyn<'py, f32>;

/// A mask as the crate takes it: a bool array (True = attend) or an additive float array.
enum MaskArg<'py> {
    Bool(PyReadonlyArrayDyn<'py, bool>),
    Float(Arr<'py>),
}

impl<'py> MaskArg<'py> {
    fn from_py(m: Option<&Bound<'py, PyAny>>) -> PyResult<Option<Self>> {
        let Some(m) = m else { return Ok(None) };
        if let Ok(b) = m.extract::<PyReadonlyArrayDyn<'py, bool>>() {
            return Ok(Some(MaskArg::Bool(b)));
        }
        if let Ok(f) = m.extract::<Arr<'py>>() {
            return Ok(Some(MaskArg::Float(f)));
        }
        Err(PyValueError::new_err(
            "attn_mask must be a bool (True = attend) or float32 (added to the scores) array",
        ))
    }

    /// The array in place, as a view that may cross into the GIL-free part of a call.
    fn view(&self) -> MaskView<'_> {
        match self {
            MaskArg::Bool(b) => MaskView::Bool(b.as_array()),
            MaskArg::Float(f) => MaskView::Float(f.as_array()),
        }
    }
}

enum MaskView<'a> {
    Bool(ArrayViewD<'a, bool>),
    Float(ArrayViewD<'a, f32>),
}

impl MaskView<'_> {
    fn mask(&self, kv_lengths: Option<&[usize]>) -> Mask<'_> {
        let m = match self {
            MaskView::Bool(b) => Mask::boolean(b.view()),
            MaskView::Float(f) => Mask::additive(f.view()),
        };
        match kv_lengths {
            Some(l) => m.with_kv_lengths(l),
            None => m,
        }
    }
}

fn lengths_mask<'a>(kv_lengths: Option<&[usize]>) -> Option<Mask<'a>> {
    kv_lengths.map(|l| Mask::none().with_kv_lengths(l))
}

fn to_py<'py>(py: Python<'py>, a: ArrayD<f32>) -> Bound<'py, PyArrayDyn<f32>> {
    a.into_pyarray(py)
}

/// What the backward of one forward needs, kept on the device: `backward(d_o)` gives the
/// gradients of Q, K and V (and of a relative bias table).
#[pyclass(module = "wgpu_attention._native", frozen)]
struct SavedForward {
    saved: Saved,
    ctx: Arc<Context>,
}

#[pymethods]
impl SavedForward {
    /// `(dq, dk, dv, d_table)` from `d_o`, the gradient of the loss with respect to the
    /// context (float32, the context's shape), by the fused backward on the device;
    /// `d_table` is the relative bias table's `(buckets, heads)` gradient, None without one.
    #[allow(clippy::type_complexity)]
    fn backward<'py>(
        &self,
        py: Python<'py>,
        d_o: Arr<'py>,
    ) -> PyResult<(
        Bound<'py, PyArrayDyn<f32>>,
        Bound<'py, PyArrayDyn<f32>>,
        Bound<'py, PyArrayDyn<f32>>,
        Option<Bound<'py, PyArrayDyn<f32>>>,
    )> {
        let d_o = d_o.as_array();
        let g = py.detach(|| guarded(|| self.saved.backward(&self.ctx, d_o)))?;
        let missing = || PyRuntimeError::new_err("the backward returned no gradient of Q, K or V");
        Ok((
            to_py(py, g.q.ok_or_else(missing)?),
            to_py(py, g.k.ok_or_else(missing)?),
            to_py(py, g.v.ok_or_else(missing)?),
            g.relative_bias.map(|t| to_py(py, t)),
        ))
    }

    /// Each query row's log-sum-exp of its scaled, masked scores, `(batch, heads, L)`.
    fn log_sum_exp<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let lse = py.detach(|| guarded(|| self.saved.log_sum_exp(&self.ctx)))?;
        Ok(to_py(py, lse))
    }
}

type Array<'py> = Bound<'py, PyArrayDyn<f32>>;

/// A forward's results: the context, the weights when asked for, what the backward needs
/// when asked to save it.
type Forward<'py> = (Array<'py>, Option<Array<'py>>, Option<SavedForward>);

fn dtype(half: bool) -> Dtype {
    if half {
        Dtype::F16
    } else {
        Dtype::F32
    }
}

/// A modifier buffer's elements: a float32 array as `array<f32>`, an int32 one as
/// `array<i32>`, read row-major whatever its shape.
fn buffer_data(name: &str, a: &Bound<'_, PyAny>) -> PyResult<BufferData> {
    if let Ok(f) = a.extract::<Arr<'_>>() {
        return Ok(BufferData::F32(f.as_array().iter().copied().collect()));
    }
    if let Ok(i) = a.extract::<PyReadonlyArrayDyn<'_, i32>>() {
        return Ok(BufferData::I32(i.as_array().iter().copied().collect()));
    }
    Err(PyValueError::new_err(format!(
        "mod_buffers[{name:?}] must be a float32 (array<f32>) or int32 (array<i32>) array"
    )))
}

/// The keywords [`modifiers`] reads, in the order it applies them.
const MODIFIER_KEYWORDS: [&str; 12] = [
    "score_mod",
    "score_mod_grad",
    "mask_mod",
    "mod_buffers",
    "window",
    "prefix_length",
    "document_ids",
    "alibi_slopes",
    "relative_bias",
    "relative_bias_max_distance",
    "relative_bias_bidirectional",
    "softcap",
];

/// Keyword `name` of `kw` as a `T` (`what` names it in the error); absent or None is `None`.
fn keyword<'py, T>(kw: &Bound<'py, PyDict>, name: &str, what: &str) -> PyResult<Option<T>>
where
    T: for<'a> FromPyObject<'a, 'py>,
{
    match kw.get_item(name)? {
        Some(v) if !v.is_none() => v
            .extract::<T>()
            .map(Some)
            .map_err(|_| PyTypeError::new_err(format!("{name} must be {what}"))),
        _ => Ok(None),
    }
}

/// The modifiers of one call from its keywords ([`MODIFIER_KEYWORDS`]): a caller's WGSL
/// (`score_mod`, `score_mod_grad`, `mask_mod`) and the buffers it reads (`mod_buffers`, name →
/// float32 or int32 array), then the presets `window=(left, right)`, `prefix_length`,
/// `document_ids` (int32 `(batch, n)`), `alibi_slopes` (float32, one per query head),
/// `relative_bias` (T5's float32 `(buckets, heads)` table, with
/// `relative_bias_max_distance`, default 128, and `relative_bias_bidirectional`, default
/// true) and `softcap`. Score modifiers apply in the order the caller's `score_mod`, ALiBi,
/// the relative bias, the soft-cap; mask modifiers are and-ed.
fn modifiers(kw: Option<&Bound<'_, PyDict>>) -> PyResult<Modifiers> {
    let spec = modifier_spec(kw)?;
    guarded(|| spec.modifiers())
}

/// The keywords as the library's [`ModifierSpec`], which names, defaults and checks every
/// modifier: here only the keywords' Python types are checked, and arrays read with their
/// shapes.
fn modifier_spec(kw: Option<&Bound<'_, PyDict>>) -> PyResult<ModifierSpec> {
    let mut spec = ModifierSpec::new();
    let Some(kw) = kw else { return Ok(spec) };
    for key in kw.keys() {
        let key: String = key.extract()?;
        if !MODIFIER_KEYWORDS.contains(&key.as_str()) {
            return Err(PyTypeError::new_err(format!(
                "sdpa() got an unexpected keyword argument {key:?}"
            )));
        }
    }
    let source = |name: &str| -> PyResult<Option<SourceSpec>> {
        Ok(keyword::<String>(kw, name, "WGSL source (a str)")?
            .map(|src| SourceSpec::new(name, src)))
    };
    spec.score_mod = source("score_mod")?;
    spec.score_mod_grad = source("score_mod_grad")?;
    spec.mask_mod = source("mask_mod")?;
    if let Some(buffers) = keyword::<Bound<'_, PyDict>>(kw, "mod_buffers", "a dict")? {
        for (name, a) in buffers.iter() {
            let name: String = name
                .extract()
                .map_err(|_| PyTypeError::new_err("mod_buffers' keys must be strings"))?;
            let data = buffer_data(&name, &a)?;
            spec.buffers.push(BufferSpec::new(name, data));
        }
    }
    if let Some((left, right)) = keyword::<(u32, u32)>(kw, "window", "(left, right), two u32")? {
        spec.presets.push(PresetSpec::Window([left, right]));
    }
    if let Some(p) = keyword::<u32>(kw, "prefix_length", "a u32")? {
        spec.presets.push(PresetSpec::PrefixLm(p));
    }
    if let Some(ids) = keyword::<PyReadonlyArrayDyn<'_, i32>>(kw, "document_ids", "an int32 array")?
    {
        let ids = ids.as_array();
        let flat: Vec<i32> = ids.iter().copied().collect();
        let p = PresetSpec::documents_array("document_ids", ids.shape(), &flat);
        spec.presets.push(guarded(|| p)?);
    }
    if let Some(slopes) = keyword::<Arr<'_>>(kw, "alibi_slopes", "a float32 array")? {
        let slopes = slopes.as_array();
        let p = PresetSpec::alibi_array(
            "alibi_slopes",
            slopes.shape(),
            slopes.iter().copied().collect(),
        );
        spec.presets.push(guarded(|| p)?);
    }
    let max_distance = keyword::<u32>(kw, "relative_bias_max_distance", "a u32")?;
    let bidirectional = keyword::<bool>(kw, "relative_bias_bidirectional", "a bool")?;
    if let Some(table) = keyword::<Arr<'_>>(kw, "relative_bias", "a float32 array")? {
        let table = table.as_array();
        let p = PresetSpec::relative_bias_array(
            "relative_bias",
            table.shape(),
            table.iter().copied().collect(),
            max_distance,
            bidirectional,
        );
        spec.presets.push(guarded(|| p)?);
    } else if max_distance.is_some() || bidirectional.is_some() {
        return Err(PyTypeError::new_err(
            "relative_bias_max_distance and relative_bias_bidirectional need relative_bias",
        ));
    }
    if let Some(c) = keyword::<f32>(kw, "softcap", "a float")? {
        spec.presets.push(PresetSpec::Softcap(c));
    }
    Ok(spec)
}

/// Attention on Q `(B, H, L, E)`, K `(B, H_kv, S, E)`, V `(B, H_kv, S, Ev)` (float32, any
/// strides); the mask broadcasts to `(B, H, L, S)`. Returns `(context, weights or None,
/// saved or None)`. `**modifiers` are [`modifiers`]' keywords; they apply on the forward,
/// fused or with the weights, and on its saved form (`save`, whose backward takes them too):
/// `save` with a `score_mod` but no `score_mod_grad` is a `NotImplementedError`, as the
/// crate's `Unsupported`.
#[pyfunction]
#[pyo3(signature = (q, k, v, mask=None, kv_lengths=None, is_causal=false, scale=None,
    return_weights=false, save=false, half=false, **modifiers))]
#[allow(clippy::too_many_arguments)]
fn sdpa<'py>(
    py: Python<'py>,
    q: Arr<'py>,
    k: Arr<'py>,
    v: Arr<'py>,
    mask: Option<Bound<'py, PyAny>>,
    kv_lengths: Option<Vec<usize>>,
    is_causal: bool,
    scale: Option<f32>,
    return_weights: bool,
    save: bool,
    half: bool,
    modifiers: Option<&Bound<'py, PyDict>>,
) -> PyResult<Forward<'py>> {
    let mods = self::modifiers(modifiers)?;
    let mask_arg = MaskArg::from_py(mask.as_ref())?;
    let mask = mask_arg.as_ref().map(MaskArg::view);
    let (qa, ka, va) = (q.as_array(), k.as_array(), v.as_array());
    let mut op = Attention::new()
        .causal(is_causal)
        .dtype(dtype(half))
        .return_weights(return_weights)
        .save_for_backward(save);
    if let Some(s) = scale {
        op = op.scale(s);
    }
    let lengths = kv_lengths.as_deref();
    let out = py.detach(|| {
        guarded(|| {
            let ctx = context()?;
            let mut m = mask
                .as_ref()
                .map(|m| m.mask(lengths))
                .or_else(|| lengths_mask(lengths));
            if !mods.is_empty() {
                m = Some(m.unwrap_or_else(Mask::none).with_modifiers(&mods));
            }
            let mut inputs = Inputs::qkv(qa.view(), ka.view(), va.view());
            if let Some(m) = m.as_ref() {
                inputs = inputs.mask(m);
            }
            let out = op.run(&ctx, inputs)?;
            Ok((out, ctx))
        })
    })?;
    let (out, ctx) = out;
    Ok((
        to_py(py, out.context),
        out.weights.map(|w| to_py(py, w)),
        out.saved.map(|saved| SavedForward { saved, ctx }),
    ))
}

fn view2<'a>(
    name: &str,
    a: &'a ArrayViewD<'a, f32>,
) -> PyResult<wgpu_attention::ndarray::ArrayView2<'a, f32>> {
    a.view().into_dimensionality::<Ix2>().map_err(|_| {
        PyValueError::new_err(format!("{name} must be 2-D, got shape {:?}", a.shape()))
    })
}

fn view1<'a>(
    name: &str,
    a: &'a ArrayViewD<'a, f32>,
) -> PyResult<wgpu_attention::ndarray::ArrayView1<'a, f32>> {
    a.view().into_dimensionality::<Ix1>().map_err(|_| {
        PyValueError::new_err(format!("{name} must be 1-D, got shape {:?}", a.shape()))
    })
}

/// A self-attention layer whose projections live on the device: built once from
/// `W_Q, W_K, W_V (d, d_k|d_v)` (the `X·W` orientation), optional biases and output
/// projection; each call uploads only X.
#[pyclass(module = "wgpu_attention._native", frozen)]
struct ResidentLayer {
    layer: Layer,
    ctx: Arc<Context>,
}

#[pymethods]
impl ResidentLayer {
    #[new]
    #[pyo3(signature = (w_q, w_k, w_v, b_q=None, b_k=None, b_v=None, w_o=None, b_o=None,
        heads=1, is_causal=false, scale=None, return_weights=false, half=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        w_q: Arr<'_>,
        w_k: Arr<'_>,
        w_v: Arr<'_>,
        b_q: Option<Arr<'_>>,
        b_k: Option<Arr<'_>>,
        b_v: Option<Arr<'_>>,
        w_o: Option<Arr<'_>>,
        b_o: Option<Arr<'_>>,
        heads: usize,
        is_causal: bool,
        scale: Option<f32>,
        return_weights: bool,
        half: bool,
    ) -> PyResult<Self> {
        let (wq, wk, wv) = (w_q.as_array(), w_k.as_array(), w_v.as_array());
        let biases = [&b_q, &b_k, &b_v].map(|b| b.as_ref().map(|b| b.as_array()));
        let (wo, bo) = (
            w_o.as_ref().map(|w| w.as_array()),
            b_o.as_ref().map(|b| b.as_array()),
        );
        let mut p = Projections::new(view2("w_q", &wq)?, view2("w_k", &wk)?, view2("w_v", &wv)?);
        match &biases {
            [Some(bq), Some(bk), Some(bv)] => {
                p = p.with_bias(view1("b_q", bq)?, view1("b_k", bk)?, view1("b_v", bv)?)
            }
            [None, None, None] => {}
            _ => {
                return Err(PyValueError::new_err(
                    "give all three of b_q, b_k, b_v or none (zeros for a missing one)",
                ))
            }
        }
        if let Some(wo) = wo.as_ref() {
            let bo = bo.as_ref().map(|b| view1("b_o", b)).transpose()?;
            p = p.with_output(view2("w_o", wo)?, bo);
        } else if bo.is_some() {
            return Err(PyValueError::new_err("b_o given without w_o"));
        }
        let mut op = Attention::new()
            .heads(heads)
            .causal(is_causal)
            .dtype(dtype(half))
            .return_weights(return_weights);
        if let Some(s) = scale {
            op = op.scale(s);
        }
        let (layer, ctx) = py.detach(|| {
            guarded(|| {
                let ctx = context()?;
                Ok((Layer::new(&ctx, op, &p)?, ctx))
            })
        })?;
        Ok(ResidentLayer { layer, ctx })
    }

    /// The layer on X `(n, d)` or `(batch, n, d)`: `(output, weights or None)`.
    #[pyo3(signature = (x, mask=None, kv_lengths=None))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        x: Arr<'py>,
        mask: Option<Bound<'py, PyAny>>,
        kv_lengths: Option<Vec<usize>>,
    ) -> PyResult<(Array<'py>, Option<Array<'py>>)> {
        let mask_arg = MaskArg::from_py(mask.as_ref())?;
        let mask = mask_arg.as_ref().map(MaskArg::view);
        let xa = x.as_array();
        let lengths = kv_lengths.as_deref();
        let out = py.detach(|| {
            guarded(|| {
                let m = mask
                    .as_ref()
                    .map(|m| m.mask(lengths))
                    .or_else(|| lengths_mask(lengths));
                let mut inputs = Inputs::x(xa.view());
                if let Some(m) = m.as_ref() {
                    inputs = inputs.mask(m);
                }
                self.layer.run(&self.ctx, inputs)
            })
        })?;
        Ok((to_py(py, out.context), out.weights.map(|w| to_py(py, w))))
    }
}

fn view4<'a>(name: &str, a: &'a ArrayViewD<'a, f32>) -> PyResult<ArrayView4<'a, f32>> {
    a.view().into_dimensionality::<Ix4>().map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be 4-D (batch, heads, tokens, features), got shape {:?}",
            a.shape()
        ))
    })
}

/// A KV cache on the device for token-by-token decoding: `append(k, v)` writes new tokens'
/// keys and values `(batch, kv_heads, m, d)`, `attend(q)` attends `(batch, heads, m, d_k)`
/// queries (the cache's last `m` tokens, causal aligned to the bottom right) to everything
/// cached.
#[pyclass(module = "wgpu_attention._native", frozen)]
struct KvCacheHandle {
    cache: Mutex<KvCache>,
    decoder: Decoder,
    ctx: Arc<Context>,
}

impl KvCacheHandle {
    fn cache(&self) -> std::sync::MutexGuard<'_, KvCache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl KvCacheHandle {
    /// `rolling`: keep only the last `capacity` tokens (appends wrap; a window preset must
    /// keep every step within them). `**modifiers`: as `sdpa`'s, applied at each token's
    /// position.
    #[new]
    #[pyo3(signature = (capacity, batch, kv_heads, d_k, d_v, scale=None, half=false, rolling=false, **modifiers))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        capacity: usize,
        batch: usize,
        kv_heads: usize,
        d_k: usize,
        d_v: usize,
        scale: Option<f32>,
        half: bool,
        rolling: bool,
        modifiers: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let mods = self::modifiers(modifiers)?;
        let spec = KvCacheSpec::new(capacity, batch, kv_heads, d_k, d_v).dtype(dtype(half));
        let (cache, ctx) = py.detach(|| {
            guarded(|| {
                let ctx = context()?;
                let cache = KvCache::new(&ctx, spec)?;
                Ok((if rolling { cache.rolling() } else { cache }, ctx))
            })
        })?;
        let decoder = match scale {
            Some(s) => Decoder::new().scale(s),
            None => Decoder::new(),
        }
        .modifiers(&mods);
        Ok(KvCacheHandle {
            cache: Mutex::new(cache),
            decoder,
            ctx,
        })
    }

    /// Appends `k (batch, kv_heads, m, d_k)` and `v (batch, kv_heads, m, d_v)`.
    fn append(&self, py: Python<'_>, k: Arr<'_>, v: Arr<'_>) -> PyResult<()> {
        let (ka, va) = (k.as_array(), v.as_array());
        let (k4, v4) = (view4("key", &ka)?, view4("value", &va)?);
        py.detach(|| {
            guarded(|| {
                let mut cache = self.cache();
                if cache.spec().dtype == Dtype::F16 {
                    let (kh, vh) = (k4.mapv(f16::from_f32), v4.mapv(f16::from_f32));
                    cache.append(&self.ctx, kh.view(), vh.view())
                } else {
                    cache.append(&self.ctx, k4, v4)
                }
            })
        })
    }

    /// `q (batch, heads, m, d_k)` attended to the cache: `(batch, heads, m, d_v)`.
    fn attend<'py>(&self, py: Python<'py>, q: Arr<'py>) -> PyResult<Array<'py>> {
        let qa = q.as_array();
        let q4 = view4("query", &qa)?;
        let out = py.detach(|| guarded(|| self.decoder.step(&self.ctx, &self.cache(), q4)))?;
        Ok(to_py(py, out.into_dyn()))
    }

    /// Tokens cached.
    fn __len__(&self) -> usize {
        self.cache().len()
    }

    #[getter]
    fn capacity(&self) -> usize {
        self.cache().capacity()
    }

    #[getter]
    fn memory_bytes(&self) -> u64 {
        self.cache().memory_bytes()
    }

    /// Empties the cache for the next sequence.
    fn clear(&self) {
        self.cache().clear()
    }
}

/// The crate's own check on this device: its standard cases and `random` drawn ones (seed
/// `seed`), on every kernel path the adapter has, against the f64 CPU reference. One dict
/// per case: `case`, `context_rel`, `context_max`, `weights_rel`, `weights_max` (NaN on the
/// fused path, which returns no weights), `tolerance`, `passed`, `error` (or None).
#[pyfunction]
#[pyo3(signature = (random=8, seed=0, half=false))]
fn verify<'py>(
    py: Python<'py>,
    random: usize,
    seed: u64,
    half: bool,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    use wgpu_attention::verify as v;
    let results = py.detach(|| {
        guarded(|| {
            let ctx = context()?;
            if half {
                ctx.require_f16()?;
            }
            let mut cases = v::standard_cases();
            cases.extend(v::random_cases(random, seed));
            let cases: Vec<_> = v::on_every_path(&ctx, &cases)
                .into_iter()
                .map(|c| c.dtype(dtype(half)))
                .collect();
            Ok(cases
                .iter()
                .enumerate()
                .map(|(i, case)| {
                    let r = v::run_case(&ctx, case, seed.wrapping_add(i as u64));
                    (case.to_string(), r)
                })
                .collect::<Vec<_>>())
        })
    })?;
    results
        .into_iter()
        .map(|(case, r)| {
            let d = PyDict::new(py);
            d.set_item("case", case.trim())?;
            match r {
                Ok(r) => {
                    let fused = r.case.fused;
                    d.set_item("context_rel", r.context_rel)?;
                    d.set_item("context_max", r.context_max)?;
                    d.set_item("weights_rel", if fused { f64::NAN } else { r.weights_rel })?;
                    d.set_item("weights_max", if fused { f64::NAN } else { r.weights_max })?;
                    d.set_item("tolerance", r.tolerance)?;
                    d.set_item("passed", r.passed())?;
                    d.set_item("error", py.None())?;
                }
                Err(e) => {
                    d.set_item("passed", false)?;
                    d.set_item("error", one_line(&e.to_string()))?;
                }
            }
            Ok(d)
        })
        .collect()
}

/// Seconds per call of the Rust API's `Attention::run` on these Q, K, V (blocking: upload,
/// kernels, readback), `repeats` calls (after one untimed call when `warmup`), timed in Rust:
/// what a call costs without the binding, for the overhead figure of `bench`.
#[pyfunction]
#[pyo3(signature = (q, k, v, is_causal=false, repeats=20, warmup=true))]
fn time_sdpa(
    py: Python<'_>,
    q: Arr<'_>,
    k: Arr<'_>,
    v: Arr<'_>,
    is_causal: bool,
    repeats: usize,
    warmup: bool,
) -> PyResult<Vec<f64>> {
    let (qa, ka, va) = (q.as_array(), k.as_array(), v.as_array());
    let op = Attention::new().causal(is_causal).return_weights(false);
    py.detach(|| {
        guarded(|| {
            let ctx = context()?;
            let call = || op.run(&ctx, Inputs::qkv(qa.view(), ka.view(), va.view()));
            if warmup {
                call()?;
            }
            (0..repeats)
                .map(|_| {
                    let t = std::time::Instant::now();
                    call()?;
                    Ok(t.elapsed().as_secs_f64())
                })
                .collect()
        })
    })
}

/// ALiBi's standard slopes for `heads` query heads (the crate's `Preset::alibi_slopes`).
#[pyfunction]
fn alibi_slopes(py: Python<'_>, heads: usize) -> PyResult<Bound<'_, PyArrayDyn<f32>>> {
    if heads == 0 {
        return Err(PyValueError::new_err("ALiBi needs at least one head"));
    }
    Ok(to_py(
        py,
        Array1::from_vec(Preset::alibi_slopes(heads)).into_dyn(),
    ))
}

/// Checks modifiers given as [`modifiers`]' keywords, running nothing: the crate's rules
/// for each preset and a caller's WGSL (`Modifiers::check`), so the Python presets check
/// theirs where they are made without stating the rules again.
#[pyfunction]
#[pyo3(signature = (**kw))]
fn check_modifiers(kw: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    modifiers(kw).map(drop)
}

/// Panics inside the guard every call runs in: the tests' proof that a Rust panic comes out
/// as a `RuntimeError`, not a dead interpreter.
#[pyfunction]
fn _panic_for_tests() -> PyResult<()> {
    guarded(|| -> Result<(), Error> { panic!("a deliberate panic") })
}

/// The crate's version and the adapter-independent facts a bug report wants.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sdpa, m)?)?;
    m.add_function(wrap_pyfunction!(devices, m)?)?;
    m.add_function(wrap_pyfunction!(use_device, m)?)?;
    m.add_function(wrap_pyfunction!(device, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    m.add_function(wrap_pyfunction!(time_sdpa, m)?)?;
    m.add_function(wrap_pyfunction!(alibi_slopes, m)?)?;
    m.add_function(wrap_pyfunction!(check_modifiers, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_tests, m)?)?;
    m.add_class::<SavedForward>()?;
    m.add_class::<ResidentLayer>()?;
    m.add_class::<KvCacheHandle>()?;
    Ok(())
}
