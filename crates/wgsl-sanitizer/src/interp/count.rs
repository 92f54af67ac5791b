//! Counting what a subgroup would spend on a GPU ([`crate::Counters`]), when the dispatch
//! asks for it: the addresses of one memory instruction's lanes are gathered by the access
//! path loads, stores, atomics and cooperative loads share ([`Exec::mem`]), and turned into
//! sectors or bank wavefronts when the instruction ends ([`Exec::tally_flush`]).

use naga::{Expression, MathFunction as M, Statement};

use super::memory::GMem;
use super::{Exec, Ptr};
use crate::counters::{Counters, BANKS};
use crate::types::K;

/// One subgroup's counts and the accesses of the instruction running.
#[derive(Default)]
pub(super) struct Tally {
    pub c: Counters,
    /// Global accesses of the instruction: (memory, byte offset, bytes).
    global: Vec<(u32, u32, u32)>,
    /// Workgroup-memory accesses of the instruction: 4-byte word indices.
    words: Vec<u32>,
    shared_bytes: u64,
    /// This barrier interval loaded from global memory.
    loaded: bool,
    /// This loop iteration (and barrier interval) loaded from global or texture memory.
    loaded_here: bool,
}

/// Whether an expression costs an instruction (constants, names and pointers to whole
/// variables do not; a dynamic index is address arithmetic; loads are counted where their
/// memory is known: a local or private variable's is a register).
pub(super) fn costs_expr(e: &Expression) -> bool {
    !matches!(
        e,
        Expression::Literal(_)
            | Expression::Constant(_)
            | Expression::Override(_)
            | Expression::ZeroValue(_)
            | Expression::FunctionArgument(_)
            | Expression::GlobalVariable(_)
            | Expression::LocalVariable(_)
            | Expression::AccessIndex { .. }
            | Expression::CallResult(_)
            | Expression::AtomicResult { .. }
            | Expression::WorkGroupUniformLoadResult { .. }
            | Expression::SubgroupBallotResult
            | Expression::SubgroupOperationResult { .. }
            | Expression::Compose { .. }
            | Expression::Splat { .. }
            | Expression::Swizzle { .. }
            | Expression::Load { .. }
    )
}

/// Whether a statement costs an instruction of its own (blocks, emits, calls and
/// `return`/`break` do not: their expressions and branches are counted; a loop costs one
/// per iteration; stores and atomics are counted where their memory is known).
pub(super) fn costs_stmt(s: &Statement) -> bool {
    !matches!(
        s,
        Statement::Emit(_)
            | Statement::Block(_)
            | Statement::Call { .. }
            | Statement::Return { .. }
            | Statement::Break
            | Statement::Continue
            | Statement::Loop { .. }
            | Statement::Store { .. }
            | Statement::Atomic { .. }
            | Statement::ImageStore { .. }
            | Statement::CooperativeStore { .. }
    )
}

/// Floating-point operations per component of a math function (`None`: not arithmetic
/// counted as FLOPs), and whether it is a transcendental.
pub(super) fn math_cost(fun: M) -> (u64, bool) {
    match fun {
        M::Fma => (2, false),
        M::Mix => (3, false),
        M::Exp
        | M::Exp2
        | M::Log
        | M::Log2
        | M::Sqrt
        | M::InverseSqrt
        | M::Sin
        | M::Cos
        | M::Tan
        | M::Tanh
        | M::Pow => (0, true),
        _ => (0, false),
    }
}

impl Exec<'_, '_> {
    /// One instruction of the lanes in `mask` (when counting).
    #[inline]
    pub(super) fn tally_instruction(&mut self, mask: u64) {
        if let Some(t) = self.tally.as_deref_mut() {
            t.c.instructions += 1;
            t.c.lane_instructions += u64::from(mask.count_ones());
        }
    }

    /// `per_lane` floating-point operations of kind `k` in each lane of `mask`.
    #[inline]
    pub(super) fn tally_flops(&mut self, k: K, per_lane: u64, mask: u64) {
        if let Some(t) = self.tally.as_deref_mut() {
            let n = per_lane * u64::from(mask.count_ones());
            match k {
                K::F16 => t.c.flops_f16 += n,
                K::F32 => t.c.flops_f32 += n,
                _ => {}
            }
        }
    }

    /// Adds `n` to the counter `f` picks (when counting).
    #[inline]
    pub(super) fn tally_add(&mut self, f: impl FnOnce(&mut Counters) -> &mut u64, n: u64) {
        if let Some(t) = self.tally.as_deref_mut() {
            *f(&mut t.c) += n;
        }
    }

    /// A barrier reached: a new interval.
    pub(super) fn tally_barrier(&mut self) {
        if let Some(t) = self.tally.as_deref_mut() {
            t.c.barriers += 1;
            t.loaded = false;
            t.loaded_here = false;
        }
    }

