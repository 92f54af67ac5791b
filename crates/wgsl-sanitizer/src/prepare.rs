//! Everything the interpreter needs to know about a function before running it, worked out
//! once: each expression's shape (leaf count, scalar kind, what a pointer points at), the
//! offsets of access chains, which expressions are emitted; and the static check that every
//! expression, statement and builtin reachable from an entry point is supported.

use std::sync::Arc;

use naga::{AddressSpace, Block, Expression, Function, Handle, MathFunction, Statement, TypeInner};

use crate::types::{column_stride, homogeneous, leaf_count, leaves_of, Leaves, K};
use crate::{Error, Shader};

/// What a pointer points at.
#[derive(Clone, Debug)]
pub struct PtrMeta {
    /// Byte memory (storage or uniform buffer): offsets count bytes; else words (leaves).
    pub bytes: bool,
    /// Leaves of the pointee (`None` when it is runtime-sized).
    pub leaves: Option<Arc<Leaves>>,
    /// Homogeneous kind of the pointee (scalar, vector, matrix, atomic).
    pub k: Option<K>,
    pub atomic: bool,
}

/// The bound of a dynamic index.
#[derive(Clone, Copy, Debug)]
pub enum Bound {
    /// Known length.
    Fixed(u32),
    /// A runtime-sized array in byte memory: its length follows from the buffer's size.
    Runtime { stride: u32 },
}

/// One step of an access chain: offset += index × `mul` + `add`.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    pub mul: u32,
    pub add: u32,
    pub bound: Bound,
}

/// An expression's shape.
#[derive(Clone, Debug, Default)]
pub struct Meta {
    /// Leaves of its value (0 for pointers and textures).
    pub n: u32,
    /// Homogeneous scalar kind of the value.
    pub k: Option<K>,
    /// Leaves of the value, for composites (kinds of each leaf).
    pub leaves: Option<Arc<Leaves>>,
    pub ptr: Option<PtrMeta>,
    /// For `Access`/`AccessIndex`: how the index moves the offset.
    pub step: Option<Step>,
}

/// A function, prepared.
pub struct FnPrep {
    pub metas: Vec<Meta>,
    pub emitted: Vec<bool>,
}

fn is_bytes(space: AddressSpace) -> bool {
    matches!(
        space,
        AddressSpace::Storage { .. } | AddressSpace::Uniform | AddressSpace::Immediate
    )
}

fn leaves_for(shader: &Shader, inner: &TypeInner) -> Option<Arc<Leaves>> {
    leaves_of(inner, &shader.module.types, &shader.types.leaves)
        .ok()
        .map(Arc::new)
}

fn ptr_meta(shader: &Shader, inner: &TypeInner) -> Option<PtrMeta> {
    let types = &shader.module.types;
    match *inner {
        TypeInner::Pointer { base, space } => {
            let pointee = &types[base].inner;
            Some(PtrMeta {
                bytes: is_bytes(space),
                leaves: shader.types.get(base).cloned(),
                k: homogeneous(pointee),
                atomic: matches!(pointee, TypeInner::Atomic(_)),
            })
        }
        TypeInner::ValuePointer {
            size,
            scalar,
            space,
        } => {
            let pointee = match size {
                Some(size) => TypeInner::Vector { size, scalar },
                None => TypeInner::Scalar(scalar),
            };
            Some(PtrMeta {
                bytes: is_bytes(space),
                leaves: leaves_for(shader, &pointee),
                k: K::of(scalar).ok(),
                atomic: false,
            })
        }
        _ => None,
    }
}

/// The type an access chain step walks into, and the step.
fn step_of(
    shader: &Shader,
    base: &TypeInner,
    index: Option<u32>,
) -> Result<(Step, Option<TypeInner>), Error> {
    let types = &shader.module.types;
    // `bytes` decides the unit; the caller passes the container type (pointee or value).
    Ok(match *base {
        TypeInner::Vector { size, scalar } => (
            Step {
                mul: scalar.width as u32,
                add: 0,
                bound: Bound::Fixed(size as u32),
            },
            Some(TypeInner::Scalar(scalar)),
        ),
        TypeInner::Matrix {
            columns,
            rows,
            scalar,
        } => (
            Step {
                mul: column_stride(rows, scalar.width),
                add: 0,
                bound: Bound::Fixed(columns as u32),
            },
            Some(TypeInner::Vector { size: rows, scalar }),
        ),
        TypeInner::Array { base, size, stride } => (
            Step {
                mul: stride,
                add: 0,
                bound: match size {
                    naga::ArraySize::Constant(n) => Bound::Fixed(n.get()),
                    _ => Bound::Runtime { stride },
                },
            },
            Some(types[base].inner.clone()),
        ),
        TypeInner::Struct { ref members, .. } => {
            let i = index.ok_or_else(|| Error::Unsupported("dynamic struct index".into()))?;
            let m = &members[i as usize];
            (
                Step {
                    mul: 0,
                    add: m.offset,
                    bound: Bound::Fixed(members.len() as u32),
                },
                Some(types[m.ty].inner.clone()),
            )
        }
        ref other => {
            return Err(Error::Unsupported(format!(
                "indexing into a {}",
                crate::types::type_name(other)
            )))
        }
    })
}

