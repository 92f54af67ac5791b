//! What a dispatch would spend on a GPU, counted from the accesses the interpreter makes
//! ([`crate::Dispatch::counters`]): arithmetic, global-memory transactions (32-byte sectors
//! per subgroup-wide access), workgroup-memory bank conflicts (32 banks of 4 bytes),
//! barriers, instructions, texture reads and atomics; and which workgroups a large dispatch
//! is counted on ([`Sample`]).

use std::collections::BTreeMap;

/// Bytes of one global-memory sector (the unit NVIDIA's L1/L2 move, and AMD's 32-byte
/// requests): a subgroup-wide access costs the distinct sectors its lanes touch.
pub const SECTOR_BYTES: u64 = 32;

/// Banks of workgroup memory, 4 bytes wide (NVIDIA since Kepler, AMD's LDS per half).
pub const BANKS: u64 = 32;

/// `*to += x · w`, rounded, never below 0 (a weight may be negative: [`Sample::Chosen`]).
fn add(to: &mut u64, x: u64, w: f64) {
    *to = (*to as f64 + x as f64 * w).round().max(0.0) as u64;
}

/// Global (storage buffer) traffic of one binding, or of all together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Subgroup-wide load instructions (each lane's element or vector counted once per
    /// instruction, all lanes together).
    pub loads: u64,
    /// Subgroup-wide store instructions.
    pub stores: u64,
    /// Bytes the lanes asked for, read.
    pub bytes_read: u64,
    /// Bytes the lanes wrote.
    pub bytes_written: u64,
    /// Distinct 32-byte sectors each load instruction touched, summed over instructions.
    pub sectors_read: u64,
    /// Distinct 32-byte sectors each store instruction touched, summed.
    pub sectors_written: u64,
}

impl Traffic {
    /// Adds one subgroup-wide access of the lanes' `(byte offset, bytes)`, sorted by offset:
    /// the bytes they asked for and the distinct sectors those bytes fall in.
    pub(crate) fn add_access(&mut self, sorted: impl IntoIterator<Item = (u64, u64)>, write: bool) {
        let (mut bytes, mut sectors, mut last) = (0u64, 0u64, None);
        for (off, b) in sorted {
            bytes += b;
            for s in off / SECTOR_BYTES..=(off + b.max(1) - 1) / SECTOR_BYTES {
                if last.is_none_or(|l| s > l) {
                    sectors += 1;
                    last = Some(s);
                }
            }
        }
        if write {
            self.stores += 1;
            self.bytes_written += bytes;
            self.sectors_written += sectors;
        } else {
            self.loads += 1;
            self.bytes_read += bytes;
            self.sectors_read += sectors;
        }
    }

    /// Bytes requested over bytes moved (sectors × 32), loads and stores together: 1 when
    /// each instruction's lanes cover whole sectors, 1/8 when each lane's 4 bytes sit in a
    /// sector of their own. 1 when there was no traffic.
    pub fn sector_efficiency(&self) -> f64 {
        let sectors = self.sectors_read + self.sectors_written;
        if sectors == 0 {
            return 1.0;
        }
        (self.bytes_read + self.bytes_written) as f64 / (sectors * SECTOR_BYTES) as f64
    }

    /// Bytes moved in sectors (what the memory system carries).
    pub fn sector_bytes(&self) -> u64 {
        (self.sectors_read + self.sectors_written) * SECTOR_BYTES
    }

    fn add_scaled(&mut self, o: &Traffic, w: f64) {
        let pairs = [
            (&mut self.loads, o.loads),
            (&mut self.stores, o.stores),
            (&mut self.bytes_read, o.bytes_read),
            (&mut self.bytes_written, o.bytes_written),
            (&mut self.sectors_read, o.sectors_read),
            (&mut self.sectors_written, o.sectors_written),
        ];
        for (to, x) in pairs {
            add(to, x, w);
        }
    }
}

