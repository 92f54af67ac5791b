//! Occupancy and a time model from one dispatch's counters: a roofline per SM (instruction
//! issue, FMA, shared-memory wavefronts, L2 sectors, DRAM bytes) beside a latency bound (each
//! SM's rounds of workgroups, each as long as one subgroup's chain of global loads, barriers
//! and dependent instructions), the larger of the two.

use wgsl_sanitizer::Counters;

use super::DeviceSpec;

/// How many workgroups one SM holds, and what limits it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Occupancy {
    /// Workgroups resident per SM.
    pub workgroups: u32,
    /// Warps resident per SM.
    pub warps: u32,
    /// Of the SM's maximum warps.
    pub fraction: f64,
    /// What limits it: "registers", "shared memory", "threads", "workgroups".
    pub limit: &'static str,
}

/// The occupancy of a workgroup of `threads` threads, `registers` 32-bit registers per
/// thread and `shared` bytes of workgroup memory on `dev`.
pub fn occupancy(dev: &DeviceSpec, threads: u32, registers: u32, shared: u64) -> Occupancy {
    let warps_per_wg = threads.div_ceil(dev.lanes).max(1);
    let regs_per_warp = (registers * dev.lanes).next_multiple_of(dev.register_granule);
    let by_regs = dev.registers_per_sm / (regs_per_warp * warps_per_wg).max(1);
    let by_shared = match shared {
        0 => u32::MAX,
        s => (dev.shared_per_sm / (s + dev.shared_reserved)) as u32,
    };
    let by_threads = dev.max_threads / (warps_per_wg * dev.lanes);
    let limits = [
        (by_regs, "registers"),
        (by_shared, "shared memory"),
        (by_threads, "threads"),
        (dev.max_workgroups, "workgroups"),
    ];
    let (workgroups, limit) = limits.into_iter().min_by_key(|l| l.0).expect("four limits");
    let warps = workgroups * warps_per_wg;
    Occupancy {
        workgroups,
        warps,
        fraction: f64::from(warps) / f64::from(dev.max_threads / dev.lanes),
        limit,
    }
}

/// What bounds a dispatch's predicted time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bottleneck {
    /// Instruction issue (the schedulers).
    Issue,
    /// f32 FMA throughput.
    Fma,
    /// Tensor cores.
    Coop,
    /// Shared-memory wavefronts (bank conflicts included).
    SharedMemory,
    /// L2 bandwidth (global sectors, re-reads included).
    L2,
    /// DRAM bandwidth.
    Memory,
    /// Latency not hidden: too few warps or workgroups for the chain each one waits through.
    Latency,
}

impl std::fmt::Display for Bottleneck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Bottleneck::Issue => "issue",
            Bottleneck::Fma => "FMA",
            Bottleneck::Coop => "tensor cores",
            Bottleneck::SharedMemory => "shared memory",
            Bottleneck::L2 => "L2",
            Bottleneck::Memory => "memory",
            Bottleneck::Latency => "latency",
        })
    }
}

/// The model's times for one dispatch, seconds, each bound alone and the prediction.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    pub issue: f64,
    pub fma: f64,
    pub coop: f64,
    pub shared: f64,
    pub l2: f64,
    pub dram: f64,
    pub latency: f64,
    /// The largest, times the wave quantisation, plus the launch.
    pub time: f64,
    pub bottleneck: Bottleneck,
    /// Rounds of workgroups per SM (workgroups over SMs × resident).
    pub rounds: f64,
}

