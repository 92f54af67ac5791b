//! Setting up one dispatch (overrides, constants, the globals' memory from the bound
//! resources), running its workgroups one after another, and giving back the resources and
//! the findings.

use std::sync::{Condvar, Mutex};

use naga::{AddressSpace, Expression, Handle, Literal, TypeInner};

use super::memory::GMem;
use super::sched::{subgroup_main, Baton, Shared};
use super::shadow::Shadow;
use super::{Prog, Res};
use crate::counters::{self, Counters, Sample};
use crate::findings::FindingKind as FK;
use crate::math::from_f64;
use crate::prepare::prepare;
use crate::types::{leaf_count, K};
use crate::{Dispatch, Error, Finding, Report, Resource, Severity, Shader};

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
            const_eval(sh, overrides, value)?.repeat(size as usize)
        }
        ref other => {
            return Err(Error::Unsupported(format!(
                "the constant expression {other:?}"
            )))
        }
    })
}

/// A literal's leaf.
pub(super) fn literal(l: Literal) -> Res<u32> {
    Ok(match l {
        Literal::F32(x) => x.to_bits(),
        Literal::F16(x) => x.to_bits() as u32,
        Literal::U32(x) => x,
        Literal::I32(x) => x as u32,
        Literal::Bool(b) => b as u32,
        other => return Err(Error::Unsupported(format!("the literal {other:?}"))),
    })
}

/// The overrides' values: the dispatch's (by name or `@id`), else their initialisers.
fn overrides(sh: &Shader, d: &Dispatch) -> Res<Vec<Vec<u32>>> {
    let m = &sh.module;
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
    Ok(overrides)
}

/// The globals' memory (the bound resources taken out of the dispatch, workgroup memory),
/// and each private global's leaf count and initial value.
struct Globals {
    mem: Vec<GMem>,
    private_n: Vec<u32>,
    private_init: Vec<Vec<u32>>,
}

fn bind_globals(
    sh: &Shader,
    ep: usize,
    d: &mut Dispatch,
    overrides: &[Vec<u32>],
    out: &mut Globals,
    taken: &mut Vec<((u32, u32), Resource)>,
) -> Res<()> {
    let m = &sh.module;
    let ep_info = sh.info.get_entry_point(ep);
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
                bound(m, gv, key, r, taken)?
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
                    Some(h) => const_eval(sh, overrides, h)?,
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
        out.mem.push(g);
        out.private_n.push(pn);
        out.private_init.push(pinit);
    }
    Ok(())
}

/// Puts the resources held in `mem` (and `taken`) back into the dispatch.
fn give_back(mem: Vec<GMem>, taken: Vec<((u32, u32), Resource)>, d: &mut Dispatch) {
    for gm in mem {
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
    d.resources.extend(taken);
}

/// The memory of a bound resource `r` at `key` for the global `gv` (a texture for a handle,
/// else a buffer; a mismatch is an error, `r` then kept in `taken`).
fn bound(
    m: &naga::Module,
    gv: &naga::GlobalVariable,
    key: (u32, u32),
    r: Resource,
    taken: &mut Vec<((u32, u32), Resource)>,
) -> Res<GMem> {
    let name = gv.name.as_deref().unwrap_or("?");
    Ok(match (gv.space, r) {
        (AddressSpace::Handle, Resource::Texture(tex)) => {
            let writable = matches!(
                m.types[gv.ty].inner,
                TypeInner::Image {
                    class: naga::ImageClass::Storage { .. },
                    ..
                }
            );
            let texels = (tex.width * tex.height) as usize;
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
                shadow: vec![Shadow::default(); if writable { texels } else { 0 }],
                binding: key,
            }
        }
        (AddressSpace::Handle, r) | (_, r @ Resource::Texture(_)) => {
            let (is, bound) = match gv.space {
                AddressSpace::Handle => ("texture", "buffer"),
                _ => ("buffer", "texture"),
            };
            taken.push((key, r));
            return Err(Error::Dispatch(format!(
                "`{name}` is a {is}; a {bound} is bound"
            )));
        }
        (space, Resource::Buffer(data)) => {
            let writable = matches!(space, AddressSpace::Storage { access } if access.contains(naga::StorageAccess::STORE));
            // Per 2-byte granule, for writable buffers only.
            let granules = if writable { data.len() / 2 + 1 } else { 0 };
            GMem::Bytes {
                data,
                shadow: vec![Shadow::default(); granules],
                binding: key,
                uniform: space == AddressSpace::Uniform,
            }
        }
    })
}

