//! Memory: each lane's local and private variables, and the globals shared by the dispatch
//! (buffers as bytes, workgroup memory as leaves, textures), with loads, stores and atomics
//! checked for bounds, initialisation and races against the shadow.

use naga::{Expression, Handle, Span};

use super::shadow::{Acc, Race, Shadow};
use super::{data, internal, ptrs, Exec, Frame, Ptr, Res, Val, INVALID};
use crate::findings::FindingKind as FK;
use crate::prepare::PtrMeta;
use crate::types::K;
use crate::{Error, Texture};

/// One global variable's memory during the dispatch.
pub(super) enum GMem {
    Unused,
    Bytes {
        data: Vec<u8>,
        /// Per 2-byte granule, for writable buffers only.
        shadow: Vec<Shadow>,
        binding: (u32, u32),
        /// A uniform buffer (not counted as global traffic).
        uniform: bool,
    },
    Words {
        data: Vec<u32>,
        shadow: Vec<Shadow>,
    },
    /// Per lane, in each subgroup's own state.
    Private,
    Tex {
        tex: Texture,
        shadow: Vec<Shadow>,
        binding: (u32, u32),
    },
}

/// The site of a span: its first byte (how the shadow remembers where an access was).
pub(super) fn site(span: Span) -> u32 {
    span.to_range().map(|r| r.start as u32).unwrap_or(0)
}

impl Exec<'_, '_> {
    /// The `n` leaves at `p` of lane `l` when `p` points at a local or private variable
    /// (memory of the lane's own); `None` for shared memory.
    fn lane_mem(&mut self, p: Ptr, l: usize, n: usize) -> Option<&mut [u32]> {
        let (ln, v) = match p.local() {
            Some((depth, idx)) => {
                let (ln, v) = &mut self.locals[depth][idx];
                (*ln as usize, v)
            }
            None => {
                let gi = p.mem as usize;
                let pn = self.p.private_n[gi] as usize;
                if pn == 0 {
                    return None;
                }
                (pn, &mut self.private[gi])
            }
        };
        let o = l * ln + p.off as usize;
        Some(&mut v[o..o + n])
    }

    /// Whether `p` points at memory that invocations share and can race on: workgroup
    /// memory, a writable storage buffer or texture.
    pub(super) fn is_shared(&mut self, p: Ptr) -> bool {
        if p.local().is_some() || self.p.private_n[p.mem as usize] > 0 {
            return false;
        }
        match &self.g().mem[p.mem as usize] {
            GMem::Words { .. } => true,
            GMem::Bytes { shadow, .. } | GMem::Tex { shadow, .. } => !shadow.is_empty(),
            _ => false,
        }
    }

    /// Whether `p` points at memory outside the lane's registers (not a local or private
    /// variable): its accesses are memory instructions.
    pub(super) fn is_global(&self, p: Ptr) -> bool {
        p.local().is_none() && self.p.private_n[p.mem as usize] == 0
    }

    /// Length of a pointer's memory, in its units.
    pub(super) fn mem_len(&mut self, p: Ptr) -> u32 {
        if let Some((depth, idx)) = p.local() {
            return self.locals[depth][idx].0;
        }
        let gi = p.mem as usize;
        if self.p.private_n[gi] > 0 {
            return self.p.private_n[gi];
        }
        match &self.g().mem[gi] {
            GMem::Bytes { data, .. } => data.len() as u32,
            GMem::Words { data, .. } => data.len() as u32,
            _ => 0,
        }
    }

    /// The name of a pointer's memory, for findings.
    pub(super) fn mem_name(&self, fr: &Frame, p: Ptr) -> String {
        if let Some((depth, idx)) = p.local() {
            if depth == fr.depth as usize {
                if let Some((_, lv)) = fr.f.local_variables.iter().nth(idx) {
                    return format!("local `{}`", lv.name.as_deref().unwrap_or("?"));
                }
            }
            return "a local variable".into();
        }
        let m = &self.p.sh.module;
        match m.global_variables.iter().nth(p.mem as usize) {
            Some((_, gv)) => {
                let name = gv.name.as_deref().unwrap_or("?");
                match gv.binding {
                    Some(ref b) => format!("`{name}` (group {} binding {})", b.group, b.binding),
                    None => format!("`{name}`"),
                }
            }
            None => "?".into(),
        }
    }