/// The same step in word units (leaves): used for word memory and for values.
fn word_step(shader: &Shader, base: &TypeInner, index: Option<u32>) -> Result<Step, Error> {
    let types = &shader.module.types;
    Ok(match *base {
        TypeInner::Vector { size, .. } => Step {
            mul: 1,
            add: 0,
            bound: Bound::Fixed(size as u32),
        },
        TypeInner::Matrix { columns, rows, .. } => Step {
            mul: rows as u32,
            add: 0,
            bound: Bound::Fixed(columns as u32),
        },
        TypeInner::Array { base, size, .. } => {
            let n = match size {
                naga::ArraySize::Constant(n) => n.get(),
                _ => {
                    return Err(Error::Unsupported(
                        "a runtime-sized array outside a buffer".into(),
                    ))
                }
            };
            Step {
                mul: leaf_count(&types[base].inner, types)?,
                add: 0,
                bound: Bound::Fixed(n),
            }
        }
        TypeInner::Struct { ref members, .. } => {
            let i = index.ok_or_else(|| Error::Unsupported("dynamic struct index".into()))?;
            let mut add = 0;
            for m in &members[..i as usize] {
                add += leaf_count(&types[m.ty].inner, types)?;
            }
            Step {
                mul: 0,
                add,
                bound: Bound::Fixed(members.len() as u32),
            }
        }
        ref other => {
            return Err(Error::Unsupported(format!(
                "indexing into a {}",
                crate::types::type_name(other)
            )))
        }
    })
}

fn mark_emitted(block: &Block, emitted: &mut [bool]) {
    for stmt in block.iter() {
        match *stmt {
            Statement::Emit(ref r) => {
                for h in r.clone() {
                    emitted[h.index()] = true;
                }
            }
            Statement::Block(ref b) => mark_emitted(b, emitted),
            Statement::If {
                ref accept,
                ref reject,
                ..
            } => {
                mark_emitted(accept, emitted);
                mark_emitted(reject, emitted);
            }
            Statement::Switch { ref cases, .. } => {
                for c in cases {
                    mark_emitted(&c.body, emitted);
                }
            }
            Statement::Loop {
                ref body,
                ref continuing,
                ..
            } => {
                mark_emitted(body, emitted);
                mark_emitted(continuing, emitted);
            }
            _ => {}
        }
    }
}

/// Prepares `func` (whose validation info is `finfo`).
pub fn prepare(
    shader: &Shader,
    func: &Function,
    finfo: &naga::valid::FunctionInfo,
) -> Result<FnPrep, Error> {
    let types = &shader.module.types;
    let mut metas: Vec<Meta> = Vec::with_capacity(func.expressions.len());
    for (h, expr) in func.expressions.iter() {
        let inner = finfo[h].ty.inner_with(types);
        let mut m = Meta {
            k: homogeneous(inner),
            ..Meta::default()
        };
        match *inner {
            TypeInner::Pointer { .. } | TypeInner::ValuePointer { .. } => {
                m.ptr = ptr_meta(shader, inner);
            }
            TypeInner::Image { .. } | TypeInner::Sampler { .. } => {}
            _ => {
                m.n = leaf_count(inner, types).unwrap_or(0);
                if m.k.is_none() {
                    m.leaves = match finfo[h].ty {
                        naga::proc::TypeResolution::Handle(t) => shader.types.get(t).cloned(),
                        naga::proc::TypeResolution::Value(ref v) => leaves_for(shader, v),
                    };
                }
            }
        }
        let index = match *expr {
            Expression::AccessIndex { base, index } => Some((base, Some(index))),
            Expression::Access { base, .. } => Some((base, None)),
            _ => None,
        };
        if let Some((base, index)) = index {
            let binner = finfo[base].ty.inner_with(types);
            let step = match *binner {
                TypeInner::Pointer {
                    base: pointee,
                    space,
                } => {
                    let pt = &types[pointee].inner;
                    if is_bytes(space) {
                        step_of(shader, pt, index)?.0
                    } else {
                        word_step(shader, pt, index)?
                    }
                }
                TypeInner::ValuePointer {
                    size: Some(size),
                    scalar,
                    space,
                } => {
                    let pt = TypeInner::Vector { size, scalar };
                    if is_bytes(space) {
                        step_of(shader, &pt, index)?.0
                    } else {
                        word_step(shader, &pt, index)?
                    }
                }
                ref v => word_step(shader, v, index)?,
            };
            let step = match index {
                Some(i) => Step {
                    add: step.add + i * step.mul,
                    ..step
                },
                None => step,
            };
            m.step = Some(step);
        }
        metas.push(m);
    }
    let mut emitted = vec![false; func.expressions.len()];
    mark_emitted(&func.body, &mut emitted);
    Ok(FnPrep { metas, emitted })
}

