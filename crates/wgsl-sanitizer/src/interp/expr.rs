//! Expressions, evaluated for the lanes of an active mask into lane-major values.

use naga::{AddressSpace, Expression, Handle, Span, TypeInner};

use super::dispatch::literal;
use super::{
    data, expr_span, fold, internal, lanes, ptrs, take_buf, Exec, Frame, Ptr, Res, Val, INVALID,
    LOCAL,
};
use crate::findings::FindingKind as FK;
use crate::math::{self, from_f64};
use crate::prepare::Bound;
use crate::types::K;
use crate::Error;

impl Exec<'_, '_> {
    /// Evaluates expression `h` for the lanes in `mask`.
    pub(super) fn eval(&mut self, fr: &mut Frame, h: Handle<Expression>, mask: u64) -> Res<()> {
        self.lane_ops += mask.count_ones() as u64;
        let w = self.w();
        let meta = &fr.prep.metas[h.index()];
        let n = meta.n as usize;
        let expr = &fr.f.expressions[h];
        if self.tally.is_some() && super::count::costs_expr(expr) {
            // A vector operation is one instruction per component on scalar GPUs (NVIDIA,
            // AMD); an index or a texel read is one. A cooperative matrix (the only values
            // of more than 16 components) is the subgroup's together: each lane holds
            // n / w of its elements and moves or multiplies them 4 at a time (a 16 × 16
            // f16 fragment is one 16-byte access a lane on NVIDIA, ldmatrix.x4 from shared
            // memory; a 16 × 16 × 16 multiply-add two mma.m16n8k16): n / (4 w) warp
            // instructions, not one per element.
            let per = match expr {
                Expression::Access { .. } | Expression::ImageLoad { .. } => 1,
                _ if n > 16 => (n / (4 * w)).max(1),
                _ => n.max(1),
            };
            for _ in 0..per {
                self.tally_instruction(mask);
            }
        }
        match *expr {
            Expression::Literal(l) => {
                let x = literal(l)?;
                fr.vals[h.index()] = Val::D(vec![x; w]);
            }
            Expression::Constant(c) => {
                let v = &self.p.consts[c.index()];
                fr.vals[h.index()] = Val::D(v.repeat(w));
            }
            Expression::Override(o) => {
                let v = &self.p.overrides[o.index()];
                fr.vals[h.index()] = Val::D(v.repeat(w));
            }
            Expression::ZeroValue(_) => {
                fr.vals[h.index()] = Val::D(vec![0; w * n]);
            }
            Expression::Compose { ref components, .. } => {
                self.ensure_all(fr, components.iter().copied())?;
                let mut out = take_buf(fr, h, w * n);
                for l in lanes(mask) {
                    let mut at = l * n;
                    for c in components {
                        let cn = fr.prep.metas[c.index()].n as usize;
                        out[at..at + cn].copy_from_slice(&data(fr, *c)[l * cn..(l + 1) * cn]);
                        at += cn;
                    }
                }
                fr.vals[h.index()] = Val::D(out);
            }
            Expression::Splat { size, value } => {
                self.ensure(fr, value)?;
                let s = size as usize;
                let mut out = take_buf(fr, h, w * s);
                let v = data(fr, value);
                for l in lanes(mask) {
                    out[l * s..(l + 1) * s].fill(v[l]);
                }
                fr.vals[h.index()] = Val::D(out);
            }
            Expression::Swizzle {
                size,
                vector,
                pattern,
            } => {
                self.ensure(fr, vector)?;
                let s = size as usize;
                let vn = fr.prep.metas[vector.index()].n as usize;
                let mut out = take_buf(fr, h, w * s);
                let v = data(fr, vector);
                for l in lanes(mask) {
                    for i in 0..s {
                        out[l * s + i] = v[l * vn + pattern[i] as usize];
                    }
                }
                fr.vals[h.index()] = Val::D(out);
            }
            Expression::FunctionArgument(i) => {
                fr.vals[h.index()] = fr.args[i as usize].clone();
            }
            Expression::GlobalVariable(gv) => {
                let g = &self.p.sh.module.global_variables[gv];
                fr.vals[h.index()] = if g.space == AddressSpace::Handle {
                    Val::Img(gv.index() as u32)
                } else {
                    Val::P(vec![
                        Ptr {
                            mem: gv.index() as u32,
                            off: 0
                        };
                        w
                    ])
                };
            }
            Expression::LocalVariable(lv) => {
                fr.vals[h.index()] = Val::P(vec![
                    Ptr {
                        mem: LOCAL | (fr.depth << 16) | lv.index() as u32,
                        off: 0
                    };
                    w
                ]);
            }
            Expression::Access { base, index } => {
                self.ensure_all(fr, [base, index])?;
                self.access(fr, h, base, Some(index), mask)?;
            }
            Expression::AccessIndex { base, .. } => {
                self.ensure(fr, base)?;
                self.access(fr, h, base, None, mask)?;
            }
            Expression::Load { pointer } => {
                self.ensure(fr, pointer)?;
                let mut out = take_buf(fr, h, w * n);
                let span = expr_span(fr, h);
                self.load_into(fr, pointer, &mut out, n, span, mask)?;
                fr.vals[h.index()] = Val::D(out);
            }
            Expression::ImageLoad {
                image,
                coordinate,
                level,
                ..
            } => {
                self.ensure_all(
                    fr,
                    [Some(image), Some(coordinate), level].into_iter().flatten(),
                )?;
                self.image_load(fr, h, image, coordinate, level, mask)?;
            }
            Expression::ImageQuery { image, query } => {
                self.ensure(fr, image)?;
                self.image_query(fr, h, image, query, mask)?;
            }
            Expression::Unary { op, expr: e } => {
                self.ensure(fr, e)?;
                let k = fr.prep.metas[e.index()]
                    .k
                    .ok_or_else(|| internal("unary kind"))?;
                let mut out = take_buf(fr, h, w * n);
                map_leaves(&mut out, data(fr, e), n, mask, |x| math::unary(op, k, x))?;
                fr.vals[h.index()] = Val::D(out);
            }
            Expression::Binary { op, left, right } => {
                self.ensure_all(fr, [left, right])?;
                self.binary(fr, h, op, left, right, mask)?;
            }
            Expression::Select {
                condition,
                accept,
                reject,
            } => {
                self.ensure_all(fr, [condition, accept, reject])?;
                let cn = fr.prep.metas[condition.index()].n as usize;
                let mut out = take_buf(fr, h, w * n);
                let (c, a, r) = (data(fr, condition), data(fr, accept), data(fr, reject));
                for l in lanes(mask) {
                    for i in 0..n {
                        let ci = if cn == 1 { l } else { l * cn + i };
                        out[l * n + i] = if c[ci] != 0 {
                            a[l * n + i]
                        } else {
                            r[l * n + i]
                        };
                    }
                }
                fr.vals[h.index()] = Val::D(out);
            }
            Expression::Relational { fun, argument } => {
                self.ensure(fr, argument)?;
                let am = &fr.prep.metas[argument.index()];
                let an = am.n as usize;
                let k = am.k.ok_or_else(|| internal("relational kind"))?;
                let mut out = take_buf(fr, h, w * n);
                let a = data(fr, argument);
                for l in lanes(mask) {
                    let v = &a[l * an..(l + 1) * an];
                    use naga::RelationalFunction as R;
                    match fun {
                        R::All => out[l] = v.iter().all(|x| *x != 0) as u32,
                        R::Any => out[l] = v.iter().any(|x| *x != 0) as u32,
                        R::IsNan | R::IsInf => {
                            for i in 0..an {
                                let x = math::to_f64(k, v[i]);
                                out[l * n + i] = if fun == R::IsNan {
                                    x.is_nan() as u32
                                } else {
                                    x.is_infinite() as u32
                                };
                            }
                        }
                    }
                }
                fr.vals[h.index()] = Val::D(out);
            }
            Expression::Math {
                fun,
                arg,
                arg1,
                arg2,
                arg3,
            } => {
                self.ensure_all(fr, [Some(arg), arg1, arg2, arg3].into_iter().flatten())?;
                self.math(fr, h, fun, [Some(arg), arg1, arg2, arg3], mask)?;
            }
            Expression::As {
                expr: e,
                kind,
                convert,
            } => {
                self.ensure(fr, e)?;
                let em = &fr.prep.metas[e.index()];
                let en = em.n as usize;
                let from = em.k.ok_or_else(|| internal("conversion kind"))?;
                let to = meta.k.ok_or_else(|| internal("conversion kind"))?;
                let mut out = take_buf(fr, h, w * n);
                let a = data(fr, e);
                match convert {
                    Some(_) => {
                        map_leaves(&mut out, a, n, mask, |x| Ok(math::convert(from, to, x)))?;
                    }
                    None if en == n && from.bytes() == to.bytes() => {
                        map_leaves(&mut out, a, n, mask, Ok)?;
                    }
                    None if from == K::F16 && en == 2 * n => {
                        for l in lanes(mask) {
                            for i in 0..n {
                                out[l * n + i] = a[l * en + 2 * i] | (a[l * en + 2 * i + 1] << 16);
                            }
                        }
                    }
                    None if to == K::F16 && n == 2 * en => {
                        for l in lanes(mask) {
                            for i in 0..en {
                                out[l * n + 2 * i] = a[l * en + i] & 0xffff;
                                out[l * n + 2 * i + 1] = a[l * en + i] >> 16;
                            }
                        }
                    }
                    None => {
                        return Err(Error::Unsupported(format!(
                            "bitcast from {en}×{from:?} to {n}×{to:?} ({kind:?})"
                        )))
                    }
                }
                let _ = kind;
                if self.p.check_nf && to.is_float() && from != to {
                    let span = expr_span(fr, h);
                    self.check_nf(fr, span, &out, n, to, &[e], mask);
                }
                fr.vals[h.index()] = Val::D(out);
            }
            Expression::ArrayLength(e) => {
                self.ensure(fr, e)?;
                let inner = fr.info[e].ty.inner_with(&self.p.sh.module.types);
                let stride = match *inner {
                    TypeInner::Pointer { base, .. } => match self.p.sh.module.types[base].inner {
                        TypeInner::Array { stride, .. } => stride,
                        _ => return Err(internal("arrayLength of a non-array")),
                    },
                    _ => return Err(internal("arrayLength of a non-pointer")),
                };
                let ps = ptrs(fr, e).to_vec();
                let mut out = take_buf(fr, h, w);
                for l in lanes(mask) {
                    let len = self.mem_len(ps[l]);
                    out[l] = len.saturating_sub(ps[l].off) / stride;
                }
                fr.vals[h.index()] = Val::D(out);
            }
            Expression::CallResult(_)
            | Expression::AtomicResult { .. }
            | Expression::WorkGroupUniformLoadResult { .. }
            | Expression::SubgroupBallotResult
            | Expression::SubgroupOperationResult { .. } => {
                // Set by their statements.
                if matches!(fr.vals[h.index()], Val::Empty) {
                    return Err(internal("a result read before its statement ran"));
                }
            }
            Expression::CooperativeLoad {
                columns,
                rows,
                role: _,
                ref data,
            } => {
                self.coop_load(fr, h, columns as usize, rows as usize, data, mask)?;
            }
            Expression::CooperativeMultiplyAdd { a, b, c } => {
                self.ensure_all(fr, [a, b, c])?;
                self.coop_mma(fr, h, a, b, c, mask)?;
            }
            ref other => {
                return Err(Error::Unsupported(format!(
                    "the expression {}",
                    expr_name(other)
                )))
            }
        }
        Ok(())
    }