/// What a dispatch would spend, summed over its workgroups (or estimated from a sample of
/// them: [`Counters::workgroups_counted`] of [`Counters::workgroups`]). Subgroup-wide
/// figures (instructions, accesses) count once per subgroup that runs them; per-lane ones
/// once per active lane.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters {
    /// Subgroup width the dispatch was counted at.
    pub subgroup_size: u32,
    /// Workgroups of the dispatch.
    pub workgroups: u64,
    /// Workgroups actually interpreted (the rest estimated from them).
    pub workgroups_counted: u64,
    /// Invocations (lanes alive at the start).
    pub invocations: u64,
    /// Subgroups that ran.
    pub subgroups: u64,
    /// Floating-point operations in f32 (add, subtract, multiply, divide: 1 per component
    /// per lane; `fma` 2; `dot` 2 per component).
    pub flops_f32: u64,
    /// The same in f16.
    pub flops_f16: u64,
    /// Cooperative-matrix multiply-add operations: 2·M·N·K per subgroup-wide product.
    pub coop_flops: u64,
    /// Transcendentals (exp, exp2, log, log2, sqrt, inverseSqrt, sin, cos, tanh, pow), per
    /// component per lane: a GPU's special-function units.
    pub special: u64,
    /// Subgroup-wide instructions (a vector operation one per component, as on scalar
    /// GPUs; a vector load or store one): every expression that computes something (arithmetic,
    /// conversions, selects, loads, dynamic indexing) and every statement that does (stores,
    /// atomics, barriers, subgroup operations, branches, loop iterations); constants, names
    /// and pointers to whole variables are free.
    pub instructions: u64,
    /// The same, per active lane (sum over instructions of the lanes active).
    pub lane_instructions: u64,
    /// Barriers reached, per subgroup (`workgroupBarrier`, `storageBarrier`, the two of
    /// `workgroupUniformLoad`).
    pub barriers: u64,
    /// Barrier intervals (per subgroup) in which the subgroup loaded from global memory: each
    /// waits a global-memory latency at least once.
    pub global_intervals: u64,
    /// Loads that wait (per subgroup): the first global or texture load of each loop
    /// iteration within each barrier interval. A warp issues in order, so a load whose value
    /// its own iteration uses stalls it a memory latency; loads of one iteration overlap,
    /// and so do an interval's when no loop separates them.
    pub load_waits: u64,
    /// Global (storage buffer) traffic, all bindings together (uniform buffers excluded:
    /// they are read through a constant cache).
    pub global: Traffic,
    /// The same per binding `(group, binding)`.
    pub by_binding: BTreeMap<(u32, u32), Traffic>,
    /// Subgroup-wide workgroup-memory accesses (loads, stores, atomics, cooperative loads
    /// and stores).
    pub shared_accesses: u64,
    /// Workgroup-memory bytes accessed (each lane's element).
    pub shared_bytes: u64,
    /// Wavefronts the accesses take: for each, the most distinct 4-byte words that fall in
    /// one of the 32 banks (the same word in several lanes is a broadcast, one wavefront).
    pub shared_wavefronts: u64,
    /// Wavefronts they would take without conflicts: for each, its distinct words / 32,
    /// rounded up (a vec4 per lane needs 4 whatever the layout).
    pub shared_ideal: u64,
    /// The worst access's ways (wavefronts over ideal).
    pub shared_max_ways: u32,
    /// Texels read (`textureLoad`, per lane).
    pub texture_reads: u64,
    /// Texels written (`textureStore`, per lane).
    pub texture_writes: u64,
    /// Texture traffic as sectors, the texture laid out row-major and tightly packed (as a
    /// buffer of its texels): each subgroup-wide `textureLoad` / `textureStore` costs the
    /// distinct 32-byte sectors its lanes' texels touch. A GPU's tiled layouts (NVIDIA's
    /// block-linear 64-byte-wide rows of a GOB) keep a row's adjacent texels in whole
    /// sectors as this one does; texels of different rows share no sector here.
    pub texture: Traffic,
    /// Atomic operations, per lane (on workgroup or storage memory).
    pub atomics: u64,
}

impl Counters {
    /// All floating-point operations (f32, f16 and cooperative).
    pub fn flops(&self) -> u64 {
        self.flops_f32 + self.flops_f16 + self.coop_flops
    }

    /// Mean ways of the workgroup-memory accesses: wavefronts over conflict-free
    /// wavefronts (1: no conflicts; 32: every access serialised across the banks).
    pub fn shared_ways(&self) -> f64 {
        if self.shared_ideal == 0 {
            1.0
        } else {
            self.shared_wavefronts as f64 / self.shared_ideal as f64
        }
    }

    /// `x` per invocation.
    pub fn per_lane(&self, x: u64) -> f64 {
        x as f64 / self.invocations.max(1) as f64
    }

