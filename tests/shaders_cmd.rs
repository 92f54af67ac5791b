//! `wgpu-attention shaders --out DIR`: the specialised WGSL of every kernel variant either
//! profile may run, written where asked, listed on stdout; an unwritable directory is a clear error.

mod common;

use common::bin;

#[test]
fn shaders_writes_every_variant_and_lists_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["shaders", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = String::from_utf8(out.stdout).unwrap();
    for d in [64, 128] {
        for t in ["f32", "f16"] {
            let f = dir
                .path()
                .join(format!("storage/flash-blocked-64x64-d{d}-{t}.wgsl"));
            assert!(f.exists(), "{}", f.display());
            assert!(listed.contains(&f.display().to_string()));
            let text = std::fs::read_to_string(&f).unwrap();
            assert!(text.contains(&format!("const DK4: u32 = {}u;", d / 4)));
            assert_eq!(text.contains("enable f16;"), t == "f16");
        }
    }
    for stem in [
        "matmul-f32",
        "matmul-f16-abc",
        "softmax-mask0-f32",
        "weighted-sum-f16",
    ] {
        let f = dir.path().join(format!("storage/{stem}.wgsl"));
        assert!(listed.contains(&f.display().to_string()), "{stem} missing");
    }
    // The masked and NaN-pass-through builds of the fused kernel, so CI compiles them too.
    for tag in ["mask", "mask-skip0"] {
        let f = dir
            .path()
            .join(format!("storage/flash-blocked-64x64-d64-f32-{tag}.wgsl"));
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(text.contains("const MASK: u32 = 1u;"), "{tag}");
        let skip = u32::from(tag == "mask-skip0");
        assert!(
            text.contains(&format!("const SKIP_ZERO: u32 = {skip}u;")),
            "{tag}"
        );
    }
    // The fused backward's storage kernels and the forward that saves its row statistics.
    for stem in [
        "flash-backward-dot",
        "flash-backward-kv-d64-f32-mask1",
        "flash-backward-q-d128-f16-mask0",
    ] {
        let f = dir.path().join(format!("storage/{stem}.wgsl"));
        assert!(listed.contains(&f.display().to_string()), "{stem} missing");
    }
    let lse = dir
        .path()
        .join("storage/flash-blocked-64x64-d64-f32-lse.wgsl");
    assert!(std::fs::read_to_string(lse)
        .unwrap()
        .contains("const LSE: u32 = 1u;"));
    // flash_tiled spills on GPUs and is not offered there: it is lavapipe's alone (`cpu/`),
    // never in a GPU family's folder.
    assert!(!listed.contains("storage/flash-tiled"), "{listed}");
    let tiled = dir.path().join("cpu/flash-tiled-bk32-d64-f32.wgsl");
    assert!(listed.contains(&tiled.display().to_string()), "{listed}");
    // Every kernel either profile may run is written (the static gates check them all): each
    // shaders/*.wgsl kernel is in some file, and the stand-in's emulated sources are there.
    let shaders = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let mut kernels: Vec<String> = std::fs::read_dir(shaders)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|n| Some(n.strip_suffix(".wgsl")?.replace('_', "-")))
        .filter(|n| !["prelude", "flash-backward-io"].contains(&n.as_str()))
        .collect();
    kernels.sort();
    let stems: Vec<&str> = listed
        .lines()
        .filter_map(|l| std::path::Path::new(l).file_stem()?.to_str())
        .collect();
    for k in &kernels {
        assert!(
            stems.iter().any(|s| s.starts_with(k.as_str())),
            "no file of shaders/{k}.wgsl written"
        );
    }
    for stem in [
        "stand-in/flash-blocked-64x64-d64-f32-sgr-emu32",
        "stand-in/flash-coop-16-d64-f16-emu32",
        "subgroup/flash-subgroup-r1-d64-f32-sg64",
        "subgroup/flash-subgroup-r1-d128-f32-sg32",
        "subgroup/matmul-subgroup-t2-mask1-split0-f32-sg8",
        "subgroup/flash-backward-q-subgroup-d64-f32-mask1-sg32",
        "subgroup/pack-f16",
        "subgroup/row-stats",
        "cpu/decode-partial-d64-rows1",
        "bench/fma-peak",
    ] {
        let f = dir.path().join(format!("{stem}.wgsl"));
        assert!(listed.contains(&f.display().to_string()), "{stem} missing");
    }
    // The fused backward's storage kernels with each profile's constants: a key per thread
    // on the CPU adapter, 4 threads per key on a GPU.
    let kv = |folder: &str| {
        let f = dir
            .path()
            .join(format!("{folder}/flash-backward-kv-d64-f32-mask0.wgsl"));
        std::fs::read_to_string(f).unwrap()
    };
    assert!(kv("cpu").contains("const CT: u32 = 1u;"), "{}", kv("cpu"));
    assert!(kv("storage").contains("const CT: u32 = 4u;"));
    let emulated = dir
        .path()
        .join("stand-in/flash-blocked-64x64-d64-f32-sgr-emu32.wgsl");
    let text = std::fs::read_to_string(emulated).unwrap();
    assert!(
        text.contains("// Subgroups of 32 lanes emulated through workgroup memory"),
        "not emulated"
    );
}

#[test]
fn shaders_into_a_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, "").unwrap();
    let out = bin()
        .args(["shaders", "--out"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("f/storage") || err.contains("f\\storage"),
        "{err}"
    );
}
