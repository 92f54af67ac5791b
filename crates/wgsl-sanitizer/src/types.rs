//! How values of naga's types are laid out: as a flat list of scalar *leaves*.
//!
//! A value in a register is its leaves, one `u32` word each (f32 and i32 as their bits, f16
//! in the low 16 bits, bool as 0 or 1). Memory comes in two kinds:
//! - *word memory* (function, private and workgroup variables, which the host never sees):
//!   one word per leaf, and a pointer's offset counts leaves;
//! - *byte memory* (storage and uniform buffers): the host's bytes, laid out as naga
//!   laid them out (struct member offsets, array strides), and a pointer's offset counts bytes.

use std::sync::Arc;

use naga::{Handle, Scalar, ScalarKind, Type, TypeInner, UniqueArena};

use crate::Error;

/// The kind of one scalar leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum K {
    F32,
    F16,
    I32,
    U32,
    Bool,
}

impl K {
    pub fn of(s: Scalar) -> Result<K, Error> {
        Ok(match (s.kind, s.width) {
            (ScalarKind::Float, 4) => K::F32,
            (ScalarKind::Float, 2) => K::F16,
            (ScalarKind::Sint, 4) => K::I32,
            (ScalarKind::Uint, 4) => K::U32,
            (ScalarKind::Bool, _) => K::Bool,
            _ => return Err(Error::Unsupported(format!("scalar type {s:?}"))),
        })
    }

    /// Bytes of this leaf in byte memory.
    pub fn bytes(self) -> u32 {
        match self {
            K::F16 => 2,
            _ => 4,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, K::F32 | K::F16)
    }
}

/// A type's leaves in order: their kinds and their byte offsets in byte memory.
#[derive(Clone, Debug, Default)]
pub struct Leaves {
    pub kinds: Vec<K>,
    pub offsets: Vec<u32>,
}

impl Leaves {
    pub fn len(&self) -> usize {
        self.kinds.len()
    }
}

/// Per type handle of a module: its leaves (`None` for runtime-sized and opaque types).
pub struct TypeTable {
    pub leaves: Vec<Option<Arc<Leaves>>>,
}

impl TypeTable {
    pub fn new(types: &UniqueArena<Type>) -> TypeTable {
        let mut leaves: Vec<Option<Arc<Leaves>>> = Vec::with_capacity(types.len());
        for (_, ty) in types.iter() {
            let l = leaves_of(&ty.inner, types, &leaves).ok().map(Arc::new);
            leaves.push(l);
        }
        TypeTable { leaves }
    }

    pub fn get(&self, h: Handle<Type>) -> Option<&Arc<Leaves>> {
        self.leaves[h.index()].as_ref()
    }
}

/// Column stride in bytes of a matrix with `rows` rows of `width`-byte scalars.
pub fn column_stride(rows: naga::VectorSize, width: u8) -> u32 {
    let r = rows as u32;
    let aligned = if r == 3 { 4 } else { r };
    aligned * width as u32
}

fn push_scalar(out: &mut Leaves, k: K, off: u32) {
    out.kinds.push(k);
    out.offsets.push(off);
}