    fn access(
        &mut self,
        fr: &mut Frame,
        h: Handle<Expression>,
        base: Handle<Expression>,
        index: Option<Handle<Expression>>,
        mask: u64,
    ) -> Res<()> {
        let w = self.w();
        let step = fr.prep.metas[h.index()]
            .step
            .ok_or_else(|| internal("access step"))?;
        let span = expr_span(fr, h);
        match fr.vals[base.index()] {
            Val::P(ref bp) => {
                let mut out = bp.clone();
                for l in lanes(mask) {
                    let mut p = out[l];
                    if p.off == INVALID {
                        continue;
                    }
                    if let Some(ix) = index {
                        let i = data(fr, ix)[l];
                        let len = match step.bound {
                            Bound::Fixed(n) => n,
                            Bound::Runtime { stride } => {
                                let ml = self.mem_len(p);
                                ml.saturating_sub(p.off) / stride.max(1)
                            }
                        };
                        if i >= len {
                            let name = self.mem_name(fr, p);
                            self.finding(FK::OutOfBounds, span, Some(l), None, None, || {
                                format!("index {} into {name} of length {len}", i as i32)
                            });
                            p.off = INVALID;
                            out[l] = p;
                            continue;
                        }
                        p.off = p.off.wrapping_add(i.wrapping_mul(step.mul));
                    }
                    p.off = p.off.wrapping_add(step.add);
                    out[l] = p;
                }
                fr.vals[h.index()] = Val::P(out);
            }
            Val::D(_) => {
                let bn = fr.prep.metas[base.index()].n as usize;
                let n = fr.prep.metas[h.index()].n as usize;
                let mut out = take_buf(fr, h, w * n);
                for l in lanes(mask) {
                    let mut at = step.add as usize;
                    if let Some(ix) = index {
                        let i = data(fr, ix)[l];
                        let len = match step.bound {
                            Bound::Fixed(n) => n,
                            Bound::Runtime { .. } => 0,
                        };
                        if i >= len {
                            self.finding(FK::OutOfBounds, span, Some(l), None, None, || {
                                format!("index {} into a value of length {len}", i as i32)
                            });
                            out[l * n..(l + 1) * n].fill(0);
                            continue;
                        }
                        at += i as usize * step.mul as usize;
                    }
                    let b = data(fr, base);
                    out[l * n..(l + 1) * n].copy_from_slice(&b[l * bn + at..l * bn + at + n]);
                }
                fr.vals[h.index()] = Val::D(out);
            }
            _ => return Err(internal("access base")),
        }
        Ok(())
    }

