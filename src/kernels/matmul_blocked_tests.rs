//! `matmul_blocked.wgsl` against an f64 product on lavapipe: odd sizes, padded rows (NaN in
//! the padding, which the zeroed vec4 lanes must never let through), Kᵀ read k-major with
//! batches, heads and grouped heads, the causal tile skip, ACCUMULATE, f16, the split output,
//! and the fallback for unaligned operands.

use super::*;
use crate::gpu::{buffer, readback};
use crate::kernels::matmul::{ACCUMULATE, F16_C, HAS_BIAS, SKIP_UPPER};
use crate::variant::{self, MatmulVariant};
use crate::Context;

fn ctx() -> Context {
    Context::new().unwrap().with_tuning(false)
}

/// Deterministic values in [-1, 1).
fn data(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i * 7919 + seed * 104_729) % 997) as f32 / 498.5) - 1.0)
        .collect()
}

fn at(s: Strides, heads: usize, g: usize, r: usize, c: usize) -> usize {
    (s.off + s.batch * (g / heads) as u32 + s.head * (g % heads) as u32) as usize
        + r * s.row as usize
        + c * s.col as usize
}

/// C of `mm` in f64 from the host operands (f16-rounded where `mm` says), starting from `c0`.
fn reference(mm: &Matmul, a: &[f32], b: &[f32], bias: &[f32], c0: &[f32]) -> Vec<f64> {
    let round = |v: f32, f16: bool| {
        if f16 {
            half::f16::from_f32(v).to_f32() as f64
        } else {
            v as f64
        }
    };
    let (fa, fb) = (mm.f16 & F16_A != 0, mm.f16 & F16_B != 0);
    let mut c: Vec<f64> = c0.iter().map(|&v| v as f64).collect();
    let b_heads = mm.heads / mm.b_ratio;
    for g in 0..mm.batch * mm.heads {
        let gb = (g / mm.heads) * b_heads + (g % mm.heads) / mm.b_ratio;
        for i in 0..mm.m {
            for j in 0..mm.n {
                if mm.flags & SKIP_UPPER != 0 && j > i {
                    continue;
                }
                let mut s = 0.0;
                for k in 0..mm.k {
                    s += round(a[at(mm.a, mm.heads, g, i, k)], fa)
                        * round(b[at(mm.b, b_heads, gb, k, j)], fb);
                }
                if mm.flags & HAS_BIAS != 0 {
                    s += round(bias[j], fb);
                }
                let o = at(mm.c, mm.heads, g, i, j);
                c[o] = if mm.flags & ACCUMULATE != 0 {
                    c[o] + s
                } else {
                    s
                };
            }
        }
    }
    c
}

/// Runs `mm` with `variant` on operands `a`, `b` (NaN wherever the strides do not reach)
/// and checks C against [`reference`] (skipped upper tiles are not compared); the variant
/// that ran.
fn check(
    ctx: &Context,
    mm: &Matmul,
    variant: MatmulVariant,
    (a, b): (&[f32], &[f32]),
    c_len: usize,
) -> MatmulVariant {
    let bias = data(mm.n, 3);
    let c0 = if mm.flags & ACCUMULATE != 0 {
        data(c_len, 4)
    } else {
        vec![0.0; c_len]
    };
    let (fa, fb, fc) = (
        mm.f16 & F16_A != 0,
        mm.f16 & F16_B != 0,
        mm.f16 & F16_C != 0,
    );
    let ga = buffer::upload_as(ctx, "A", a, fa).unwrap();
    let gb = buffer::upload_as(ctx, "B", b, fb).unwrap();
    let gbias = buffer::upload_as(ctx, "bias", &bias, fb).unwrap();
    let gc = buffer::upload_as(ctx, "C", &c0, fc).unwrap();
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let ran = variant::record_matmul(ctx, &mut enc, mm, variant, &ga, &gb, &gbias, &gc).unwrap();
    ctx.queue.submit([enc.finish()]);
    let got = readback::read_as(ctx, &gc, c_len, fc).unwrap();
    let want = reference(mm, a, b, &bias, &c0);
    let (mut err, mut norm, mut max_abs) = (0.0f64, 0.0f64, 0.0f64);
    let b_heads = mm.heads / mm.b_ratio;
    let _ = b_heads;
    for g in 0..mm.batch * mm.heads {
        for i in 0..mm.m {
            for j in 0..mm.n {
                if mm.flags & SKIP_UPPER != 0 && j > i {
                    continue;
                }
                let o = at(mm.c, mm.heads, g, i, j);
                let d = got[o] as f64 - want[o];
                assert!(
                    d.is_finite(),
                    "{variant} {mm:?}: C[{g},{i},{j}] = {}",
                    got[o]
                );
                err += d * d;
                norm += want[o] * want[o];
                max_abs = max_abs.max(d.abs());
            }
        }
    }
    let rel = (err / norm.max(1e-30)).sqrt();
    let tol = if fc { 2e-3 } else { 1e-5 };
    assert!(
        rel < tol,
        "{variant} {mm:?}: relative error {rel:e}, max abs {max_abs:e}"
    );
    ran
}