    /// Loads through `pointer` for the lanes in `mask` into `out` (lanes × n).
    pub(super) fn load_into(
        &mut self,
        fr: &Frame,
        pointer: Handle<Expression>,
        out: &mut [u32],
        n: usize,
        span: Span,
        mask: u64,
    ) -> Res<()> {
        let pm = pointee(fr, pointer)?;
        let ps = ptrs(fr, pointer);
        let first = ps.get(mask.trailing_zeros() as usize).copied();
        for l in self.instruction(first, mask, false)? {
            let p = ps[l];
            let dst = &mut out[l * n..(l + 1) * n];
            if p.off == INVALID {
                dst.fill(0);
                continue;
            }
            self.mem(fr, p, pm, dst, l, span, false)?;
        }
        self.tally_flush(false);
        Ok(())
    }

    /// `*pointer = value` for the lanes in `mask`.
    pub(super) fn store(
        &mut self,
        fr: &mut Frame,
        pointer: Handle<Expression>,
        value: Handle<Expression>,
        span: Span,
        mask: u64,
    ) -> Res<()> {
        let n = fr.prep.metas[value.index()].n as usize;
        // The value is taken out of the frame while the lanes store it, and put back (an
        // error ends the dispatch).
        let Val::D(mut src) = std::mem::take(&mut fr.vals[value.index()]) else {
            return Err(internal("store of a non-value"));
        };
        let pm = pointee(fr, pointer)?;
        let ps = ptrs(fr, pointer);
        let first = ps.get(mask.trailing_zeros() as usize).copied();
        for l in self.instruction(first, mask, true)? {
            let p = ps[l];
            if p.off != INVALID {
                self.mem(fr, p, pm, &mut src[l * n..(l + 1) * n], l, span, true)?;
            }
        }
        self.tally_flush(true);
        fr.vals[value.index()] = Val::D(src);
        Ok(())
    }

