//! The subgroups of a workgroup, each on its own scoped thread, one running at a time: the
//! one whose number is `Shared::turn` holds the lock (the baton) and runs until it reaches a
//! barrier, ends, or switches at a memory instruction ([`crate::Schedule`]); the turn then
//! goes to a subgroup drawn at random from those that can run (`pass_turn`), each thread
//! waiting on a condition variable of its own. When every subgroup waits at a barrier (or is
//! done) the barrier is checked and a new interval begins.

use std::sync::{Condvar, Mutex, MutexGuard};

use naga::Span;

use super::memory::GMem;
use super::shadow::Shadow;
use super::{splitmix, Exec, Prog, Res};
use crate::findings::{Collector, FindingKind as FK, Raw};
use crate::Error;

/// The shared state and one condition variable per subgroup (its thread waits on it for
/// its turn).
pub(super) type Baton = (Mutex<Shared>, Vec<Condvar>);

/// Where a subgroup is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum St {
    Ready,
    Barrier(Span, naga::Barrier),
    Done,
}

/// Nobody's turn (the workgroup is done).
const NOBODY: usize = usize::MAX;

/// Memory instructions a subgroup is assumed to make in its first interval, before one of
/// its intervals has been seen.
const FIRST_ESTIMATE: u32 = 16;

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
    turn: usize,
    /// The seeded random source of every scheduling decision (drawn by whoever runs, so a
    /// seed gives one run).
    pub(super) rng: u64,
    /// Memory instructions each subgroup made in its first interval of the last workgroup
    /// (where its switch points in the first interval of the next are drawn).
    first_len: Vec<u32>,
    abort: bool,
    pub(super) error: Option<Error>,
    pub(super) lane_ops: u64,
    pub(super) max_iters: u64,
    /// The counts of the workgroup running (when counted).
    pub(super) counters: crate::Counters,
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
            turn: NOBODY,
            rng: seed ^ 0x5eed_5eed_5eed_5eed,
            first_len: vec![FIRST_ESTIMATE; n_sg as usize],
            abort: false,
            error: None,
            lane_ops: 0,
            max_iters: 0,
            counters: crate::Counters::default(),
        }
    }

    /// A random number below `n` (`n` > 0) from the seeded source.
    pub(super) fn below(&mut self, n: u32) -> u32 {
        (((splitmix(&mut self.rng) >> 32) * n as u64) >> 32) as u32
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
        self.turn = self.draw_ready(None).unwrap_or(NOBODY);
    }

    /// A subgroup that can run (other than `except`), drawn at random.
    fn draw_ready(&mut self, except: Option<usize>) -> Option<usize> {
        let ready = |(s, st): (usize, &St)| *st == St::Ready && Some(s) != except;
        let n = self.status.iter().enumerate().filter(|x| ready(*x)).count();
        if n == 0 {
            return None;
        }
        let k = self.below(n as u32) as usize;
        self.status
            .iter()
            .enumerate()
            .filter(|x| ready(*x))
            .nth(k)
            .map(|(s, _)| s)
    }

    /// Wakes the subgroup whose turn it is (all of them when the dispatch is aborted).
    fn wake(&self, cvs: &[Condvar]) {
        if self.abort {
            cvs.iter().for_each(Condvar::notify_all);
        } else if let Some(cv) = cvs.get(self.turn) {
            cv.notify_one();
        }
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

/// Passes the baton from a subgroup that waits at a barrier or is done: a ready subgroup
/// runs; when none is left, the barrier is resolved (checked, a new interval begun) or the
/// workgroup is done.
fn pass_turn(g: &mut Shared, p: &Prog) {
    if let Some(s) = g.draw_ready(None) {
        g.turn = s;
        return;
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
        g.turn = NOBODY;
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
    g.turn = g.draw_ready(None).unwrap_or(NOBODY);
}

/// A subgroup's switches at memory instructions in its current barrier interval.
pub(super) struct Switches {
    /// Memory instructions on shared memory made in this interval.
    count: u32,
    /// Those of the previous interval (or an estimate), across which switch points are drawn.
    estimate: u32,
    /// Switch at the instruction after this many.
    next: u32,
    /// Switches left in this interval.
    left: u32,
    /// Whether this is the subgroup's first interval in its workgroup.
    first: bool,
}

impl Switches {
    /// A new interval of a subgroup that made `estimate` memory instructions in its last
    /// (or is assumed to): `per_interval` switch points, the first drawn.
    fn begin(g: &mut Shared, estimate: u32, per_interval: u32, first: bool) -> Switches {
        let estimate = estimate.max(1);
        Switches {
            count: 0,
            estimate,
            next: if per_interval > 0 {
                g.below(estimate)
            } else {
                0
            },
            left: per_interval,
            first,
        }
    }
}

/// The thread of subgroup `s` of workgroup `wg_id` (linear index `linear`).
pub(super) fn subgroup_main(p: &Prog, lock: &Baton, s: u32, wg_id: [u32; 3], linear: u32) {
    let mut g = lock.0.lock().unwrap_or_else(|e| e.into_inner());
    while g.turn != s as usize && !g.abort {
        g = lock.1[s as usize]
            .wait(g)
            .unwrap_or_else(|e| e.into_inner());
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
    let estimate = g.first_len[s as usize];
    let switches = Switches::begin(&mut g, estimate, p.schedule.switches_per_interval, true);
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
        switches,
        tally: p.count.then(Box::default),
    };
    let r = ex.run_entry();
    let mut g = ex.g.take().expect("the baton");
    ex.end_interval(&mut g);
    g.lane_ops += ex.lane_ops;
    if let Some(mut t) = ex.tally.take() {
        t.c.subgroups = 1;
        t.c.invocations = u64::from(alive.count_ones());
        g.counters.add_scaled(&t.c, 1.0);
    }
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
    g.wake(&lock.1);
}

impl<'s> Exec<'_, 's> {
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
        self.tally_barrier();
        let p = self.p;
        let mut g = self.g.take().expect("the baton");
        self.end_interval(&mut g);
        g.status[self.sg as usize] = St::Barrier(span, flags);
        pass_turn(&mut g, p);
        let mut g = self.hand_over(g)?;
        let estimate = self.switches.count;
        self.switches = Switches::begin(&mut g, estimate, p.schedule.switches_per_interval, false);
        self.g = Some(g);
        Ok(())
    }

    /// Notes the length of the interval that ends (in its first interval, for the next
    /// workgroup's subgroup of this number).
    fn end_interval(&mut self, g: &mut Shared) {
        if self.switches.first {
            g.first_len[self.sg as usize] = self.switches.count;
        }
    }

    /// Wakes whoever's turn it now is and waits for this subgroup's turn again.
    fn hand_over(&mut self, mut g: MutexGuard<'s, Shared>) -> Res<MutexGuard<'s, Shared>> {
        let s = self.sg as usize;
        g.wake(&self.lock.1);
        while g.turn != s && !g.abort {
            g = self.lock.1[s].wait(g).unwrap_or_else(|e| e.into_inner());
        }
        if g.abort {
            self.g = Some(g);
            return Err(Error::Dispatch("aborted".into()));
        }
        Ok(g)
    }

    /// Before a memory instruction on shared memory: at the interval's switch points another
    /// ready subgroup runs first.
    pub(super) fn switch_point(&mut self) -> Res<()> {
        let sw = &mut self.switches;
        sw.count += 1;
        if sw.left == 0 || sw.count <= sw.next {
            return Ok(());
        }
        sw.left -= 1;
        let mut g = self.g.take().expect("the baton");
        // The next switch point, drawn across what is left of the interval.
        let rest = self
            .switches
            .estimate
            .saturating_sub(self.switches.count)
            .max(1);
        self.switches.next = self.switches.count + g.below(rest);
        match g.draw_ready(Some(self.sg as usize)) {
            Some(other) => {
                g.turn = other;
                let g = self.hand_over(g)?;
                self.g = Some(g);
            }
            None => self.g = Some(g),
        }
        Ok(())
    }
}