/// A `(m, k)·(k, n)` problem with rows padded to multiples of 4 (NaN in the padding).
fn padded(
    m: usize,
    n: usize,
    k: usize,
    flags: u32,
    f16: u8,
) -> (Matmul, Vec<f32>, Vec<f32>, usize) {
    let (ka, nb) = (k.next_multiple_of(4), n.next_multiple_of(4));
    let mut a = data(m * ka, 1);
    let mut b = data(k * nb, 2);
    a.iter_mut()
        .enumerate()
        .filter(|(i, _)| i % ka >= k)
        .for_each(|(_, v)| *v = f32::NAN);
    b.iter_mut()
        .enumerate()
        .filter(|(i, _)| i % nb >= n)
        .for_each(|(_, v)| *v = f32::NAN);
    let mm = Matmul {
        a: Strides::row_major(ka as u32, 0, 0),
        b: Strides::row_major(nb as u32, 0, 0),
        flags,
        f16,
        ..Matmul::plain(m, n, k, false, 0).unwrap()
    };
    (mm, a, b, m * n)
}

#[test]
fn blocked_matches_the_reference_at_odd_sizes_with_bias_and_padding() {
    let ctx = ctx();
    for per_thread in [4, 8] {
        let v = MatmulVariant::Blocked { per_thread };
        for (m, n, k) in [
            (1, 1, 1),
            (7, 5, 3),
            (37, 41, 29),
            (130, 70, 64),
            (1000, 36, 20),
        ] {
            let (mm, a, b, len) = padded(m, n, k, HAS_BIAS, 0);
            let dummy = buffer::upload(&ctx, "x", &vec![0.0; a.len().max(b.len()) + 4]).unwrap();
            assert!(eligible(&mm, per_thread / 4, &dummy, &dummy).is_some());
            check(&ctx, &mm, v, (&a, &b), len);
        }
    }
}

#[test]
fn blocked_reads_k_transposed_per_batch_and_grouped_head_and_skips_upper_tiles() {
    let ctx = ctx();
    // Scores Q_h·K_hᵀ: Q (batch, n, heads·dh), K (batch, n, kv·dh), 4 heads over 2 K heads.
    let (batch, heads, kv, n, dh) = (2, 4, 2, 67, 12);
    let q = data(batch * n * heads * dh, 5);
    let k = data(batch * n * kv * dh, 6);
    let c_len = batch * heads * n * n;
    for flags in [0, SKIP_UPPER] {
        let mm = Matmul {
            m: n,
            n,
            k: dh,
            batch,
            heads,
            a: Strides::row_major((heads * dh) as u32, dh as u32, (n * heads * dh) as u32),
            b: Strides::row_major((kv * dh) as u32, dh as u32, (n * kv * dh) as u32).transposed(),
            c: Strides {
                off: 0,
                batch: (heads * n * n) as u32,
                head: (n * n) as u32,
                row: n as u32,
                col: 1,
            },
            flags,
            b_ratio: heads / kv,
            f16: 0,
        };
        for per_thread in [4, 8] {
            check(
                &ctx,
                &mm,
                MatmulVariant::Blocked { per_thread },
                (&q, &k),
                c_len,
            );
        }
    }
}

