//! The shadow of memory: per element of workgroup memory (per 2-byte granule of a writable
//! buffer, per texel of a storage texture) who last wrote and read it, in which barrier
//! interval and where; each access is checked against it for races and uninitialised reads.

use super::NONE;

/// Who last wrote and read one element, for race and initialisation checks.
#[derive(Clone, Copy)]
pub(super) struct Shadow {
    w_inv: u32,
    w_ep: u32,
    w_site: u32,
    r_inv: u32,
    r_ep: u32,
    r_site: u32,
    /// Read by more than one invocation in the reader's interval.
    multi: bool,
    pub(super) init: bool,
}

impl Default for Shadow {
    fn default() -> Self {
        Shadow {
            w_inv: NONE,
            w_ep: 0,
            w_site: 0,
            r_inv: NONE,
            r_ep: 0,
            r_site: 0,
            multi: false,
            init: false,
        }
    }
}

/// The earlier access an access races with: its invocation, its site (the byte offset of its
/// span) and whether it wrote.
pub(super) type Race = (u32, u32, bool);

/// One access to an element: by whom (linear invocation id), in which barrier interval,
/// where in the source, and how.
#[derive(Clone, Copy)]
pub(super) struct Acc {
    pub(super) me: u32,
    pub(super) ep: u32,
    pub(super) write: bool,
    pub(super) site: u32,
    /// Storage memory: accesses from other workgroups always conflict.
    pub(super) storage: bool,
    pub(super) wg_total: u32,
    pub(super) atomic: bool,
}

impl Acc {
    /// Records this access to each of `shadows`; keeps the first race found in `race`.
    /// Returns whether one of them was never written.
    #[inline]
    pub(super) fn record(self, shadows: &mut [Shadow], race: &mut Option<Race>) -> bool {
        let mut uninit = false;
        for s in shadows {
            let (r, u) = access(s, self);
            if race.is_none() {
                *race = r;
            }
            uninit |= u;
        }
        uninit
    }
}

/// Checks one access against an element's shadow and records it. Returns the conflicting
/// earlier access and whether the element was never written.
#[inline]
fn access(s: &mut Shadow, a: Acc) -> (Option<Race>, bool) {
    let Acc {
        me,
        ep,
        write,
        site,
        storage,
        wg_total,
        atomic,
    } = a;
    let uninit = !write && !s.init && !storage;
    if atomic {
        if write {
            s.init = true;
        }
        return (None, uninit);
    }
    let conflict = |other: u32, oep: u32| {
        other != NONE
            && other != me
            && (oep == ep || (storage && other / wg_total != me / wg_total))
    };
    let mut race = None;
    if conflict(s.w_inv, s.w_ep) {
        race = Some((s.w_inv, s.w_site, true));
    }
    if write {
        if race.is_none() && (conflict(s.r_inv, s.r_ep) || (s.multi && s.r_ep == ep)) {
            race = Some((s.r_inv, s.r_site, false));
        }
        s.w_inv = me;
        s.w_ep = ep;
        s.w_site = site;
        s.init = true;
    } else {
        if s.r_ep == ep && s.r_inv != me && s.r_inv != NONE {
            s.multi = true;
        } else if s.r_ep != ep {
            s.multi = false;
        }
        s.r_inv = me;
        s.r_ep = ep;
        s.r_site = site;
    }
    (race, uninit)
}
