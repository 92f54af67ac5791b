//! The backward of a projection on the device: for `Y = A·W (+ b)`, given `dY`, the weight's
//! gradient `dW = Aᵀ·dY`, the bias's `db = 1ᵀ·dY` (column sums) and the input's
//! `dA = dY·Wᵀ`, each one strided matmul (the register-tiled kernel, which reads any
//! operand transposed through its strides and can add into C), recorded into the caller's
//! encoder: nothing comes back to the host in between.

use super::weights::Linear;

use crate::context::Context;
use crate::error::Result;
use crate::gpu::buffer::{self, Buf};
use crate::kernels::matmul::{Matmul, ACCUMULATE, F16_A, F16_B};
use crate::kernels::{u32_of, Strides};

/// What [`Linear::record_backward`] returns: `dW (rows, cols)` and `db (cols)`, f32.
pub(super) struct LinearGrads {
    pub dw: Buf,
    pub db: Option<Buf>,
}

/// Where `dA` goes: a buffer `(n, rows)` of f32, overwritten or added to.
pub(super) struct InputGrad<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub accumulate: bool,
}

impl Linear {
    /// Records the gradients of `Y = A·W (+ b)` over `n` rows, `A` `(n, self.rows)` (f16 when
    /// `a_f16`), `dY` `(n, self.cols)` f32; `dA` into `da` when given. `w_f16`: the weight is
    /// stored as f16.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record_backward(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        n: usize,
        (a, a_f16): (&wgpu::Buffer, bool),
        dy: &wgpu::Buffer,
        da: Option<InputGrad<'_>>,
        w_f16: bool,
    ) -> Result<LinearGrads> {
        let (inp, out) = (self.rows, self.cols);
        let row_major = |width: usize| -> Result<Strides> {
            Ok(Strides::row_major(u32_of("width", width)?, 0, 0))
        };
        let no_bias = ctx.stand_in();
        // dW = Aᵀ·dY: (inp, n)·(n, out).
        let dw = buffer::output(ctx, "dW", inp * out, false)?;
        let mm = Matmul {
            a: row_major(inp)?.transposed(),
            b: row_major(out)?,
            f16: if a_f16 { F16_A } else { 0 },
            ..Matmul::plain(inp, out, n, false, 0)?
        };
        mm.dispatch(ctx, encoder, a, dy, no_bias, &dw)?;
        // db = 1ᵀ·dY: a row of ones read from one element through zero strides.
        let db = match self.b {
            Some(_) => {
                let db = buffer::output(ctx, "db", out, false)?;
                let mm = Matmul {
                    a: Strides::default(),
                    ..Matmul::plain(1, out, n, false, 0)?
                };
                mm.dispatch(ctx, encoder, ctx.one()?, dy, no_bias, &db)?;
                Some(db)
            }
            None => None,
        };
        // dA (+)= dY·Wᵀ: (n, out)·(out, inp).
        if let Some(InputGrad { buffer, accumulate }) = da {
            let mm = Matmul {
                b: row_major(out)?.transposed(),
                flags: if accumulate { ACCUMULATE } else { 0 },
                f16: if w_f16 { F16_B } else { 0 },
                ..Matmul::plain(n, inp, out, false, 0)?
            };
            mm.dispatch(ctx, encoder, dy, self.weight(), no_bias, buffer)?;
        }
        Ok(LinearGrads { dw, db })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::readback;
    use ndarray::{Array1, Array2};

    fn read(ctx: &Context, b: &wgpu::Buffer, len: usize) -> Vec<f32> {
        readback::read_as(ctx, b, len, false).unwrap()
    }

    fn close(got: &[f32], want: &ndarray::ArrayViewD<'_, f32>, what: &str) {
        let want: Vec<f32> = want.iter().copied().collect();
        assert_eq!(got.len(), want.len(), "{what}");
        let scale = want.iter().fold(1e-6f32, |a, v| a.max(v.abs()));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * scale, "{what}[{i}]: {g} vs {w}");
        }
    }

    #[test]
    fn gradients_of_a_projection_match_ndarray_across_tile_edges() {
        let ctx = crate::context::test_context();
        // Sizes that cross the 64-wide tiles and divide by nothing.
        let (n, inp, out) = (37, 70, 65);
        let f = |r: usize, c: usize, s: f32| {
            Array2::from_shape_fn((r, c), |(i, j)| ((i * 7 + j * 3) as f32 * s).sin())
        };
        let (a, w, dy) = (f(n, inp, 0.11), f(inp, out, 0.07), f(n, out, 0.05));
        let b = Array1::from_elem(out, 0.5f32);
        let prior = f(n, inp, 0.3);
        let linear = Linear::upload(ctx, "W", &w.view(), Some(&b.view()), false).unwrap();
        let up = |x: &Array2<f32>| buffer::upload(ctx, "x", x.as_slice().unwrap()).unwrap();
        let (a_buf, dy_buf, da_buf) = (up(&a), up(&dy), up(&prior));
        let mut encoder = ctx.device().create_command_encoder(&Default::default());
        let da = InputGrad {
            buffer: &da_buf,
            accumulate: true,
        };
        let g = linear
            .record_backward(
                ctx,
                &mut encoder,
                n,
                (&a_buf, false),
                &dy_buf,
                Some(da),
                false,
            )
            .unwrap();
        ctx.queue().submit([encoder.finish()]);
        close(
            &read(ctx, &g.dw, inp * out),
            &a.t().dot(&dy).view().into_dyn(),
            "dW",
        );
        let db = dy.sum_axis(ndarray::Axis(0));
        close(
            &read(ctx, g.db.as_ref().unwrap(), out),
            &db.view().into_dyn(),
            "db",
        );
        let want = &prior + &dy.dot(&w.t());
        close(&read(ctx, &da_buf, n * inp), &want.view().into_dyn(), "dA");
    }
}