    /// Adds `o` times `w` (a sampled workgroup standing for `w` of them; a negative weight
    /// subtracts, each count staying ≥ 0: add the positive weights first).
    pub fn add_scaled(&mut self, o: &Counters, w: f64) {
        add(&mut self.invocations, o.invocations, w);
        add(&mut self.subgroups, o.subgroups, w);
        add(&mut self.flops_f32, o.flops_f32, w);
        add(&mut self.flops_f16, o.flops_f16, w);
        add(&mut self.coop_flops, o.coop_flops, w);
        add(&mut self.special, o.special, w);
        add(&mut self.instructions, o.instructions, w);
        add(&mut self.lane_instructions, o.lane_instructions, w);
        add(&mut self.barriers, o.barriers, w);
        add(&mut self.global_intervals, o.global_intervals, w);
        add(&mut self.load_waits, o.load_waits, w);
        self.global.add_scaled(&o.global, w);
        for (k, t) in &o.by_binding {
            self.by_binding.entry(*k).or_default().add_scaled(t, w);
        }
        add(&mut self.shared_accesses, o.shared_accesses, w);
        add(&mut self.shared_bytes, o.shared_bytes, w);
        add(&mut self.shared_wavefronts, o.shared_wavefronts, w);
        add(&mut self.shared_ideal, o.shared_ideal, w);
        self.shared_max_ways = self.shared_max_ways.max(o.shared_max_ways);
        add(&mut self.texture_reads, o.texture_reads, w);
        add(&mut self.texture_writes, o.texture_writes, w);
        self.texture.add_scaled(&o.texture, w);
        add(&mut self.atomics, o.atomics, w);
    }
}

/// Which workgroups a dispatch interprets, and what each stands for.
#[derive(Clone, Debug, PartialEq)]
pub enum Sample {
    /// Every workgroup (the default).
    All,
    /// At most this many (at least 2): the first, the last, and one drawn at random from
    /// each of the equal strata of the grid in between (stratified, so the part of a causal
    /// grid each falls in — diagonal blocks early, long rows late — is represented without
    /// aliasing a power-of-two stride). Each stands for its stratum in [`Counters`]. Only
    /// the sampled workgroups' results are written: for counting, not for answers.
    Workgroups(u32),
    /// These workgroups (linear indices, `x + y·X + z·X·Y`), each standing for the given
    /// weight of workgroups in [`Counters`] (any real: a caller who knows how the work is
    /// spread over the grid, e.g. the key tiles each block of a causal grid visits, chooses
    /// cheap workgroups and weights that make the estimate exact for work linear in what it
    /// knows). Indices past the grid and repeats are errors.
    Chosen(Vec<(u64, f64)>),
}

/// The linear indices of the workgroups to run out of `total`, each with the number of
/// workgroups it stands for (summing to `total`), drawn from `seed`.
pub(crate) fn sample(total: u64, sample: &Sample, seed: u64) -> Vec<(u64, f64)> {
    let k = match sample {
        Sample::Chosen(list) => {
            let mut list = list.clone();
            list.sort_by_key(|x| x.0);
            return list;
        }
        Sample::Workgroups(k) if total > u64::from(*k.max(&2)) => u64::from(*k.max(&2)),
        _ => return (0..total).map(|i| (i, 1.0)).collect(),
    };
    // k - 1 strata: the first holds workgroup 0 as well, the last the last workgroup.
    let strata = k - 1;
    let mut state = seed ^ 0x0005_a3b1_e5ee_d000;
    let mut out: Vec<(u64, f64)> = Vec::new();
    for s in 0..strata {
        let lo = total * s / strata;
        let hi = total * (s + 1) / strata;
        let size = (hi - lo) as f64;
        let pick = lo + crate::interp::random(&mut state) % (hi - lo);
        let mut picks = vec![pick];
        if s == 0 && pick != 0 {
            picks.push(0);
        }
        if s + 1 == strata && pick != total - 1 {
            picks.push(total - 1);
        }
        let w = size / picks.len() as f64;
        out.extend(picks.into_iter().map(|p| (p, w)));
    }
    out.sort_by_key(|x| x.0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_stands_for_the_whole_grid_and_includes_both_ends() {
        let s = sample(4096, &Sample::Workgroups(9), 7);
        assert!(s.len() <= 10 && s.len() >= 9, "{s:?}");
        assert_eq!(s[0].0, 0);
        assert_eq!(s.last().unwrap().0, 4095);
        let w: f64 = s.iter().map(|x| x.1).sum();
        assert!((w - 4096.0).abs() < 1e-6);
        assert_eq!(sample(5, &Sample::Workgroups(9), 7).len(), 5);
        assert_eq!(sample(5, &Sample::All, 7).len(), 5);
    }
}