    /// Reads (`write` false: into `buf`) or writes (from `buf`) the leaves at `p` for lane
    /// `l`, checking the access when the memory is shared.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mem(
        &mut self,
        fr: &Frame,
        p: Ptr,
        pm: &PtrMeta,
        buf: &mut [u32],
        l: usize,
        span: Span,
        write: bool,
    ) -> Res<()> {
        let n = buf.len();
        if let Some(own) = self.lane_mem(p, l, n) {
            if write {
                own.copy_from_slice(buf);
            } else {
                buf.copy_from_slice(own);
            }
            return Ok(());
        }
        if self.tally.is_some() {
            let offsets = pm.leaves.as_ref().map_or(&[][..], |l| &l.offsets[..]);
            self.tally_access(p, pm.k, n, offsets);
        }
        let mut acc = Acc {
            me: self.inv0 + l as u32,
            ep: 0,
            write,
            site: site(span),
            storage: false,
            wg_total: self.p.wg_total,
            atomic: pm.atomic,
        };
        let zero_wg = self.p.zero_wg;
        let mut race: Option<Race> = None;
        let mut uninit = false;
        let mut oob = false;
        let g = self.g.as_mut().expect("the baton");
        let (wg_ep, st_ep) = (g.wg_ep, g.st_ep);
        match &mut g.mem[p.mem as usize] {
            GMem::Words { data, shadow } => {
                acc.ep = wg_ep;
                let o = p.off as usize;
                if o + n > data.len() {
                    oob = true;
                    if !write {
                        buf.fill(0);
                    }
                } else {
                    let (data, shadow) = (&mut data[o..o + n], &mut shadow[o..o + n]);
                    if write {
                        data.copy_from_slice(buf);
                    } else {
                        buf.copy_from_slice(data);
                    }
                    uninit = acc.record(shadow, &mut race);
                    if uninit && !zero_wg {
                        // Garbage, as a GPU that does not zero workgroup memory.
                        for (d, s) in buf.iter_mut().zip(shadow.iter()) {
                            if !s.init {
                                *d = 0x7fc0_dead;
                            }
                        }
                    }
                }
            }
            GMem::Bytes { data, shadow, .. } => {
                if write && shadow.is_empty() {
                    return Err(internal("store to a read-only buffer"));
                }
                acc.ep = st_ep;
                acc.storage = true;
                let leaves = pm
                    .leaves
                    .as_ref()
                    .ok_or_else(|| internal("access of an unsized value"))?;
                let base = p.off as usize;
                let leaves = leaves.kinds.iter().zip(&leaves.offsets).take(n);
                for (leaf, (k, lo)) in buf.iter_mut().zip(leaves) {
                    let o = base + *lo as usize;
                    let b = k.bytes() as usize;
                    if o + b > data.len() {
                        oob = true;
                        if !write {
                            *leaf = 0;
                        }
                        continue;
                    }
                    let bytes = &mut data[o..o + b];
                    if write {
                        bytes.copy_from_slice(&leaf.to_le_bytes()[..b]);
                    } else {
                        let mut w = [0u8; 4];
                        w[..b].copy_from_slice(bytes);
                        *leaf = u32::from_le_bytes(w);
                    }
                    if !shadow.is_empty() {
                        acc.record(&mut shadow[o / 2..o / 2 + 1], &mut race);
                    }
                }
            }
            _ => return Err(internal("a texture accessed through a pointer")),
        }
        self.report_access(fr, p, span, l, [oob, uninit], race, write);
        Ok(())
    }

    /// Reports what one access found: past the end, never written (`flags`), a race.
    #[allow(clippy::too_many_arguments)]
    fn report_access(
        &mut self,
        fr: &Frame,
        p: Ptr,
        span: Span,
        l: usize,
        [oob, uninit]: [bool; 2],
        race: Option<Race>,
        write: bool,
    ) {
        if oob {
            let name = self.mem_name(fr, p);
            let what = if write { "write" } else { "read" };
            self.finding(FK::OutOfBounds, span, Some(l), None, None, || {
                format!("{what} past the end of {name} at offset {}", p.off)
            });
        }
        if uninit {
            let name = self.mem_name(fr, p);
            self.finding(FK::UninitializedRead, span, Some(l), None, None, || {
                format!("{name} element {} never written by this workgroup", p.off)
            });
        }
        if let Some((other, osite, other_write)) = race {
            let kind = match self.g().mem[p.mem as usize] {
                GMem::Words { .. } => FK::WorkgroupRace,
                _ => FK::StorageRace,
            };
            let name = self.mem_name(fr, p);
            let unit = if kind == FK::WorkgroupRace {
                "element"
            } else {
                "byte"
            };
            let rw = |w| if w { "write" } else { "read" };
            self.race(kind, span, l, (other, osite), || {
                format!(
                    "{} of {name} {unit} {} races with an earlier {}",
                    rw(write),
                    p.off,
                    rw(other_write)
                )
            });
        }
    }

    /// A race of lane `l`'s access at `span` with the earlier access of invocation `other`
    /// at site `osite`.
    pub(super) fn race(
        &mut self,
        kind: FK,
        span: Span,
        l: usize,
        (other, osite): (u32, u32),
        detail: impl FnOnce() -> String,
    ) {
        let other_span = Some(Span::new(osite, osite + 1));
        self.finding(kind, span, Some(l), Some(other), other_span, detail);
    }

    /// An atomic read-modify-write through `pointer` for the lanes in `mask`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn atomic(
        &mut self,
        fr: &mut Frame,
        pointer: Handle<Expression>,
        fun: &naga::AtomicFunction,
        value: Handle<Expression>,
        result: Option<Handle<Expression>>,
        span: Span,
        mask: u64,
    ) -> Res<()> {
        use naga::AtomicFunction as A;
        self.ensure_all(fr, [pointer, value])?;
        let pm = pointee(fr, pointer)?;
        let k = pm.k.ok_or_else(|| internal("atomic kind"))?;
        let mut res = vec![0u32; self.w()];
        let signed = k == K::I32;
        let ps = ptrs(fr, pointer);
        let first = ps.get(mask.trailing_zeros() as usize).copied();
        for l in self.instruction(first, mask, true)? {
            let p = ps[l];
            if p.off == INVALID {
                continue;
            }
            let mut old = [0u32];
            self.mem(fr, p, pm, &mut old, l, span, false)?;
            let (old, v) = (old[0], data(fr, value)[l]);
            let new = match fun {
                A::Add => old.wrapping_add(v),
                A::Subtract => old.wrapping_sub(v),
                A::And => old & v,
                A::InclusiveOr => old | v,
                A::ExclusiveOr => old ^ v,
                A::Min if signed => (old as i32).min(v as i32) as u32,
                A::Max if signed => (old as i32).max(v as i32) as u32,
                A::Min => old.min(v),
                A::Max => old.max(v),
                A::Exchange { compare: None } => v,
                A::Exchange { compare: Some(_) } => {
                    return Err(Error::Unsupported("atomicCompareExchangeWeak".into()))
                }
            };
            self.mem(fr, p, pm, &mut [new], l, span, true)?;
            res[l] = old;
        }
        self.tally_discard(u64::from(mask.count_ones()));
        if let Some(r) = result {
            fr.vals[r.index()] = Val::D(res);
        }
        Ok(())
    }
}

/// What `pointer` points at.
pub(super) fn pointee<'a>(fr: &'a Frame, pointer: Handle<Expression>) -> Res<&'a PtrMeta> {
    fr.prep.metas[pointer.index()]
        .ptr
        .as_ref()
        .ok_or_else(|| internal("an access through a non-pointer"))
}
