//! `wgpu-attention profile`'s sample of a causal grid: the fused kernel's lightest
//! workgroups, weighted by the key tiles each visits (which the host knows), estimate what
//! every workgroup together counts: FLOPs and instructions within 1 % on the block shapes
//! whose diagonal tiles differ (64 × 64, 32 × 64 with its half-empty tiles, 64 × 32). And
//! what the counts hold the kernels to, where a GPU would otherwise waste bandwidth or wait:
//! the backward's accesses in whole sectors without bank conflicts, a decode step's few waits
//! per key tile, and a decode batch too large to fill counted on a divisor of it.

use wgpu_attention::internals::FlashVariant;
use wgpu_attention::profile::{self, DeviceSpec, Era, Problem};
use wgpu_attention::Dtype;

/// `(batch, heads, n)` of width 64 in f32, with or without causal.
fn problem((batch, heads, n): (usize, usize, usize), causal: bool) -> Problem {
    Problem {
        batch,
        heads,
        n,
        d: 64,
        dtype: Dtype::F32,
        causal,
        window: None,
    }
}

#[test]
fn the_sampled_causal_counts_match_every_workgroup_counted() {
    let ctx = profile::context(32, Era::Today).unwrap();
    let dev = DeviceSpec::h100();
    let p = problem((1, 1, 512), true);
    for (rows, keys) in [(64, 64), (32, 64), (64, 32)] {
        let v = FlashVariant::Blocked { rows, keys };
        let fused = |sample| {
            let k = profile::profile_flash(&ctx, &dev, &p, v, sample, Era::Today).unwrap();
            k.into_iter()
                .find(|k| k.kernel == "flash_blocked.wgsl")
                .unwrap()
        };
        let exact = fused(None);
        let sampled = fused(Some(4));
        assert_eq!(exact.counters.workgroups_counted, exact.workgroups);
        assert!(
            sampled.counters.workgroups_counted <= 6,
            "{rows}x{keys}: {} counted of {} ({})",
            sampled.counters.workgroups_counted,
            sampled.workgroups,
            sampled.variant
        );
        let near = |a: u64, b: u64| (a as f64 / b as f64 - 1.0).abs() < 0.01;
        let (e, s) = (&exact.counters, &sampled.counters);
        assert!(
            near(s.flops(), e.flops()),
            "{rows}x{keys}: {} vs {}",
            s.flops(),
            e.flops()
        );
        assert!(
            near(s.instructions, e.instructions),
            "{rows}x{keys}: {} vs {}",
            s.instructions,
            e.instructions
        );
        assert!(near(s.global.sector_bytes(), e.global.sector_bytes()));
        // The tiles the host counted are the ones the kernel visited: one tile's FLOPs.
        let tiles = exact.tiles.as_ref().unwrap().total();
        let per_tile = e.flops() as f64 / tiles as f64;
        let qk_pv = 2.0 * 2.0 * f64::from(rows * keys) * 64.0;
        assert!(
            per_tile > qk_pv && per_tile < 1.15 * qk_pv,
            "{per_tile} vs {qk_pv}"
        );
    }
}

