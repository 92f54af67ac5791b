//! Where a context's wall time goes, by phase: opening the adapter, compiling pipelines,
//! tuning, uploading (operands and weights, checks included), recording (planning and
//! encoding), the device's work, and reading back (checks included); a caller that reads
//! files adds their `io`. Each call logs its own split at `info` level; [`crate::Context::phase_times`] gives
//! the totals (the CLI's `--timings`).
//!
//! Phases nest: time inside an inner phase counts for it alone, except under
//! [`Phase::Tune`], which keeps everything its measuring does (the candidates' compiles and
//! runs). Each thread keeps its own stack, so calls from several threads do not mix their
//! phases (their totals still add up).

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::thread::ThreadId;
use std::time::Duration;

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use std::time::Instant;
// The browser has no `std::time::Instant` (it panics there): `performance.now()` instead.
#[cfg(target_arch = "wasm32")]
pub(crate) use web_time::Instant;

/// A phase of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
// In the browser the device's wait and the readback are not timed (nothing blocks there).
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
pub(crate) enum Phase {
    /// Enumerating adapters and opening the device.
    Adapter,
    /// Creating pipelines (shader translation and the driver's compile).
    Compile,
    /// The autotuner measuring candidates (their compiles included).
    Tune,
    /// Host → device copies: operands and weights, their checks included.
    Upload,
    /// Reading a file operand's values (the part of an upload from a file spent reading).
    Io,
    /// The rest of a call on the host: planning, recording the passes.
    Record,
    /// The device running the submitted work, waited for.
    Dispatch,
    /// Mapping the results and copying them out.
    Readback,
}

/// Wall time per phase, and how many pipelines were compiled.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct PhaseTimes {
    /// Reading and writing files (`.npy`): a call's reads of the file operands it uploads
    /// ([`crate::npy::Opened`]), plus what the caller adds (the CLI adds
    /// [`crate::npy::io_time`], its other reads and its writes).
    pub io: Duration,
    /// Enumerating adapters and opening the device.
    pub adapter: Duration,
    /// Creating pipelines: WGSL to the driver's code (outside tuning).
    pub compile: Duration,
    /// Pipelines compiled (tuning's included).
    pub pipelines: usize,
    /// The autotuner measuring candidates, their compiles and runs included.
    pub tune: Duration,
    /// Host → device: the operands (Q, K, V, X, a mask) and the projections' weights copied
    /// into staging memory, their values checked on the way.
    pub upload: Duration,
    /// The rest of the calls on the host: planning, encoding the passes.
    pub record: Duration,
    /// The device running the submitted work (waited for).
    pub dispatch: Duration,
    /// Device → host: mapping the results and copying them out, checked for overflow on the
    /// way.
    pub readback: Duration,
}

impl PhaseTimes {
    fn slot(&mut self, p: Phase) -> &mut Duration {
        match p {
            Phase::Adapter => &mut self.adapter,
            Phase::Compile => &mut self.compile,
            Phase::Tune => &mut self.tune,
            Phase::Upload => &mut self.upload,
            Phase::Io => &mut self.io,
            Phase::Record => &mut self.record,
            Phase::Dispatch => &mut self.dispatch,
            Phase::Readback => &mut self.readback,
        }
    }

    /// The sum of every phase.
    pub fn total(&self) -> Duration {
        self.io
            + self.adapter
            + self.compile
            + self.tune
            + self.upload
            + self.record
            + self.dispatch
            + self.readback
    }

    /// What happened since `earlier` (a snapshot of the same totals).
    pub fn since(&self, earlier: &PhaseTimes) -> PhaseTimes {
        let d = |a: Duration, b: Duration| a.saturating_sub(b);
        PhaseTimes {
            io: d(self.io, earlier.io),
            adapter: d(self.adapter, earlier.adapter),
            compile: d(self.compile, earlier.compile),
            pipelines: self.pipelines.saturating_sub(earlier.pipelines),
            tune: d(self.tune, earlier.tune),
            upload: d(self.upload, earlier.upload),
            record: d(self.record, earlier.record),
            dispatch: d(self.dispatch, earlier.dispatch),
            readback: d(self.readback, earlier.readback),
        }
    }
}

impl fmt::Display for PhaseTimes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        // Only a caller that reads or writes files has an `io` phase.
        if !self.io.is_zero() {
            write!(f, "io {:.1} ms, ", ms(self.io))?;
        }
        write!(
            f,
            "adapter {:.1} ms, compile {:.1} ms ({} pipelines), tune {:.1} ms, upload {:.1} ms, \
             record {:.1} ms, dispatch {:.1} ms, readback {:.1} ms; total {:.1} ms",
            ms(self.adapter),
            ms(self.compile),
            self.pipelines,
            ms(self.tune),
            ms(self.upload),
            ms(self.record),
            ms(self.dispatch),
            ms(self.readback),
            ms(self.total())
        )
    }
}

