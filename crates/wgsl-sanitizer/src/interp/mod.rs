//! The interpreter: one dispatch, workgroup after workgroup; in a workgroup each subgroup on
//! its own thread, one running at a time (the lock is the baton), switching at barriers and at
//! some memory accesses in a seeded random order ([`crate::Schedule`]); in a subgroup the
//! lanes in lockstep under an active mask, apart where that is observable (divergent branches
//! and the lanes of a store or atomic in a seeded order).
//!
//! - [`dispatch`]: setting up a dispatch (overrides, constants, the globals' memory), the
//!   loop over workgroups, the findings turned into [`crate::Finding`]s;
//! - [`sched`]: the subgroups of a workgroup on their threads, passing the turn;
//! - [`stmt`]: calls and statements under an active mask;
//! - [`expr`]: expressions (arithmetic, conversions, access chains, math functions);
//! - [`memory`] and [`shadow`]: loads, stores and atomics, and the per-element record of
//!   writers and readers that finds races and uninitialised reads;
//! - [`subgroup`], [`coop`], [`texture`]: subgroup operations, cooperative matrices, textures.

use std::sync::MutexGuard;

use naga::{Expression, Function, Handle, Span};

use crate::findings::{FindingKind as FK, Raw};
use crate::prepare::FnPrep;
use crate::{Error, Invocation, Shader};

mod coop;
mod count;
mod dispatch;
mod expr;
mod memory;
mod sched;
mod shadow;
mod stmt;
mod subgroup;
mod texture;

pub use dispatch::run;

use sched::{Baton, Shared, Switches};

type Res<T> = Result<T, Error>;

/// No invocation (in a shadow record).
const NONE: u32 = u32::MAX;
/// The offset of a pointer whose index was out of bounds: its accesses do nothing.
const INVALID: u32 = u32::MAX;
/// Marks a pointer's memory as a local variable: `LOCAL | depth << 16 | index`.
const LOCAL: u32 = 1 << 31;

/// A pointer of one lane: a memory (global variable index, or a local variable of a frame)
/// and an offset in it (bytes in byte memory, leaves in word memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ptr {
    mem: u32,
    off: u32,
}

impl Ptr {
    /// `(frame depth, index)` of a local variable's pointer; `None` for a global.
    fn local(self) -> Option<(usize, usize)> {
        (self.mem & LOCAL != 0).then_some((
            ((self.mem & !LOCAL) >> 16) as usize,
            (self.mem & 0xffff) as usize,
        ))
    }
}

/// A value of every lane of a subgroup.
#[derive(Clone, Debug, Default)]
enum Val {
    #[default]
    Empty,
    /// `lanes × n` leaves, lane-major.
    D(Vec<u32>),
    /// One pointer per lane.
    P(Vec<Ptr>),
    /// A texture (the global variable's index).
    Img(u32),
}

/// What does not change while a dispatch runs.
struct Prog<'a> {
    sh: &'a Shader,
    ep: usize,
    func: &'a Function,
    ep_prep: FnPrep,
    fn_preps: Vec<FnPrep>,
    consts: Vec<Vec<u32>>,
    overrides: Vec<Vec<u32>>,
    w: u32,
    wg_size: [u32; 3],
    wg_total: u32,
    n_sg: u32,
    groups: [u32; 3],
    check_nf: bool,
    max_lane_ops: u64,
    /// Never-written workgroup memory reads zero ([`crate::Dispatch::zero_workgroup_memory`]).
    zero_wg: bool,
    schedule: crate::Schedule,
    /// Counting what the dispatch would spend ([`crate::Dispatch::counters`]).
    count: bool,
    /// Leaf count of each private global.
    private_n: Vec<u32>,
    private_init: Vec<Vec<u32>>,
}

impl Prog<'_> {
    fn invocation(&self, inv: u32) -> Invocation {
        let wgl = inv / self.wg_total;
        let li = inv % self.wg_total;
        let [gx, gy, _] = self.groups;
        let [sx, sy, _] = self.wg_size;
        Invocation {
            workgroup: [wgl % gx, (wgl / gx) % gy, wgl / (gx * gy)],
            local_id: [li % sx, (li / sx) % sy, li / (sx * sy)],
            subgroup: li / self.w,
            lane: li % self.w,
        }
    }
}

/// A random number from `state` (advanced).
pub(crate) fn random(state: &mut u64) -> u64 {
    splitmix(state)
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The lanes of `mask`, lowest first.
fn lanes(mask: u64) -> impl Iterator<Item = usize> {
    let mut m = mask;
    std::iter::from_fn(move || {
        if m == 0 {
            None
        } else {
            let l = m.trailing_zeros() as usize;
            m &= m - 1;
            Some(l)
        }
    })
}

/// The lanes of `mask` whose `c` is true (non-zero).
fn lanes_where(c: &[u32], mask: u64) -> u64 {
    let mut t = 0u64;
    for l in lanes(mask) {
        if c[l] != 0 {
            t |= 1 << l;
        }
    }
    t
}

fn internal(what: &str) -> Error {
    Error::Unsupported(format!("internal: {what}"))
}

/// Masks a loop's or switch's `break` and `continue` collect.
struct Brk {
    is_loop: bool,
    brk: u64,
    cont: u64,
}

/// One function call of a subgroup: its expressions' values and its control state.
struct Frame<'p> {
    f: &'p Function,
    prep: &'p FnPrep,
    info: &'p naga::valid::FunctionInfo,
    vals: Vec<Val>,
    args: Vec<Val>,
    depth: u32,
    ret: Vec<u32>,
    ret_n: usize,
    returned: u64,
    brk: Vec<Brk>,
}

