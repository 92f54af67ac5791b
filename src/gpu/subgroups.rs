//! The kernels' subgroup operations, native or emulated.
//!
//! Kernels never call WGSL's subgroup builtins directly: they call typed helpers
//! (`sg_shuffle4`, `sg_shuffle1`, `sg_xor4`, `sg_first_u`, `sg_max1`, `sg_add1`), and
//! [`native`] appends the definitions the composed source uses, each one builtin. On a device
//! that emulates a subgroup width it does not have (the GPU stand-in: 32 lanes on lavapipe's
//! 8, see [`super::hardware`]), [`emulate`] replaces those definitions with exchanges through
//! workgroup memory among `W` consecutive invocations (a virtual subgroup, numbered as
//! Vulkan numbers lanes: `local_invocation_index % W`), and the entry point's subgroup
//! builtins with the same numbering. Every kernel calls them in workgroup-uniform control
//! flow (its header says so), which the emulation's barriers need. naga 30 does not check
//! it (it accepts subgroup calls and barriers in divergent code); Tint's uniformity analysis
//! does, and CI runs it on every kernel variant, the emulated sources included
//! (`static_gates_ci` in `.ci/run`, docs/testing.md "Static gates").

/// The first line of the helpers' block in a composed source.
const BEGIN: &str = "// subgroup helpers (src/gpu/subgroups.rs)";
/// The last line of it.
const END: &str = "// end of the subgroup helpers";

/// `(name, native definition)` of every helper.
const NATIVE: &[(&str, &str)] = &[
    (
        "sg_shuffle4",
        "fn sg_shuffle4(x: vec4<f32>, l: u32) -> vec4<f32> { return subgroupShuffle(x, l); }",
    ),
    (
        "sg_shuffle1",
        "fn sg_shuffle1(x: f32, l: u32) -> f32 { return subgroupShuffle(x, l); }",
    ),
    (
        "sg_xor4",
        "fn sg_xor4(x: vec4<f32>, m: u32) -> vec4<f32> { return subgroupShuffleXor(x, m); }",
    ),
    (
        "sg_first_u",
        "fn sg_first_u(x: u32) -> u32 { return subgroupBroadcast(x, 0u); }",
    ),
    (
        "sg_max1",
        "fn sg_max1(x: f32) -> f32 { return subgroupMax(x); }",
    ),
    (
        "sg_add1",
        "fn sg_add1(x: f32) -> f32 { return subgroupAdd(x); }",
    ),
];

/// The emulated definitions (through `emu_swap`, `emu_gather` and `emu_base`, see
/// [`emulate`]).
const EMULATED: &[(&str, &str)] = &[
    (
        "sg_shuffle4",
        "fn sg_shuffle4(x: vec4<f32>, l: u32) -> vec4<f32> {\n    \
         return bitcast<vec4<f32>>(emu_swap(bitcast<vec4<u32>>(x), emu_base() + l % EMU_SG));\n}",
    ),
    (
        "sg_shuffle1",
        "fn sg_shuffle1(x: f32, l: u32) -> f32 {\n    \
         let v = vec4<u32>(bitcast<u32>(x), 0u, 0u, 0u);\n    \
         return bitcast<f32>(emu_swap(v, emu_base() + l % EMU_SG).x);\n}",
    ),
    (
        "sg_xor4",
        "fn sg_xor4(x: vec4<f32>, m: u32) -> vec4<f32> {\n    \
         let src_lane = emu_base() + ((emu_li % EMU_SG) ^ m) % EMU_SG;\n    \
         return bitcast<vec4<f32>>(emu_swap(bitcast<vec4<u32>>(x), src_lane));\n}",
    ),
    (
        "sg_first_u",
        "fn sg_first_u(x: u32) -> u32 {\n    \
         return emu_swap(vec4<u32>(x, 0u, 0u, 0u), emu_base()).x;\n}",
    ),
    (
        "sg_max1",
        "fn sg_max1(x: f32) -> f32 {\n    \
         emu_gather(x);\n    \
         var m = bitcast<f32>(emu_x[emu_base()].x);\n    \
         for (var i = 0u; i < EMU_SG; i++) { // unroll\n        \
         if i < emu_lanes() { m = max(m, bitcast<f32>(emu_x[emu_base() + i].x)); }\n    }\n    \
         return m;\n}",
    ),
    (
        "sg_add1",
        "fn sg_add1(x: f32) -> f32 {\n    \
         emu_gather(x);\n    \
         var s = 0.0;\n    \
         for (var i = 0u; i < EMU_SG; i++) { // unroll\n        \
         if i < emu_lanes() { s += bitcast<f32>(emu_x[emu_base() + i].x); }\n    }\n    \
         return s;\n}",
    ),
];

