//! `--grad-output G.npy` on `run` and `sdpa`: the gradient of every input, given
//! `dO = ∂loss/∂output`, written beside the outputs as `grad_<flag>.npy`.
//!
//! Both come from the device: a saved forward (`Attention::save_for_backward`, then
//! `Attention::run`), then `Saved::backward`: for `sdpa` the fused backward, for `run` the
//! fused backward and the projections' matmuls.
//! dO is read and checked before the device is opened, so a bad `dO` fails fast.

use std::path::{Path, PathBuf};

use clap::Args;
use ndarray::{Array4, ArrayD, ArrayView4, ArrayViewD};
use wgpu_attention::{
    npy, Attention, Context, Dims, Dtype, Error, Inputs, Mask, Output, Projections, Result,
};

/// The `--grad-output` flag, shared by `run` and `sdpa`.
#[derive(Args, Clone, Default)]
pub struct GradArgs {
    /// dO = ∂loss/∂output, a .npy of the output's shape (context.npy's). With it, also write
    /// the gradient of each input as grad_<flag>.npy in its input's shape: grad_x.npy and
    /// grad_wq/wk/wv/bq/bk/bv/wo/bo.npy for the flags given (run), or grad_q/k/v.npy (sdpa);
    /// with --relative-bias also grad_relative_bias.npy, the table's, (buckets, heads).
    /// Computed on the GPU (the fused backward, and for run the projections' matmuls; f32
    /// arithmetic; one forward more when the weights are written too). NaN/Inf in any input
    /// is an error even with --propagate-nan.
    #[arg(long, value_name = "G.npy")]
    grad_output: Option<PathBuf>,
}

/// Gradients computed and waiting to be written: `(flag, gradient)`, and where they were
/// computed.
pub struct Grads(Vec<(&'static str, ArrayD<f32>)>, &'static str);

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

impl GradArgs {
    /// `sdpa`'s dO, read and checked against the context's shape `(batch, heads, L, E_v)` and
    /// for NaN/Inf, or `None` without `--grad-output`.
    pub fn sdpa_grad_output(&self, [q, v]: [&[usize]; 2]) -> Result<Option<Array4<f32>>> {
        let Some(path) = &self.grad_output else {
            return Ok(None);
        };
        let want = [q[0], q[1], q[2], v[3]];
        let d_o = read_grad_output(path, &want, "context (batch, heads, L, E_v)")?;
        if let Some((index, &value)) = d_o.indexed_iter().find(|(_, v)| !v.is_finite()) {
            return Err(Error::NonFinite {
                array: "dO".into(),
                value,
                index: ndarray::Dimension::slice(&index).to_vec(),
            });
        }
        d_o.into_dimensionality()
            .map(Some)
            .map_err(|e| Error::shape(e.to_string()))
    }

    /// `sdpa` with `d_o`: the forward's output and `grad_q`, `grad_k`, `grad_v` (and with
    /// `--relative-bias`, `grad_relative_bias`, the table's) from the GPU's fused backward; the output from a plain forward when it must hold the weights
    /// (`weights`: whether `op` returns them).
    pub fn sdpa_on_gpu(
        ctx: &Context,
        (op, weights): (&Attention, bool),
        [q, k, v]: [ArrayView4<'_, f32>; 3],
        mask: &Mask<'_>,
        d_o: &Array4<f32>,
    ) -> Result<(Output, Grads)> {
        let inputs = Inputs::qkv(q, k, v).mask(mask);
        let out = op.save_for_backward(true).run(ctx, inputs.clone())?;
        let g = saved(&out)?.backward(ctx, d_o.view())?;
        let out = match weights {
            true => op.run(ctx, inputs)?,
            false => out,
        };
        let grads = [
            ("q", g.q),
            ("k", g.k),
            ("v", g.v),
            ("relative_bias", g.relative_bias),
        ];
        let grads = grads.into_iter().filter_map(|(n, a)| Some((n, a?)));
        Ok((out, Grads(grads.collect(), "GPU")))
    }

    /// `run`'s dO, read and checked against the output's shape; `None` without
    /// `--grad-output`.
    pub fn run_grad_output(
        &self,
        op: &Attention,
        x: ArrayViewD<'_, f32>,
        proj: Option<&Projections<'_>>,
    ) -> Result<Option<ArrayD<f32>>> {
        let Some(path) = &self.grad_output else {
            return Ok(None);
        };
        let inputs = Inputs::x(x).projections(proj);
        let want = Dims::new(op, &inputs)?.context_shape();
        read_grad_output(path, &want, "output").map(Some)
    }

    /// `run` with `d_o`: the forward's output and the gradients from the device (a saved
    /// forward, then `Saved::backward`): `grad_x`, and with `from_flags` (weights given as
    /// `--wq …`, not `--weights`) one per projection flag given. The output comes from a
    /// plain forward when it must hold the weights (`weights`: whether `op` returns them).
    pub fn run_on_gpu(
        ctx: &Context,
        (op, weights): (&Attention, bool),
        (x, proj): (ArrayViewD<'_, f32>, Option<&Projections<'_>>),
        mask: &Mask<'_>,
        d_o: &ArrayD<f32>,
        from_flags: bool,
    ) -> Result<(Output, Grads)> {
        let inputs = Inputs::x(x).projections(proj).mask(mask);
        let out = op.save_for_backward(true).run(ctx, inputs.clone())?;
        let g = saved(&out)?.backward(ctx, d_o)?;
        let out = match weights {
            true => op.run(ctx, inputs)?,
            false => out,
        };
        let x =
            g.x.ok_or_else(|| Error::invalid("backward", "no gradient of X"))?;
        let mut grads = vec![("x", x)];
        if from_flags {
            let named = [
                ("wq", g.w_q),
                ("wk", g.w_k),
                ("wv", g.w_v),
                ("bq", g.b_q),
                ("bk", g.b_k),
                ("bv", g.b_v),
                ("wo", g.w_o),
                ("bo", g.b_o),
            ];
            grads.extend(named.into_iter().filter_map(|(n, a)| Some((n, a?))));
        }
        if let Some(t) = g.relative_bias {
            grads.push(("relative_bias", t));
        }
        Ok((out, Grads(grads, "GPU")))
    }
}

/// What a saved forward kept for its backward.
fn saved(out: &Output) -> Result<&wgpu_attention::Saved> {
    out.saved
        .as_ref()
        .ok_or_else(|| Error::invalid("saved forward", "nothing saved"))
}

/// Writes each gradient as `dir/grad_<flag>.npy` (float16 with `--dtype f16`, else float32)
/// and prints where.
pub fn write(grads: Option<Grads>, dir: &Path, dtype: Dtype) -> Result<()> {
    let Some(Grads(grads, source)) = grads else {
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
            "grad_{flag:<5}{:?} -> {} ({source})",
            g.shape(),
            path.display()
        );
    }
    Ok(())
}
