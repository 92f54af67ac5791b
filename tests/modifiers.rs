//! Score and mask modifiers in the forward of the storage and subgroup families,
//! fused and with the weights, on Q, K, V and on X (projected or not): each preset and their
//! combinations with causal, a boolean mask, grouped-query heads and L ≠ S against the f64
//! reference (its weights too); a caller's own WGSL, reading buffers, against its CPU form
//! (closures) in the reference; every path that does not apply modifiers yet is an error,
//! not a silent omission (the backward's own tests are in tests/modifiers_backward.rs); a
//! caller's mistake is one located error.

mod common;

use ndarray::{Array2, Array4};
use wgpu_attention::internals::{FlashVariant, KeySplit};
use wgpu_attention::modifiers::{BufferData, Modifiers, Preset};
use wgpu_attention::{reference, Attention, Error, Inputs, Kernels, Mask, Options, Projections};

/// The families that apply modifiers, as forced kernels, fused (no weights), NaN-prefilled.
fn fused_on(kernels: Kernels) -> Attention {
    Attention::new()
        .return_weights(false)
        .options(Options::default().kernels(kernels).nan_fill(true))
}

const FAMILIES: [Kernels; 2] = [Kernels::Storage, Kernels::Subgroup];

/// Q `(b, h, L, e)`, K and V `(b, h_kv, S, e)`.
fn qkv(b: usize, h: usize, h_kv: usize, l: usize, s: usize, e: usize) -> [Array4<f32>; 3] {
    [
        common::smooth((b, h, l, e), 1, 1.5),
        common::smooth((b, h_kv, s, e), 2, 1.5),
        common::smooth((b, h_kv, s, e), 3, 1.5),
    ]
}

/// The relative error of `op` with `mask` against the reference.
fn rel_err(op: Attention, [q, k, v]: &[Array4<f32>; 3], mask: &Mask<'_>) -> f64 {
    context_err(op, Inputs::qkv(q, k, v).mask(mask))
}

/// The relative error of `op`'s context on `inputs` against the reference's.
fn context_err(op: Attention, inputs: Inputs<'_>) -> f64 {
    let want = reference::run(&op.return_weights(true), &inputs).unwrap();
    let got = op.run(common::ctx(), inputs).unwrap();
    assert!(got.context.iter().all(|x| x.is_finite()));
    reference::compare(&got.context, &want.context).0
}