    fn binary(
        &mut self,
        fr: &mut Frame,
        h: Handle<Expression>,
        op: naga::BinaryOperator,
        left: Handle<Expression>,
        right: Handle<Expression>,
        mask: u64,
    ) -> Res<()> {
        let w = self.w();
        let n = fr.prep.metas[h.index()].n as usize;
        let lm = &fr.prep.metas[left.index()];
        let rm = &fr.prep.metas[right.index()];
        let (ln, rn) = (lm.n as usize, rm.n as usize);
        let k = lm.k.ok_or_else(|| internal("binary kind"))?;
        let lmat = matches!(
            fr.info[left].ty.inner_with(&self.p.sh.module.types),
            TypeInner::Matrix { .. }
        );
        let rmat = matches!(
            fr.info[right].ty.inner_with(&self.p.sh.module.types),
            TypeInner::Matrix { .. }
        );
        if (lmat || rmat) && op == naga::BinaryOperator::Multiply && ln > 1 && rn > 1 {
            return Err(Error::Unsupported("matrix products".into()));
        }
        if k.is_float()
            && matches!(
                op,
                naga::BinaryOperator::Add
                    | naga::BinaryOperator::Subtract
                    | naga::BinaryOperator::Multiply
                    | naga::BinaryOperator::Divide
            )
        {
            self.tally_flops(k, n as u64, mask);
        }
        let mut out = take_buf(fr, h, w * n);
        let (a, b) = (data(fr, left), data(fr, right));
        for l in lanes(mask) {
            for i in 0..n {
                let x = a[l * ln + if ln == 1 { 0 } else { i }];
                let y = b[l * rn + if rn == 1 { 0 } else { i }];
                out[l * n + i] = math::binary(op, k, x, y)?;
            }
        }
        if self.p.check_nf
            && k.is_float()
            && fr.prep.metas[h.index()].k.is_some_and(|k| k.is_float())
        {
            let span = expr_span(fr, h);
            self.check_nf(fr, span, &out, n, k, &[left, right], mask);
        }
        fr.vals[h.index()] = Val::D(out);
        Ok(())
    }