    /// A loop iteration begins: its loads wait anew.
    pub(super) fn tally_iteration(&mut self) {
        if let Some(t) = self.tally.as_deref_mut() {
            t.loaded_here = false;
        }
    }

    /// A load from global or texture memory: the first of its loop iteration and barrier
    /// interval is a wait ([`Counters::load_waits`]).
    pub(super) fn tally_load_wait(&mut self) {
        if let Some(t) = self.tally.as_deref_mut() {
            if !t.loaded_here {
                t.loaded_here = true;
                t.c.load_waits += 1;
            }
        }
    }

    /// One subgroup-wide texture access: the lanes' texels `(x, y)` (in bounds) of a
    /// `width`-texel-wide texture of `texel_bytes` per texel, as sectors of its row-major
    /// layout ([`Counters::texture`]).
    pub(super) fn tally_texels(
        &mut self,
        texels: &[(u32, u32)],
        width: u32,
        texel_bytes: u64,
        write: bool,
    ) {
        if let Some(t) = self.tally.as_deref_mut() {
            let mut at: Vec<u64> = texels
                .iter()
                .map(|&(x, y)| (u64::from(y) * u64::from(width) + u64::from(x)) * texel_bytes)
                .collect();
            at.sort_unstable();
            t.c.texture
                .add_access(at.into_iter().map(|o| (o, texel_bytes)), write);
        }
    }

    /// Notes one lane's access of `n` leaves of kind `k` at `p` in shared memory (workgroup
    /// memory: leaf offsets; a buffer: the leaves' byte offsets `offsets` from `p`).
    pub(super) fn tally_access(&mut self, p: Ptr, k: Option<K>, n: usize, offsets: &[u32]) {
        let Some(t) = self.tally.as_deref_mut() else {
            return;
        };
        let g = self.g.as_ref().expect("the baton");
        match &g.mem[p.mem as usize] {
            GMem::Words { .. } => {
                let b = k.map_or(4, K::bytes);
                t.shared_bytes += (b as usize * n) as u64;
                for leaf in p.off..p.off + n as u32 {
                    t.words.push(leaf * b / 4);
                }
            }
            GMem::Bytes { uniform: false, .. } => {
                let b = k.map_or(4, K::bytes);
                for o in offsets.iter().take(n) {
                    t.global.push((p.mem, p.off + o, b));
                }
            }
            _ => {}
        }
    }

    /// Drops the accesses gathered (an atomic: counted as atomics, not as traffic).
    pub(super) fn tally_discard(&mut self, lanes: u64) {
        if let Some(t) = self.tally.as_deref_mut() {
            t.global.clear();
            t.words.clear();
            t.shared_bytes = 0;
            t.c.atomics += lanes;
        }
    }

    /// Ends one memory instruction: its lanes' accesses become sectors (global memory) or
    /// wavefronts (workgroup memory).
    pub(super) fn tally_flush(&mut self, write: bool) {
        let Some(mut t) = self.tally.take() else {
            return;
        };
        if !t.global.is_empty() {
            t.global.sort_unstable();
            let mut at = 0;
            while at < t.global.len() {
                let mem = t.global[at].0;
                let end = at + t.global[at..].iter().take_while(|a| a.0 == mem).count();
                let one = t.global[at..end]
                    .iter()
                    .map(|&(_, off, b)| (u64::from(off), u64::from(b)));
                let binding = match &self.g.as_ref().expect("the baton").mem[mem as usize] {
                    GMem::Bytes { binding, .. } => *binding,
                    _ => (u32::MAX, u32::MAX),
                };
                t.c.global.add_access(one.clone(), write);
                t.c.by_binding
                    .entry(binding)
                    .or_default()
                    .add_access(one, write);
                at = end;
            }
            if !write && !t.loaded {
                t.loaded = true;
                t.c.global_intervals += 1;
            }
            if !write && !t.loaded_here {
                t.loaded_here = true;
                t.c.load_waits += 1;
            }
            t.global.clear();
        }
        if !t.words.is_empty() {
            t.words.sort_unstable();
            t.words.dedup();
            let mut per_bank = [0u32; BANKS as usize];
            for w in &t.words {
                per_bank[(*w as u64 % BANKS) as usize] += 1;
            }
            let ways = u64::from(per_bank.iter().copied().max().unwrap_or(1));
            let ideal = (t.words.len() as u64).div_ceil(BANKS);
            t.c.shared_accesses += 1;
            t.c.shared_bytes += t.shared_bytes;
            t.c.shared_wavefronts += ways;
            t.c.shared_ideal += ideal;
            t.c.shared_max_ways = t.c.shared_max_ways.max(ways.div_ceil(ideal) as u32);
            t.words.clear();
            t.shared_bytes = 0;
        }
        self.tally = Some(t);
    }
}