#[test]
fn every_preset_matches_the_reference_on_both_families() {
    let (b, h, h_kv, l, s, e) = (2, 4, 2, 37, 37, 16);
    let data = qkv(b, h, h_kv, l, s, e);
    let presets = common::every_preset(b, h, s);
    let mut failures = Vec::new();
    for kernels in FAMILIES {
        for (i, p) in presets.iter().enumerate() {
            for causal in [false, true] {
                let mods = Modifiers::new().preset(p.clone());
                let mask = Mask::none().with_modifiers(&mods);
                let rel = rel_err(fused_on(kernels).causal(causal), &data, &mask);
                if rel > 1e-5 {
                    failures.push(format!("{kernels:?} preset {i} causal={causal}: {rel:.2e}"));
                }
            }
        }
        // Everything at once, with a boolean mask, L ≠ S and a scale.
        let data = qkv(b, h, h_kv, 13, 29, 8);
        let keep = Array2::from_shape_fn((13, 29), |(i, j)| (i * 7 + j) % 5 != 0);
        let mods = Modifiers::new()
            .preset(Preset::Softcap(2.0))
            .preset(Preset::Alibi(Preset::alibi_slopes(h)))
            .preset(Preset::Window { left: 8, right: 8 });
        let mask = Mask::boolean(keep.view().into_dyn()).with_modifiers(&mods);
        let rel = rel_err(fused_on(kernels).causal(true).scale(0.7), &data, &mask);
        if rel > 1e-5 {
            failures.push(format!("{kernels:?} combined: {rel:.2e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_gpu_familys_kernel_applies_them_whole_and_with_its_keys_split() {
    // flash_blocked forced on this adapter, whole and in key ranges merged by flash_combine.
    let (b, h, h_kv) = (2, 4, 2);
    let data = qkv(b, h, h_kv, 45, 70, 16);
    let mods = Modifiers::new()
        .preset(Preset::Window { left: 20, right: 3 })
        .preset(Preset::Softcap(1.5))
        .preset(Preset::Alibi(Preset::alibi_slopes(h)));
    let mask = Mask::none().with_modifiers(&mods);
    let mut failures = Vec::new();
    for key_split in [KeySplit::Off, KeySplit::Ranges(3)] {
        for causal in [false, true] {
            let op = Attention::new()
                .causal(causal)
                .return_weights(false)
                .options(
                    Options::default()
                        .kernels(Kernels::Storage)
                        .flash_variant(FlashVariant::Blocked { rows: 32, keys: 32 })
                        .key_split(key_split)
                        .nan_fill(true),
                );
            let rel = rel_err(op, &data, &mask);
            if rel > 1e-5 {
                failures.push(format!("{key_split:?} causal={causal}: {rel:.2e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_callers_wgsl_matches_its_cpu_form_in_the_reference() {
    // ALiBi and a window as a caller's WGSL, with the same functions as closures: the
    // reference applies those.
    let data = qkv(1, 4, 4, 21, 21, 8);
    let slopes = Preset::alibi_slopes(4);
    let cpu_slopes = slopes.clone();
    let own = Modifiers::new()
        .score_mod(
            "alibi.wgsl",
            "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
             return score + slope[h] * (f32(kv) - f32(q));\n}\n",
        )
        .score_mod_cpu(move |s, _b, h, q, kv| s + f64::from(cpu_slopes[h]) * (kv as f64 - q as f64))
        .buffer("slope", BufferData::F32(slopes))
        .mask_mod(
            "window.wgsl",
            "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {\n    \
             return kv + 3u >= q && kv <= q + 1u;\n}\n",
        )
        .mask_mod_cpu(|_b, _h, q, kv| kv + 3 >= q && kv <= q + 1);
    let mask = Mask::none().with_modifiers(&own);
    for kernels in FAMILIES {
        let rel = rel_err(fused_on(kernels), &data, &mask);
        assert!(rel < 1e-5, "{kernels:?}: {rel:.2e}");
    }
}

#[test]
fn a_callers_modifiers_reading_buffers_match_their_cpu_form_on_every_path() {
    // A score_mod reading a per-head f32 buffer (ALiBi's symmetric form, as encoders use it),
    // then a soft-cap preset, then a float mask (the order matters: the soft-cap bends what
    // comes before it and not what comes after), and a mask_mod reading an i32 buffer (a
    // query sees the keys of its own and earlier documents, ids per batch index); sizes of no
    // tile's multiple, L ≠ S, two batch indices, grouped-query heads. Every path, fused and
    // with the weights, against the reference with the closures.
    let (b, h, h_kv, l, s) = (2, 4, 2, 37, 53);
    let data = qkv(b, h, h_kv, l, s, 16);
    let slope: Vec<f32> = (0..h).map(|i| 0.05 + 0.11 * i as f32).collect();
    let doc: Vec<i32> = (0..b * s)
        .map(|p| ((p % s) / (9 + 4 * (p / s))) as i32)
        .collect();
    let (cpu_slope, cpu_doc) = (slope.clone(), doc.clone());
    let mods = Modifiers::new()
        .score_mod(
            "symmetric_alibi.wgsl",
            "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
             return score - slope[h] * abs(f32(kv) - f32(q));\n}\n",
        )
        .score_mod_cpu(move |t, _b, h, q, kv| {
            t - f64::from(cpu_slope[h]) * (kv as f64 - q as f64).abs()
        })
        .buffer("slope", BufferData::F32(slope))
        .mask_mod(
            "earlier_documents.wgsl",
            format!(
                "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {{\n    \
                 return doc[b * {s}u + kv] <= doc[b * {s}u + q];\n}}\n"
            ),
        )
        .mask_mod_cpu(move |b, _h, q, kv| cpu_doc[b * s + kv] <= cpu_doc[b * s + q])
        .buffer("doc", BufferData::I32(doc))
        .preset(Preset::Softcap(2.5));
    let bias = Array2::from_shape_fn((l, s), |(i, j)| ((i * 3 + j * 5) % 7) as f32 * 0.3 - 0.9);
    let mask = Mask::additive(bias.view().into_dyn()).with_modifiers(&mods);
    let mut failures = Vec::new();
    for causal in [false, true] {
        let base = Attention::new().causal(causal).scale(0.4);
        failures.extend(common::sdpa_failures(
            base,
            &data,
            &mask,
            &format!("causal={causal}"),
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The relative errors of `op`'s weights and context with `mask` against the reference's
/// (`op` returns the weights); infinite where an output holds a non-finite value (an element
/// the kernels left NaN-prefilled).
fn weights_err(op: Attention, inputs: Inputs<'_>) -> (f64, f64) {
    let want = reference::run(&op, &inputs).unwrap();
    let got = op.run(common::ctx(), inputs).unwrap();
    let w = got.weights.expect("weights returned");
    let finite = |a: &ndarray::ArrayD<f32>| a.iter().all(|x| x.is_finite());
    let rel = |got: &ndarray::ArrayD<f32>, want: &ndarray::ArrayD<f64>| match finite(got) {
        true => reference::compare(got, want).0,
        false => f64::INFINITY,
    };
    (
        rel(&w, want.weights.as_ref().unwrap()),
        rel(&got.context, &want.context),
    )
}

/// Whether every relative error is under 1e-5 (NaN is not).
fn within(errors: &[f64]) -> bool {
    errors.iter().all(|&e| e < 1e-5)
}

/// The weights path of a family, forced, NaN-prefilled: the storage family's is scores →
/// `softmax` → weighted sum, the subgroup family's the fused context with the weights from
/// the subgroup matmul's statistics and softmax epilogues.
fn weights_on(kernels: Kernels) -> Attention {
    fused_on(kernels).return_weights(true)
}

#[test]
fn the_weights_apply_every_preset_as_the_reference_does_on_both_families() {
    // Sizes no multiple of any tile, L ≠ S, grouped-query heads; document ids for every
    // position of the longer side.
    let (b, h, h_kv, l, s, e) = (2, 4, 2, 37, 45, 16);
    let data = qkv(b, h, h_kv, l, s, e);
    let [q, k, v] = &data;
    let ids: Vec<i32> = (0..b * s).map(|p| ((p % s) / 9 + p / s) as i32).collect();
    let documents = Preset::Documents {
        ids: ids.clone(),
        n: s as u32,
    };
    let presets = [
        Preset::Window { left: 5, right: 2 },
        Preset::Softcap(1.5),
        Preset::Alibi(Preset::alibi_slopes(h)),
        documents.clone(),
        Preset::PrefixLm(7),
    ];
    let keep = Array2::from_shape_fn((l, s), |(i, j)| (i * 7 + j) % 5 != 0);
    let combined = Modifiers::new()
        .preset(Preset::Softcap(2.0))
        .preset(Preset::Alibi(Preset::alibi_slopes(h)))
        .preset(Preset::Window { left: 8, right: 8 })
        .preset(documents);
    let mut failures = Vec::new();
    for kernels in FAMILIES {
        for causal in [false, true] {
            let op = weights_on(kernels).causal(causal);
            for (i, p) in presets.iter().enumerate() {
                let mods = Modifiers::new().preset(p.clone());
                let mask = Mask::none().with_modifiers(&mods);
                let (w, c) = weights_err(op, Inputs::qkv(q, k, v).mask(&mask));
                if !within(&[w, c]) {
                    failures.push(format!(
                        "{kernels:?} preset {i} causal={causal}: weights {w:.2e}, context {c:.2e}"
                    ));
                }
            }
            // Everything at once, with a boolean mask and a scale.
            let mask = Mask::boolean(keep.view().into_dyn()).with_modifiers(&combined);
            let (w, c) = weights_err(op.scale(0.7), Inputs::qkv(q, k, v).mask(&mask));
            if !within(&[w, c]) {
                failures.push(format!(
                    "{kernels:?} combined causal={causal}: weights {w:.2e}, context {c:.2e}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_weights_of_a_long_windowed_call_skip_no_visible_key() {
    // Many column tiles per row (the subgroup weights skip those above the diagonal), a
    // window whose visible keys span several of them.
    let data = qkv(1, 2, 1, 300, 300, 8);
    let [q, k, v] = &data;
    let mods = Modifiers::new()
        .preset(Preset::Window { left: 70, right: 0 })
        .preset(Preset::Alibi(Preset::alibi_slopes(2)));
    let mask = Mask::none().with_modifiers(&mods);
    for kernels in FAMILIES {
        let (w, c) = weights_err(
            weights_on(kernels).causal(true),
            Inputs::qkv(q, k, v).mask(&mask),
        );
        assert!(
            w < 1e-5 && c < 1e-5,
            "{kernels:?}: weights {w:.2e}, context {c:.2e}"
        );
    }
}

#[test]
fn self_attention_on_x_applies_them_with_and_without_projections() {
    // X (batch, n, d) with 4 heads; with projections, K and V have 2 heads (grouped-query).
    let (b, n, d, h) = (2, 37, 16, 4);
    let x = ndarray::Array3::from_shape_fn((b, n, d), |(i, j, m)| {
        ((i * 131 + j * 17 + m * 5) as f32 * 0.031).sin()
    });
    let w = |cols: usize, salt: usize| {
        Array2::from_shape_fn((d, cols), |(i, j)| {
            (((i * cols + j) * salt) as f32 * 0.057).cos() * 0.4
        })
    };
    let (wq, wk, wv, wo) = (w(16, 3), w(8, 5), w(8, 7), w(12, 11));
    // d_v = 16 (4 heads of the 2 K/V heads' width 4): W_O is (16, 12).
    let proj = Projections::new(wq.view(), wk.view(), wv.view()).with_output(wo.view(), None);
    let ids: Vec<i32> = (0..b * n).map(|p| ((p % n) / 10) as i32).collect();
    let mods = Modifiers::new()
        .preset(Preset::Softcap(1.5))
        .preset(Preset::Alibi(Preset::alibi_slopes(h)))
        .preset(Preset::Documents { ids, n: n as u32 })
        .preset(Preset::Window { left: 12, right: 3 });
    let mask = Mask::none().with_modifiers(&mods);
    let mut failures = Vec::new();
    for kernels in FAMILIES {
        for projected in [false, true] {
            let inputs = match projected {
                false => Inputs::x(&x).mask(&mask),
                true => Inputs::x(&x).projections(&proj).mask(&mask),
            };
            let op = weights_on(kernels).heads(h).causal(true);
            let (w, c) = weights_err(op, inputs.clone());
            if !within(&[w, c]) {
                failures.push(format!(
                    "{kernels:?} projected={projected}: weights {w:.2e}, context {c:.2e}"
                ));
            }
            // Fused, the context alone.
            let rel = context_err(op.return_weights(false), inputs);
            if !within(&[rel]) {
                failures.push(format!(
                    "{kernels:?} projected={projected} fused: {rel:.2e}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_tiny_call_on_the_default_kernels_applies_them_with_or_without_the_weights() {
    // Tiny (batch · n ≤ 64) and nothing forced: the kernels cheapest to compile (on lavapipe
    // scores → softmax → weighted sum either way).
    let data = qkv(1, 2, 2, 11, 11, 8);
    let [q, k, v] = &data;
    let mods = Modifiers::new()
        .preset(Preset::Softcap(1.0))
        .preset(Preset::PrefixLm(4));
    let mask = Mask::none().with_modifiers(&mods);
    let op = Attention::new()
        .causal(true)
        .options(Options::default().nan_fill(true));
    let (w, c) = weights_err(op, Inputs::qkv(q, k, v).mask(&mask));
    assert!(w < 1e-5 && c < 1e-5, "weights {w:.2e}, context {c:.2e}");
    let rel = rel_err(op.return_weights(false), &data, &mask);
    assert!(rel < 1e-5, "fused: {rel:.2e}");
}

#[test]
fn paths_that_do_not_apply_modifiers_yet_are_errors() {
    let data = qkv(1, 2, 2, 9, 9, 8);
    let [q, k, v] = &data;
    let mods = Modifiers::new().preset(Preset::Softcap(3.0));
    let mask = Mask::none().with_modifiers(&mods);
    let ctx = common::ctx();
    let unsupported = |r: wgpu_attention::Result<_>| matches!(r, Err(Error::Unsupported { .. }));
    // A forward on device tensors not saved for the backward (saved ones apply them:
    // tests/modifiers_backward.rs, on Q, K, V and on X).
    let t = |a: &ndarray::Array4<f32>| {
        let rows = a
            .view()
            .permuted_axes([0, 2, 1, 3])
            .as_standard_layout()
            .into_owned();
        wgpu_attention::Tensor::from_array(ctx, rows.into_dyn().view(), wgpu_attention::Dtype::F32)
            .unwrap()
    };
    let (q_t, k_t, v_t) = (t(q), t(k), t(v));
    let op = fused_on(Kernels::Storage);
    assert!(unsupported(
        op.run(ctx, Inputs::qkv(&q_t, &k_t, &v_t).mask(&mask))
            .map(drop)
    ));
    // Without modifiers the same call runs.
    op.run(ctx, Inputs::qkv(&q_t, &k_t, &v_t)).unwrap();
}

#[test]
fn a_call_split_past_the_limits_applies_them_in_every_part() {
    // A binding limit that the weights (and X's projected call) do not fit: split by batch
    // and heads, each part sees the whole call's indices (ALiBi reads the head), weights
    // included; on X too.
    let ctx = common::context_with(|l| l.max_storage_buffer_binding_size = 8192);
    let data = qkv(2, 2, 2, 40, 40, 8);
    let [q, k, v] = &data;
    let mods = Modifiers::new()
        .preset(Preset::Window { left: 3, right: 0 })
        .preset(Preset::Alibi(Preset::alibi_slopes(2)));
    let mask = Mask::none().with_modifiers(&mods);
    let op = Attention::new().return_weights(true);
    let inputs = Inputs::qkv(q, k, v).mask(&mask);
    let got = op.run(&ctx, inputs.clone()).unwrap();
    let want = reference::run(&op, &inputs).unwrap();
    assert!(reference::compare(&got.context, &want.context).0 < 1e-5);
    let (w, ww) = (got.weights.unwrap(), want.weights.unwrap());
    assert!(reference::compare(&w, &ww).0 < 1e-5);
    let x = ndarray::Array3::from_shape_fn((2, 40, 8), |(b, i, e)| {
        ((b * 31 + i * 5 + e) as f32 * 0.07).sin()
    });
    let op = op.heads(2);
    let got = op.run(&ctx, Inputs::x(&x).mask(&mask)).unwrap();
    let want = reference::run(&op, &Inputs::x(&x).mask(&mask)).unwrap();
    assert!(reference::compare(&got.context, &want.context).0 < 1e-5);
}

#[test]
fn a_callers_mistake_is_one_located_error() {
    let data = qkv(1, 1, 1, 4, 4, 4);
    let [q, k, v] = &data;
    let bad = Modifiers::new().mask_mod(
        "mine.wgsl",
        "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {\n    return kv <= q +;\n}\n",
    );
    let mask = Mask::none().with_modifiers(&bad);
    let err = fused_on(Kernels::Storage)
        .run(common::ctx(), Inputs::qkv(q, k, v).mask(&mask))
        .unwrap_err()
        .to_string();
    assert!(err.contains("mine.wgsl:2:"), "{err}");
    assert!(!err.contains('\n'), "{err}");
}

#[test]
fn a_name_the_kernels_use_is_refused_before_any_pipeline() {
    // A buffer or function named like a kernel's own binding or helper would be a
    // redefinition where the two are compiled together (was wgpu's validation error, on
    // some paths only): one error naming it, on every path.
    let data = qkv(1, 2, 2, 9, 9, 8);
    let [q, k, v] = &data;
    let score = "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
                 return score + NAME[h];\n}\n";
    let helper = "fn load4(x: f32) -> f32 {\n    return x;\n}\n\
                  fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {\n    \
                  return load4(1.0) > 0.0;\n}\n";
    // sg_xor4 and emu_li: the subgroup helpers' and their emulation's (src/gpu/subgroups.rs).
    let cases = ["mask", "p", "bias", "out", "stats", "sg_xor4", "emu_li"].map(|name| {
        Modifiers::new()
            .score_mod("mine.wgsl", score.replace("NAME", name))
            .buffer(name, BufferData::F32(vec![0.5; 2]))
    });
    let function = Modifiers::new().mask_mod("mine.wgsl", helper);
    for mods in cases.iter().chain([&function]) {
        let mask = Mask::none().with_modifiers(mods);
        for op in [fused_on(Kernels::Storage), fused_on(Kernels::Subgroup)] {
            for op in [op, op.return_weights(true)] {
                let err = op
                    .run(common::ctx(), Inputs::qkv(q, k, v).mask(&mask))
                    .unwrap_err();
                let text = err.to_string();
                assert!(matches!(err, Error::InvalidArgument { .. }), "{text}");
                assert!(text.contains("a name the kernels use"), "{text}");
            }
        }
    }
    // Another name runs.
    let fine = Modifiers::new()
        .score_mod("mine.wgsl", score.replace("NAME", "hbias"))
        .buffer("hbias", BufferData::F32(vec![0.5; 2]));
    let mask = Mask::none().with_modifiers(&fine);
    fused_on(Kernels::Storage)
        .run(common::ctx(), Inputs::qkv(q, k, v).mask(&mask))
        .unwrap();
}

/// The forced variants whose key loops skip the tiles a mask modifier leaves empty: the
/// storage kernel at two tile widths, the subgroup kernel, and the GPU family's kernel whole
/// and with its keys split.
fn sparse_variants() -> Vec<(String, Attention)> {
    let mut out: Vec<(String, Attention)> = [16, 64]
        .into_iter()
        .map(|keys| {
            let op = Attention::new().return_weights(false).options(
                Options::default()
                    .kernels(Kernels::Storage)
                    .flash_variant(FlashVariant::Tiled { keys })
                    .nan_fill(true),
            );
            (format!("tiled bk={keys}"), op)
        })
        .collect();
    out.push(("subgroup".into(), fused_on(Kernels::Subgroup)));
    // The GPU family's kernel (its loop bounded by the map's spans), whole and split.
    for key_split in [KeySplit::Off, KeySplit::Ranges(3)] {
        let op = Attention::new().return_weights(false).options(
            Options::default()
                .kernels(Kernels::Storage)
                .flash_variant(FlashVariant::Blocked { rows: 32, keys: 32 })
                .key_split(key_split)
                .nan_fill(true),
        );
        out.push((format!("blocked {key_split:?}"), op));
    }
    out
}

#[test]
fn tiles_a_mask_modifier_empties_are_skipped_without_changing_the_result() {
    // Long enough that most key tiles of a query block are empty (windows, documents), sizes
    // that are no multiple of any tile, L ≠ S, and per-batch documents (a map per batch).
    let (b, h, h_kv, e) = (2, 3, 3, 8);
    let cases: Vec<(&str, usize, usize, Modifiers, bool)> = vec![
        (
            "causal window 40",
            300,
            300,
            Modifiers::new().preset(Preset::Window { left: 40, right: 0 }),
            true,
        ),
        (
            "window 10,70",
            200,
            300,
            Modifiers::new().preset(Preset::Window {
                left: 10,
                right: 70,
            }),
            false,
        ),
        (
            "documents",
            300,
            300,
            Modifiers::new().preset(common::uneven_documents(b, 300)),
            true,
        ),
        (
            "prefix-LM 100 and a window",
            300,
            300,
            Modifiers::new()
                .preset(Preset::PrefixLm(100))
                .preset(Preset::Window {
                    left: 120,
                    right: 300,
                }),
            false,
        ),
    ];
    let mut failures = Vec::new();
    for (name, l, s, mods, causal) in &cases {
        let data = qkv(b, h, h_kv, *l, *s, e);
        let mask = Mask::none().with_modifiers(mods);
        for (variant, op) in sparse_variants() {
            let rel = rel_err(op.causal(*causal), &data, &mask);
            if rel > 1e-5 {
                failures.push(format!("{name}, {variant}: {rel:.2e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_callers_mask_reading_batch_and_head_gets_a_map_for_each() {
    // A per-head window from a buffer, one batch index keeping even keys only, and a query
    // row that sees nothing (zeros): were the block map shared across batch or head, some
    // tiles would be skipped or kept wrongly.
    let (b, h, n, e) = (2, 3, 200, 8);
    let data = qkv(b, h, h, n, n, e);
    let [q, k, v] = &data;
    let widths = [3u32, 50, 130];
    let visible = move |bi: usize, hi: usize, qi: usize, kv: usize| {
        kv + widths[hi] as usize >= qi && kv <= qi && (bi == 0 || kv.is_multiple_of(2)) && qi != 77
    };
    let mods = Modifiers::new()
        .mask_mod(
            "heads.wgsl",
            "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {\n    \
             return kv + u32(width[h]) >= q && kv <= q && (b == 0u || kv % 2u == 0u) \
             && q != 77u;\n}\n",
        )
        .mask_mod_cpu(visible)
        .buffer(
            "width",
            BufferData::I32(widths.iter().map(|&w| w as i32).collect()),
        );
    let mask = Mask::none().with_modifiers(&mods);
    let want = reference::run(
        &Attention::new().return_weights(true),
        &Inputs::qkv(q, k, v).mask(&mask),
    )
    .unwrap();
    assert!(want
        .context
        .slice(ndarray::s![.., .., 77, ..])
        .iter()
        .all(|&x| x == 0.0));
    for (variant, op) in sparse_variants() {
        let got = op
            .run(common::ctx(), Inputs::qkv(q, k, v).mask(&mask))
            .unwrap();
        let (rel, _) = reference::compare(&got.context, &want.context);
        assert!(rel < 1e-5, "{variant}: {rel:.2e}");
    }
}