/// Runs the dispatch under `seed`.
pub fn run(sh: &Shader, ep: usize, d: &mut Dispatch, seed: u64) -> Res<Report> {
    let m = &sh.module;
    let entry = &m.entry_points[ep];
    let w = d.subgroup_size;
    if !(4..=64).contains(&w) || !w.is_power_of_two() {
        return Err(Error::Dispatch(format!(
            "subgroup size {w}: must be a power of two from 4 to 64"
        )));
    }
    if let Sample::Chosen(list) = &d.sample {
        let total: u64 = d.workgroups.iter().map(|&x| u64::from(x)).product();
        let mut seen = std::collections::HashSet::new();
        if let Some((i, _)) = list.iter().find(|(i, _)| *i >= total || !seen.insert(*i)) {
            return Err(Error::Dispatch(format!(
                "sampled workgroup {i}: past the grid of {total} or chosen twice"
            )));
        }
    }
    let overrides = overrides(sh, d)?;
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
    let ep_prep = prepare(sh, &entry.function, sh.info.get_entry_point(ep))?;
    let mut fn_preps = Vec::new();
    for (fh, f) in m.functions.iter() {
        fn_preps.push(prepare(sh, f, &sh.info[fh])?);
    }
    let mut globals = Globals {
        mem: Vec::new(),
        private_n: Vec::new(),
        private_init: Vec::new(),
    };
    let mut taken = Vec::new();
    if let Err(e) = bind_globals(sh, ep, d, &overrides, &mut globals, &mut taken) {
        give_back(globals.mem, taken, d);
        return Err(e);
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
        schedule: d.schedule,
        count: d.counters,
        private_n: globals.private_n,
        private_init: globals.private_init,
    };
    let lock: Baton = (
        Mutex::new(Shared::new(globals.mem, n_sg, seed)),
        (0..n_sg).map(|_| Condvar::new()).collect(),
    );
    let [gx, gy, gz] = d.workgroups;
    let total = u64::from(gx) * u64::from(gy) * u64::from(gz);
    let mut counters = d.counters.then(|| Counters {
        subgroup_size: w,
        workgroups: total,
        ..Counters::default()
    });
    let mut by_weight = std::collections::BTreeMap::new();
    let mut each = Vec::new();
    let mut result = Ok(());
    for (linear, weight) in counters::sample(total, &d.sample, seed) {
        let linear = linear as u32;
        let wg_id = [linear % gx, (linear / gx) % gy, linear / (gx * gy)];
        lock.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .begin_workgroup(linear, d.zero_workgroup_memory);
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
            break;
        }
        if counters.is_some() {
            // Summed per weight, scaled once at the end (no rounding per workgroup).
            let wg = std::mem::take(&mut g.counters);
            if matches!(d.sample, Sample::Chosen(_)) {
                let mut own = wg.clone();
                own.subgroup_size = w;
                own.workgroups = 1;
                own.workgroups_counted = 1;
                each.push((u64::from(linear), own));
            }
            by_weight
                .entry(weight.to_bits())
                .or_insert_with(Counters::default)
                .add_scaled(&wg, 1.0);
        }
    }
    if let Some(c) = counters.as_mut() {
        for (weight, sum) in &by_weight {
            c.add_scaled(sum, f64::from_bits(*weight));
            c.workgroups_counted += sum.subgroups / u64::from(n_sg.max(1));
        }
    }
    let shared = lock.0.into_inner().unwrap_or_else(|e| e.into_inner());
    give_back(shared.mem, Vec::new(), d);
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
            entry_point: entry.name.clone(),
            location: sh.location(raw.span),
            other_location: raw.other_span.and_then(|s| sh.location(s)),
            invocation: raw.inv.map(|i| prog.invocation(i)),
            other: raw.other.map(|i| prog.invocation(i)),
            detail: raw.detail,
            count,
            seed,
        });
    }
    Ok(Report {
        findings,
        lane_ops: shared.lane_ops,
        max_loop_iterations: shared.max_iters,
        seed,
        seeds_run: 1,
        counters,
        workgroup_counters: each,
    })
}
