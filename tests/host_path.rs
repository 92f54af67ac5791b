//! The host side of a call on arrays: Q, K and V copied once into staging memory from the
//! caller's layout (heads-first, sliced or permuted views included: no host transpose), the
//! checks on the way, the context read straight back into the returned array, device and
//! staging buffers reused by the next call of the same shape, and `--timings` phases that
//! account for the CLI's time.

mod common;

use ndarray::{s, Array4};
use wgpu_attention::{reference, Attention, Context, Error, Inputs, Kernels, Options};

fn nan_filled(kernels: Kernels) -> Attention {
    Attention::new().options(Options::default().kernels(kernels).nan_fill(true))
}

#[test]
fn views_in_any_layout_upload_as_they_are_and_match_the_reference() {
    let ctx = common::ctx();
    // Q as a permuted view of (b, L, h, E) data (rows of E contiguous, heads not), K a slice
    // of a longer sequence, V a slice of a wider array (rows not adjacent).
    let q_rows = common::smooth((2, 37, 3, 8), 1, 1.5);
    let q = q_rows.view().permuted_axes([0, 2, 1, 3]);
    let k_long = common::smooth((2, 3, 60, 8), 2, 1.5);
    let k = k_long.slice(s![.., .., 7..60, ..]);
    let v_wide = common::smooth((2, 3, 53, 20), 3, 1.5);
    let v = v_wide.slice(s![.., .., .., 4..16]);
    let owned = [q.to_owned(), k.to_owned(), v.to_owned()];
    for causal in [false, true] {
        for (kernels, fused) in wgpu_attention::verify::paths(ctx) {
            let op = nan_filled(kernels).causal(causal).return_weights(!fused);
            let views = Inputs::qkv(q, k, v);
            let got = op.run(ctx, views).unwrap();
            let want = reference::run(&op, &Inputs::qkv(&owned[0], &owned[1], &owned[2])).unwrap();
            let (rel, max) = reference::compare(&got.context, &want.context);
            assert!(
                rel < 1e-5,
                "{kernels} fused={fused} causal={causal}: rel {rel:e}, max {max:e}"
            );
            if let (Some(g), Some(w)) = (&got.weights, &want.weights) {
                assert!(reference::compare(g, w).0 < 1e-5, "{kernels} weights");
            }
        }
    }
}

#[test]
fn a_bad_value_in_a_view_is_named_at_the_callers_index() {
    let ctx = common::ctx();
    let mut q = common::smooth((2, 3, 40, 8), 1, 1.0);
    q[[1, 2, 33, 5]] = f32::NAN;
    let k = common::smooth((2, 3, 40, 8), 2, 1.0);
    let q_view = q.slice(s![.., .., 10..40, ..]);
    let k_view = k.slice(s![.., .., 10..40, ..]);
    let err = Attention::new()
        .run(ctx, Inputs::qkv(q_view, k_view, k_view))
        .unwrap_err();
    match err {
        Error::NonFinite { array, index, .. } => {
            assert_eq!((array.as_str(), index), ("Q", vec![1, 2, 23, 5]));
        }
        other => panic!("{other}"),
    }
}

#[test]
fn a_second_call_of_the_same_shape_allocates_no_buffer() {
    common::isolate();
    let ctx = Context::new().unwrap().with_tuning(false);
    let [q, k, v] = common::sdpa_arrays(2, 4, 70, 70, 16, 16);
    for return_weights in [false, true] {
        let op = Attention::new().causal(true).return_weights(return_weights);
        let first = op.run(&ctx, Inputs::qkv(&q, &k, &v)).unwrap();
        let after_first = ctx.memory().allocations;
        if !return_weights {
            // Q, K and V's device buffers are the pool's, kept for the next call.
            let qkv_bytes = 3 * q.len() as u64 * 4;
            assert!(ctx.memory().free_bytes >= qkv_bytes, "{:?}", ctx.memory());
        }
        let second = op.run(&ctx, Inputs::qkv(&q, &k, &v)).unwrap();
        assert_eq!(
            ctx.memory().allocations,
            after_first,
            "weights {return_weights}"
        );
        assert_eq!(first.context, second.context);
    }
    // A sequence of other lengths takes other buffers.
    let [q, k, v] = common::sdpa_arrays(2, 4, 300, 300, 16, 16);
    let before = ctx.memory().allocations;
    Attention::new().run(&ctx, Inputs::qkv(&q, &k, &v)).unwrap();
    assert!(ctx.memory().allocations > before);
}

