//! Calls and statements, run for the lanes of an active mask: each statement returns the
//! lanes that carry on after it (those that did not `break`, `continue` or `return`).

use naga::{Block, Expression, Function, Handle, Span, Statement, TypeInner};

use super::subgroup::SgOp;
use super::{data, internal, lanes, lanes_where, take_buf, Brk, Exec, Frame, Res, Val};
use crate::prepare::FnPrep;
use crate::types::leaf_count;
use crate::Error;

impl<'p> Exec<'p, '_> {
    pub(super) fn run_entry(&mut self) -> Res<()> {
        let p = self.p;
        let f = p.func;
        let w = self.w();
        // Entry point arguments: builtins.
        let mut args = Vec::new();
        for a in &f.arguments {
            let mut v = Vec::new();
            for l in 0..w {
                self.builtin_arg(a.binding.as_ref(), a.ty, l, &mut v)?;
            }
            args.push(Val::D(v));
        }
        let info = p.sh.info.get_entry_point(p.ep);
        let mask = self.alive;
        self.call(f, &p.ep_prep, info, args, mask)?;
        Ok(())
    }

    fn builtin_arg(
        &self,
        binding: Option<&naga::Binding>,
        ty: Handle<naga::Type>,
        lane: usize,
        out: &mut Vec<u32>,
    ) -> Res<()> {
        use naga::BuiltIn as B;
        let p = self.p;
        let li = self.sg * p.w + lane as u32;
        let [sx, sy, _] = p.wg_size;
        let lid = [li % sx, (li / sx) % sy, li / (sx * sy)];
        match binding {
            Some(naga::Binding::BuiltIn(b)) => match b {
                B::GlobalInvocationId => {
                    for (i, li) in lid.iter().enumerate() {
                        out.push(self.wg_id[i] * p.wg_size[i] + li);
                    }
                }
                B::LocalInvocationId => out.extend(lid),
                B::LocalInvocationIndex => out.push(li),
                B::WorkGroupId => out.extend(self.wg_id),
                B::WorkGroupSize => out.extend(p.wg_size),
                B::NumWorkGroups => out.extend(p.groups),
                B::NumSubgroups => out.push(p.n_sg),
                B::SubgroupId => out.push(self.sg),
                B::SubgroupSize => out.push(p.w),
                B::SubgroupInvocationId => out.push(lane as u32),
                other => return Err(Error::Unsupported(format!("the builtin {other:?}"))),
            },
            None => {
                if let TypeInner::Struct { ref members, .. } = p.sh.module.types[ty].inner {
                    for m in members {
                        self.builtin_arg(m.binding.as_ref(), m.ty, lane, out)?;
                    }
                }
            }
            Some(_) => return Err(Error::Unsupported("a @location input".into())),
        }
        Ok(())
    }

    /// Calls `f` for the lanes in `mask`; returns its result (lanes × leaves).
    fn call(
        &mut self,
        f: &'p Function,
        prep: &'p FnPrep,
        info: &'p naga::valid::FunctionInfo,
        args: Vec<Val>,
        mask: u64,
    ) -> Res<Vec<u32>> {
        let types = &self.p.sh.module.types;
        let w = self.w();
        let depth = self.locals.len() as u32;
        if depth > 64 {
            return Err(Error::Unsupported("calls nested deeper than 64".into()));
        }
        let ret_n = match &f.result {
            Some(r) => leaf_count(&types[r.ty].inner, types)? as usize,
            None => 0,
        };
        let mut fr = Frame {
            f,
            prep,
            info,
            vals: vec![Val::Empty; f.expressions.len()],
            args,
            depth,
            ret: vec![0; w * ret_n],
            ret_n,
            returned: 0,
            brk: Vec::new(),
        };
        // Local variables: zero (WGSL), or their initialiser.
        let mut locals = Vec::new();
        for (_, lv) in f.local_variables.iter() {
            let n = leaf_count(&types[lv.ty].inner, types)?;
            locals.push((n, vec![0u32; w * n as usize]));
        }
        self.locals.push(locals);
        for (i, (_, lv)) in f.local_variables.iter().enumerate() {
            if let Some(init) = lv.init {
                // A constant (or override) expression, evaluated at the function's entry
                // even where it is also emitted later.
                self.in_init = true;
                let r = self.ensure(&mut fr, init);
                self.in_init = false;
                r?;
                let v = data(&fr, init).to_vec();
                let n = self.locals[depth as usize][i].0 as usize;
                for l in lanes(mask) {
                    self.locals[depth as usize][i].1[l * n..(l + 1) * n]
                        .copy_from_slice(&v[l * n..(l + 1) * n]);
                }
            }
        }
        self.block(&mut fr, &f.body, mask)?;
        self.locals.pop();
        Ok(fr.ret)
    }

    /// Evaluates a non-emitted (constant-like) expression for every lane, once.
    pub(super) fn ensure(&mut self, fr: &mut Frame, h: Handle<Expression>) -> Res<()> {
        if matches!(fr.vals[h.index()], Val::Empty) {
            if fr.prep.emitted[h.index()] && !self.in_init {
                return Err(internal(&format!(
                    "expression {h:?} ({:?}) of `{}` used before it is emitted",
                    fr.f.expressions[h],
                    fr.f.name.as_deref().unwrap_or("?")
                )));
            }
            let full = self.full();
            self.eval(fr, h, full)?;
        }
        Ok(())
    }

    /// [`Self::ensure`] for each of `hs`.
    pub(super) fn ensure_all(
        &mut self,
        fr: &mut Frame,
        hs: impl IntoIterator<Item = Handle<Expression>>,
    ) -> Res<()> {
        for h in hs {
            self.ensure(fr, h)?;
        }
        Ok(())
    }

    fn block(&mut self, fr: &mut Frame, block: &'p Block, mut mask: u64) -> Res<u64> {
        for (stmt, span) in block.span_iter() {
            if mask == 0 {
                break;
            }
            mask = self.stmt(fr, stmt, *span, mask)?;
        }
        Ok(mask)
    }

    /// Whether the lanes of a subgroup run apart ([`crate::Schedule::lanes_apart`]).
    pub(super) fn apart(&self) -> bool {
        self.p.schedule.lanes_apart
    }

    /// A `switch` for `mask`: each lane runs the case its selector matches (or the default).
    fn switch(
        &mut self,
        fr: &mut Frame,
        selector: Handle<Expression>,
        cases: &'p [naga::SwitchCase],
        mask: u64,
    ) -> Res<u64> {
        self.ensure(fr, selector)?;
        let sel = data(fr, selector);
        let mut case_masks = Vec::with_capacity(cases.len());
        let mut matched = 0u64;
        for c in cases {
            let v = match c.value {
                naga::SwitchValue::I32(v) => Some(v as u32),
                naga::SwitchValue::U32(v) => Some(v),
                naga::SwitchValue::Default => None,
            };
            let mut cm = 0u64;
            if let Some(v) = v {
                for l in lanes(mask & !matched) {
                    if sel[l] == v {
                        cm |= 1 << l;
                    }
                }
                matched |= cm;
            }
            case_masks.push(cm);
        }
        for (i, c) in cases.iter().enumerate() {
            if c.value == naga::SwitchValue::Default {
                case_masks[i] = mask & !matched;
            }
        }
        // The cases in groups, each run as a whole: cases that fall through (`case 1, 2:`)
        // and the one they fall into. Lanes apart: the groups in a seeded order.
        let mut groups = Vec::new();
        let mut start = 0;
        for (i, c) in cases.iter().enumerate() {
            if !c.fall_through || i + 1 == cases.len() {
                groups.push(start..i + 1);
                start = i + 1;
            }
        }
        let live = groups
            .iter()
            .filter(|r| case_masks[(*r).clone()].iter().any(|m| *m != 0))
            .count();
        if live > 1 && self.apart() {
            for i in (1..groups.len()).rev() {
                let j = self.g().below(i as u32 + 1) as usize;
                groups.swap(i, j);
            }
        }
        fr.brk.push(Brk {
            is_loop: false,
            brk: 0,
            cont: 0,
        });
        let mut exit = 0u64;
        for group in groups {
            let mut carry = 0u64;
            for i in group {
                let run = case_masks[i] | carry;
                let fell = if run != 0 {
                    self.block(fr, &cases[i].body, run)?
                } else {
                    0
                };
                if cases[i].fall_through {
                    carry = fell;
                } else {
                    exit |= fell;
                    carry = 0;
                }
            }
            exit |= carry;
        }
        let b = fr.brk.pop().expect("switch context");
        Ok(exit | b.brk)
    }

    /// Runs one statement for `mask`; returns the lanes that carry on after it.
    fn stmt(&mut self, fr: &mut Frame, stmt: &'p Statement, span: Span, mask: u64) -> Res<u64> {
        self.lane_ops += mask.count_ones() as u64;
        if self.tally.is_some() && super::count::costs_stmt(stmt) {
            self.tally_instruction(mask);
        }
        match *stmt {
            Statement::Emit(ref r) => {
                for h in r.clone() {
                    self.eval(fr, h, mask)?;
                }
                Ok(mask)
            }
            Statement::Block(ref b) => self.block(fr, b, mask),
            Statement::If {
                condition,
                ref accept,
                ref reject,
            } => {
                self.ensure(fr, condition)?;
                let t = lanes_where(data(fr, condition), mask);
                let e = mask & !t;
                // Lanes apart: the `else` side first, sometimes.
                let sides = if t != 0 && e != 0 && self.apart() && self.g().below(2) == 1 {
                    [(reject, e), (accept, t)]
                } else {
                    [(accept, t), (reject, e)]
                };
                let mut out = 0;
                for (block, lanes) in sides {
                    if lanes != 0 {
                        out |= self.block(fr, block, lanes)?;
                    }
                }
                Ok(out)
            }
            Statement::Switch {
                selector,
                ref cases,
            } => self.switch(fr, selector, cases, mask),
            Statement::Loop {
                ref body,
                ref continuing,
                break_if,
            } => {
                let mut running = mask;
                let mut exit = 0u64;
                loop {
                    for l in lanes(running) {
                        self.iters[l] += 1;
                    }
                    self.tally_instruction(running);
                    self.tally_iteration();
                    if self.lane_ops > self.p.max_lane_ops {
                        return Err(Error::Dispatch(format!(
                            "more than {} lane-operations in one subgroup (a loop that never ends?)",
                            self.p.max_lane_ops
                        )));
                    }
                    fr.brk.push(Brk {
                        is_loop: true,
                        brk: 0,
                        cont: 0,
                    });
                    let fell = self.block(fr, body, running)?;
                    let b = fr.brk.pop().expect("loop context");
                    exit |= b.brk;
                    let cont = fell | b.cont;
                    let after = if cont != 0 {
                        self.block(fr, continuing, cont)?
                    } else {
                        0
                    };
                    running = after;
                    if let Some(bi) = break_if {
                        if after != 0 {
                            self.ensure(fr, bi)?;
                            let t = lanes_where(data(fr, bi), after);
                            exit |= t;
                            running = after & !t;
                        }
                    }
                    if running == 0 {
                        break;
                    }
                }
                Ok(exit)
            }
            Statement::Break => {
                let b = fr.brk.last_mut().ok_or_else(|| internal("break outside"))?;
                b.brk |= mask;
                Ok(0)
            }
            Statement::Continue => {
                let b = fr
                    .brk
                    .iter_mut()
                    .rev()
                    .find(|b| b.is_loop)
                    .ok_or_else(|| internal("continue outside a loop"))?;
                b.cont |= mask;
                Ok(0)
            }
            Statement::Return { value } => {
                if let Some(v) = value {
                    self.ensure(fr, v)?;
                    let n = fr.ret_n;
                    let src = data(fr, v).to_vec();
                    for l in lanes(mask) {
                        fr.ret[l * n..(l + 1) * n].copy_from_slice(&src[l * n..(l + 1) * n]);
                    }
                }
                fr.returned |= mask;
                if fr.depth == 0 {
                    self.alive &= !mask;
                }
                Ok(0)
            }
            Statement::ControlBarrier(flags) | Statement::MemoryBarrier(flags) => {
                if flags.intersects(naga::Barrier::WORK_GROUP | naga::Barrier::STORAGE) {
                    self.barrier(span, flags, mask)?;
                }
                Ok(mask)
            }
            Statement::Store { pointer, value } => {
                self.ensure_all(fr, [pointer, value])?;
                self.store(fr, pointer, value, span, mask)?;
                Ok(mask)
            }
            Statement::ImageStore {
                image,
                coordinate,
                value,
                ..
            } => {
                self.image_store(fr, image, coordinate, value, span, mask)?;
                Ok(mask)
            }
            Statement::Atomic {
                pointer,
                ref fun,
                value,
                result,
            } => {
                self.atomic(fr, pointer, fun, value, result, span, mask)?;
                Ok(mask)
            }
            Statement::WorkGroupUniformLoad { pointer, result } => {
                self.barrier(span, naga::Barrier::WORK_GROUP, mask)?;
                self.ensure(fr, pointer)?;
                let n = fr.prep.metas[result.index()].n as usize;
                let mut out = take_buf(fr, result, self.w() * n);
                self.load_into(fr, pointer, &mut out, n, span, mask)?;
                fr.vals[result.index()] = Val::D(out);
                self.barrier(span, naga::Barrier::WORK_GROUP, mask)?;
                Ok(mask)
            }
            Statement::Call {
                function,
                ref arguments,
                result,
            } => {
                let mut args = Vec::with_capacity(arguments.len());
                for a in arguments {
                    self.ensure(fr, *a)?;
                    args.push(fr.vals[a.index()].clone());
                }
                let m = &self.p.sh.module;
                let f = &m.functions[function];
                let prep = &self.p.fn_preps[function.index()];
                let info = &self.p.sh.info[function];
                let ret = self.call(f, prep, info, args, mask)?;
                if let Some(r) = result {
                    fr.vals[r.index()] = Val::D(ret);
                }
                Ok(mask)
            }
            Statement::SubgroupBallot { result, predicate } => {
                self.ballot(fr, predicate, result, mask)?;
                Ok(mask)
            }
            Statement::SubgroupGather {
                mode,
                argument,
                result,
            } => {
                self.subgroup_op(fr, SgOp::Gather(mode), argument, result, span, mask)?;
                Ok(mask)
            }
            Statement::SubgroupCollectiveOperation {
                op,
                collective_op,
                argument,
                result,
            } => {
                let op = SgOp::Collective(op, collective_op);
                self.subgroup_op(fr, op, argument, result, span, mask)?;
                Ok(mask)
            }
            Statement::CooperativeStore { target, ref data } => {
                self.coop_store(fr, target, data, span, mask)?;
                Ok(mask)
            }
            ref other => Err(Error::Unsupported(format!(
                "the statement {}",
                stmt_name(other)
            ))),
        }
    }
}

fn stmt_name(s: &Statement) -> &'static str {
    match s {
        Statement::Kill => "discard",
        Statement::ImageAtomic { .. } => "texture atomics",
        Statement::RayQuery { .. } => "ray queries",
        Statement::RayPipelineFunction(_) => "ray tracing",
        _ => "(unnamed)",
    }
}
