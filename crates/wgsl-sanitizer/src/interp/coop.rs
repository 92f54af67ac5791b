//! Cooperative matrices: `coopLoad`, `coopStore` and `coopMultiplyAdd` of a whole subgroup,
//! in subgroup-uniform control flow.

use naga::{Expression, Handle, Span, TypeInner};

use super::memory::pointee;
use super::{
    data, expr_span, internal, lanes, ptrs, take_buf, Exec, Frame, Ptr, Res, Val, INVALID,
};
use crate::math::{self, from_f64};
use crate::prepare::PtrMeta;
use crate::types::{Leaves, K};
use crate::Error;

impl Exec<'_, '_> {
    /// Where a cooperative load or store of a `cols × rows` matrix goes: the lane that does
    /// it for the subgroup, what each element pointer points at, and the pointer of each
    /// element in the value's order (column-major: element (r, c) is leaf `c * rows + r`),
    /// none when the base pointer is out of bounds. The pointer and stride must be the same
    /// in every active lane (the operation is the subgroup's), in uniform control flow.
    fn coop_places(
        &mut self,
        fr: &mut Frame,
        d: &naga::CooperativeData,
        (cols, rows): (usize, usize),
        mask: u64,
    ) -> Res<(usize, PtrMeta, Vec<Ptr>)> {
        self.ensure(fr, d.pointer)?;
        self.ensure(fr, d.stride)?;
        if mask != self.alive {
            return Err(Error::Unsupported(
                "a cooperative matrix operation in divergent control flow".into(),
            ));
        }
        let lane = mask.trailing_zeros() as usize;
        let p = ptrs(fr, d.pointer)[lane];
        let stride = data(fr, d.stride)[lane] as usize;
        let pm = pointee(fr, d.pointer)?;
        let k = pm.k.ok_or_else(|| internal("coop element kind"))?;
        let unit = if pm.bytes { k.bytes() } else { 1 };
        // One element per access.
        let one = PtrMeta {
            leaves: Some(std::sync::Arc::new(Leaves {
                kinds: vec![k],
                offsets: vec![0],
            })),
            ..pm.clone()
        };
        self.instruction(Some(p), 1 << lane, false)?;
        let mut places = Vec::new();
        if p.off != INVALID {
            for c in 0..cols {
                for r in 0..rows {
                    let e = if d.row_major {
                        r * stride + c
                    } else {
                        c * stride + r
                    };
                    places.push(Ptr {
                        mem: p.mem,
                        off: p.off + e as u32 * unit,
                    });
                }
            }
        }
        Ok((lane, one, places))
    }

    pub(super) fn coop_load(
        &mut self,
        fr: &mut Frame,
        h: Handle<Expression>,
        cols: usize,
        rows: usize,
        d: &naga::CooperativeData,
        mask: u64,
    ) -> Res<()> {
        let (lane, pm, places) = self.coop_places(fr, d, (cols, rows), mask)?;
        let span = expr_span(fr, h);
        let n = rows * cols;
        let mut m = vec![0u32; n];
        for (leaf, q) in m.iter_mut().zip(places) {
            self.mem(fr, q, &pm, std::slice::from_mut(leaf), lane, span, false)?;
        }
        self.tally_flush(false);
        self.set_uniform(fr, h, &m, mask);
        Ok(())
    }

    pub(super) fn coop_store(
        &mut self,
        fr: &mut Frame,
        target: Handle<Expression>,
        d: &naga::CooperativeData,
        span: Span,
        mask: u64,
    ) -> Res<()> {
        self.ensure(fr, target)?;
        let (cols, rows) = match *fr.info[target].ty.inner_with(&self.p.sh.module.types) {
            TypeInner::CooperativeMatrix { columns, rows, .. } => (columns as usize, rows as usize),
            _ => return Err(internal("coop store of a non-matrix")),
        };
        let (lane, pm, places) = self.coop_places(fr, d, (cols, rows), mask)?;
        let n = rows * cols;
        let mut m = data(fr, target)[lane * n..(lane + 1) * n].to_vec();
        for (leaf, q) in m.iter_mut().zip(places) {
            self.mem(fr, q, &pm, std::slice::from_mut(leaf), lane, span, true)?;
        }
        self.tally_flush(true);
        Ok(())
    }

    pub(super) fn coop_mma(
        &mut self,
        fr: &mut Frame,
        h: Handle<Expression>,
        a: Handle<Expression>,
        b: Handle<Expression>,
        c: Handle<Expression>,
        mask: u64,
    ) -> Res<()> {
        let types = &self.p.sh.module.types;
        let dims = |e: Handle<Expression>| match *fr.info[e].ty.inner_with(types) {
            TypeInner::CooperativeMatrix {
                columns,
                rows,
                scalar,
                ..
            } => Ok((columns as usize, rows as usize, K::of(scalar)?)),
            _ => Err(internal("coop operand")),
        };
        let (ak, am, aks) = dims(a)?; // a: am rows × ak columns
        let (bn, bk, bks) = dims(b)?;
        let (cn, cm, cks) = dims(c)?;
        if ak != bk || am != cm || bn != cn {
            return Err(internal("coop shapes"));
        }
        if mask != self.alive {
            return Err(Error::Unsupported(
                "a cooperative matrix operation in divergent control flow".into(),
            ));
        }
        self.tally_add(|c| &mut c.coop_flops, (2 * am * ak * cn) as u64);
        let l = mask.trailing_zeros() as usize;
        let (an, bnn, cnn) = (am * ak, bk * bn, cm * cn);
        let av = &data(fr, a)[l * an..(l + 1) * an];
        let bv = &data(fr, b)[l * bnn..(l + 1) * bnn];
        let cv = &data(fr, c)[l * cnn..(l + 1) * cnn];
        let mut r = vec![0u32; cnn];
        for i in 0..cm {
            for j in 0..cn {
                // Products of the inputs are exact in f64; the sum is kept at the
                // accumulator's precision after each step.
                let mut acc = math::to_f64(cks, cv[j * cm + i]);
                for kk in 0..ak {
                    let x = math::to_f64(aks, av[kk * am + i]);
                    let y = math::to_f64(bks, bv[j * bk + kk]);
                    acc = math::to_f64(cks, from_f64(cks, acc + x * y));
                }
                r[j * cm + i] = from_f64(cks, acc);
            }
        }
        self.set_uniform(fr, h, &r, mask);
        Ok(())
    }

    /// Sets `h` to the subgroup's matrix `m`, held by every lane in `mask`.
    fn set_uniform(&self, fr: &mut Frame, h: Handle<Expression>, m: &[u32], mask: u64) {
        let n = m.len();
        let mut out = take_buf(fr, h, self.w() * n);
        for l in lanes(mask) {
            out[l * n..(l + 1) * n].copy_from_slice(m);
        }
        fr.vals[h.index()] = Val::D(out);
    }
}
