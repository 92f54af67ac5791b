//! Writing a kernel's WGSL once: the uniform struct and the specialisation constants are
//! declared in Rust ([`uniform!`], [`constants!`]) and their WGSL text is generated from that
//! declaration; [`compose`] prepends it, with the shared prelude (`shaders/prelude.wgsl`) and
//! the element-type aliases, to the kernel's file, and unrolls the loops marked `// unroll`.

/// The shared WGSL helpers every kernel is built with: masking, `-inf` stand-ins, `LOG2E`.
pub(crate) const PRELUDE: &str = include_str!("../../shaders/prelude.wgsl");

/// A Rust type with a WGSL counterpart of the same size in a uniform block.
pub(crate) trait WgslType {
    /// Its WGSL spelling.
    const WGSL: &'static str;
}

impl WgslType for u32 {
    const WGSL: &'static str = "u32";
}
impl WgslType for f32 {
    const WGSL: &'static str = "f32";
}
impl WgslType for [u32; 2] {
    const WGSL: &'static str = "vec2<u32>";
}
impl WgslType for [u32; 4] {
    const WGSL: &'static str = "vec4<u32>";
}

/// A kernel's uniform block (binding 0): a `#[repr(C)]` struct whose WGSL `struct Params` is
/// generated from the same declaration by [`uniform!`].
pub(crate) trait Uniform: bytemuck::Pod {
    /// `(name, WGSL type, byte offset)` of every field, in order.
    const FIELDS: &'static [(&'static str, &'static str, usize)];

    /// The WGSL declaration the host prepends: `struct Params { … }`.
    fn wgsl() -> String {
        let mut text = String::from("struct Params {\n");
        for (name, ty, _) in Self::FIELDS {
            text.push_str(&format!("    {name}: {ty},\n"));
        }
        text.push_str("}\n");
        text
    }
}