/// Predicts the time of a dispatch with counters `c`, occupancy `occ` and `footprint` bytes
/// of distinct global memory (the bound buffers: what DRAM must deliver at least once) on
/// `dev`; `per_wg`, where the host knows it, the instructions each workgroup issues in grid
/// order (then the workgroups are scheduled one by one: [`schedule`]). Texture accesses
/// move their sectors through L2 as buffers do (`footprint` holds the textures).
pub fn predict(
    dev: &DeviceSpec,
    c: &Counters,
    occ: &Occupancy,
    footprint: u64,
    per_wg: Option<&[f64]>,
) -> Prediction {
    let sms = f64::from(dev.sms);
    let clock = dev.clock();
    let issue = c.instructions as f64 / (sms * f64::from(dev.issue_per_clock) * clock);
    let fma = (c.flops_f32 + c.flops_f16) as f64 / dev.fma_flops;
    let coop = c.coop_flops as f64 / dev.coop_flops;
    let shared = c.shared_wavefronts as f64 / (sms * clock);
    let moved = c.global.sector_bytes() + c.texture.sector_bytes();
    let l2 = moved as f64 / dev.l2_bandwidth;
    let dram = footprint.min(moved.max(1)) as f64 / dev.dram_bandwidth;
    // Latency: each SM runs `rounds` rounds of `occ.workgroups` workgroups; a round lasts at
    // least one subgroup's chain (its loads that wait: the first of each loop iteration and
    // barrier interval, global or texture; its barriers; its instructions one after another
    // at the dependent rate).
    let wgs = c.workgroups.max(1) as f64;
    let slots = sms * f64::from(occ.workgroups.max(1));
    let rounds = (wgs / slots).ceil();
    let per_sg = |x: u64| x as f64 / c.subgroups.max(1) as f64;
    let chain = per_sg(c.load_waits) * dev.memory_latency
        + per_sg(c.barriers) * dev.barrier_cycles / clock
        + per_sg(c.instructions) * dev.dependent_cycles / clock;
    let latency = rounds * chain;
    let on_sm = [
        (issue, Bottleneck::Issue),
        (fma, Bottleneck::Fma),
        (coop, Bottleneck::Coop),
        (shared, Bottleneck::SharedMemory),
    ];
    let (busy, on_sm_bound) =
        on_sm.into_iter().fold(
            (0.0, Bottleneck::Issue),
            |a, b| if b.0 > a.0 { b } else { a },
        );
    let mut bounds = match per_wg {
        // Each workgroup as long as its share of the SM's bound at full occupancy, or its
        // own chain, whichever is longer; the slots take them in grid order.
        Some(w) if !w.is_empty() => {
            let mean = w.iter().sum::<f64>() / w.len() as f64;
            let full = busy * slots / wgs;
            let t = schedule(w, slots as usize, |x| {
                (x / mean.max(1e-30)) * full.max(chain)
            });
            let bound = if chain > full {
                Bottleneck::Latency
            } else {
                on_sm_bound
            };
            vec![(t, bound)]
        }
        // Throughput bounds: the SM given the most workgroups sets the time (⌈wgs / SMs⌉
        // against the mean), and an SM whose warps are fewer than its schedulers issues at
        // that fraction. A partial last round costs its share of the SM, not a whole round
        // (what a round of chains costs is the latency bound's).
        _ => {
            let per_sm = wgs / sms;
            let warps_per_wg = f64::from(occ.warps) / f64::from(occ.workgroups.max(1));
            let warps = per_sm.ceil().min(f64::from(occ.workgroups.max(1))) * warps_per_wg;
            let fill = (warps / f64::from(dev.issue_per_clock.max(1))).min(1.0);
            let quantise = per_sm.ceil() / per_sm / fill.max(1e-9);
            vec![
                (busy * quantise, on_sm_bound),
                (latency, Bottleneck::Latency),
            ]
        }
    };
    bounds.extend([(l2, Bottleneck::L2), (dram, Bottleneck::Memory)]);
    let (t, bottleneck) =
        bounds.into_iter().fold(
            (0.0, Bottleneck::Latency),
            |a, b| if b.0 > a.0 { b } else { a },
        );
    Prediction {
        issue,
        fma,
        coop,
        shared,
        l2,
        dram,
        latency,
        time: t + dev.launch,
        bottleneck,
        rounds: wgs / slots,
    }
}