/// The leaves of `inner`, with `done` holding those of every earlier type handle.
pub fn leaves_of(
    inner: &TypeInner,
    types: &UniqueArena<Type>,
    done: &[Option<Arc<Leaves>>],
) -> Result<Leaves, Error> {
    let mut out = Leaves::default();
    match *inner {
        TypeInner::Scalar(s) | TypeInner::Atomic(s) => push_scalar(&mut out, K::of(s)?, 0),
        TypeInner::Vector { size, scalar } => {
            let k = K::of(scalar)?;
            for i in 0..size as u32 {
                push_scalar(&mut out, k, i * scalar.width as u32);
            }
        }
        TypeInner::Matrix {
            columns,
            rows,
            scalar,
        } => {
            let k = K::of(scalar)?;
            let cs = column_stride(rows, scalar.width);
            for c in 0..columns as u32 {
                for r in 0..rows as u32 {
                    push_scalar(&mut out, k, c * cs + r * scalar.width as u32);
                }
            }
        }
        TypeInner::CooperativeMatrix {
            columns,
            rows,
            scalar,
            ..
        } => {
            let k = K::of(scalar)?;
            for i in 0..(columns as u32 * rows as u32) {
                push_scalar(&mut out, k, i * scalar.width as u32);
            }
        }
        TypeInner::Array { base, size, stride } => {
            let n = match size {
                naga::ArraySize::Constant(n) => n.get(),
                _ => {
                    return Err(Error::Unsupported(
                        "a runtime-sized array as a value".into(),
                    ))
                }
            };
            let el = match done.get(base.index()) {
                Some(Some(l)) => l.clone(),
                _ => Arc::new(leaves_of(&types[base].inner, types, done)?),
            };
            out.kinds.reserve(el.len() * n as usize);
            for i in 0..n {
                for (k, o) in el.kinds.iter().zip(&el.offsets) {
                    push_scalar(&mut out, *k, i * stride + o);
                }
            }
        }
        TypeInner::Struct { ref members, .. } => {
            for m in members {
                let el = match done.get(m.ty.index()) {
                    Some(Some(l)) => l.clone(),
                    _ => Arc::new(leaves_of(&types[m.ty].inner, types, done)?),
                };
                for (k, o) in el.kinds.iter().zip(&el.offsets) {
                    push_scalar(&mut out, *k, m.offset + o);
                }
            }
        }
        ref other => {
            return Err(Error::Unsupported(format!(
                "a value of type {}",
                type_name(other)
            )))
        }
    }
    Ok(out)
}

/// Leaf count of a type (runtime-sized arrays and opaque types: error).
pub fn leaf_count(inner: &TypeInner, types: &UniqueArena<Type>) -> Result<u32, Error> {
    Ok(match *inner {
        TypeInner::Scalar(_) | TypeInner::Atomic(_) => 1,
        TypeInner::Vector { size, .. } => size as u32,
        TypeInner::Matrix { columns, rows, .. } => columns as u32 * rows as u32,
        TypeInner::CooperativeMatrix { columns, rows, .. } => columns as u32 * rows as u32,
        TypeInner::Array { base, size, .. } => match size {
            naga::ArraySize::Constant(n) => n.get() * leaf_count(&types[base].inner, types)?,
            _ => {
                return Err(Error::Unsupported(
                    "a runtime-sized array as a value".into(),
                ))
            }
        },
        TypeInner::Struct { ref members, .. } => {
            let mut n = 0;
            for m in members {
                n += leaf_count(&types[m.ty].inner, types)?;
            }
            n
        }
        ref other => {
            return Err(Error::Unsupported(format!(
                "a value of type {}",
                type_name(other)
            )))
        }
    })
}

/// A short name of a type's shape, for error messages.
pub fn type_name(inner: &TypeInner) -> &'static str {
    match inner {
        TypeInner::Scalar(_) => "scalar",
        TypeInner::Vector { .. } => "vector",
        TypeInner::Matrix { .. } => "matrix",
        TypeInner::CooperativeMatrix { .. } => "cooperative matrix",
        TypeInner::Atomic(_) => "atomic",
        TypeInner::Pointer { .. } | TypeInner::ValuePointer { .. } => "pointer",
        TypeInner::Array { .. } => "array",
        TypeInner::Struct { .. } => "struct",
        TypeInner::Image { .. } => "texture",
        TypeInner::Sampler { .. } => "sampler",
        TypeInner::AccelerationStructure { .. } => "acceleration structure",
        TypeInner::RayQuery { .. } => "ray query",
        TypeInner::BindingArray { .. } => "binding array",
    }
}

/// The homogeneous scalar kind of a scalar, vector, matrix or atomic type.
pub fn homogeneous(inner: &TypeInner) -> Option<K> {
    match *inner {
        TypeInner::Scalar(s)
        | TypeInner::Atomic(s)
        | TypeInner::Vector { scalar: s, .. }
        | TypeInner::Matrix { scalar: s, .. }
        | TypeInner::CooperativeMatrix { scalar: s, .. } => K::of(s).ok(),
        _ => None,
    }
}