/// `name X.Y ms` out of a `--timings` line.
fn phase(line: &str, name: &str) -> f64 {
    let at = line
        .find(&format!("{name} "))
        .unwrap_or_else(|| panic!("{name} in {line}"));
    let rest = &line[at + name.len() + 1..];
    rest.split(' ').next().unwrap().parse().unwrap()
}

#[test]
fn timings_name_every_phase_of_a_cli_call() {
    let dir = std::env::temp_dir().join(format!("host-path-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let qkv: Vec<Array4<f32>> = common::sdpa_arrays(2, 4, 300, 300, 64, 64).into();
    let mut args = vec!["sdpa".to_string()];
    for (name, a) in ["q", "k", "v"].iter().zip(&qkv) {
        let path = dir.join(format!("{name}.npy"));
        wgpu_attention::npy::write(&path, &a.clone().into_dyn()).unwrap();
        args.extend([format!("--{name}"), path.display().to_string()]);
    }
    for dtype in ["f32", "f16"] {
        let out = dir.join(dtype);
        let mut run = args.clone();
        run.extend(
            [
                "--causal",
                "--context-only",
                "--timings",
                "--dtype",
                dtype,
                "--out",
            ]
            .map(String::from),
        );
        run.push(out.display().to_string());
        let start = std::time::Instant::now();
        let output = common::bin().args(&run).output().unwrap();
        let wall = start.elapsed().as_secs_f64() * 1e3;
        common::ok(&output);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let line = stderr
            .lines()
            .find(|l| l.starts_with("timings"))
            .expect("a timings line");
        // Reading three files and writing one, the upload (checks included) and the readback
        // each take time, and are counted where they happen; the phases add up to no more
        // than the process's wall time.
        for name in ["io", "upload", "readback", "dispatch"] {
            assert!(phase(line, name) > 0.0, "{name} in {line}");
        }
        assert!(phase(line, "total") <= wall, "{line} vs wall {wall:.1} ms");
        let context = wgpu_attention::npy::read(&out.join("context.npy")).unwrap();
        assert_eq!(context.shape(), &[2, 4, 300, 64]);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bad_value_in_x_is_named_through_the_projections_and_a_layer() {
    use wgpu_attention::{ndarray::Array2, Layer, Projections};
    let ctx = common::ctx();
    let mut x = Array2::from_shape_fn((7, 8), |(i, j)| ((i * 8 + j) as f32 * 0.1).sin());
    x[[3, 2]] = f32::INFINITY;
    let w = Array2::from_shape_fn((8, 8), |(i, j)| ((i + 2 * j) as f32 * 0.05).cos());
    let p = Projections::new(w.view(), w.view(), w.view());
    let named = |e: Error| match e {
        Error::NonFinite { array, index, .. } => (array, index),
        other => panic!("{other}"),
    };
    let op = Attention::new().heads(2);
    let e = op.run(ctx, Inputs::x(&x).projections(&p)).unwrap_err();
    assert_eq!(named(e), ("X".to_string(), vec![3, 2]));
    let layer = Layer::new(ctx, op, &p).unwrap();
    let e = layer.run(ctx, Inputs::x(&x)).unwrap_err();
    assert_eq!(named(e), ("X".to_string(), vec![3, 2]));
}

#[test]
fn a_saved_forward_checks_its_inputs_on_the_way_up_at_the_callers_index() {
    let ctx = common::ctx();
    let [mut q, k, v] = common::sdpa_arrays(2, 3, 20, 20, 8, 8);
    q[[1, 2, 7, 3]] = f32::NAN;
    // Passing NaN through is not offered to a saved forward: an error either way.
    for propagate in [false, true] {
        let op = Attention::new()
            .save_for_backward(true)
            .options(Options::default().propagate_non_finite(propagate));
        let e = op.run(ctx, Inputs::qkv(&q, &k, &v)).unwrap_err();
        assert!(
            matches!(&e, Error::NonFinite { array, index, .. } if array == "Q" && index == &[1, 2, 7, 3]),
            "{e}"
        );
    }
}