/// Whether the interpreter implements this math function.
pub fn math_supported(f: MathFunction) -> bool {
    use MathFunction as M;
    matches!(
        f,
        M::Abs
            | M::Min
            | M::Max
            | M::Clamp
            | M::Saturate
            | M::Cos
            | M::Cosh
            | M::Sin
            | M::Sinh
            | M::Tan
            | M::Tanh
            | M::Acos
            | M::Asin
            | M::Atan
            | M::Atan2
            | M::Asinh
            | M::Acosh
            | M::Atanh
            | M::Radians
            | M::Degrees
            | M::Ceil
            | M::Floor
            | M::Round
            | M::Fract
            | M::Trunc
            | M::Ldexp
            | M::Exp
            | M::Exp2
            | M::Log
            | M::Log2
            | M::Pow
            | M::Dot
            | M::Cross
            | M::Distance
            | M::Length
            | M::Normalize
            | M::Sign
            | M::Fma
            | M::Mix
            | M::Step
            | M::SmoothStep
            | M::Sqrt
            | M::InverseSqrt
            | M::CountTrailingZeros
            | M::CountLeadingZeros
            | M::CountOneBits
            | M::ReverseBits
            | M::ExtractBits
            | M::InsertBits
            | M::FirstTrailingBit
            | M::FirstLeadingBit
            | M::Pack2x16float
            | M::Unpack2x16float
    )
}

fn at(shader: &Shader, span: naga::Span) -> String {
    match shader.location(span) {
        Some((l, c)) => format!(" at {l}:{c}"),
        None => String::new(),
    }
}

fn check_block(shader: &Shader, block: &Block) -> Result<(), Error> {
    for (stmt, span) in block.span_iter() {
        let bad = |what: &str| Err(Error::Unsupported(format!("{what}{}", at(shader, *span))));
        match *stmt {
            Statement::Emit(_)
            | Statement::Break
            | Statement::Continue
            | Statement::Return { .. }
            | Statement::Store { .. }
            | Statement::Call { .. }
            | Statement::WorkGroupUniformLoad { .. }
            | Statement::SubgroupBallot { .. }
            | Statement::SubgroupCollectiveOperation { .. }
            | Statement::CooperativeStore { .. } => {}
            Statement::ControlBarrier(b) | Statement::MemoryBarrier(b) => {
                if b.contains(naga::Barrier::TEXTURE) {
                    return bad("textureBarrier");
                }
            }
            Statement::ImageStore { array_index, .. } => {
                if array_index.is_some() {
                    return bad("textureStore to an arrayed texture");
                }
            }
            Statement::Atomic { fun, .. } => {
                if let naga::AtomicFunction::Exchange { compare: Some(_) } = fun {
                    return bad("atomicCompareExchangeWeak");
                }
            }
            Statement::SubgroupGather { mode, .. } => {
                if let naga::GatherMode::QuadBroadcast(_) | naga::GatherMode::QuadSwap(_) = mode {
                    return bad("quad operations");
                }
            }
            Statement::Block(ref b) => check_block(shader, b)?,
            Statement::If {
                ref accept,
                ref reject,
                ..
            } => {
                check_block(shader, accept)?;
                check_block(shader, reject)?;
            }
            Statement::Switch { ref cases, .. } => {
                for c in cases {
                    check_block(shader, &c.body)?;
                }
            }
            Statement::Loop {
                ref body,
                ref continuing,
                ..
            } => {
                check_block(shader, body)?;
                check_block(shader, continuing)?;
            }
            Statement::Kill => return bad("discard"),
            Statement::ImageAtomic { .. } => return bad("texture atomics"),
            Statement::RayQuery { .. } | Statement::RayPipelineFunction(_) => {
                return bad("ray tracing")
            }
        }
    }
    Ok(())
}