/// When the last of the workgroups of `work` ends, each started in grid order on the first
/// of `slots` slots to come free and lasting `time(work)`: the tail a grid whose heaviest
/// workgroups come last leaves (a slot runs one alone while the others idle).
pub fn schedule(work: &[f64], slots: usize, time: impl Fn(f64) -> f64) -> f64 {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    // Free times as the bits of non-negative f64s (ordered as the numbers are).
    let mut free: BinaryHeap<Reverse<u64>> = (0..slots.max(1)).map(|_| Reverse(0)).collect();
    let mut end = 0.0f64;
    for &w in work {
        let Reverse(at) = free.pop().expect("a slot");
        let done = f64::from_bits(at) + time(w);
        end = end.max(done);
        free.push(Reverse(done.to_bits()));
    }
    end
}

/// Registers per thread of a kernel variant: RDNA3's VGPRs from `tools/shader-stats`
/// (docs/RESULTS.md, wave32: a lane's registers, the same unit as NVIDIA's per-thread
/// count) where measured, else an estimate; NVIDIA's own count is unknown until a GPU
/// gives it (`cuobjdump`-less Vulkan: none yet), so the same figure stands for it.
/// `label` is the kernel file, `variant` its constants as [`super::KernelProfile`] names
/// them, `d` the head width.
pub fn registers(label: &str, variant: &str, d: usize) -> (u32, &'static str) {
    let wide = d > 64;
    match label {
        "flash_blocked.wgsl" => {
            // Today's text, f32 (tools/shader-stats, gfx1100, 2026-11-29 after the rewrite
            // by the counts): 64x64 at d 64 with double buffering and subgroup reductions
            // (a GPU's default) 84, else 96; 64x32 and 128x32 at d 128 144 (132 with both),
            // every other shape and width 96.
            let has = |s: &str| variant.contains(s);
            let both = has("dbuf: 1") && has("sgr: 1");
            let r = if has("rows: 64, keys: 64") && !wide && both {
                84
            } else if (has("rows: 64, keys: 32") || has("rows: 128, keys: 32")) && wide {
                if both {
                    132
                } else {
                    144
                }
            } else {
                96
            };
            (r, "RDNA3 VGPRs (shader-stats)")
        }
        "decode_partial_gpu.wgsl" => {
            // Today's text with K staged side by side (tools/shader-stats, gfx1100,
            // 2026-11-29): 1 row 72, 2 rows 72 at d 128 and 96 at d 64, 4 rows 96, 8 rows 120.
            let rows = |n: u32| variant.contains(&format!("rows: {n},"));
            let r = if rows(8) {
                120
            } else if rows(4) || (rows(2) && !wide) {
                96
            } else {
                72
            };
            (r, "RDNA3 VGPRs (shader-stats)")
        }
        "decode_combine.wgsl" => (24, "RDNA3 VGPRs (shader-stats)"),
        "coop_matmul.wgsl" | "flash_coop.wgsl" => (128, "estimate (Mesa cannot compile coop)"),
        "matmul_blocked.wgsl" => (96, "RDNA3 VGPRs (shader-stats)"),
        "softmax.wgsl" => (24, "RDNA3 VGPRs (shader-stats)"),
        _ => (64, "estimate"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h100_occupancy_is_limited_by_what_runs_out_first() {
        let h = DeviceSpec::h100();
        // 256 threads of 72 registers, 30 KiB: registers allow 3 (72·32 → 2304 per warp,
        // 8 warps: 18,432 → 3), shared memory 7.
        let o = occupancy(&h, 256, 72, 30 * 1024);
        assert_eq!((o.workgroups, o.limit), (3, "registers"));
        let o = occupancy(&h, 256, 32, 100 * 1024);
        assert_eq!((o.workgroups, o.limit), (2, "shared memory"));
        let o = occupancy(&h, 1024, 16, 0);
        assert_eq!((o.workgroups, o.limit), (2, "threads"));
        assert!((h.clock() - 1.317e9).abs() < 1e7);
    }

    #[test]
    fn the_heaviest_last_leaves_a_tail() {
        // 8 workgroups on 4 slots: light ones first leave the heavy pair to run alone.
        let light_first = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 4.0, 4.0];
        let heavy_first: Vec<f64> = light_first.iter().rev().copied().collect();
        assert_eq!(schedule(&light_first, 4, |w| w), 5.0);
        assert_eq!(schedule(&heavy_first, 4, |w| w), 4.0);
    }
}