/// Declares a uniform struct once for Rust and WGSL: the `#[repr(C)]`, `Pod` struct and its
/// [`Uniform`] description (field names, WGSL types, offsets). Fields are `u32`, `f32`,
/// `[u32; 2]` or `[u32; 4]` (a WGSL `vec`, which must sit at a multiple of its
/// alignment: add `_pad` fields; a unit test checks every offset against naga's layout).
macro_rules! uniform {
    ($(#[$meta:meta])* $vis:vis struct $name:ident {
        $($(#[$fmeta:meta])* $field:ident: $ty:ty),* $(,)?
    }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        $vis struct $name {
            $($(#[$fmeta])* pub(crate) $field: $ty),*
        }

        impl $crate::kernels::wgsl::Uniform for $name {
            const FIELDS: &'static [(&'static str, &'static str, usize)] = &[
                $((
                    stringify!($field),
                    <$ty as $crate::kernels::wgsl::WgslType>::WGSL,
                    std::mem::offset_of!($name, $field),
                )),*
            ];
        }
    };
}
pub(crate) use uniform;

/// A kernel's specialisation constants: named `u32`s the host prepends as `const NAME: u32`.
/// They size private arrays and unroll loops, which WGSL `override`s cannot.
pub(crate) trait Constants: Copy + std::fmt::Debug {
    /// The WGSL names, in [`Constants::values`] order.
    const NAMES: &'static [&'static str];
    /// The values, one per name.
    fn values(&self) -> Vec<u32>;
}

/// Declares a kernel's constants as a struct of named `u32` fields, each with its WGSL name:
/// `constants! { pub(crate) struct FooConsts { rows => "R", mask => "MASK" } }`. A table with
/// more constants than a pipeline key holds ([`super::MAX_CONSTS`]) does not compile.
macro_rules! constants {
    ($(#[$meta:meta])* $vis:vis struct $name:ident {
        $($(#[$fmeta:meta])* $field:ident => $wgsl:literal),* $(,)?
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
        $vis struct $name {
            $($(#[$fmeta])* pub(crate) $field: u32),*
        }

        impl $crate::kernels::wgsl::Constants for $name {
            const NAMES: &'static [&'static str] = &[$($wgsl),*];
            fn values(&self) -> Vec<u32> {
                vec![$(self.$field),*]
            }
        }

        // Every value must find a slot in the pipeline key: checked where the table is
        // declared, at compile time.
        const _: () = assert!(
            <$name as $crate::kernels::wgsl::Constants>::NAMES.len()
                <= $crate::kernels::MAX_CONSTS,
            concat!(
                "constants! table `",
                stringify!($name),
                "` has more constants than a PipelineKey holds: raise kernels::MAX_CONSTS"
            )
        );
    };
}
pub(crate) use constants;

/// The constants of a kernel that has none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct NoConstants;

impl Constants for NoConstants {
    const NAMES: &'static [&'static str] = &[];
    fn values(&self) -> Vec<u32> {
        Vec::new()
    }
}

/// The full WGSL text of a kernel: `enable f16;` when any element type is f16, the aliases
/// (`alias Q_T = f16;`, bit `i` of `f16` for `dtypes[i]`), the constants, the prelude, the
/// generated `struct Params`, then `source` with its `// unroll` loops unrolled unless
/// `unrolled` is false (the emulated subgroups' builds: each exchange is two barriers, and
/// LLVM compiles 32 unrolled copies of them for minutes where it compiles the loop in
/// seconds), then the subgroup helpers it calls.
pub(crate) fn compose(
    source: &str,
    dtypes: &[&str],
    f16: u8,
    consts: &[(&str, u32)],
    params: &str,
    unrolled: bool,
) -> String {
    let mut text = String::new();
    if f16 != 0 {
        text.push_str("enable f16;\n");
    }
    for (i, name) in dtypes.iter().enumerate() {
        let ty = if f16 & (1 << i) != 0 { "f16" } else { "f32" };
        text.push_str(&format!("alias {name} = {ty};\n"));
    }
    for (name, value) in consts {
        text.push_str(&format!("const {name}: u32 = {value}u;\n"));
    }
    text.push_str(PRELUDE);
    text.push_str(params);
    let kept = drop_disabled(source, consts);
    let body = match unrolled {
        true => unroll(&kept, consts),
        false => kept,
    };
    text.push_str(&body);
    text.push_str(&crate::gpu::subgroups::native(&body));
    text
}

/// The marker that keeps a line (or the block it opens) only when a constant is not 0.
const IF: &str = "// if ";

/// Drops every line that ends in `// if NAME` while constant `NAME` of `consts` is 0 (or
/// unknown), and every line that ends in `// if !NAME` while it is not; a line that opens a
/// block (ends in `{` before the marker) goes with its whole block. For code a device may be
/// unable to compile even when it never runs (subgroup builtins and operations without
/// `Features::SUBGROUP`), and for declarations whose type a constant picks (a binding read
/// as scalars or as vec4s).
pub(crate) fn drop_disabled(source: &str, consts: &[(&str, u32)]) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while !rest.is_empty() {
        let end = rest.find('\n').map_or(rest.len(), |i| i + 1);
        let line = &rest[..end];
        let drop = line
            .rfind(IF)
            .filter(|_| !line.trim_start().starts_with("//"))
            .and_then(|at| {
                let marked = line[at + IF.len()..].trim();
                let (name, negated) = match marked.strip_prefix('!') {
                    Some(name) => (name, true),
                    None => (marked, false),
                };
                let on = consts.iter().any(|(n, v)| *n == name && *v != 0);
                (on == negated).then_some(at)
            });
        match drop {
            Some(at) if line[..at].trim_end().ends_with('{') => {
                // Through the brace that closes the block, and the rest of that line.
                let close = matching_brace(&rest[end..]).map_or(rest.len(), |i| end + i);
                let line_end = rest[close..]
                    .find('\n')
                    .map_or(rest.len(), |i| close + i + 1);
                rest = &rest[line_end..];
            }
            Some(_) => rest = &rest[end..],
            None => {
                out.push_str(line);
                rest = &rest[end..];
            }
        }
    }
    out
}

use crate::gpu::unroll::matching_brace;
pub(crate) use crate::gpu::unroll::unroll;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unroll_expands_marked_loops_with_nesting() {
        let src = "fn f() {\n    for (var r = 0u; r < R; r++) { // unroll\n        for (var e = 0u; e < 2u; e++) { // unroll\n            x[r][e] = 1.0;\n        }\n    }\n    for (var j = 0u; j < n; j++) { // unroll\n    }\n}\n";
        let out = unroll(src, &[("R", 2)]);
        assert!(
            !out.contains("for (var r") && !out.contains("for (var e"),
            "{out}"
        );
        assert_eq!(out.matches("x[r][e] = 1.0;").count(), 4, "{out}");
        assert_eq!(out.matches("const r = 1u;").count(), 1, "{out}");
        assert_eq!(out.matches("const e = 1u;").count(), 2, "{out}");
        // A bound that is neither a literal nor a known constant stays a loop.
        assert!(out.contains("for (var j = 0u; j < n; j++)"), "{out}");
        // A quotient of two: D / S trips.
        let src = "for (var c = 0u; c < D / S; c++) { // unroll\n    y[c] = 0.0;\n}\n";
        let out = unroll(src, &[("D", 128), ("S", 16)]);
        assert_eq!(out.matches("y[c] = 0.0;").count(), 8, "{out}");
        assert!(!out.contains("for (var c"), "{out}");
        let out = unroll(src, &[("D", 128)]);
        assert!(out.contains("for (var c = 0u; c < D / S; c++)"), "{out}");
    }

    #[test]
    fn lines_and_blocks_marked_if_a_constant_go_when_it_is_zero() {
        let src = "a\nfn f() { // if SG\n    x;\n}\nb(y); // if SG\n// a comment // if SG\nc\n";
        assert_eq!(
            drop_disabled(src, &[("SG", 0)]),
            "a\n// a comment // if SG\nc\n"
        );
        assert_eq!(drop_disabled(src, &[("SG", 1)]), src);
        assert_eq!(drop_disabled(src, &[]), "a\n// a comment // if SG\nc\n");
        // `!NAME`: kept while the constant is 0 (or unknown), dropped otherwise.
        let src = "x: f32; // if !V\nx: vec4<f32>; // if V\nfn g() { // if !V\n    y;\n}\nz\n";
        assert_eq!(
            drop_disabled(src, &[("V", 1)]),
            "x: vec4<f32>; // if V\nz\n"
        );
        let scalar = "x: f32; // if !V\nfn g() { // if !V\n    y;\n}\nz\n";
        assert_eq!(drop_disabled(src, &[("V", 0)]), scalar);
        assert_eq!(drop_disabled(src, &[]), scalar);
    }

    uniform! {
        struct Example {
            n: u32,
            scale: f32,
            _pad: [u32; 2],
            strides: [u32; 4],
        }
    }

    #[test]
    fn a_uniform_declares_its_wgsl_struct_with_rust_offsets() {
        assert_eq!(
            Example::wgsl(),
            "struct Params {\n    n: u32,\n    scale: f32,\n    _pad: vec2<u32>,\n    strides: vec4<u32>,\n}\n"
        );
        let offsets: Vec<usize> = Example::FIELDS.iter().map(|f| f.2).collect();
        assert_eq!(offsets, [0, 4, 8, 16]);
    }

    constants! {
        struct ExampleConsts {
            rows => "R",
            mask => "MASK",
        }
    }

    #[test]
    fn constants_are_named_in_declaration_order() {
        let c = ExampleConsts { rows: 3, mask: 1 };
        assert_eq!(ExampleConsts::NAMES, ["R", "MASK"]);
        assert_eq!(c.values(), [3, 1]);
    }
}