#[derive(Default)]
struct State {
    totals: PhaseTimes,
    /// Per thread: the open phases, innermost last, each with when it last resumed.
    stacks: HashMap<ThreadId, Vec<(Phase, Instant)>>,
}

/// A context's phase clock.
#[derive(Default)]
pub(crate) struct Phases {
    state: Mutex<State>,
}

/// An open phase; closes on drop.
pub(crate) struct Guard<'a> {
    phases: &'a Phases,
    active: bool,
}

impl Phases {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Opens `phase` on this thread until the guard drops (inside [`Phase::Tune`]: a no-op).
    pub(crate) fn enter(&self, phase: Phase) -> Guard<'_> {
        let now = Instant::now();
        let mut state = self.lock();
        let State { totals, stacks } = &mut *state;
        let stack = stacks.entry(std::thread::current().id()).or_default();
        if stack.iter().any(|(p, _)| *p == Phase::Tune) {
            return Guard {
                phases: self,
                active: false,
            };
        }
        if let Some((outer, since)) = stack.last() {
            *totals.slot(*outer) += now - *since;
        }
        stack.push((phase, now));
        Guard {
            phases: self,
            active: true,
        }
    }

    /// Adds `d` to `phase` directly.
    pub(crate) fn add(&self, phase: Phase, d: Duration) {
        *self.lock().totals.slot(phase) += d;
    }

    /// Counts one compiled pipeline.
    pub(crate) fn count_pipeline(&self) {
        self.lock().totals.pipelines += 1;
    }

    /// The totals so far.
    pub(crate) fn totals(&self) -> PhaseTimes {
        self.lock().totals
    }

    /// Sets the totals to zero.
    pub(crate) fn reset(&self) {
        self.lock().totals = PhaseTimes::default();
    }
}

// The browser uploads no files.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
impl Guard<'_> {
    /// Closes the phase, moving `d` of its time (at most what it was open) to `to`: a phase
    /// whose wall time includes work of another kind done on other threads (an upload's
    /// reads from files).
    pub(crate) fn close_moving(self, to: Phase, d: Duration) {
        // This thread's innermost phase (this guard's), and when it opened or last resumed.
        let open = self.active.then(|| {
            let state = self.phases.lock();
            let stack = state.stacks.get(&std::thread::current().id())?;
            stack
                .last()
                .map(|&(phase, since)| (phase, d.min(since.elapsed())))
        });
        let phases = self.phases;
        drop(self);
        let Some((phase, moved)) = open.flatten() else {
            return;
        };
        let mut state = phases.lock();
        let slot = state.totals.slot(phase);
        *slot = slot.saturating_sub(moved);
        *state.totals.slot(to) += moved;
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if !self.active {
            return;
        }
        let now = Instant::now();
        let mut state = self.phases.lock();
        let State { totals, stacks } = &mut *state;
        let id = std::thread::current().id();
        let Some(stack) = stacks.get_mut(&id) else {
            return;
        };
        if let Some((phase, since)) = stack.pop() {
            *totals.slot(phase) += now - since;
        }
        match stack.last_mut() {
            Some((_, since)) => *since = now,
            None => {
                stacks.remove(&id);
            }
        }
    }
}

/// [`Phases::enter`] with [`Phase::Record`] that, on drop, also logs the call's split at
/// `info` level.
pub(crate) struct CallGuard<'a> {
    start: PhaseTimes,
    phases: &'a Phases,
    inner: Option<Guard<'a>>,
}

impl Phases {
    /// Opens a whole call (its residual host time counts as [`Phase::Record`]).
    pub(crate) fn call(&self) -> CallGuard<'_> {
        CallGuard {
            start: self.totals(),
            phases: self,
            inner: Some(self.enter(Phase::Record)),
        }
    }
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        drop(self.inner.take());
        log::info!("timings: {}", self.phases.totals().since(&self.start));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleep(ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
    }

    #[test]
    fn nested_phases_count_once_and_tune_keeps_its_inner_phases() {
        let p = Phases::default();
        {
            let _call = p.call();
            sleep(5);
            {
                let _c = p.enter(Phase::Compile);
                sleep(20);
            }
            {
                let _t = p.enter(Phase::Tune);
                let _c = p.enter(Phase::Compile);
                sleep(200);
            }
            sleep(5);
        }
        let t = p.totals();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        // The compile inside tuning counts for tuning only.
        assert!(ms(t.compile) >= 20.0 && ms(t.compile) < 200.0, "{t}");
        assert!(ms(t.tune) >= 200.0, "{t}");
        assert!(ms(t.record) >= 10.0 && ms(t.record) < 200.0, "{t}");
        let sum = t.compile + t.tune + t.record;
        assert_eq!(sum, t.total());
        p.reset();
        assert_eq!(p.totals(), PhaseTimes::default());
    }
}
