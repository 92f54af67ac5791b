//! Opened `.npy` files as operands (`Inputs::qkv(&q, &k, &v)` on `npy::Opened`): each
//! file's values go from the file into device memory in one pass, checked on the way, with
//! no array of them on the host. What a call on files gives is what the same call on the
//! arrays the files hold gives, bit for bit, on every path (the stand-in GPU's staging and
//! lavapipe's unified memory, f32 and f16, past the device's limits); a bad value is named
//! at its index in the file's array; a file that fails while it is read is an `Io` error.

mod common;

use std::path::{Path, PathBuf};

use ndarray::{Array4, ArrayD};
use wgpu_attention::internals::StandIn;
use wgpu_attention::npy::{self, Opened};
use wgpu_attention::{Attention, Context, Dtype, Error, Inputs, Mask, Options};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("npy-operands-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Q, K, V written as `.npy` (float16 when `f16`), and what the files hold as arrays.
fn files(dir: &Path, qkv: &[Array4<f32>; 3], f16: bool) -> ([Opened; 3], [ArrayD<f32>; 3]) {
    let paths = ["q", "k", "v"].map(|n| dir.join(format!("{n}{}.npy", if f16 { 16 } else { 32 })));
    for (p, a) in paths.iter().zip(qkv) {
        let a = a.clone().into_dyn();
        match f16 {
            true => npy::write_f16(p, &a).unwrap(),
            false => npy::write(p, &a).unwrap(),
        }
    }
    let held = paths.clone().map(|p| npy::read(&p).unwrap());
    (paths.map(|p| Opened::open(&p).unwrap()), held)
}

fn nan_filled(dtype: Dtype) -> Attention {
    Attention::new()
        .dtype(dtype)
        .options(Options::default().nan_fill(true))
}

fn stand_in() -> Context {
    Context::new()
        .unwrap()
        .with_tuning(false)
        .with_stand_in(StandIn::Gpu)
}

#[test]
fn a_call_on_files_gives_what_the_call_on_their_arrays_gives() {
    let d = dir("same");
    // Uneven sizes, grouped-query heads, L != S; and a problem past the upload's threading
    // threshold (4 MiB of f32 per operand), whose parts are read on several threads.
    let small: [Array4<f32>; 3] = common::sdpa_arrays(2, 6, 37, 29, 8, 12);
    let small = [
        small[0].clone(),
        small[1].slice(ndarray::s![.., ..3, .., ..]).to_owned(),
        small[2].slice(ndarray::s![.., ..3, .., ..]).to_owned(),
    ];
    let large: [Array4<f32>; 3] = common::sdpa_arrays(4, 4, 1030, 1030, 64, 64);
    let lengths = [29usize, 11];
    let stand_in = stand_in();
    for (qkv, contexts) in [
        (&small, vec![common::ctx(), &stand_in]),
        (&large, vec![common::ctx()]),
    ] {
        for file_f16 in [false, true] {
            let (opened, held) = files(&d, qkv, file_f16);
            for ctx in &contexts {
                for dtype in [Dtype::F32, Dtype::F16] {
                    for causal in [false, true] {
                        let mask = match qkv[0].dim().0 == 2 {
                            true => Mask::none().with_kv_lengths(&lengths),
                            false => Mask::none(),
                        };
                        let op = nan_filled(dtype).causal(causal).return_weights(false);
                        let [q, k, v] = &opened;
                        let got = op.run(ctx, Inputs::qkv(q, k, v).mask(&mask)).unwrap();
                        let [q, k, v] = &held;
                        let want = op.run(ctx, Inputs::qkv(q, k, v).mask(&mask)).unwrap();
                        assert!(got.context.iter().all(|x| x.is_finite()));
                        assert!(
                            got.context == want.context,
                            "shape {:?}, f16 file {file_f16}, {dtype:?}, causal {causal}, stand-in {:?}",
                            qkv[0].shape(),
                            ctx.standing_in()
                        );
                    }
                }
            }
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn calls_that_do_not_upload_files_directly_read_them_first() {
    let d = dir("fallback");
    let ctx = common::ctx();
    let qkv: [Array4<f32>; 3] = common::sdpa_arrays(2, 4, 40, 40, 16, 16);
    let (opened, held) = files(&d, &qkv, false);
    // Past the device's limits: read and split.
    let small = common::context_with(|l| l.max_storage_buffer_binding_size = 16 << 10);
    let op = nan_filled(Dtype::F32).causal(true);
    let [q, k, v] = &opened;
    let got = op.run(&small, Inputs::qkv(q, k, v)).unwrap();
    let [hq, hk, hv] = &held;
    let want = op.run(&small, Inputs::qkv(hq, hk, hv)).unwrap();
    assert!(got.context == want.context && got.weights == want.weights);
    // Saved for the backward: its gradients as the arrays' are.
    let saving = op.save_for_backward(true);
    let got = saving.run(ctx, Inputs::qkv(q, k, v)).unwrap();
    let want = saving.run(ctx, Inputs::qkv(hq, hk, hv)).unwrap();
    let d_o = ArrayD::from_elem(got.context.shape(), 0.5f32);
    let g_got = got.saved.unwrap().backward(ctx, &d_o).unwrap();
    let g_want = want.saved.unwrap().backward(ctx, &d_o).unwrap();
    assert!(g_got.q == g_want.q && g_got.k == g_want.k && g_got.v == g_want.v);
    // X from a file: self-attention on it.
    let x_path = d.join("x.npy");
    let x = ArrayD::from_shape_fn(vec![2, 9, 16], |i| ((i[1] * 16 + i[2]) as f32 * 0.37).sin());
    npy::write(&x_path, &x).unwrap();
    let x_file = Opened::open(&x_path).unwrap();
    let op = nan_filled(Dtype::F32).heads(2);
    let got = op.run(ctx, Inputs::x(&x_file)).unwrap();
    let want = op.run(ctx, Inputs::x(&x)).unwrap();
    assert!(got.context == want.context && got.weights == want.weights);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_bad_value_in_a_file_is_named_at_its_index_in_the_files_array() {
    let d = dir("bad");
    let ctx = common::ctx();
    // Past the threading threshold, the bad value in a later thread's part.
    let mut qkv: [Array4<f32>; 3] = common::sdpa_arrays(4, 4, 1030, 1030, 64, 64);
    qkv[1][[3, 2, 1000, 5]] = f32::NAN;
    let (opened, _) = files(&d, &qkv, false);
    let [q, k, v] = &opened;
    let err = Attention::new().run(ctx, Inputs::qkv(q, k, v)).unwrap_err();
    assert!(
        matches!(&err, Error::NonFinite { array, index, .. } if array == "K" && index == &[3, 2, 1000, 5]),
        "{err}"
    );
    // Past f16's range under f16.
    qkv[1][[3, 2, 1000, 5]] = 0.0;
    qkv[2][[0, 1, 7, 63]] = 1e6;
    let (opened, _) = files(&d, &qkv, false);
    let [q, k, v] = &opened;
    let err = Attention::new()
        .dtype(Dtype::F16)
        .run(ctx, Inputs::qkv(q, k, v))
        .unwrap_err();
    assert!(err.to_string().contains("V[0, 1, 7, 63]"), "{err}");
    // A file cut short after it was opened: an Io error naming it, not a panic.
    let [q, k, v] = &opened;
    std::fs::OpenOptions::new()
        .write(true)
        .open(k.path())
        .unwrap()
        .set_len(1000)
        .unwrap();
    let err = Attention::new().run(ctx, Inputs::qkv(q, k, v)).unwrap_err();
    assert!(
        matches!(&err, Error::Io { path, .. } if path == k.path()),
        "{err}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}
