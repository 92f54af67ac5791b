//! Subgroup operations on the active lanes: ballots, broadcasts and shuffles (a read of an
//! inactive lane is a finding), reductions and scans.

use naga::{Expression, Handle, Span};

use super::{data, fold, internal, lanes, lanes_where, take_buf, Exec, Frame, Res, Val};
use crate::findings::FindingKind as FK;
use crate::math;
use crate::types::K;
use crate::Error;

impl Exec<'_, '_> {
    /// `subgroupBallot(predicate)` for the lanes in `mask`: the active lanes whose predicate
    /// holds, as a `vec4<u32>`.
    pub(super) fn ballot(
        &mut self,
        fr: &mut Frame,
        predicate: Option<Handle<Expression>>,
        result: Handle<Expression>,
        mask: u64,
    ) -> Res<()> {
        let bits = match predicate {
            Some(p) => {
                self.ensure(fr, p)?;
                lanes_where(data(fr, p), mask)
            }
            None => mask,
        };
        let w = self.w();
        let mut out = take_buf(fr, result, w * 4);
        for l in lanes(mask) {
            out[l * 4..l * 4 + 4].copy_from_slice(&[bits as u32, (bits >> 32) as u32, 0, 0]);
        }
        fr.vals[result.index()] = Val::D(out);
        Ok(())
    }

    /// A subgroup gather (broadcast or shuffle) or collective operation (reduction or scan)
    /// of `argument` for the lanes in `mask`, into `result`.
    pub(super) fn subgroup_op(
        &mut self,
        fr: &mut Frame,
        op: SgOp,
        argument: Handle<Expression>,
        result: Handle<Expression>,
        span: Span,
        mask: u64,
    ) -> Res<()> {
        self.ensure(fr, argument)?;
        let w = self.w();
        let am = &fr.prep.metas[argument.index()];
        let n = am.n as usize;
        let k = am.k;
        let mut out = take_buf(fr, result, w * n);
        match op {
            SgOp::Gather(mode) => {
                let index = gather_index(mode)?;
                if let Some(i) = index {
                    self.ensure(fr, i)?;
                }
                let index = index.map(|i| data(fr, i));
                let bad = gather(mode, data(fr, argument), index, &mut out, (n, w), mask);
                for (l, src) in bad {
                    let other = (0..w as i64).contains(&src).then(|| self.inv0 + src as u32);
                    self.finding(FK::InactiveLaneRead, span, Some(l), other, None, || {
                        format!(
                            "{mode:?} reads lane {src}, which is not active (active lanes {mask:#x})"
                        )
                    });
                }
            }
            SgOp::Collective(op, cop) => {
                let k = k.ok_or_else(|| internal("subgroup operation kind"))?;
                collective((op, cop), k, data(fr, argument), &mut out, n, mask)?;
                if self.p.check_nf && k.is_float() {
                    self.check_nf(fr, span, &out, n, k, &[argument], mask);
                }
            }
        }
        fr.vals[result.index()] = Val::D(out);
        Ok(())
    }
}

/// A subgroup operation on one value per lane.
pub(super) enum SgOp {
    Gather(naga::GatherMode),
    Collective(naga::SubgroupOperation, naga::CollectiveOperation),
}

/// The lane index (or offset) expression of a gather.
fn gather_index(mode: naga::GatherMode) -> Res<Option<Handle<Expression>>> {
    use naga::GatherMode as G;
    match mode {
        G::BroadcastFirst => Ok(None),
        G::Broadcast(i)
        | G::Shuffle(i)
        | G::ShuffleDown(i)
        | G::ShuffleUp(i)
        | G::ShuffleXor(i) => Ok(Some(i)),
        G::QuadBroadcast(_) | G::QuadSwap(_) => Err(Error::Unsupported("quad operations".into())),
    }
}

/// Each lane of `mask` gets the `n` leaves of `a` of the lane `mode` names (by `index`);
/// returns the lanes that named an inactive lane (or none), with that lane: they get zero.
fn gather(
    mode: naga::GatherMode,
    a: &[u32],
    index: Option<&[u32]>,
    out: &mut [u32],
    (n, w): (usize, usize),
    mask: u64,
) -> Vec<(usize, i64)> {
    use naga::GatherMode as G;
    let first = mask.trailing_zeros() as usize;
    let mut bad = Vec::new();
    for l in lanes(mask) {
        let iv = index.map_or(0, |d| d[l]) as i64;
        let src = match mode {
            G::BroadcastFirst => first as i64,
            G::ShuffleDown(_) => l as i64 + iv,
            G::ShuffleUp(_) => l as i64 - iv,
            G::ShuffleXor(_) => (l as i64) ^ iv,
            _ => iv,
        };
        if src < 0 || src >= w as i64 || mask & (1u64 << src) == 0 {
            out[l * n..(l + 1) * n].fill(0);
            bad.push((l, src));
            continue;
        }
        let s = src as usize;
        out[l * n..(l + 1) * n].copy_from_slice(&a[s * n..(s + 1) * n]);
    }
    bad
}

/// A reduction or scan of `a` (kind `k`, `n` leaves a lane) over the lanes of `mask`.
fn collective(
    (op, cop): (naga::SubgroupOperation, naga::CollectiveOperation),
    k: K,
    a: &[u32],
    out: &mut [u32],
    n: usize,
    mask: u64,
) -> Res<()> {
    use naga::BinaryOperator as B;
    use naga::CollectiveOperation as C;
    use naga::SubgroupOperation as S;
    let combine = |x: u32, y: u32| -> Res<u32> {
        Ok(match op {
            S::Add => math::binary(B::Add, k, x, y)?,
            S::Mul => math::binary(B::Multiply, k, x, y)?,
            S::Min => math::math(naga::MathFunction::Min, k, x, y, 0)?,
            S::Max => math::math(naga::MathFunction::Max, k, x, y, 0)?,
            S::And | S::All => x & y,
            S::Or | S::Any => x | y,
            S::Xor => x ^ y,
        })
    };
    let identity = |k: K| -> u32 {
        match op {
            S::Add | S::Or | S::Any | S::Xor => 0,
            S::Mul => match k {
                K::F32 => 1f32.to_bits(),
                K::F16 => math::hw(1.0),
                _ => 1,
            },
            S::And | S::All => {
                if k == K::Bool {
                    1
                } else {
                    u32::MAX
                }
            }
            S::Min => match k {
                K::F32 => f32::INFINITY.to_bits(),
                K::F16 => 0x7c00,
                K::I32 => i32::MAX as u32,
                _ => u32::MAX,
            },
            S::Max => match k {
                K::F32 => f32::NEG_INFINITY.to_bits(),
                K::F16 => 0xfc00,
                K::I32 => i32::MIN as u32,
                _ => 0,
            },
        }
    };
    for i in 0..n {
        match cop {
            C::Reduce => {
                let r =
                    fold(lanes(mask).map(|l| Ok(a[l * n + i])), combine)?.unwrap_or(identity(k));
                for l in lanes(mask) {
                    out[l * n + i] = r;
                }
            }
            C::InclusiveScan | C::ExclusiveScan => {
                let mut acc = identity(k);
                for l in lanes(mask) {
                    let v = a[l * n + i];
                    let next = combine(acc, v)?;
                    out[l * n + i] = if cop == C::InclusiveScan { next } else { acc };
                    acc = next;
                }
            }
        }
    }
    Ok(())
}
