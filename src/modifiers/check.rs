//! Checking a caller's WGSL before any pipeline exists: parsed and validated by naga, each
//! mistake one error naming the caller's file, line and column; what a modifier may not do
//! (globals, entry points, barriers, atomics, subgroup operations, reserved names, wrong
//! signatures) refused.

use super::{Modifiers, Preset, Role, RESERVED_PREFIX, SCORE_MOD_GRAD_SIGNATURE};
use crate::error::{Error, Result};

impl Modifiers {
    /// Checks the modifiers before any pipeline is made, every rule in one place (the CLI,
    /// Python and the browser validate nothing themselves): each preset's own rules
    /// ([`super::Preset::check`]: a soft-cap finite and positive, …); the caller's WGSL
    /// parses and validates, defines each function it was given for with the expected
    /// signature, declares no global (bindings, workgroup or private memory), no entry
    /// point, uses no atomic, barrier or subgroup operation, and names nothing `wa_…`; buffer
    /// names are identifiers, unique, non-empty.
    ///
    /// ```
    /// use wgpu_attention::{Error, Modifiers, Preset};
    /// let e = Modifiers::new().preset(Preset::Softcap(0.0)).check().unwrap_err();
    /// assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    /// assert!(e.to_string().contains("softcap"), "{e}");
    /// assert!(Modifiers::new().preset(Preset::Softcap(30.0)).check().is_ok());
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`], one line naming the preset and its rule, or the source
    /// (file), line and column.
    pub fn check(&self) -> Result<()> {
        for p in &self.presets {
            p.check()?;
        }
        let mut seen = std::collections::HashSet::new();
        for b in &self.buffers {
            let ok = b
                .name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && b.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok || b.name.starts_with(RESERVED_PREFIX) {
                return Err(invalid(format!(
                    "modifier buffer name {:?} is not an identifier of letters, digits and _ \
                     (not starting with {RESERVED_PREFIX})",
                    b.name
                )));
            }
            if !seen.insert(b.name.clone()) {
                return Err(invalid(format!("modifier buffer {:?} given twice", b.name)));
            }
            if b.data.len() == 0 {
                return Err(invalid(format!("modifier buffer {:?} is empty", b.name)));
            }
        }
        // The caller's code alone first (with the buffers it reads), so each message points
        // into it; then everything the kernels include, which must check too.
        let (text, segments) = self.assemble(0, 0, false);
        let module = parse_and_validate(&text, &segments)?;
        let ours = self.all_buffers().len();
        if let Some((_, g)) = module.global_variables.iter().nth(ours) {
            return Err(invalid(format!(
                "a modifier may not declare `var {}` (a binding, workgroup or private memory); \
                 pass data as a modifier buffer",
                g.name.as_deref().unwrap_or("?")
            )));
        }
        if let Some(ep) = module.entry_points.first() {
            return Err(invalid(format!(
                "a modifier may not declare an entry point (`{}`)",
                ep.name
            )));
        }
        for (_, f) in module.functions.iter() {
            let name = f.name.as_deref().unwrap_or("?");
            if name.starts_with(RESERVED_PREFIX) {
                return Err(invalid(format!(
                    "modifier function `{name}`: names starting with {RESERVED_PREFIX} are reserved"
                )));
            }
            if let Some(what) = forbidden(&f.body) {
                return Err(invalid(format!(
                    "modifier function `{name}` uses {what}, which a modifier may not"
                )));
            }
        }
        for (role, given) in [
            (Role::Score, self.score_mod.is_some()),
            (Role::ScoreGrad, self.score_mod_grad.is_some()),
            (Role::Mask, self.mask_mod.is_some()),
        ] {
            if given {
                check_signature(&module, role)?;
            }
        }
        let (all, _) = self.assemble(0, 0, true);
        parse_and_validate(&all, &[("generated modifier code".into(), 1)])?;
        Ok(())
    }

    /// Every name the caller's code declares at module scope: its buffers, functions and
    /// constants (each must differ from the names of the kernels it is compiled into).
    ///
    /// # Errors
    /// As [`Modifiers::check`].
    pub(crate) fn declared_names(&self) -> Result<Vec<String>> {
        let (text, segments) = self.assemble(0, 0, false);
        let module = parse_and_validate(&text, &segments)?;
        let mut names: Vec<String> = self.buffers.iter().map(|b| b.name.clone()).collect();
        names.extend(module.functions.iter().filter_map(|(_, f)| f.name.clone()));
        names.extend(module.constants.iter().filter_map(|(_, c)| c.name.clone()));
        Ok(names)
    }

    /// Which of the batch and head indices the mask modifiers read, `[b, h]`: a block map
    /// is shared along an axis none of them reads. A caller's `mask_mod` reads an index
    /// when naga finds its argument used at all (passing it to a helper counts); of the
    /// presets, document masking reads the batch index.
    ///
    /// # Errors
    /// As [`Modifiers::check`].
    pub(crate) fn mask_axes(&self) -> Result<[bool; 2]> {
        let mut axes = [false; 2];
        if self
            .presets
            .iter()
            .any(|p| matches!(p, super::Preset::Documents { .. }))
        {
            axes[0] = true;
        }
        if self.mask_mod.is_some() {
            let (text, segments) = self.assemble(0, 0, false);
            let (module, info) = parse_and_validate_info(&text, &segments)?;
            let name = Role::Mask.function();
            let found = module
                .functions
                .iter()
                .find(|(_, f)| f.name.as_deref() == Some(name));
            if let Some((fh, f)) = found {
                for (e, expr) in f.expressions.iter() {
                    if let naga::Expression::FunctionArgument(i @ (0 | 1)) = *expr {
                        if info[fh][e].ref_count > 0 {
                            axes[i as usize] = true;
                        }
                    }
                }
            }
        }
        Ok(axes)
    }

    /// Whether any mask modifier is present (the caller's or a preset's).
    pub(crate) fn has_mask(&self) -> bool {
        self.mask_mod.is_some() || self.presets.iter().any(|p| p.role() == Role::Mask)
    }
}

/// What the reference and the problem need of the modifiers (beyond their own rules).
impl Modifiers {
    /// Whether the f64 reference can apply these modifiers as the kernels do: each of the
    /// caller's WGSL functions with its CPU form and each CPU form with its WGSL (else the
    /// reference would not compute what the kernels do); for the `backward`, the CPU form of
    /// `score_mod_grad` with a `score_mod`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the missing half of a pair; for the backward,
    /// [`Error::Unsupported`] naming the missing derivative.
    pub(crate) fn check_cpu(&self, backward: bool) -> Result<()> {
        let pairs = [
            (
                "score_mod",
                self.score_mod.is_some(),
                self.score_mod_cpu.is_some(),
            ),
            (
                "mask_mod",
                self.mask_mod.is_some(),
                self.mask_mod_cpu.is_some(),
            ),
        ];
        for (name, wgsl, cpu) in pairs {
            if wgsl && !cpu {
                return Err(Error::invalid(
                    "reference",
                    format!(
                        "a caller's {name} has no CPU form: give the same function as a Rust                          closure with Modifiers::{name}_cpu"
                    ),
                ));
            }
            if cpu && !wgsl {
                return Err(Error::invalid(
                    "reference",
                    format!(
                        "Modifiers::{name}_cpu without its WGSL (Modifiers::{name}): the                          kernels would not apply it"
                    ),
                ));
            }
        }
        if backward && self.score_mod_cpu.is_some() && self.score_mod_grad_cpu.is_none() {
            return Err(Error::Unsupported {
                feature: "gradients through a caller's score_mod without the CPU form of its                           score_mod_grad"
                    .into(),
                adapter: "the f64 reference".into(),
                hint: "give its derivative by the score as a Rust closure as well:                        Modifiers::score_mod_grad_cpu(|score, b, h, q, kv| ..)"
                    .into(),
            });
        }
        Ok(())
    }

    /// Whether gradients can flow through the score modifiers: every preset has one, a
    /// caller's `score_mod` only with its `score_mod_grad`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming what is missing.
    pub fn check_differentiable(&self) -> Result<()> {
        let tables = self
            .presets
            .iter()
            .filter(|p| matches!(p, Preset::RelativeBias { .. }))
            .count();
        if tables > 1 {
            return Err(Error::Unsupported {
                feature: format!("gradients through {tables} relative bias tables in one call"),
                adapter: "any".into(),
                hint: "add the tables into one (their buckets must agree) or run the backward \
                       with one"
                    .into(),
            });
        }
        if self.score_mod.is_some() && self.score_mod_grad.is_none() {
            return Err(Error::Unsupported {
                feature: "gradients through a caller's score_mod without its score_mod_grad".into(),
                adapter: "any".into(),
                hint: format!(
                    "give its derivative by the score as well: {SCORE_MOD_GRAD_SIGNATURE}"
                ),
            });
        }
        Ok(())
    }

    /// Checks the presets against the problem `(batch, heads, n_q, n_kv)`: each preset's own
    /// rules ([`Preset::check`]), one ALiBi slope per query head, a relative bias table of
    /// one column per query head, document ids for every position a query or key has.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] as [`Preset::check`]; [`Error::ShapeMismatch`] naming the
    /// preset and what it needed.
    pub fn check_problem(&self, [batch, heads, n_q, n_kv]: [usize; 4]) -> Result<()> {
        for p in &self.presets {
            p.check()?;
        }
        for p in &self.presets {
            match p {
                Preset::Alibi(slopes) if slopes.len() != heads => {
                    return Err(Error::shape(format!(
                        "ALiBi has {} slopes; the query has {heads} heads (one slope per head)",
                        slopes.len()
                    )))
                }
                Preset::RelativeBias { table, buckets, .. }
                    if table.len() != *buckets as usize * heads =>
                {
                    let has = table.len() / (*buckets).max(1) as usize;
                    return Err(Error::shape(format!(
                        "the relative bias table has {has} heads, (buckets, heads) = \
                         ({buckets}, {has}); the query has {heads} heads"
                    )));
                }
                Preset::Documents { ids, n } => {
                    let n = *n as usize;
                    if n < n_q.max(n_kv) {
                        return Err(Error::shape(format!(
                            "document ids have {n} positions; the query has {n_q} and the key \
                             {n_kv} (one id per position)"
                        )));
                    }
                    if ids.len() != batch * n {
                        return Err(Error::shape(format!(
                            "document ids of {} values in rows of {n}: (batch, n) = ({batch}, \
                             {n}) is needed",
                            ids.len()
                        )));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// `text` parsed and validated by naga; an error names the source (of `segments`: origin,
/// first line) and the line and column in it.
fn parse_and_validate(text: &str, segments: &[(String, u32)]) -> Result<naga::Module> {
    parse_and_validate_info(text, segments).map(|(m, _)| m)
}

/// [`parse_and_validate`], with naga's analysis of the module.
fn parse_and_validate_info(
    text: &str,
    segments: &[(String, u32)],
) -> Result<(naga::Module, naga::valid::ModuleInfo)> {
    let locate = |loc: Option<naga::SourceLocation>| -> String {
        let Some(loc) = loc else {
            return "modifier".into();
        };
        let (origin, first) = segments
            .iter()
            .rev()
            .find(|(_, first)| *first <= loc.line_number)
            .map(|(o, f)| (o.as_str(), *f))
            .unwrap_or(("modifier buffers", 1));
        format!(
            "{origin}:{}:{}",
            loc.line_number - first + 1,
            loc.line_position
        )
    };
    let module = naga::front::wgsl::parse_str(text)
        .map_err(|e| invalid(format!("{}: {}", locate(e.location(text)), e.message())))?;
    let mut validator = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    );
    let info = validator.validate(&module).map_err(|e| {
        // The innermost span is the most precise; the message chain says what and where.
        let loc = e.spans().last().map(|(span, _)| span.location(text));
        let mut msg = e.as_inner().to_string();
        let mut cause = std::error::Error::source(e.as_inner());
        while let Some(c) = cause {
            msg.push_str(": ");
            msg.push_str(&c.to_string());
            cause = c.source();
        }
        invalid(format!("{}: {}", locate(loc), one_line(&msg)))
    })?;
    Ok((module, info))
}

fn invalid(msg: String) -> Error {
    Error::invalid("modifier", msg)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The first statement a modifier may not use, described.
fn forbidden(block: &naga::Block) -> Option<&'static str> {
    use naga::Statement as S;
    for st in block.iter() {
        let found = match st {
            S::ControlBarrier(_) | S::MemoryBarrier(_) => Some("a barrier"),
            S::WorkGroupUniformLoad { .. } => Some("workgroupUniformLoad (a barrier)"),
            S::Atomic { .. } | S::ImageAtomic { .. } => Some("an atomic operation"),
            S::SubgroupBallot { .. }
            | S::SubgroupGather { .. }
            | S::SubgroupCollectiveOperation { .. } => Some("a subgroup operation"),
            S::Store { .. } | S::ImageStore { .. } => None,
            S::Block(b) => forbidden(b),
            S::If { accept, reject, .. } => forbidden(accept).or_else(|| forbidden(reject)),
            S::Switch { cases, .. } => cases.iter().find_map(|c| forbidden(&c.body)),
            S::Loop {
                body, continuing, ..
            } => forbidden(body).or_else(|| forbidden(continuing)),
            _ => None,
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// `Err` unless `module` defines `role`'s function with its signature.
fn check_signature(module: &naga::Module, role: Role) -> Result<()> {
    use naga::{Scalar, TypeInner};
    let name = role.function();
    let Some((_, f)) = module
        .functions
        .iter()
        .find(|(_, f)| f.name.as_deref() == Some(name))
    else {
        return Err(invalid(format!(
            "the {name} source defines no `{name}`; expected `{}`",
            role.signature()
        )));
    };
    let scalar = |ty: naga::Handle<naga::Type>| match module.types[ty].inner {
        TypeInner::Scalar(s) => Some(s),
        _ => None,
    };
    let args: Vec<_> = f.arguments.iter().map(|a| scalar(a.ty)).collect();
    let want_args: &[Scalar] = match role {
        Role::Mask => &[Scalar::U32; 4],
        _ => &[
            Scalar::F32,
            Scalar::U32,
            Scalar::U32,
            Scalar::U32,
            Scalar::U32,
        ],
    };
    let want_result = match role {
        Role::Mask => Scalar::BOOL,
        _ => Scalar::F32,
    };
    let result = f.result.as_ref().and_then(|r| scalar(r.ty));
    let args_ok = args.len() == want_args.len()
        && args
            .iter()
            .zip(want_args)
            .all(|(a, w)| a.as_ref() == Some(w));
    if !args_ok || result != Some(want_result) {
        return Err(invalid(format!(
            "`{name}` has the wrong signature; expected `{}`",
            role.signature()
        )));
    }
    Ok(())
}