/// What every emulated helper stands on: this invocation's index (set first thing in the
/// entry point), one vec4 of exchange space per invocation, and the exchange.
const EMULATION_BASE: &str = "\
var<private> emu_li: u32;
var<workgroup> emu_x: array<vec4<u32>, EMU_WG>;
// The first lane of this invocation's virtual subgroup, and how many lanes it has.
fn emu_base() -> u32 { return emu_li / EMU_SG * EMU_SG; }
fn emu_lanes() -> u32 { return min(EMU_SG, EMU_WG - emu_base()); }
// Publishes x, then reads invocation `from`'s (clamped into the workgroup). The first barrier
// keeps an earlier exchange's readers ahead of this one's writers.
fn emu_swap(x: vec4<u32>, src_lane: u32) -> vec4<u32> {
    workgroupBarrier();
    emu_x[emu_li] = x;
    workgroupBarrier();
    return emu_x[min(src_lane, EMU_WG - 1u)];
}
fn emu_gather(x: f32) {
    workgroupBarrier();
    emu_x[emu_li] = vec4<u32>(bitcast<u32>(x), 0u, 0u, 0u);
    workgroupBarrier();
}
";

/// Every declaration a composed kernel may get from here, native or emulated: names a
/// caller's modifiers must not take (`kernels::mods`).
pub(crate) fn declarations() -> String {
    let defs = NATIVE.iter().chain(EMULATED).map(|(_, def)| *def);
    let mut text: String = defs.map(|d| format!("{d}\n")).collect();
    text.push_str("const EMU_SG: u32 = 32u;\nconst EMU_WG: u32 = 1u;\n");
    text.push_str(EMULATION_BASE);
    text
}

/// Whether `text` calls helper `name` (`name(` not preceded by an identifier character, and
/// not its own definition).
fn calls(text: &str, name: &str) -> bool {
    let pat = format!("{name}(");
    text.match_indices(&pat).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let ident = before.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !ident && !text[..at].ends_with("fn ")
    })
}

/// The definitions of the helpers `body` calls, natively (empty when it calls none).
pub(crate) fn native(body: &str) -> String {
    let used: Vec<&str> = NATIVE
        .iter()
        .filter(|(name, _)| calls(body, name))
        .map(|(_, def)| *def)
        .collect();
    match used.is_empty() {
        true => String::new(),
        false => format!("{BEGIN}\n{}\n{END}\n", used.join("\n")),
    }
}