/// `--d646ab0` counts that commit's own `flash_blocked` text (kept compressed), for the H100
/// run's problems only: its three block shapes at d 64 f32 run, its scalar loads touch more
/// sectors than they ask for (today's vector loads do not), and another width is refused
/// with a reason.
#[test]
fn d646ab0s_own_text_is_counted_where_it_is_kept() {
    let dev = DeviceSpec::h100();
    let p = problem((1, 2, 128), false);
    let then = profile::context(32, Era::D646ab0).unwrap();
    let now = profile::context(32, Era::Today).unwrap();
    let fused = |ctx, p: &Problem, v, era| {
        profile::profile_flash(ctx, &dev, p, v, Some(4), era).map(|k| {
            k.into_iter()
                .find(|k| k.kernel == "flash_blocked.wgsl")
                .unwrap()
        })
    };
    let v = FlashVariant::Blocked { rows: 64, keys: 64 };
    let old = fused(&then, &p, v, Era::D646ab0).unwrap();
    let new = fused(&now, &p, v, Era::Today).unwrap();
    assert!(old.counters.global.sector_efficiency() < 0.5, "{old:?}");
    assert!(new.counters.global.sector_efficiency() > 0.9, "{new:?}");
    assert!(Era::D646ab0.had(FlashVariant::Blocked { rows: 32, keys: 64 }));
    assert!(!Era::D646ab0.had(FlashVariant::Blocked {
        rows: 128,
        keys: 32
    }));
    assert!(!Era::D646ab0.had(FlashVariant::Coop));
    let d32 = Problem { d: 32, ..p };
    let e = fused(&then, &d32, v, Era::D646ab0).unwrap_err().to_string();
    assert!(e.contains("d 64, f32"), "{e}");
}

/// A causal window's block map (made on the host for a preset) reaches the counted kernel:
/// counted whole, the fused kernel visits only the key tiles the host says the map leaves
/// (a map read as zeros is off, and every causal tile is visited: 136 here, not 108); its
/// lightest workgroups sampled agree with every one counted. `--d646ab0` counts that
/// commit's text composed with the window's code where its grid is unsplit (as the H100
/// run's was), and refuses a split grid or another window with the reason.
#[test]
fn a_window_is_counted_on_the_tiles_its_block_map_leaves() {
    let dev = DeviceSpec::h100();
    let window = |(batch, heads, n), w| Problem {
        window: Some(w),
        ..problem((batch, heads, n), true)
    };
    let fused = |ctx, p: &Problem, (rows, keys), sample, era| {
        let v = FlashVariant::Blocked { rows, keys };
        profile::profile_flash(ctx, &dev, p, v, sample, era).map(|k| {
            k.into_iter()
                .find(|k| k.kernel == "flash_blocked.wgsl")
                .unwrap()
        })
    };
    let one_tile = |k: &profile::KernelProfile, (rows, keys): (u32, u32)| {
        let per_tile = k.counters.flops() as f64 / k.tiles.as_ref().unwrap().total() as f64;
        let qk_pv = 2.0 * 2.0 * f64::from(rows * keys) * 64.0;
        assert!(
            per_tile > qk_pv && per_tile < 1.15 * qk_pv,
            "{per_tile} vs {qk_pv}"
        );
    };
    let now = profile::context(32, Era::Today).unwrap();
    let p = window((1, 1, 1024), 511);
    let exact = fused(&now, &p, (64, 64), None, Era::Today).unwrap();
    let sampled = fused(&now, &p, (64, 64), Some(4), Era::Today).unwrap();
    // Row block r sees key tiles r - 8 ..= r: 1 + 2 + … + 8, then 8 blocks of 9.
    assert_eq!(exact.tiles.as_ref().unwrap().total(), 108);
    one_tile(&exact, (64, 64));
    let near = |a: u64, b: u64| (a as f64 / b as f64 - 1.0).abs() < 0.01;
    let (e, s) = (&exact.counters, &sampled.counters);
    assert!(near(s.flops(), e.flops()), "{} vs {}", s.flops(), e.flops());
    assert!(near(s.instructions, e.instructions));

    let then = profile::context(32, Era::D646ab0).unwrap();
    // 4 heads of 32 blocks of 32 rows: 128 workgroups, unsplit.
    let unsplit = window((1, 4, 1024), 511);
    let k = fused(&then, &unsplit, (32, 64), Some(4), Era::D646ab0).unwrap();
    one_tile(&k, (32, 64));
    let e = fused(&then, &p, (64, 64), Some(4), Era::D646ab0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("split"), "{e}");
    let e = fused(
        &then,
        &window((1, 4, 1024), 63),
        (32, 64),
        Some(4),
        Era::D646ab0,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("window (511)"), "{e}");
}

