//! `--grad-output G.npy` on `run` and `sdpa`: the gradient of every input, given
//! `dO = ∂loss/∂output`, written beside the outputs as `grad_<flag>.npy`.
//!
//! Computed on the CPU in f64 by `reference::sdpa_backward` / `reference::attention_backward`
//! until the GPU backward exists (issue 13); the forward outputs still come from the GPU.
//! The gradients are computed before the device is opened, so a bad `dO` fails fast.

use std::path::{Path, PathBuf};

use clap::Args;
use ndarray::{ArrayD, ArrayView4, ArrayViewD};
use wgpu_attention::{npy, reference, Attention, Dtype, Error, Mask, Projections, Result};

/// The `--grad-output` flag, shared by `run` and `sdpa`.
#[derive(Args, Clone, Default)]
pub struct GradArgs {
    /// dO = ∂loss/∂output, a .npy of the output's shape (context.npy's). With it, also write
    /// the gradient of each input as grad_<flag>.npy in its input's shape: grad_x.npy and
    /// grad_wq/wk/wv/bq/bk/bv/wo/bo.npy for the flags given (run), or grad_q/k/v.npy (sdpa).
    /// Computed on the CPU in f64 for now (the GPU backward is not written yet); NaN/Inf in
    /// any input is an error even with --propagate-nan.
    #[arg(long, value_name = "G.npy")]
    grad_output: Option<PathBuf>,
}

/// Gradients computed and waiting to be written: `(flag, gradient)`.
pub struct Grads(Vec<(&'static str, ArrayD<f32>)>);

/// Reads dO and checks it has the output's shape, naming the file.
fn read_grad_output(path: &Path, want: &[usize], output: &str) -> Result<ArrayD<f32>> {
    let d_o = npy::read(path)?;
    if d_o.shape() != want {
        return Err(Error::shape(format!(
            "--grad-output {} is {:?} but the {output} is {want:?}: dO has the output's shape",
            path.display(),
            d_o.shape()
        )));
    }
    Ok(d_o)
}

fn to_f32(a: ArrayD<f64>) -> ArrayD<f32> {
    a.mapv(|v| v as f32)
}

impl GradArgs {
    /// `sdpa`'s gradients `grad_q`, `grad_k`, `grad_v`, or `None` without `--grad-output`.
    pub fn sdpa(
        &self,
        op: &Attention,
        [q, k, v]: [ArrayView4<'_, f32>; 3],
        mask: &Mask<'_>,
    ) -> Result<Option<Grads>> {
        let Some(path) = &self.grad_output else {
            return Ok(None);
        };
        let (b, h, l, _) = q.dim();
        let want = [b, h, l, v.dim().3];
        let d_o = read_grad_output(path, &want, "context (batch, heads, L, E_v)")?;
        let d_o = d_o
            .view()
            .into_dimensionality()
            .map_err(|e| Error::shape(e.to_string()))?;
        let g = reference::sdpa_backward(op, q, k, v, d_o, mask)?;
        Ok(Some(Grads(vec![
            ("q", to_f32(g.q.into_dyn())),
            ("k", to_f32(g.k.into_dyn())),
            ("v", to_f32(g.v.into_dyn())),
        ])))
    }

    /// `run`'s gradients: `grad_x`, and with `from_flags` (weights given as `--wq …`, not
    /// `--weights`) one per projection flag given. `None` without `--grad-output`.
    pub fn run(
        &self,
        op: &Attention,
        x: ArrayViewD<'_, f32>,
        proj: Option<&Projections<'_>>,
        mask: &Mask<'_>,
        from_flags: bool,
    ) -> Result<Option<Grads>> {
        let Some(path) = &self.grad_output else {
            return Ok(None);
        };
        let want = op.dims(x.shape(), proj)?.context_shape();
        let d_o = read_grad_output(path, &want, "output")?;
        let g = reference::attention_backward(op, x, proj, d_o.view(), mask)?;
        let mut out = vec![("x", to_f32(g.x))];
        if from_flags {
            let two = |a: Option<ndarray::Array2<f64>>| a.map(|a| to_f32(a.into_dyn()));
            let one = |a: Option<ndarray::Array1<f64>>| a.map(|a| to_f32(a.into_dyn()));
            let named = [
                ("wq", two(g.w_q)),
                ("wk", two(g.w_k)),
                ("wv", two(g.w_v)),
                ("bq", one(g.b_q)),
                ("bk", one(g.b_k)),
                ("bv", one(g.b_v)),
                ("wo", two(g.w_o)),
                ("bo", one(g.b_o)),
            ];
            out.extend(named.into_iter().filter_map(|(n, a)| Some((n, a?))));
        }
        Ok(Some(Grads(out)))
    }
}

/// Writes each gradient as `dir/grad_<flag>.npy` (float16 with `--dtype f16`, else float32)
/// and prints where.
pub fn write(grads: Option<Grads>, dir: &Path, dtype: Dtype) -> Result<()> {
    let Some(Grads(grads)) = grads else {
        return Ok(());
    };
    let write = match dtype {
        Dtype::F32 => npy::write,
        Dtype::F16 => npy::write_f16,
    };
    for (flag, g) in grads {
        let path = dir.join(format!("grad_{flag}.npy"));
        write(&path, &g)?;
        println!(
            "grad_{flag:<5}{:?} -> {} (CPU, f64)",
            g.shape(),
            path.display()
        );
    }
    Ok(())
}
