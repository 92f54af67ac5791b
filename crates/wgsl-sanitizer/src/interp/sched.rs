//! The subgroups of a workgroup, each on its own scoped thread, one running at a time: the
//! one whose number is `Shared::turn` holds the lock (the baton) and runs until it reaches a
//! barrier or ends, then passes the turn to the next ready subgroup of a seeded random order
//! (`pass_turn`); when every subgroup waits at a barrier (or is done) the barrier is checked
//! and a new interval begins in a new order.

use std::sync::{Condvar, Mutex};

use naga::Span;

use super::memory::GMem;
use super::shadow::Shadow;
use super::{splitmix, Exec, Prog, Res};
use crate::findings::{Collector, FindingKind as FK, Raw};
use crate::Error;

/// Where a subgroup is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum St {
    Ready,
    Barrier(Span, naga::Barrier),
    Done,
}

/// Shared by the subgroups of a dispatch; whoever holds the lock runs.
pub(super) struct Shared {
    pub(super) mem: Vec<GMem>,
    pub(super) findings: Collector,
    /// The last barrier interval's number handed out.
    counter: u32,
    /// The current interval of workgroup memory and of storage memory.
    pub(super) wg_ep: u32,
    pub(super) st_ep: u32,
    wg_linear: u32,
    status: Vec<St>,
    order: Vec<usize>,
    pos: usize,
    turn: usize,
    rng: u64,
    abort: bool,
    pub(super) error: Option<Error>,
    pub(super) lane_ops: u64,
    pub(super) max_iters: u64,
}

impl Shared {
    pub(super) fn new(mem: Vec<GMem>, n_sg: u32, seed: u64) -> Shared {
        Shared {
            mem,
            findings: Collector::default(),
            counter: 1,
            wg_ep: 0,
            st_ep: 0,
            wg_linear: 0,
            status: vec![St::Ready; n_sg as usize],
            order: Vec::new(),
            pos: 0,
            turn: usize::MAX,
            rng: seed ^ 0x5eed_5eed_5eed_5eed,
            abort: false,
            error: None,
            lane_ops: 0,
            max_iters: 0,
        }
    }

    /// Starts workgroup `linear`: new intervals, workgroup memory garbage (or zero) and never
    /// written, every subgroup ready, the first to run drawn.
    pub(super) fn begin_workgroup(&mut self, linear: u32, zero_workgroup_memory: bool) {
        self.wg_linear = linear;
        self.counter += 1;
        self.wg_ep = self.counter;
        self.counter += 1;
        self.st_ep = self.counter;
        let fill = if zero_workgroup_memory {
            0
        } else {
            0xdead_beef
        };
        for mm in self.mem.iter_mut() {
            if let GMem::Words { data, shadow } = mm {
                data.iter_mut().for_each(|x| *x = fill);
                shadow.iter_mut().for_each(|s| *s = Shadow::default());
            }
        }
        for s in self.status.iter_mut() {
            *s = St::Ready;
        }
        let order = shuffle(&mut self.rng, self.status.len());
        self.turn = order[0];
        self.order = order;
        self.pos = 0;
    }

    /// The first invocation of subgroup `s` of the current workgroup.
    fn sg_inv(&self, p: &Prog, s: usize) -> u32 {
        self.wg_linear * p.wg_total + s as u32 * p.w
    }

    /// A divergent barrier: subgroup `s` waits at `span` while subgroup `other` is elsewhere.
    fn divergent(
        &mut self,
        p: &Prog,
        (s, span): (usize, Span),
        other: usize,
        other_span: Option<Span>,
        detail: String,
    ) {
        let (inv, other) = (self.sg_inv(p, s), self.sg_inv(p, other));
        self.findings.add(Raw {
            kind: FK::DivergentBarrier,
            span,
            other_span,
            inv: Some(inv),
            other: Some(other),
            detail,
        });
    }
}