/// A decode step too large to fill is counted on a divisor of its batch: the most sequences
/// whose K and V fit `DECODE_CACHE_BYTES`, at least one.
#[test]
fn a_large_decode_batch_is_counted_on_a_divisor_of_it() {
    let counted = profile::decode_counted_batch;
    // 512 MiB per sequence in f16 at 32 heads, cache 32,768, d 128: one of 8.
    assert_eq!(counted((8, 32, 32768, 128), Dtype::F16), 1);
    assert_eq!(counted((1, 32, 4096, 128), Dtype::F32), 1);
    assert_eq!(counted((8, 2, 64, 8), Dtype::F32), 8);
    // 128 MiB per sequence: 4 fit, 6 is a multiple of 3.
    assert_eq!(counted((6, 32, 4096, 128), Dtype::F32), 3);
}

/// The fused backward on a small problem: every global access in whole sectors (≥ 90 %: a
/// partial sector spends bandwidth on bytes nobody reads) and workgroup memory without bank
/// conflicts (≤ 1.25 ways: each extra way serialises the access), for each of its kernels
/// (d 64 and 128: 4 and 8 threads per key or row).
#[test]
fn the_backward_kernels_load_whole_sectors_without_bank_conflicts() {
    let ctx = profile::context(32, Era::Today).unwrap();
    let dev = DeviceSpec::h100();
    for d in [64, 128] {
        let p = Problem {
            batch: 1,
            heads: 2,
            n: 128,
            d,
            dtype: Dtype::F32,
            causal: false,
            window: None,
        };
        let kernels = profile::profile_backward(&ctx, &dev, &p, 4).unwrap();
        let names: Vec<&str> = kernels.iter().map(|k| k.kernel).collect();
        assert_eq!(
            names,
            [
                "flash_backward_dot.wgsl",
                "flash_backward_kv.wgsl",
                "flash_backward_q.wgsl"
            ],
            "d {d}"
        );
        for k in &kernels {
            let c = &k.counters;
            assert!(
                c.global.sector_efficiency() >= 0.9,
                "d {d} {}: {:.2}",
                k.kernel,
                c.global.sector_efficiency()
            );
            assert!(
                c.shared_ways() <= 1.25,
                "d {d} {}: {:.2} ways",
                k.kernel,
                c.shared_ways()
            );
        }
    }
}

/// Decode: each thread keeps several loads in flight, so a subgroup waits a memory latency a
/// few times per 64-key tile (K's texels and V's keys in steps of 8), not once per texel and
/// per key (64 per tile at d 128 before); and a subgroup's texel loads fill whole sectors
/// (K read with a key per lane used a quarter of each in f16, half in f32), in both dtypes.
#[test]
fn a_decode_step_waits_a_few_times_per_key_tile_and_reads_whole_sectors() {
    let ctx = profile::context(32, Era::Today).unwrap();
    let dev = DeviceSpec::h100();
    for dtype in [Dtype::F32, Dtype::F16] {
        let kernels = profile::profile_decode(&ctx, &dev, (1, 2, 1024, 128), dtype, 4).unwrap();
        let partial = kernels
            .iter()
            .find(|k| k.kernel == "decode_partial_gpu.wgsl")
            .unwrap();
        let c = &partial.counters;
        let keys_per_workgroup = 1024.0 * 2.0 / c.workgroups as f64;
        let per_tile = c.load_waits as f64 / c.subgroups as f64 / (keys_per_workgroup / 64.0);
        assert!(per_tile <= 10.0, "{dtype:?}: {per_tile:.1} waits per tile");
        let e = c.texture.sector_efficiency();
        assert!(
            c.texture.loads > 0 && e >= 0.9,
            "{dtype:?}: K/V texels at {:.0} % sector efficiency",
            100.0 * e
        );
        assert!(
            c.shared_ways() <= 1.25,
            "{dtype:?}: {:.2} ways",
            c.shared_ways()
        );
    }
}