/// Splits `list` at the commas outside any brackets.
fn split_top(list: &str) -> Vec<&str> {
    let (mut depth, mut start, mut parts) = (0i32, 0usize, Vec::new());
    for (i, c) in list.char_indices() {
        match c {
            '(' | '<' | '[' => depth += 1,
            ')' | '>' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&list[start..]);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// Byte offset of the `)` closing the `(` just before `text`.
fn closing_paren(text: &str) -> Option<usize> {
    Some(super::coop::emulate::closing(text, '(', ')')).filter(|&i| i < text.len())
}

/// `source` (a composed kernel) with its subgroups emulated `width` lanes wide: the native
/// helpers replaced by [`EMULATED`]'s, and the entry point's `subgroup_invocation_id`,
/// `subgroup_size`, `subgroup_id` and `num_subgroups` computed from
/// `local_invocation_index`. A source without subgroups comes back as it was.
pub(crate) fn emulate(source: &str, width: u32) -> String {
    let builtins = [
        "subgroup_invocation_id",
        "subgroup_size",
        "subgroup_id",
        "num_subgroups",
    ];
    let has_helpers = source.contains(BEGIN);
    let has_builtins = builtins
        .iter()
        .any(|b| source.contains(&format!("@builtin({b})")));
    if !has_helpers && !has_builtins {
        return source.to_string();
    }
    // The helpers' block out; the rest as it is.
    let mut text = match (source.find(BEGIN), source.find(END)) {
        (Some(a), Some(b)) => format!("{}{}", &source[..a], &source[b + END.len()..]),
        _ => source.to_string(),
    };
    // The entry point: `@compute @workgroup_size(X, Y, Z)` then `fn NAME(PARAMS) … {`.
    let Some(compute) = text.find("@compute") else {
        return source.to_string();
    };
    let wg_at = text[compute..]
        .find("@workgroup_size(")
        .map(|i| compute + i + "@workgroup_size(".len());
    let wg = match wg_at.and_then(|a| closing_paren(&text[a..]).map(|b| &text[a..a + b])) {
        Some(args) => split_top(args)
            .iter()
            .map(|a| format!("u32({})", a.trim()))
            .collect::<Vec<_>>()
            .join(" * "),
        None => return source.to_string(),
    };
    let Some(fn_at) = text[compute..].find("fn ").map(|i| compute + i) else {
        return source.to_string();
    };
    let Some(open) = text[fn_at..].find('(').map(|i| fn_at + i + 1) else {
        return source.to_string();
    };
    let Some(close) = closing_paren(&text[open..]).map(|i| open + i) else {
        return source.to_string();
    };
    let Some(body) = text[close..].find('{').map(|i| close + i + 1) else {
        return source.to_string();
    };
    // Comments out of the parameter list (a `// if NAME` marker may hold a comma).
    let params: String = text[open..close]
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut kept = Vec::new();
    let mut lets = vec!["    emu_li = emu_li_in;".to_string()];
    let mut has_index = false;
    for param in split_top(&params) {
        let p = param.trim();
        let name = p
            .rsplit_once(')')
            .map(|(_, r)| r)
            .unwrap_or(p)
            .split(':')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        let value = if p.contains("@builtin(subgroup_invocation_id)") {
            Some("emu_li % EMU_SG".to_string())
        } else if p.contains("@builtin(subgroup_size)") {
            Some("EMU_SG".to_string())
        } else if p.contains("@builtin(subgroup_id)") {
            Some("emu_li / EMU_SG".to_string())
        } else if p.contains("@builtin(num_subgroups)") {
            Some("(EMU_WG + EMU_SG - 1u) / EMU_SG".to_string())
        } else if p.contains("@builtin(local_invocation_index)") {
            has_index = true;
            kept.push("@builtin(local_invocation_index) emu_li_in: u32".to_string());
            Some("emu_li_in".to_string())
        } else {
            kept.push(p.to_string());
            None
        };
        if let Some(v) = value {
            lets.push(format!("    let {name} = {v};"));
        }
    }
    if !has_index {
        kept.push("@builtin(local_invocation_index) emu_li_in: u32".to_string());
    }
    let new_params = format!("\n    {},\n", kept.join(",\n    "));
    text = format!(
        "{}{}){}\n{}\n{}",
        &text[..open],
        new_params,
        &text[close + 1..body],
        lets.join("\n"),
        &text[body..]
    );
    // The reductions' loops over the lanes are unrolled here, whether or not the kernel's
    // own `// unroll` loops are: lavapipe caps an invocation's loop iterations
    // (`src/kernels/loops.rs`), and these would add a lane count per call.
    let defs: Vec<String> = EMULATED
        .iter()
        .filter(|(name, _)| calls(&text, name))
        .map(|(_, def)| super::unroll::unroll(def, &[("EMU_SG", width)]))
        .collect();
    format!(
        "{text}\n// Subgroups of {width} lanes emulated through workgroup memory \
         (src/gpu/subgroups.rs).\nconst EMU_SG: u32 = {width}u;\nconst EMU_WG: u32 = {wg};\n\
         {EMULATION_BASE}{}\n",
        defs.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_defines_only_what_is_called() {
        let text = native("let a = sg_shuffle4(v, 1u); let b = sg_max1(x);");
        assert!(text.contains("fn sg_shuffle4(") && text.contains("fn sg_max1("));
        assert!(!text.contains("fn sg_add1(") && !text.contains("fn sg_xor4("));
        assert_eq!(native("let a = my_sg_add1(x);"), "");
    }

    #[test]
    fn emulation_replaces_builtins_and_helpers() {
        let src = format!(
            "const WG: u32 = 64u;\n@compute @workgroup_size(WG)\nfn main(\n    \
             @builtin(workgroup_id) wg: vec3<u32>,\n    \
             @builtin(subgroup_invocation_id) lane: u32, // if SGR\n    \
             @builtin(subgroup_size) sg_size: u32,\n) {{\n    let y = sg_xor4(vec4<f32>(), 1u);\n}}\n{}",
            native("sg_xor4(")
        );
        let out = emulate(&src, 32);
        assert!(!out.contains("subgroupShuffleXor"), "{out}");
        assert!(!out.contains("@builtin(subgroup"), "{out}");
        assert!(out.contains("let lane = emu_li % EMU_SG;"), "{out}");
        assert!(out.contains("let sg_size = EMU_SG;"), "{out}");
        assert!(
            out.contains("@builtin(local_invocation_index) emu_li_in: u32"),
            "{out}"
        );
        assert!(out.contains("const EMU_WG: u32 = u32(WG);"), "{out}");
        assert!(out.contains("const EMU_SG: u32 = 32u;"), "{out}");
        let module = naga::front::wgsl::parse_str(&out).expect(&out);
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        )
        .validate(&module)
        .expect("validates");
    }
}