fn data<'a>(fr: &'a Frame, h: Handle<Expression>) -> &'a [u32] {
    match &fr.vals[h.index()] {
        Val::D(v) => v,
        _ => &[],
    }
}

fn ptrs<'a>(fr: &'a Frame, h: Handle<Expression>) -> &'a [Ptr] {
    match &fr.vals[h.index()] {
        Val::P(v) => v,
        _ => &[],
    }
}

/// The buffer of `h`'s value taken out of the frame to be written again (`len` leaves).
fn take_buf(fr: &mut Frame, h: Handle<Expression>, len: usize) -> Vec<u32> {
    let mut v = match std::mem::take(&mut fr.vals[h.index()]) {
        Val::D(v) => v,
        _ => Vec::new(),
    };
    v.resize(len, 0);
    v
}

fn expr_span(fr: &Frame, h: Handle<Expression>) -> Span {
    fr.f.expressions.get_span(h)
}

/// One subgroup running.
struct Exec<'p, 's> {
    p: &'p Prog<'p>,
    g: Option<MutexGuard<'s, Shared>>,
    lock: &'s Baton,
    sg: u32,
    inv0: u32,
    alive: u64,
    private: Vec<Vec<u32>>,
    /// Local variables of each frame on the call stack: (leaf count, lanes × leaves).
    locals: Vec<Vec<(u32, Vec<u32>)>>,
    lane_ops: u64,
    iters: Vec<u64>,
    wg_id: [u32; 3],
    /// Evaluating a local variable's initialiser (constant), emitted or not.
    in_init: bool,
    /// Where this subgroup switches in its current barrier interval.
    switches: Switches,
    /// What it would spend on a GPU, when counted.
    tally: Option<Box<count::Tally>>,
}

impl Exec<'_, '_> {
    fn g(&mut self) -> &mut Shared {
        self.g.as_mut().expect("the baton")
    }

    fn w(&self) -> usize {
        self.p.w as usize
    }

    fn full(&self) -> u64 {
        if self.p.w == 64 {
            u64::MAX
        } else {
            (1u64 << self.p.w) - 1
        }
    }

    /// Records a finding by lane `lane` of this subgroup (its detail made only the first
    /// time this kind and place is found).
    fn finding(
        &mut self,
        kind: FK,
        span: Span,
        lane: Option<usize>,
        other: Option<u32>,
        other_span: Option<Span>,
        detail: impl FnOnce() -> String,
    ) {
        let inv = lane.map(|l| self.inv0 + l as u32);
        let g = self.g();
        if g.findings.bump(kind, span) {
            return;
        }
        g.findings.add(Raw {
            kind,
            span,
            other_span,
            inv,
            other,
            detail: detail(),
        });
    }
}

/// `items` combined left to right by `f` (`None` when there are none).
fn fold(
    items: impl Iterator<Item = Res<u32>>,
    mut f: impl FnMut(u32, u32) -> Res<u32>,
) -> Res<Option<u32>> {
    let mut acc = None;
    for x in items {
        let x = x?;
        acc = Some(match acc {
            None => x,
            Some(a) => f(a, x)?,
        });
    }
    Ok(acc)
}

/// The lanes of a mask in the order they make their accesses.
struct LaneOrder {
    lanes: [u8; 64],
    len: u8,
    at: u8,
}

impl Iterator for LaneOrder {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        (self.at < self.len).then(|| {
            self.at += 1;
            self.lanes[self.at as usize - 1] as usize
        })
    }
}

impl Exec<'_, '_> {
    /// Before a memory instruction of the lanes in `mask` on the memory of `p` (the first
    /// active lane's pointer; `None` when there is none): when that
    /// memory is shared (workgroup memory, a writable buffer or texture), another subgroup
    /// may run first (a switch point), and with lanes apart a store or atomic (`reorder`)
    /// makes its lanes' accesses in a seeded order: the active lanes rotated, reversed or
    /// not. Returns that order (lowest lane first otherwise).
    fn instruction(&mut self, p: Option<Ptr>, mask: u64, reorder: bool) -> Res<LaneOrder> {
        let mut order = LaneOrder {
            lanes: [0; 64],
            len: 0,
            at: 0,
        };
        for l in lanes(mask) {
            order.lanes[order.len as usize] = l as u8;
            order.len += 1;
        }
        if self.tally.is_some() && p.is_some_and(|p| self.is_global(p)) {
            self.tally_instruction(mask);
        }
        if !p.is_some_and(|p| self.is_shared(p)) {
            return Ok(order);
        }
        self.switch_point()?;
        if reorder && self.apart() && order.len > 1 {
            let n = order.len as u32;
            let r = self.g().below(2 * n);
            let active = &mut order.lanes[..n as usize];
            active.rotate_left((r / 2) as usize);
            if r & 1 == 1 {
                active.reverse();
            }
        }
        Ok(order)
    }
}
