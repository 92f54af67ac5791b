//! The interpreter: one dispatch, workgroup after workgroup; in a workgroup each subgroup on
//! its own thread, one running at a time (the lock is the baton), switching at barriers in a
//! seeded random order; in a subgroup the lanes in lockstep under an active mask.

use std::sync::{Condvar, Mutex, MutexGuard};

use naga::{
    AddressSpace, Block, Expression, Function, Handle, Literal, Span, Statement, TypeInner,
};

use crate::findings::{Collector, FindingKind as FK, Raw};
use crate::math;
use crate::prepare::{prepare, Bound, FnPrep, PtrMeta};
use crate::types::{leaf_count, Leaves, K};
use crate::{Dispatch, Error, Finding, Invocation, Report, Resource, Severity, Shader, Texture};

type Res<T> = Result<T, Error>;

const NONE: u32 = u32::MAX;
const INVALID: u32 = u32::MAX;
const LOCAL: u32 = 1 << 31;

/// A pointer of one lane: a memory (global variable index, or a local variable of a frame)
/// and an offset in it (bytes in byte memory, leaves in word memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ptr {
    mem: u32,
    off: u32,
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

/// Who last wrote and read one element, for race and initialisation checks.
#[derive(Clone, Copy)]
struct Shadow {
    w_inv: u32,
    w_ep: u32,
    w_site: u32,
    r_inv: u32,
    r_ep: u32,
    r_site: u32,
    multi: bool,
    init: bool,
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

/// One global variable's memory during the dispatch.
enum GMem {
    Unused,
    Bytes {
        data: Vec<u8>,
        /// Per 2-byte granule, for writable buffers only.
        shadow: Vec<Shadow>,
        binding: (u32, u32),
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

#[derive(Clone, Copy, Debug, PartialEq)]
enum St {
    Ready,
    Barrier(Span, naga::Barrier),
    Done,
}

/// Shared by the subgroups of a dispatch; whoever holds the lock runs.
struct Shared {
    mem: Vec<GMem>,
    findings: Collector,
    counter: u32,
    wg_ep: u32,
    st_ep: u32,
    wg_linear: u32,
    status: Vec<St>,
    order: Vec<usize>,
    pos: usize,
    turn: usize,
    rng: u64,
    abort: bool,
    error: Option<Error>,
    lane_ops: u64,
    max_iters: u64,
}

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
    /// Leaf count of each private global.
    private_n: Vec<u32>,
    private_init: Vec<Vec<u32>>,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

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

/// Evaluates a constant (global) expression to its leaves.
fn const_eval(sh: &Shader, overrides: &[Vec<u32>], h: Handle<Expression>) -> Res<Vec<u32>> {
    let m = &sh.module;
    Ok(match m.global_expressions[h] {
        Expression::Literal(l) => vec![literal(l)?],
        Expression::Constant(c) => const_eval(sh, overrides, m.constants[c].init)?,
        Expression::Override(o) => overrides
            .get(o.index())
            .cloned()
            .ok_or_else(|| Error::Unsupported("an override used in another override".into()))?,
        Expression::ZeroValue(ty) => vec![0; leaf_count(&m.types[ty].inner, &m.types)? as usize],
        Expression::Compose { ref components, .. } => {
            let mut v = Vec::new();
            for c in components {
                v.extend(const_eval(sh, overrides, *c)?);
            }
            v
        }
        Expression::Splat { size, value } => {
            let x = const_eval(sh, overrides, value)?;
            let mut v = Vec::new();
            for _ in 0..size as u32 {
                v.extend(&x);
            }
            v
        }
        ref other => {
            return Err(Error::Unsupported(format!(
                "the constant expression {other:?}"
            )))
        }
    })
}

fn literal(l: Literal) -> Res<u32> {
    Ok(match l {
        Literal::F32(x) => x.to_bits(),
        Literal::F16(x) => x.to_bits() as u32,
        Literal::U32(x) => x,
        Literal::I32(x) => x as u32,
        Literal::Bool(b) => b as u32,
        other => return Err(Error::Unsupported(format!("the literal {other:?}"))),
    })
}

fn from_f64(k: K, v: f64) -> u32 {
    match k {
        K::F32 => (v as f32).to_bits(),
        K::F16 => math::hw(v),
        K::I32 => v as i32 as u32,
        K::U32 => v as u32,
        K::Bool => (v != 0.0) as u32,
    }
}

/// Runs the dispatch.
pub fn run(sh: &Shader, ep: usize, d: &mut Dispatch) -> Res<Report> {
    let m = &sh.module;
    let entry = &m.entry_points[ep];
    let w = d.subgroup_size;
    if !(4..=64).contains(&w) || !w.is_power_of_two() {
        return Err(Error::Dispatch(format!(
            "subgroup size {w}: must be a power of two from 4 to 64"
        )));
    }
    // Overrides.
    let mut overrides = Vec::new();
    for (_, o) in m.overrides.iter() {
        let k = K::of(match m.types[o.ty].inner {
            TypeInner::Scalar(s) => s,
            _ => return Err(Error::Unsupported("a non-scalar override".into())),
        })?;
        let given = o
            .name
            .as_ref()
            .and_then(|n| d.overrides.get(n))
            .or_else(|| o.id.and_then(|id| d.overrides.get(&id.to_string())));
        let v = match (given, o.init) {
            (Some(v), _) => vec![from_f64(k, *v)],
            (None, Some(init)) => const_eval(sh, &overrides, init)?,
            (None, None) => {
                return Err(Error::Dispatch(format!(
                    "override `{}` has no value",
                    o.name.as_deref().unwrap_or("?")
                )))
            }
        };
        overrides.push(v);
    }
    let mut consts = Vec::new();
    for (_, c) in m.constants.iter() {
        consts.push(const_eval(sh, &overrides, c.init)?);
    }
    let mut wg_size = entry.workgroup_size;
    if let Some(ov) = entry.workgroup_size_overrides {
        for (i, o) in ov.iter().enumerate() {
            if let Some(h) = o {
                wg_size[i] = const_eval(sh, &overrides, *h)?[0];
            }
        }
    }
    let wg_total = wg_size[0] * wg_size[1] * wg_size[2];
    let n_sg = wg_total.div_ceil(w);
    let ep_info = sh.info.get_entry_point(ep);
    let ep_prep = prepare(sh, &entry.function, ep_info)?;
    let mut fn_preps = Vec::new();
    for (fh, f) in m.functions.iter() {
        fn_preps.push(prepare(sh, f, &sh.info[fh])?);
    }
    // Memory of the globals.
    let mut mem = Vec::new();
    let mut private_n = Vec::new();
    let mut private_init = Vec::new();
    let mut taken: Vec<((u32, u32), Resource)> = Vec::new();
    for (gh, gv) in m.global_variables.iter() {
        let used = !ep_info[gh].is_empty();
        let name = gv.name.as_deref().unwrap_or("?");
        let mut pn = 0;
        let mut pinit = Vec::new();
        let g = match gv.space {
            _ if !used => GMem::Unused,
            AddressSpace::Uniform | AddressSpace::Storage { .. } | AddressSpace::Handle => {
                let b = gv
                    .binding
                    .as_ref()
                    .ok_or_else(|| Error::Dispatch(format!("global `{name}` has no binding")))?;
                let key = (b.group, b.binding);
                let r = d.resources.remove(&key).ok_or_else(|| {
                    Error::Dispatch(format!(
                        "nothing bound at group {} binding {} (`{name}`)",
                        b.group, b.binding
                    ))
                })?;
                let g = match (gv.space, r) {
                    (AddressSpace::Handle, Resource::Texture(tex)) => {
                        let writable = matches!(
                            m.types[gv.ty].inner,
                            TypeInner::Image {
                                class: naga::ImageClass::Storage { .. },
                                ..
                            }
                        );
                        let texels = (tex.width * tex.height) as usize;
                        let shadow = if writable {
                            vec![Shadow::default(); texels]
                        } else {
                            Vec::new()
                        };
                        if tex.data.len() < texels * tex.format.bytes() {
                            return Err(Error::Dispatch(format!(
                                "texture `{name}`: {} bytes for {}×{} texels",
                                tex.data.len(),
                                tex.width,
                                tex.height
                            )));
                        }
                        GMem::Tex {
                            tex,
                            shadow,
                            binding: key,
                        }
                    }
                    (AddressSpace::Handle, r) => {
                        taken.push((key, r));
                        return Err(Error::Dispatch(format!(
                            "`{name}` is a texture; a buffer is bound"
                        )));
                    }
                    (space, Resource::Buffer(data)) => {
                        let writable = matches!(space, AddressSpace::Storage { access } if access.contains(naga::StorageAccess::STORE));
                        let shadow = if writable {
                            vec![Shadow::default(); data.len() / 2 + 1]
                        } else {
                            Vec::new()
                        };
                        GMem::Bytes {
                            data,
                            shadow,
                            binding: key,
                        }
                    }
                    (_, r) => {
                        taken.push((key, r));
                        return Err(Error::Dispatch(format!(
                            "`{name}` is a buffer; a texture is bound"
                        )));
                    }
                };
                g
            }
            AddressSpace::WorkGroup => {
                let n = leaf_count(&m.types[gv.ty].inner, &m.types)? as usize;
                GMem::Words {
                    data: vec![0; n],
                    shadow: vec![Shadow::default(); n],
                }
            }
            AddressSpace::Private => {
                pn = leaf_count(&m.types[gv.ty].inner, &m.types)?;
                pinit = match gv.init {
                    Some(h) => const_eval(sh, &overrides, h)?,
                    None => vec![0; pn as usize],
                };
                GMem::Private
            }
            other => {
                return Err(Error::Unsupported(format!(
                    "global `{name}` in address space {other:?}"
                )))
            }
        };
        mem.push(g);
        private_n.push(pn);
        private_init.push(pinit);
    }
    let prog = Prog {
        sh,
        ep,
        func: &entry.function,
        ep_prep,
        fn_preps,
        consts,
        overrides,
        w,
        wg_size,
        wg_total,
        n_sg,
        groups: d.workgroups,
        check_nf: d.check_non_finite,
        max_lane_ops: d.max_lane_ops,
        zero_wg: d.zero_workgroup_memory,
        private_n,
        private_init,
    };
    let shared = Shared {
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
        rng: d.seed ^ 0x5eed_5eed_5eed_5eed,
        abort: false,
        error: None,
        lane_ops: 0,
        max_iters: 0,
    };
    let lock = (Mutex::new(shared), Condvar::new());
    let [gx, gy, gz] = d.workgroups;
    let mut result = Ok(());
    'outer: for z in 0..gz {
        for y in 0..gy {
            for x in 0..gx {
                let linear = x + gx * (y + gy * z);
                {
                    let mut g = lock.0.lock().unwrap_or_else(|e| e.into_inner());
                    g.wg_linear = linear;
                    g.counter += 1;
                    g.wg_ep = g.counter;
                    g.counter += 1;
                    g.st_ep = g.counter;
                    for mm in g.mem.iter_mut() {
                        if let GMem::Words { data, shadow } = mm {
                            let fill = if d.zero_workgroup_memory {
                                0
                            } else {
                                0xdead_beef
                            };
                            data.iter_mut().for_each(|x| *x = fill);
                            shadow.iter_mut().for_each(|s| *s = Shadow::default());
                        }
                    }
                    for s in g.status.iter_mut() {
                        *s = St::Ready;
                    }
                    let order = shuffle(&mut g.rng, n_sg as usize);
                    g.turn = order[0];
                    g.order = order;
                    g.pos = 0;
                }
                let wg_id = [x, y, z];
                std::thread::scope(|scope| {
                    for s in 0..n_sg {
                        let prog = &prog;
                        let lock = &lock;
                        scope.spawn(move || subgroup_main(prog, lock, s, wg_id, linear));
                    }
                });
                let mut g = lock.0.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(e) = g.error.take() {
                    result = Err(e);
                    break 'outer;
                }
            }
        }
    }
    let shared = lock.0.into_inner().unwrap_or_else(|e| e.into_inner());
    // Give the resources back.
    for gm in shared.mem {
        match gm {
            GMem::Bytes { data, binding, .. } => {
                d.resources.insert(binding, Resource::Buffer(data));
            }
            GMem::Tex { tex, binding, .. } => {
                d.resources.insert(binding, Resource::Texture(tex));
            }
            _ => {}
        }
    }
    for (k, r) in taken {
        d.resources.insert(k, r);
    }
    result?;
    let mut findings = Vec::new();
    for (raw, count) in shared.findings.list {
        findings.push(Finding {
            kind: raw.kind,
            severity: if raw.kind == FK::NonFinite {
                Severity::Warning
            } else {
                Severity::Error
            },
            entry_point: m.entry_points[ep].name.clone(),
            location: sh.location(raw.span),
            other_location: raw.other_span.and_then(|s| sh.location(s)),
            invocation: raw.inv.map(|i| prog.invocation(i)),
            other: raw.other.map(|i| prog.invocation(i)),
            detail: raw.detail,
            count,
            seed: d.seed,
        });
    }
    Ok(Report {
        findings,
        lane_ops: shared.lane_ops,
        max_loop_iterations: shared.max_iters,
    })
}

fn shuffle(rng: &mut u64, n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (splitmix(rng) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
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
    let mut first: Option<(usize, Span, naga::Barrier)> = None;
    let mut any_done = None;
    let mut flags = naga::Barrier::empty();
    let statuses = g.status.clone();
    for (s, st) in statuses.iter().enumerate() {
        match *st {
            St::Barrier(span, f) => {
                flags |= f;
                match first {
                    None => first = Some((s, span, f)),
                    Some((s0, span0, _)) if span0 != span => {
                        let (inv, other) = (sg_inv(p, g, s), sg_inv(p, g, s0));
                        add_finding(
                            g,
                            Raw {
                                kind: FK::DivergentBarrier,
                                span,
                                other_span: Some(span0),
                                inv: Some(inv),
                                other: Some(other),
                                detail: format!(
                                    "subgroups {s0} and {s} wait at different barriers"
                                ),
                            },
                        );
                    }
                    _ => {}
                }
            }
            St::Done => any_done = Some(s),
            St::Ready => {}
        }
    }
    let Some((s0, span0, _)) = first else {
        g.turn = usize::MAX;
        return;
    };
    if let Some(sd) = any_done {
        let (inv, other) = (sg_inv(p, g, s0), sg_inv(p, g, sd));
        add_finding(
            g,
            Raw {
                kind: FK::DivergentBarrier,
                span: span0,
                other_span: None,
                inv: Some(inv),
                other: Some(other),
                detail: format!(
                    "subgroup {s0} waits at a barrier that subgroup {sd} never reaches (it returned)"
                ),
            },
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

fn sg_inv(p: &Prog, g: &Shared, s: usize) -> u32 {
    g.wg_linear * p.wg_total + s as u32 * p.w
}

fn add_finding(g: &mut Shared, raw: Raw) {
    g.findings.add(raw);
}

fn subgroup_main(p: &Prog, lock: &(Mutex<Shared>, Condvar), s: u32, wg_id: [u32; 3], linear: u32) {
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
    let mut private = Vec::new();
    for (i, n) in p.private_n.iter().enumerate() {
        let mut v = Vec::with_capacity(w * *n as usize);
        for _ in 0..w {
            v.extend(&p.private_init[i]);
        }
        private.push(v);
    }
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

/// Masks a loop's or switch's `break` and `continue` collect.
struct Brk {
    is_loop: bool,
    brk: u64,
    cont: u64,
}

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

/// One subgroup running.
struct Exec<'p, 's> {
    p: &'p Prog<'p>,
    g: Option<MutexGuard<'s, Shared>>,
    lock: &'s (Mutex<Shared>, Condvar),
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

fn take_buf(fr: &mut Frame, h: Handle<Expression>, len: usize) -> Vec<u32> {
    let mut v = match std::mem::take(&mut fr.vals[h.index()]) {
        Val::D(v) => v,
        _ => Vec::new(),
    };
    v.resize(len, 0);
    v
}

fn internal(what: &str) -> Error {
    Error::Unsupported(format!("internal: {what}"))
}

impl<'p> Exec<'p, '_> {
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

    fn run_entry(&mut self) -> Res<()> {
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
    fn ensure(&mut self, fr: &mut Frame, h: Handle<Expression>) -> Res<()> {
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

    fn block(&mut self, fr: &mut Frame, block: &'p Block, mut mask: u64) -> Res<u64> {
        for (stmt, span) in block.span_iter() {
            if mask == 0 {
                break;
            }
            mask = self.stmt(fr, stmt, *span, mask)?;
        }
        Ok(mask)
    }

    /// Runs one statement for `mask`; returns the lanes that carry on after it.
    fn stmt(&mut self, fr: &mut Frame, stmt: &'p Statement, span: Span, mask: u64) -> Res<u64> {
        self.lane_ops += mask.count_ones() as u64;
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
                let c = data(fr, condition);
                let mut t = 0u64;
                for l in lanes(mask) {
                    if c[l] != 0 {
                        t |= 1 << l;
                    }
                }
                let a = if t != 0 {
                    self.block(fr, accept, t)?
                } else {
                    0
                };
                let e = mask & !t;
                let b = if e != 0 {
                    self.block(fr, reject, e)?
                } else {
                    0
                };
                Ok(a | b)
            }
            Statement::Switch {
                selector,
                ref cases,
            } => {
                self.ensure(fr, selector)?;
                let sel = data(fr, selector).to_vec();
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
                fr.brk.push(Brk {
                    is_loop: false,
                    brk: 0,
                    cont: 0,
                });
                let mut carry = 0u64;
                let mut exit = 0u64;
                for (i, c) in cases.iter().enumerate() {
                    let run = case_masks[i] | carry;
                    let fell = if run != 0 {
                        self.block(fr, &c.body, run)?
                    } else {
                        0
                    };
                    if c.fall_through {
                        carry = fell;
                    } else {
                        exit |= fell;
                        carry = 0;
                    }
                }
                let b = fr.brk.pop().expect("switch context");
                Ok(exit | carry | b.brk)
            }
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
                            let c = data(fr, bi);
                            let mut t = 0u64;
                            for l in lanes(after) {
                                if c[l] != 0 {
                                    t |= 1 << l;
                                }
                            }
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
                self.ensure(fr, pointer)?;
                self.ensure(fr, value)?;
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
                if let Some(p) = predicate {
                    self.ensure(fr, p)?;
                }
                let mut bits = 0u64;
                for l in lanes(mask) {
                    if predicate.is_none_or(|p| data(fr, p)[l] != 0) {
                        bits |= 1 << l;
                    }
                }
                let w = self.w();
                let mut out = take_buf(fr, result, w * 4);
                for l in lanes(mask) {
                    out[l * 4] = bits as u32;
                    out[l * 4 + 1] = (bits >> 32) as u32;
                    out[l * 4 + 2] = 0;
                    out[l * 4 + 3] = 0;
                }
                fr.vals[result.index()] = Val::D(out);
                Ok(mask)
            }
            Statement::SubgroupGather {
                mode,
                argument,
                result,
            } => {
                self.gather(fr, mode, argument, result, span, mask)?;
                Ok(mask)
            }
            Statement::SubgroupCollectiveOperation {
                op,
                collective_op,
                argument,
                result,
            } => {
                self.collective(fr, op, collective_op, argument, result, span, mask)?;
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

    /// A workgroup or storage barrier reached by the lanes in `mask`.
    fn barrier(&mut self, span: Span, flags: naga::Barrier, mask: u64) -> Res<()> {
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

    fn expr_span(fr: &Frame, h: Handle<Expression>) -> Span {
        fr.f.expressions.get_span(h)
    }

    /// Evaluates expression `h` for the lanes in `mask`.
    fn eval(&mut self, fr: &mut Frame, h: Handle<Expression>, mask: u64) -> Res<()> {
        self.lane_ops += mask.count_ones() as u64;
        let w = self.w();
        let meta = &fr.prep.metas[h.index()];
        let n = meta.n as usize;
        let expr = &fr.f.expressions[h];
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
                for c in components {
                    self.ensure(fr, *c)?;
                }
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
                self.ensure(fr, base)?;
                self.ensure(fr, index)?;
                self.access(fr, h, base, Some(index), mask)?;
            }
            Expression::AccessIndex { base, .. } => {
                self.ensure(fr, base)?;
                self.access(fr, h, base, None, mask)?;
            }
            Expression::Load { pointer } => {
                self.ensure(fr, pointer)?;
                let mut out = take_buf(fr, h, w * n);
                let span = Self::expr_span(fr, h);
                self.load_into(fr, pointer, &mut out, n, span, mask)?;
                fr.vals[h.index()] = Val::D(out);
            }
            Expression::ImageLoad {
                image,
                coordinate,
                level,
                ..
            } => {
                self.ensure(fr, image)?;
                self.ensure(fr, coordinate)?;
                if let Some(lv) = level {
                    self.ensure(fr, lv)?;
                }
                self.image_load(fr, h, image, coordinate, level, mask)?;
            }
            Expression::ImageQuery { image, query } => {
                self.ensure(fr, image)?;
                let Val::Img(gi) = fr.vals[image.index()] else {
                    return Err(internal("texture expected"));
                };
                if let naga::ImageQuery::Size { level: Some(l) } = query {
                    self.ensure(fr, l)?;
                }
                let (tw, th) = match &self.g().mem[gi as usize] {
                    GMem::Tex { tex, .. } => (tex.width, tex.height),
                    _ => return Err(internal("texture memory")),
                };
                let mut out = take_buf(fr, h, w * 2);
                for l in lanes(mask) {
                    out[l * 2] = tw;
                    out[l * 2 + 1] = th;
                }
                fr.vals[h.index()] = Val::D(out);
            }
            Expression::Unary { op, expr: e } => {
                self.ensure(fr, e)?;
                let k = fr.prep.metas[e.index()]
                    .k
                    .ok_or_else(|| internal("unary kind"))?;
                let mut out = take_buf(fr, h, w * n);
                let a = data(fr, e);
                for l in lanes(mask) {
                    for i in 0..n {
                        out[l * n + i] = math::unary(op, k, a[l * n + i])?;
                    }
                }
                fr.vals[h.index()] = Val::D(out);
            }
            Expression::Binary { op, left, right } => {
                self.ensure(fr, left)?;
                self.ensure(fr, right)?;
                self.binary(fr, h, op, left, right, mask)?;
            }
            Expression::Select {
                condition,
                accept,
                reject,
            } => {
                self.ensure(fr, condition)?;
                self.ensure(fr, accept)?;
                self.ensure(fr, reject)?;
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
                for a in [Some(arg), arg1, arg2, arg3].into_iter().flatten() {
                    self.ensure(fr, a)?;
                }
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
                        for l in lanes(mask) {
                            for i in 0..n {
                                out[l * n + i] = math::convert(from, to, a[l * n + i]);
                            }
                        }
                    }
                    None if en == n && from.bytes() == to.bytes() => {
                        for l in lanes(mask) {
                            out[l * n..(l + 1) * n].copy_from_slice(&a[l * n..(l + 1) * n]);
                        }
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
                    let span = Self::expr_span(fr, h);
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
                    let len = self.mem_len(fr, ps[l]);
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
                self.ensure(fr, a)?;
                self.ensure(fr, b)?;
                self.ensure(fr, c)?;
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

    /// Length of a pointer's memory, in its units.
    fn mem_len(&mut self, fr: &Frame, p: Ptr) -> u32 {
        if p.mem & LOCAL != 0 {
            let depth = ((p.mem & !LOCAL) >> 16) as usize;
            let idx = (p.mem & 0xffff) as usize;
            return self.locals[depth][idx].0;
        }
        let _ = fr;
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

    fn mem_name(&self, fr: &Frame, p: Ptr) -> String {
        if p.mem & LOCAL != 0 {
            let depth = ((p.mem & !LOCAL) >> 16) as usize;
            let idx = (p.mem & 0xffff) as usize;
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
        let span = Self::expr_span(fr, h);
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
                                let ml = self.mem_len(fr, p);
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

    /// Loads through `pointer` for the lanes in `mask` into `out` (lanes × n).
    fn load_into(
        &mut self,
        fr: &Frame,
        pointer: Handle<Expression>,
        out: &mut [u32],
        n: usize,
        span: Span,
        mask: u64,
    ) -> Res<()> {
        let pm = fr.prep.metas[pointer.index()]
            .ptr
            .as_ref()
            .ok_or_else(|| internal("load through a non-pointer"))?;
        let ps = ptrs(fr, pointer);
        for l in lanes(mask) {
            let p = ps[l];
            let dst = &mut out[l * n..(l + 1) * n];
            if p.off == INVALID {
                dst.fill(0);
                continue;
            }
            self.mem_read(fr, p, pm, dst, l, span)?;
        }
        Ok(())
    }

    fn mem_read(
        &mut self,
        fr: &Frame,
        p: Ptr,
        pm: &PtrMeta,
        dst: &mut [u32],
        l: usize,
        span: Span,
    ) -> Res<()> {
        let n = dst.len();
        if p.mem & LOCAL != 0 {
            let depth = ((p.mem & !LOCAL) >> 16) as usize;
            let idx = (p.mem & 0xffff) as usize;
            let (ln, ref v) = self.locals[depth][idx];
            let o = l * ln as usize + p.off as usize;
            dst.copy_from_slice(&v[o..o + n]);
            return Ok(());
        }
        let gi = p.mem as usize;
        let pn = self.p.private_n[gi] as usize;
        if pn > 0 {
            let o = l * pn + p.off as usize;
            dst.copy_from_slice(&self.private[gi][o..o + n]);
            return Ok(());
        }
        let me = self.inv0 + l as u32;
        let wg_total = self.p.wg_total;
        let site = span.to_range().map(|r| r.start as u32).unwrap_or(0);
        let mut race: Option<(u32, u32, bool)> = None;
        let mut uninit = false;
        let mut oob = false;
        {
            let g = self.g.as_mut().expect("the baton");
            let (wg_ep, st_ep) = (g.wg_ep, g.st_ep);
            match &mut g.mem[gi] {
                GMem::Words { data, shadow } => {
                    let o = p.off as usize;
                    if o + n > data.len() {
                        oob = true;
                        dst.fill(0);
                    } else {
                        dst.copy_from_slice(&data[o..o + n]);
                        for s in &mut shadow[o..o + n] {
                            let (r, u) = access(
                                s,
                                Acc {
                                    me,
                                    ep: wg_ep,
                                    write: false,
                                    site,
                                    storage: false,
                                    wg_total,
                                    atomic: pm.atomic,
                                },
                            );
                            if race.is_none() {
                                race = r;
                            }
                            uninit |= u;
                        }
                        if uninit && !self.p.zero_wg {
                            // Garbage, as a GPU that does not zero workgroup memory.
                            for (d, s) in dst.iter_mut().zip(&shadow[o..o + n]) {
                                if !s.init {
                                    *d = 0x7fc0_dead;
                                }
                            }
                        }
                    }
                }
                GMem::Bytes { data, shadow, .. } => {
                    let leaves = pm
                        .leaves
                        .as_ref()
                        .ok_or_else(|| internal("load of an unsized value"))?;
                    let base = p.off as usize;
                    for (i, (k, lo)) in leaves.kinds.iter().zip(&leaves.offsets).enumerate().take(n)
                    {
                        let o = base + *lo as usize;
                        let b = k.bytes() as usize;
                        if o + b > data.len() {
                            oob = true;
                            dst[i] = 0;
                            continue;
                        }
                        dst[i] = if b == 2 {
                            u16::from_le_bytes([data[o], data[o + 1]]) as u32
                        } else {
                            u32::from_le_bytes([data[o], data[o + 1], data[o + 2], data[o + 3]])
                        };
                        if !shadow.is_empty() {
                            let (r, _) = access(
                                &mut shadow[o / 2],
                                Acc {
                                    me,
                                    ep: st_ep,
                                    write: false,
                                    site,
                                    storage: true,
                                    wg_total,
                                    atomic: pm.atomic,
                                },
                            );
                            if race.is_none() {
                                race = r;
                            }
                        }
                    }
                }
                _ => return Err(internal("read of a texture through a pointer")),
            }
        }
        self.report_access(fr, p, span, l, [oob, uninit], race, false);
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
        race: Option<(u32, u32, bool)>,
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
        if let Some((other, osite, was_write)) = race {
            self.report_race(fr, p, span, l, other, osite, was_write, write);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn report_race(
        &mut self,
        fr: &Frame,
        p: Ptr,
        span: Span,
        l: usize,
        other: u32,
        osite: u32,
        other_write: bool,
        write: bool,
    ) {
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
        self.finding(
            kind,
            span,
            Some(l),
            Some(other),
            Some(Span::new(osite, osite + 1)),
            || {
                format!(
                    "{} of {name} {unit} {} races with an earlier {}",
                    if write { "write" } else { "read" },
                    p.off,
                    if other_write { "write" } else { "read" }
                )
            },
        );
    }

    fn store(
        &mut self,
        fr: &mut Frame,
        pointer: Handle<Expression>,
        value: Handle<Expression>,
        span: Span,
        mask: u64,
    ) -> Res<()> {
        let n = fr.prep.metas[value.index()].n as usize;
        for l in lanes(mask) {
            let p = ptrs(fr, pointer)[l];
            if p.off == INVALID {
                continue;
            }
            let src = &data(fr, value)[l * n..(l + 1) * n];
            let src: Vec<u32> = src.to_vec();
            self.mem_write(fr, pointer, p, &src, l, span)?;
        }
        Ok(())
    }

    fn mem_write(
        &mut self,
        fr: &Frame,
        pointer: Handle<Expression>,
        p: Ptr,
        src: &[u32],
        l: usize,
        span: Span,
    ) -> Res<()> {
        let n = src.len();
        if p.mem & LOCAL != 0 {
            let depth = ((p.mem & !LOCAL) >> 16) as usize;
            let idx = (p.mem & 0xffff) as usize;
            let (ln, ref mut v) = self.locals[depth][idx];
            let o = l * ln as usize + p.off as usize;
            v[o..o + n].copy_from_slice(src);
            return Ok(());
        }
        let gi = p.mem as usize;
        let pn = self.p.private_n[gi] as usize;
        if pn > 0 {
            let o = l * pn + p.off as usize;
            self.private[gi][o..o + n].copy_from_slice(src);
            return Ok(());
        }
        let pm = fr.prep.metas[pointer.index()]
            .ptr
            .as_ref()
            .ok_or_else(|| internal("store through a non-pointer"))?;
        let me = self.inv0 + l as u32;
        let wg_total = self.p.wg_total;
        let site = span.to_range().map(|r| r.start as u32).unwrap_or(0);
        let mut race: Option<(u32, u32, bool)> = None;
        let mut oob = false;
        {
            let g = self.g.as_mut().expect("the baton");
            let (wg_ep, st_ep) = (g.wg_ep, g.st_ep);
            match &mut g.mem[gi] {
                GMem::Words { data, shadow } => {
                    let o = p.off as usize;
                    if o + n > data.len() {
                        oob = true;
                    } else {
                        data[o..o + n].copy_from_slice(src);
                        for s in &mut shadow[o..o + n] {
                            let (r, _) = access(
                                s,
                                Acc {
                                    me,
                                    ep: wg_ep,
                                    write: true,
                                    site,
                                    storage: false,
                                    wg_total,
                                    atomic: pm.atomic,
                                },
                            );
                            if race.is_none() {
                                race = r;
                            }
                        }
                    }
                }
                GMem::Bytes { data, shadow, .. } => {
                    if shadow.is_empty() {
                        return Err(internal("store to a read-only buffer"));
                    }
                    let leaves = pm
                        .leaves
                        .as_ref()
                        .ok_or_else(|| internal("store of an unsized value"))?;
                    let base = p.off as usize;
                    for (i, (k, lo)) in leaves.kinds.iter().zip(&leaves.offsets).enumerate().take(n)
                    {
                        let o = base + *lo as usize;
                        let b = k.bytes() as usize;
                        if o + b > data.len() {
                            oob = true;
                            continue;
                        }
                        if b == 2 {
                            data[o..o + 2].copy_from_slice(&(src[i] as u16).to_le_bytes());
                        } else {
                            data[o..o + 4].copy_from_slice(&src[i].to_le_bytes());
                        }
                        let (r, _) = access(
                            &mut shadow[o / 2],
                            Acc {
                                me,
                                ep: st_ep,
                                write: true,
                                site,
                                storage: true,
                                wg_total,
                                atomic: pm.atomic,
                            },
                        );
                        if race.is_none() {
                            race = r;
                        }
                    }
                }
                _ => return Err(internal("write to a texture through a pointer")),
            }
        }
        self.report_access(fr, p, span, l, [oob, false], race, true);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn atomic(
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
        self.ensure(fr, pointer)?;
        self.ensure(fr, value)?;
        let k = fr.prep.metas[pointer.index()]
            .ptr
            .as_ref()
            .and_then(|p| p.k)
            .ok_or_else(|| internal("atomic kind"))?;
        let w = self.w();
        let mut res = vec![0u32; w];
        for l in lanes(mask) {
            let p = ptrs(fr, pointer)[l];
            if p.off == INVALID {
                continue;
            }
            let pm = fr.prep.metas[pointer.index()].ptr.clone().expect("pointer");
            let mut old = [0u32];
            self.mem_read(fr, p, &pm, &mut old, l, span)?;
            let v = data(fr, value)[l];
            let new = match fun {
                A::Add => old[0].wrapping_add(v),
                A::Subtract => old[0].wrapping_sub(v),
                A::And => old[0] & v,
                A::InclusiveOr => old[0] | v,
                A::ExclusiveOr => old[0] ^ v,
                A::Min => {
                    if k == K::I32 {
                        (old[0] as i32).min(v as i32) as u32
                    } else {
                        old[0].min(v)
                    }
                }
                A::Max => {
                    if k == K::I32 {
                        (old[0] as i32).max(v as i32) as u32
                    } else {
                        old[0].max(v)
                    }
                }
                A::Exchange { compare: None } => v,
                A::Exchange { compare: Some(_) } => {
                    return Err(Error::Unsupported("atomicCompareExchangeWeak".into()))
                }
            };
            self.mem_write(fr, pointer, p, &[new], l, span)?;
            res[l] = old[0];
        }
        if let Some(r) = result {
            fr.vals[r.index()] = Val::D(res);
        }
        Ok(())
    }

    fn image_load(
        &mut self,
        fr: &mut Frame,
        h: Handle<Expression>,
        image: Handle<Expression>,
        coordinate: Handle<Expression>,
        level: Option<Handle<Expression>>,
        mask: u64,
    ) -> Res<()> {
        let w = self.w();
        let Val::Img(gi) = fr.vals[image.index()] else {
            return Err(internal("texture expected"));
        };
        let span = Self::expr_span(fr, h);
        let mut out = take_buf(fr, h, w * 4);
        let coords = data(fr, coordinate).to_vec();
        let levels = level.map(|lv| data(fr, lv).to_vec());
        let mut bad: Vec<(usize, u32, u32, u32)> = Vec::new();
        let (tw, th) = {
            let g = self.g.as_mut().expect("the baton");
            let GMem::Tex { tex, .. } = &g.mem[gi as usize] else {
                return Err(internal("texture memory"));
            };
            for l in lanes(mask) {
                let (x, y) = (coords[l * 2], coords[l * 2 + 1]);
                let lev = levels.as_ref().map_or(0, |v| v[l]);
                let dst = &mut out[l * 4..l * 4 + 4];
                if x >= tex.width || y >= tex.height || lev != 0 {
                    dst.fill(0);
                    bad.push((l, x, y, lev));
                    continue;
                }
                read_texel(tex, x, y, dst);
            }
            (tex.width, tex.height)
        };
        for (l, x, y, lev) in bad {
            let name = self.mem_name(fr, Ptr { mem: gi, off: 0 });
            self.finding(FK::OutOfBounds, span, Some(l), None, None, || {
                format!(
                    "textureLoad of texel ({}, {}) level {lev} of {name}, {tw}×{th}",
                    x as i32, y as i32
                )
            });
        }
        fr.vals[h.index()] = Val::D(out);
        Ok(())
    }

    fn image_store(
        &mut self,
        fr: &mut Frame,
        image: Handle<Expression>,
        coordinate: Handle<Expression>,
        value: Handle<Expression>,
        span: Span,
        mask: u64,
    ) -> Res<()> {
        self.ensure(fr, image)?;
        self.ensure(fr, coordinate)?;
        self.ensure(fr, value)?;
        let Val::Img(gi) = fr.vals[image.index()] else {
            return Err(internal("texture expected"));
        };
        let vk = fr.prep.metas[value.index()].k.unwrap_or(K::F32);
        let coords = data(fr, coordinate).to_vec();
        let vals = data(fr, value).to_vec();
        let wg_total = self.p.wg_total;
        let site = span.to_range().map(|r| r.start as u32).unwrap_or(0);
        let mut events = Vec::new();
        {
            let inv0 = self.inv0;
            let g = self.g.as_mut().expect("the baton");
            let st_ep = g.st_ep;
            let GMem::Tex { tex, shadow, .. } = &mut g.mem[gi as usize] else {
                return Err(internal("texture memory"));
            };
            for l in lanes(mask) {
                let (x, y) = (coords[l * 2], coords[l * 2 + 1]);
                if x >= tex.width || y >= tex.height {
                    events.push((l, x, y, None));
                    continue;
                }
                let mut v = [0f32; 4];
                for (i, vi) in v.iter_mut().enumerate() {
                    *vi = math::to_f64(vk, vals[l * 4 + i]) as f32;
                }
                write_texel(tex, x, y, &v);
                let t = (y * tex.width + x) as usize;
                if !shadow.is_empty() {
                    let (r, _) = access(
                        &mut shadow[t],
                        Acc {
                            me: inv0 + l as u32,
                            ep: st_ep,
                            write: true,
                            site,
                            storage: true,
                            wg_total,
                            atomic: false,
                        },
                    );
                    if let Some(r) = r {
                        events.push((l, x, y, Some(r)));
                    }
                }
            }
        }
        for (l, x, y, r) in events {
            let name = self.mem_name(fr, Ptr { mem: gi, off: 0 });
            match r {
                None => self.finding(FK::OutOfBounds, span, Some(l), None, None, || {
                    format!("textureStore to texel ({}, {}) of {name}", x as i32, y as i32)
                }),
                Some((other, osite, _)) => self.finding(
                    FK::StorageRace,
                    span,
                    Some(l),
                    Some(other),
                    Some(Span::new(osite, osite + 1)),
                    || format!("textureStore to texel ({x}, {y}) of {name} races with an earlier write"),
                ),
            }
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
            let span = Self::expr_span(fr, h);
            self.check_nf(fr, span, &out, n, k, &[left, right], mask);
        }
        fr.vals[h.index()] = Val::D(out);
        Ok(())
    }

    /// Warns when a lane's float result is not finite while its operands all are.
    #[allow(clippy::too_many_arguments)]
    fn check_nf(
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
                for l in lanes(mask) {
                    let mut acc = math::binary(
                        naga::BinaryOperator::Multiply,
                        k,
                        get(&x, l, 0),
                        get(&y, l, 0),
                    )?;
                    for i in 1..an {
                        let p = math::binary(
                            naga::BinaryOperator::Multiply,
                            k,
                            get(&x, l, i),
                            get(&y, l, i),
                        )?;
                        acc = math::binary(naga::BinaryOperator::Add, k, acc, p)?;
                    }
                    out[l] = acc;
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
            let span = Self::expr_span(fr, h);
            let ops: Vec<_> = args.iter().flatten().copied().collect();
            self.check_nf(fr, span, &out, n, rk.expect("kind"), &ops, mask);
        }
        fr.vals[h.index()] = Val::D(out);
        Ok(())
    }

    fn gather(
        &mut self,
        fr: &mut Frame,
        mode: naga::GatherMode,
        argument: Handle<Expression>,
        result: Handle<Expression>,
        span: Span,
        mask: u64,
    ) -> Res<()> {
        use naga::GatherMode as G;
        self.ensure(fr, argument)?;
        let idx_expr = match mode {
            G::BroadcastFirst => None,
            G::Broadcast(i)
            | G::Shuffle(i)
            | G::ShuffleDown(i)
            | G::ShuffleUp(i)
            | G::ShuffleXor(i) => Some(i),
            G::QuadBroadcast(_) | G::QuadSwap(_) => {
                return Err(Error::Unsupported("quad operations".into()))
            }
        };
        if let Some(i) = idx_expr {
            self.ensure(fr, i)?;
        }
        let w = self.w();
        let n = fr.prep.metas[argument.index()].n as usize;
        let mut out = take_buf(fr, result, w * n);
        let first = mask.trailing_zeros() as usize;
        let mut bad = Vec::new();
        {
            let a = data(fr, argument);
            let idx = idx_expr.map(|i| data(fr, i));
            for l in lanes(mask) {
                let iv = idx.map_or(0, |d| d[l]) as i64;
                let src = match mode {
                    G::BroadcastFirst => first as i64,
                    G::Broadcast(_) | G::Shuffle(_) => iv,
                    G::ShuffleDown(_) => l as i64 + iv,
                    G::ShuffleUp(_) => l as i64 - iv,
                    G::ShuffleXor(_) => (l as i64) ^ iv,
                    _ => unreachable!("quad"),
                };
                if src < 0 || src >= w as i64 || mask & (1u64 << src) == 0 {
                    out[l * n..(l + 1) * n].fill(0);
                    bad.push((l, src));
                    continue;
                }
                let s = src as usize;
                out[l * n..(l + 1) * n].copy_from_slice(&a[s * n..(s + 1) * n]);
            }
        }
        for (l, src) in bad {
            let other = if (0..w as i64).contains(&src) {
                Some(self.inv0 + src as u32)
            } else {
                None
            };
            self.finding(FK::InactiveLaneRead, span, Some(l), other, None, || {
                format!("{mode:?} reads lane {src}, which is not active (active lanes {mask:#x})")
            });
        }
        fr.vals[result.index()] = Val::D(out);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn collective(
        &mut self,
        fr: &mut Frame,
        op: naga::SubgroupOperation,
        cop: naga::CollectiveOperation,
        argument: Handle<Expression>,
        result: Handle<Expression>,
        span: Span,
        mask: u64,
    ) -> Res<()> {
        use naga::BinaryOperator as B;
        use naga::CollectiveOperation as C;
        use naga::SubgroupOperation as S;
        self.ensure(fr, argument)?;
        let w = self.w();
        let am = &fr.prep.metas[argument.index()];
        let n = am.n as usize;
        let k = am.k.ok_or_else(|| internal("subgroup operation kind"))?;
        let mut out = take_buf(fr, result, w * n);
        let a = data(fr, argument).to_vec();
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
                    let mut acc: Option<u32> = None;
                    for l in lanes(mask) {
                        let v = a[l * n + i];
                        acc = Some(match acc {
                            None => v,
                            Some(x) => combine(x, v)?,
                        });
                    }
                    let r = acc.unwrap_or(identity(k));
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
        if self.p.check_nf && k.is_float() {
            self.check_nf(fr, span, &out, n, k, &[argument], mask);
        }
        fr.vals[result.index()] = Val::D(out);
        Ok(())
    }

    /// The pointer and stride of a cooperative load or store, which must be the same in
    /// every active lane (the operation is the subgroup's).
    fn coop_args(
        &mut self,
        fr: &mut Frame,
        d: &naga::CooperativeData,
        mask: u64,
    ) -> Res<(Ptr, u32, usize)> {
        self.ensure(fr, d.pointer)?;
        self.ensure(fr, d.stride)?;
        if mask != self.alive {
            return Err(Error::Unsupported(
                "a cooperative matrix operation in divergent control flow".into(),
            ));
        }
        let l = mask.trailing_zeros() as usize;
        let p = ptrs(fr, d.pointer)[l];
        let stride = data(fr, d.stride)[l];
        Ok((p, stride, l))
    }

    fn coop_elem(&self, fr: &Frame, pointer: Handle<Expression>) -> Res<(u32, bool)> {
        let pm = fr.prep.metas[pointer.index()]
            .ptr
            .as_ref()
            .ok_or_else(|| internal("coop pointer"))?;
        let k = pm.k.ok_or_else(|| internal("coop element kind"))?;
        Ok(if pm.bytes {
            (k.bytes(), true)
        } else {
            (1, false)
        })
    }

    fn coop_load(
        &mut self,
        fr: &mut Frame,
        h: Handle<Expression>,
        cols: usize,
        rows: usize,
        d: &naga::CooperativeData,
        mask: u64,
    ) -> Res<()> {
        let (p, stride, lane) = self.coop_args(fr, d, mask)?;
        let (unit, _) = self.coop_elem(fr, d.pointer)?;
        let pm = fr.prep.metas[d.pointer.index()]
            .ptr
            .clone()
            .expect("pointer");
        let pm1 = PtrMeta {
            leaves: Some(std::sync::Arc::new(Leaves {
                kinds: vec![pm.k.expect("kind")],
                offsets: vec![0],
            })),
            ..pm
        };
        let span = Self::expr_span(fr, h);
        let n = rows * cols;
        let mut m = vec![0u32; n];
        if p.off != INVALID {
            // Element (r, c), stored column-major in the value: leaf c * rows + r.
            for c in 0..cols {
                for r in 0..rows {
                    let e = if d.row_major {
                        r * stride as usize + c
                    } else {
                        c * stride as usize + r
                    };
                    let q = Ptr {
                        mem: p.mem,
                        off: p.off + e as u32 * unit,
                    };
                    let mut v = [0u32];
                    self.mem_read(fr, q, &pm1, &mut v, lane, span)?;
                    m[c * rows + r] = v[0];
                }
            }
        }
        let w = self.w();
        let mut out = take_buf(fr, h, w * n);
        for l in lanes(mask) {
            out[l * n..(l + 1) * n].copy_from_slice(&m);
        }
        fr.vals[h.index()] = Val::D(out);
        Ok(())
    }

    fn coop_store(
        &mut self,
        fr: &mut Frame,
        target: Handle<Expression>,
        d: &naga::CooperativeData,
        span: Span,
        mask: u64,
    ) -> Res<()> {
        self.ensure(fr, target)?;
        let (p, stride, lane) = self.coop_args(fr, d, mask)?;
        let (unit, _) = self.coop_elem(fr, d.pointer)?;
        let (cols, rows) = match *fr.info[target].ty.inner_with(&self.p.sh.module.types) {
            TypeInner::CooperativeMatrix { columns, rows, .. } => (columns as usize, rows as usize),
            _ => return Err(internal("coop store of a non-matrix")),
        };
        let n = rows * cols;
        let m = data(fr, target)[lane * n..(lane + 1) * n].to_vec();
        if p.off == INVALID {
            return Ok(());
        }
        for c in 0..cols {
            for r in 0..rows {
                let e = if d.row_major {
                    r * stride as usize + c
                } else {
                    c * stride as usize + r
                };
                let q = Ptr {
                    mem: p.mem,
                    off: p.off + e as u32 * unit,
                };
                self.mem_write(fr, d.pointer, q, &[m[c * rows + r]], lane, span)?;
            }
        }
        Ok(())
    }

    fn coop_mma(
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
        let w = self.w();
        let mut out = take_buf(fr, h, w * cnn);
        for ln in lanes(mask) {
            out[ln * cnn..(ln + 1) * cnn].copy_from_slice(&r);
        }
        fr.vals[h.index()] = Val::D(out);
        Ok(())
    }
}

/// One access to an element: by whom (linear invocation id), in which barrier interval,
/// where in the source, and how.
#[derive(Clone, Copy)]
struct Acc {
    me: u32,
    ep: u32,
    write: bool,
    site: u32,
    storage: bool,
    wg_total: u32,
    atomic: bool,
}

/// Checks one access against an element's shadow and records it. Returns the conflicting
/// earlier access (invocation, site, whether it wrote) and whether the element was never
/// written. `storage`: accesses from other workgroups always conflict.
#[inline]
fn access(s: &mut Shadow, a: Acc) -> (Option<(u32, u32, bool)>, bool) {
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

fn read_texel(tex: &Texture, x: u32, y: u32, dst: &mut [u32]) {
    let t = (y * tex.width + x) as usize;
    let b = tex.format.bytes();
    let d = &tex.data[t * b..(t + 1) * b];
    match tex.format {
        crate::TexelFormat::Rgba32Float => {
            for i in 0..4 {
                dst[i] = u32::from_le_bytes([d[i * 4], d[i * 4 + 1], d[i * 4 + 2], d[i * 4 + 3]]);
            }
        }
        crate::TexelFormat::Rgba16Float => {
            for i in 0..4 {
                let hbits = u16::from_le_bytes([d[i * 2], d[i * 2 + 1]]);
                dst[i] = half::f16::from_bits(hbits).to_f32().to_bits();
            }
        }
        crate::TexelFormat::R32Float => {
            dst[0] = u32::from_le_bytes([d[0], d[1], d[2], d[3]]);
            dst[1] = 0;
            dst[2] = 0;
            dst[3] = 1f32.to_bits();
        }
    }
}

fn write_texel(tex: &mut Texture, x: u32, y: u32, v: &[f32; 4]) {
    let t = (y * tex.width + x) as usize;
    let b = tex.format.bytes();
    let d = &mut tex.data[t * b..(t + 1) * b];
    match tex.format {
        crate::TexelFormat::Rgba32Float => {
            for i in 0..4 {
                d[i * 4..i * 4 + 4].copy_from_slice(&v[i].to_le_bytes());
            }
        }
        crate::TexelFormat::Rgba16Float => {
            for i in 0..4 {
                d[i * 2..i * 2 + 2].copy_from_slice(&half::f16::from_f32(v[i]).to_le_bytes());
            }
        }
        crate::TexelFormat::R32Float => d.copy_from_slice(&v[0].to_le_bytes()),
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

fn expr_name(e: &Expression) -> String {
    let s = format!("{e:?}");
    s.split([' ', '(', '{']).next().unwrap_or("?").to_string()
}
