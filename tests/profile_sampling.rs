//! `wgpu-attention profile`'s sample of a causal grid: the fused kernel's lightest
//! workgroups, weighted by the key tiles each visits (which the host knows), estimate what
//! every workgroup together counts: FLOPs and instructions within 1 % on the block shapes
//! whose diagonal tiles differ (64 × 64, 32 × 64 with its half-empty tiles, 64 × 32).

use wgpu_attention::internals::FlashVariant;
use wgpu_attention::profile::{self, DeviceSpec, Era, Problem};
use wgpu_attention::Dtype;

#[test]
fn the_sampled_causal_counts_match_every_workgroup_counted() {
    let ctx = profile::context(32, Era::Today).unwrap();
    let dev = DeviceSpec::h100();
    let p = Problem {
        batch: 1,
        heads: 1,
        n: 512,
        d: 64,
        dtype: Dtype::F32,
        causal: true,
        window: None,
    };
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
