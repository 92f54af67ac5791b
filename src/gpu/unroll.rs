//! Unrolling WGSL loops marked `// unroll` in text: what the kernels' builds use
//! (`src/kernels/wgsl.rs`) and the emulated subgroup helpers
//! ([`super::subgroups`]), so that lavapipe keeps private arrays in registers and counts
//! no iterations for them (its loop cap: `src/kernels/loops.rs`).

/// The marker that asks for a loop to be unrolled, at the end of its `for` line.
const UNROLL: &str = "// unroll";

/// Unrolls every loop written `for (var i = 0u; i < N; i++) { // unroll` whose bound `N`
/// is a literal (`4u`), one of `consts` or the quotient `A / B` of two of those, into `N`
/// copies of its body, each in a block that starts with `const i = <k>u;`.
///
/// Shader compilers that keep private arrays in registers only when every index is constant
/// (llvmpipe's, for one) need this; others see the same program. The source stays valid WGSL
/// with the markers ignored, so tools that never unroll still read it. Markers whose loop does
/// not have that exact form are left alone.
pub(crate) fn unroll(source: &str, consts: &[(&str, u32)]) -> String {
    let mut text = source.to_string();
    // The last marker never encloses another one, so expanding from the end handles nesting.
    let mut search_end = text.len();
    while let Some(mark) = text[..search_end].rfind(UNROLL) {
        search_end = mark;
        let line_start = text[..mark].rfind('\n').map_or(0, |i| i + 1);
        let Some((var, count)) = parse_for(&text[line_start..mark], consts) else {
            continue;
        };
        let body_start = mark + UNROLL.len();
        let Some(body_end) = matching_brace(&text[body_start..]).map(|i| body_start + i) else {
            continue;
        };
        let body = &text[body_start..body_end];
        let indent: String = text[line_start..]
            .chars()
            .take_while(|c| *c == ' ')
            .collect();
        let mut out = String::new();
        for k in 0..count {
            out.push_str(&format!(
                "{{\n{indent}    const {var} = {k}u;{body}}}\n{indent}"
            ));
        }
        let out = out.trim_end().to_string();
        text.replace_range(line_start + indent.len()..body_end + 1, &out);
    }
    text
}

/// `(var, count)` from `for (var i = 0u; i < N; i++) {`.
fn parse_for(line: &str, consts: &[(&str, u32)]) -> Option<(String, u32)> {
    let rest = line.trim().strip_prefix("for (var ")?;
    let (var, rest) = rest.split_once(" = 0u; ")?;
    let rest = rest.strip_prefix(var)?.strip_prefix(" < ")?;
    let (bound, rest) = rest.split_once("; ")?;
    if rest.trim() != format!("{var}++) {{") {
        return None;
    }
    let count = match bound.split_once(" / ") {
        Some((a, b)) => value(a, consts)?.checked_div(value(b, consts)?)?,
        None => value(bound, consts)?,
    };
    Some((var.to_string(), count))
}

/// A literal (`4u`) or one of `consts`.
fn value(term: &str, consts: &[(&str, u32)]) -> Option<u32> {
    match term.strip_suffix('u').and_then(|b| b.parse().ok()) {
        Some(n) => Some(n),
        None => Some(consts.iter().find(|(name, _)| *name == term)?.1),
    }
}

/// Byte offset of the `}` closing a block whose `{` was just before `text`.
pub(crate) fn matching_brace(text: &str) -> Option<usize> {
    let mut depth = 1usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}