fn check_function(shader: &Shader, func: &Function) -> Result<(), Error> {
    let types = &shader.module.types;
    for (h, expr) in func.expressions.iter() {
        let span = func.expressions.get_span(h);
        let bad = |what: String| Err(Error::Unsupported(format!("{what}{}", at(shader, span))));
        match *expr {
            Expression::Math { fun, .. } if !math_supported(fun) => {
                return bad(format!("the math function {fun:?}"))
            }
            Expression::ImageSample { .. } => return bad("textureSample".into()),
            Expression::Derivative { .. } => return bad("derivatives".into()),
            Expression::RayQueryVertexPositions { .. }
            | Expression::RayQueryProceedResult
            | Expression::RayQueryGetIntersection { .. } => return bad("ray queries".into()),
            Expression::ImageQuery { query, .. }
                if !matches!(query, naga::ImageQuery::Size { .. }) =>
            {
                return bad(format!("the texture query {query:?}"));
            }
            Expression::ImageLoad {
                array_index,
                sample,
                ..
            } if array_index.is_some() || sample.is_some() => {
                return bad("textureLoad from an arrayed or multisampled texture".into());
            }
            Expression::As {
                convert: Some(w), ..
            } if w != 4 && w != 2 && w != 1 => {
                return bad(format!("a conversion to a {w}-byte scalar"))
            }
            _ => {}
        }
        // Every scalar type must be one of ours.
        let finfo_ty = leaf_kinds_ok(shader, expr, func, h);
        if let Err(e) = finfo_ty {
            return Err(Error::Unsupported(format!("{e}{}", at(shader, span))));
        }
    }
    for (_, lv) in func.local_variables.iter() {
        if let Err(e) = leaf_count(&types[lv.ty].inner, types) {
            return Err(Error::Unsupported(format!(
                "local variable `{}`: {e}",
                lv.name.as_deref().unwrap_or("?")
            )));
        }
    }
    check_block(shader, &func.body)
}

fn leaf_kinds_ok(
    shader: &Shader,
    expr: &Expression,
    _func: &Function,
    _h: Handle<Expression>,
) -> Result<(), String> {
    if let Expression::Literal(lit) = *expr {
        use naga::Literal as L;
        match lit {
            L::F32(_) | L::F16(_) | L::U32(_) | L::I32(_) | L::Bool(_) => {}
            other => return Err(format!("the literal {other:?}")),
        }
    }
    let _ = shader;
    Ok(())
}

/// Checks everything reachable from entry point `ep`.
pub fn check_supported(shader: &Shader, ep: usize) -> Result<(), Error> {
    let module = &shader.module;
    let entry = &module.entry_points[ep];
    for (_, gv) in module.global_variables.iter() {
        match gv.space {
            AddressSpace::Function
            | AddressSpace::Private
            | AddressSpace::WorkGroup
            | AddressSpace::Uniform
            | AddressSpace::Storage { .. }
            | AddressSpace::Handle => {}
            other => {
                return Err(Error::Unsupported(format!(
                    "global `{}` in address space {other:?}",
                    gv.name.as_deref().unwrap_or("?")
                )))
            }
        }
        if let TypeInner::Image { dim, class, .. } = module.types[gv.ty].inner {
            if dim != naga::ImageDimension::D2 {
                return Err(Error::Unsupported(format!("a {dim:?} texture")));
            }
            if let naga::ImageClass::Depth { .. } | naga::ImageClass::External = class {
                return Err(Error::Unsupported(format!("a texture of class {class:?}")));
            }
        }
        if let TypeInner::Sampler { .. } | TypeInner::BindingArray { .. } =
            module.types[gv.ty].inner
        {
            return Err(Error::Unsupported(format!(
                "global `{}`: samplers and binding arrays",
                gv.name.as_deref().unwrap_or("?")
            )));
        }
    }
    for arg in &entry.function.arguments {
        check_arg_binding(module, arg.binding.as_ref(), arg.ty)?;
    }
    check_function(shader, &entry.function)?;
    for (_, f) in module.functions.iter() {
        check_function(shader, f)?;
    }
    Ok(())
}

fn check_arg_binding(
    module: &naga::Module,
    binding: Option<&naga::Binding>,
    ty: Handle<naga::Type>,
) -> Result<(), Error> {
    use naga::BuiltIn as B;
    match binding {
        Some(naga::Binding::BuiltIn(b)) => match b {
            B::GlobalInvocationId
            | B::LocalInvocationId
            | B::LocalInvocationIndex
            | B::WorkGroupId
            | B::WorkGroupSize
            | B::NumWorkGroups
            | B::NumSubgroups
            | B::SubgroupId
            | B::SubgroupSize
            | B::SubgroupInvocationId => Ok(()),
            other => Err(Error::Unsupported(format!("the builtin {other:?}"))),
        },
        Some(naga::Binding::Location { .. }) => Err(Error::Unsupported(
            "a compute input with a @location".into(),
        )),
        None => match module.types[ty].inner {
            TypeInner::Struct { ref members, .. } => {
                for m in members {
                    check_arg_binding(module, m.binding.as_ref(), m.ty)?;
                }
                Ok(())
            }
            _ => Err(Error::Unsupported(
                "an entry point argument without binding".into(),
            )),
        },
    }
}
