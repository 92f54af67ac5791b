//! PyTorch autograd's gradients (float64 truth, `tests/python/make_torch_grad_cases.py`)
//! against `wgpu-attention run|sdpa --grad-output`: every `grad_<flag>.npy` the CLI writes
//! agrees with PyTorch's within 1e-4 relative error; for `sdpa` with grouped-query heads, a
//! boolean mask, key lengths, causal and a custom scale, and for `run` with every bias, `W_O`
//! with `b_O` and a float mask holding -inf.

mod common;

use wgpu_attention::npy;

#[test]
fn cli_gradients_match_pytorch_autograd() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for common::Case {
        dir: case, meta, ..
    } in &common::cases("torch_grad", 2)
    {
        let out_dir = tempfile::tempdir().unwrap();
        let mut args: Vec<String> = vec![meta["command"].as_str().unwrap().to_string()];
        for (flag, name) in meta["inputs"].as_object().unwrap() {
            args.push(flag.clone());
            let file = case.join(format!("{}.npy", name.as_str().unwrap()));
            args.push(file.display().to_string());
        }
        for f in meta["flags"].as_array().unwrap() {
            args.push(f.as_str().unwrap().to_string());
        }
        args.push("--grad-output".into());
        args.push(case.join("grad_output.npy").display().to_string());
        args.push("--out".into());
        args.push(out_dir.path().display().to_string());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        common::ok(&common::cli(&args));
        for entry in std::fs::read_dir(case).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let Some(flag) = name
                .strip_prefix("want_")
                .and_then(|n| n.strip_suffix(".npy"))
            else {
                continue;
            };
            let want = npy::read(&path).unwrap();
            let got = npy::read(&out_dir.path().join(format!("grad_{flag}.npy"))).unwrap();
            let label = format!("{} grad_{flag}", case.display());
            if got.shape() != want.shape() {
                failures.push(format!(
                    "{label}: shape {:?} vs {:?}",
                    got.shape(),
                    want.shape()
                ));
                continue;
            }
            let norm = |a: &ndarray::ArrayD<f32>| {
                a.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt()
            };
            let diff = norm(&(&got - &want));
            let scale = norm(&want);
            // b_K's gradient is exactly 0 (a per-row constant shift of the scores); there,
            // compare absolutely.
            let ok = if scale < 1e-6 {
                diff < 1e-5
            } else {
                diff / scale <= 1e-4
            };
            if !ok {
                failures.push(format!("{label}: |diff| {diff:e}, |want| {scale:e}"));
            }
            checked += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked >= 12, "only {checked} gradients compared");
}