fn shuffle(rng: &mut u64, n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (splitmix(rng) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

/// Passes the baton: the next ready subgroup of this interval runs; when none is left, the
/// barrier is resolved (checked, a new interval begun) or the workgroup is done.
fn pass_turn(g: &mut Shared, p: &Prog) {
    g.pos += 1;
    while g.pos < g.order.len() {
        let s = g.order[g.pos];
        if g.status[s] == St::Ready {
            g.turn = s;
            return;
        }
        g.pos += 1;
    }
    // Everyone is at a barrier or done.
    let mut first: Option<(usize, Span)> = None;
    let mut any_done = None;
    let mut flags = naga::Barrier::empty();
    let statuses = g.status.clone();
    for (s, st) in statuses.iter().enumerate() {
        match *st {
            St::Barrier(span, f) => {
                flags |= f;
                match first {
                    None => first = Some((s, span)),
                    Some((s0, span0)) if span0 != span => g.divergent(
                        p,
                        (s, span),
                        s0,
                        Some(span0),
                        format!("subgroups {s0} and {s} wait at different barriers"),
                    ),
                    _ => {}
                }
            }
            St::Done => any_done = Some(s),
            St::Ready => {}
        }
    }
    let Some((s0, span0)) = first else {
        g.turn = usize::MAX;
        return;
    };
    if let Some(sd) = any_done {
        g.divergent(
            p,
            (s0, span0),
            sd,
            None,
            format!(
                "subgroup {s0} waits at a barrier that subgroup {sd} never reaches (it returned)"
            ),
        );
    }
    if flags.contains(naga::Barrier::WORK_GROUP) {
        g.counter += 1;
        g.wg_ep = g.counter;
    }
    if flags.contains(naga::Barrier::STORAGE) || flags.contains(naga::Barrier::TEXTURE) {
        g.counter += 1;
        g.st_ep = g.counter;
    }
    for st in g.status.iter_mut() {
        if let St::Barrier(..) = st {
            *st = St::Ready;
        }
    }
    let n = g.status.len();
    g.order = shuffle(&mut g.rng, n);
    g.pos = 0;
    while g.status[g.order[g.pos]] != St::Ready {
        g.pos += 1;
    }
    g.turn = g.order[g.pos];
}

/// The thread of subgroup `s` of workgroup `wg_id` (linear index `linear`).
pub(super) fn subgroup_main(
    p: &Prog,
    lock: &(Mutex<Shared>, Condvar),
    s: u32,
    wg_id: [u32; 3],
    linear: u32,
) {
    let mut g = lock.0.lock().unwrap_or_else(|e| e.into_inner());
    while g.turn != s as usize && !g.abort {
        g = lock.1.wait(g).unwrap_or_else(|e| e.into_inner());
    }
    if g.abort {
        return;
    }
    let first = s * p.w;
    let n_lanes = (p.wg_total - first).min(p.w);
    let alive = if n_lanes == 64 {
        u64::MAX
    } else {
        (1u64 << n_lanes) - 1
    };
    let w = p.w as usize;
    let private = p.private_init.iter().map(|init| init.repeat(w)).collect();
    let mut ex = Exec {
        p,
        g: Some(g),
        lock,
        sg: s,
        inv0: linear * p.wg_total + first,
        alive,
        private,
        locals: Vec::new(),
        lane_ops: 0,
        iters: vec![0; w],
        wg_id,
        in_init: false,
    };
    let r = ex.run_entry();
    let mut g = ex.g.take().expect("the baton");
    g.lane_ops += ex.lane_ops;
    let mx = ex.iters.iter().copied().max().unwrap_or(0);
    g.max_iters = g.max_iters.max(mx);
    match r {
        Ok(()) => {
            g.status[s as usize] = St::Done;
            pass_turn(&mut g, p);
        }
        Err(Error::Dispatch(ref m)) if m == "aborted" => {}
        Err(e) => {
            if g.error.is_none() {
                g.error = Some(e);
            }
            g.abort = true;
        }
    }
    drop(g);
    lock.1.notify_all();
}

impl Exec<'_, '_> {
    /// A workgroup or storage barrier reached by the lanes in `mask`.
    pub(super) fn barrier(&mut self, span: Span, flags: naga::Barrier, mask: u64) -> Res<()> {
        if mask != self.alive {
            let missing = self.alive & !mask;
            let l = missing.trailing_zeros() as usize;
            let me = mask.trailing_zeros() as usize;
            let other = self.inv0 + l as u32;
            let alive = self.alive;
            self.finding(
                FK::DivergentBarrier,
                span,
                Some(me),
                Some(other),
                None,
                || {
                    format!(
                        "{} of the subgroup's {} live lanes reach this barrier (lane {l} does not)",
                        mask.count_ones(),
                        alive.count_ones()
                    )
                },
            );
        }
        let p = self.p;
        let s = self.sg as usize;
        let mut g = self.g.take().expect("the baton");
        g.status[s] = St::Barrier(span, flags);
        pass_turn(&mut g, p);
        self.lock.1.notify_all();
        while g.turn != s && !g.abort {
            g = self.lock.1.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        let aborted = g.abort;
        self.g = Some(g);
        if aborted {
            return Err(Error::Dispatch("aborted".into()));
        }
        Ok(())
    }
}