#[test]
fn blocked_accumulates_and_computes_in_f16() {
    let ctx = ctx();
    for per_thread in [4, 8] {
        let v = MatmulVariant::Blocked { per_thread };
        let (mm, a, b, len) = padded(45, 23, 70, ACCUMULATE | HAS_BIAS, 0);
        check(&ctx, &mm, v, (&a, &b), len);
        let (mm, a, b, len) = padded(45, 23, 70, HAS_BIAS, F16_A | F16_B | F16_C);
        check(&ctx, &mm, v, (&a, &b), len);
        let (mm, a, b, len) = padded(9, 131, 17, 0, F16_B);
        check(&ctx, &mm, v, (&a, &b), len);
    }
}

#[test]
fn unaligned_operands_fall_back_to_the_scalar_kernel() {
    let ctx = ctx();
    let (m, n, k) = (19, 7, 5);
    let mm = Matmul::plain(m, n, k, true, 0).unwrap();
    let (a, b) = (data(m * k, 1), data(k * n, 2));
    let ga = buffer::upload(&ctx, "A", &a).unwrap();
    assert!(
        eligible(&mm, 1, &ga, &ga).is_none(),
        "rows of 5 are not vec4s"
    );
    let ran = check(
        &ctx,
        &mm,
        MatmulVariant::Blocked { per_thread: 4 },
        (&a, &b),
        m * n,
    );
    assert_eq!(
        ran,
        MatmulVariant::Tiled,
        "the scalar kernel ran, and says so"
    );
}

#[test]
fn split_output_writes_three_row_major_matrices() {
    let ctx = ctx();
    let (rows, d, widths) = (37, 24, [16, 8, 12]);
    let total: usize = widths.iter().sum();
    let x = data(rows * d, 7);
    let w = data(d * total, 8);
    let bias = data(total, 9);
    let mm = Matmul::plain(rows, total, d, true, 0).unwrap();
    let gx = buffer::upload(&ctx, "X", &x).unwrap();
    let gw = buffer::upload(&ctx, "W", &w).unwrap();
    let gbias = buffer::upload(&ctx, "b", &bias).unwrap();
    let outs: Vec<_> = widths
        .iter()
        .map(|&wd| buffer::output(&ctx, "out", rows * wd, true).unwrap())
        .collect();
    for tb in [1, 2] {
        let consts = eligible(&mm, tb, &gx, &gw).unwrap();
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        let split = Some((widths[0], widths[0] + widths[1]));
        dispatch(
            &ctx,
            &mut enc,
            &mm,
            consts,
            (&gx, &gw, &gbias),
            (&outs[0], &outs[1], &outs[2]),
            split,
        )
        .unwrap();
        ctx.queue.submit([enc.finish()]);
        let want = reference(&mm, &x, &w, &bias, &vec![0.0; rows * total]);
        let mut col0 = 0;
        for (o, &wd) in outs.iter().zip(&widths) {
            let got = readback::read_as(&ctx, o, rows * wd, false).unwrap();
            for i in 0..rows {
                for j in 0..wd {
                    let (g, r) = (got[i * wd + j] as f64, want[i * total + col0 + j]);
                    assert!(
                        (g - r).abs() < 1e-5,
                        "tb {tb}: ({i}, {}) {g} vs {r}",
                        col0 + j
                    );
                }
            }
            col0 += wd;
        }
    }
}