    /// Warns when a lane's float result is not finite while its operands all are.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn check_nf(
        &mut self,
        fr: &Frame,
        span: Span,
        out: &[u32],
        n: usize,
        k: K,
        operands: &[Handle<Expression>],
        mask: u64,
    ) {
        for l in lanes(mask) {
            if out[l * n..(l + 1) * n].iter().all(|x| math::finite(k, *x)) {
                continue;
            }
            let mut ok = true;
            for o in operands {
                let om = &fr.prep.metas[o.index()];
                let on = om.n as usize;
                let ok_k = om.k.unwrap_or(K::U32);
                let v = data(fr, *o);
                if v.len() >= (l + 1) * on
                    && !v[l * on..(l + 1) * on]
                        .iter()
                        .all(|x| math::finite(ok_k, *x))
                {
                    ok = false;
                }
            }
            if ok {
                self.finding(FK::NonFinite, span, Some(l), None, None, || {
                    "a non-finite result from finite operands".into()
                });
                return;
            }
        }
    }

    fn math(
        &mut self,
        fr: &mut Frame,
        h: Handle<Expression>,
        fun: naga::MathFunction,
        args: [Option<Handle<Expression>>; 4],
        mask: u64,
    ) -> Res<()> {
        use naga::MathFunction as M;
        let w = self.w();
        let n = fr.prep.metas[h.index()].n as usize;
        let a0 = args[0].expect("first argument");
        let k = fr.prep.metas[a0.index()]
            .k
            .ok_or_else(|| internal("math kind"))?;
        let an = fr.prep.metas[a0.index()].n as usize;
        if self.tally.is_some() {
            let (per, special) = super::count::math_cost(fun);
            let flops = if fun == M::Dot {
                2 * an
            } else {
                per as usize * n
            };
            self.tally_flops(k, flops as u64, mask);
            if special {
                let lanes = u64::from(mask.count_ones());
                self.tally_add(|c| &mut c.special, n as u64 * lanes);
            }
        }
        let mut out = take_buf(fr, h, w * n);
        let arg = |i: usize| args[i].map(|a| (data(fr, a), fr.prep.metas[a.index()].n as usize));
        let (x, y, z, q) = (arg(0), arg(1), arg(2), arg(3));
        let get = |v: &Option<(&[u32], usize)>, l: usize, i: usize| -> u32 {
            match v {
                Some((d, vn)) => d[l * vn + if *vn == 1 { 0 } else { i }],
                None => 0,
            }
        };
        match fun {
            M::Dot => {
                use naga::BinaryOperator as B;
                for l in lanes(mask) {
                    let products =
                        (0..an).map(|i| math::binary(B::Multiply, k, get(&x, l, i), get(&y, l, i)));
                    out[l] = fold(products, |s, p| math::binary(B::Add, k, s, p))?.unwrap_or(0);
                }
            }
            M::Length | M::Distance | M::Normalize => {
                for l in lanes(mask) {
                    let mut s = 0f64;
                    let mut comps = Vec::with_capacity(an);
                    for i in 0..an {
                        let mut v = math::to_f64(k, get(&x, l, i));
                        if fun == M::Distance {
                            v -= math::to_f64(k, get(&y, l, i));
                        }
                        comps.push(v);
                        s += v * v;
                    }
                    let len = s.sqrt();
                    if fun == M::Normalize {
                        for i in 0..an {
                            out[l * n + i] = from_f64(k, comps[i] / len);
                        }
                    } else {
                        out[l] = from_f64(k, len);
                    }
                }
            }
            M::Cross => {
                for l in lanes(mask) {
                    let f = |v: &Option<(&[u32], usize)>, i| math::to_f64(k, get(v, l, i));
                    let r = [
                        f(&x, 1) * f(&y, 2) - f(&x, 2) * f(&y, 1),
                        f(&x, 2) * f(&y, 0) - f(&x, 0) * f(&y, 2),
                        f(&x, 0) * f(&y, 1) - f(&x, 1) * f(&y, 0),
                    ];
                    for i in 0..3 {
                        out[l * 3 + i] = from_f64(k, r[i]);
                    }
                }
            }
            M::InsertBits => {
                for l in lanes(mask) {
                    for i in 0..n {
                        out[l * n + i] = math::insert_bits(
                            get(&x, l, i),
                            get(&y, l, i),
                            get(&z, l, 0),
                            get(&q, l, 0),
                        );
                    }
                }
            }
            M::ExtractBits => {
                for l in lanes(mask) {
                    for i in 0..n {
                        out[l * n + i] =
                            math::math(fun, k, get(&x, l, i), get(&y, l, 0), get(&z, l, 0))?;
                    }
                }
            }
            M::Pack2x16float => {
                for l in lanes(mask) {
                    let lo = math::convert(K::F32, K::F16, get(&x, l, 0));
                    let hi = math::convert(K::F32, K::F16, get(&x, l, 1));
                    out[l] = lo | (hi << 16);
                }
            }
            M::Unpack2x16float => {
                for l in lanes(mask) {
                    let v = get(&x, l, 0);
                    out[l * 2] = math::convert(K::F16, K::F32, v & 0xffff);
                    out[l * 2 + 1] = math::convert(K::F16, K::F32, v >> 16);
                }
            }
            _ => {
                for l in lanes(mask) {
                    for i in 0..n {
                        out[l * n + i] =
                            math::math(fun, k, get(&x, l, i), get(&y, l, i), get(&z, l, i))?;
                    }
                }
            }
        }
        let rk = fr.prep.metas[h.index()].k;
        if self.p.check_nf && rk.is_some_and(|k| k.is_float()) {
            let span = expr_span(fr, h);
            let ops: Vec<_> = args.iter().flatten().copied().collect();
            self.check_nf(fr, span, &out, n, rk.expect("kind"), &ops, mask);
        }
        fr.vals[h.index()] = Val::D(out);
        Ok(())
    }
}

/// `out[l * n + i] = f(a[l * n + i])` for the lanes in `mask`.
fn map_leaves(
    out: &mut [u32],
    a: &[u32],
    n: usize,
    mask: u64,
    mut f: impl FnMut(u32) -> Res<u32>,
) -> Res<()> {
    for l in lanes(mask) {
        for i in l * n..(l + 1) * n {
            out[i] = f(a[i])?;
        }
    }
    Ok(())
}

fn expr_name(e: &Expression) -> String {
    let s = format!("{e:?}");
    s.split([' ', '(', '{']).next().unwrap_or("?").to_string()
}
