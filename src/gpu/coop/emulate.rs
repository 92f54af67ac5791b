//! A test hook for the coop kernels on adapters without cooperative matrices (lavapipe):
//! with `WGPU_ATTENTION_COOP_EMULATE=8` (or `16`), `Context::coop_shape` reports that shape
//! and every coop kernel's source is rewritten so each invocation holds whole S × S matrices
//! in private arrays (`coopLoad`, `coopStore`, `coopMultiplyAdd` become straight-line code over the
//! same workgroup arrays, same offsets and strides). Slow, but it runs the kernels' own
//! staging, rounds, spare slots, softmax and epilogues, so `tests/coop_emulated.rs` can check
//! them against the reference where no tensor core is at hand. Never set in normal use.

/// The emulated side, when the hook is on.
pub(crate) fn size() -> Option<u32> {
    match std::env::var("WGPU_ATTENTION_COOP_EMULATE").as_deref() {
        Ok("8") => Some(8),
        Ok("16") => Some(16),
        _ => None,
    }
}

/// Byte offset of the bracket or parenthesis closing the one just before `text` (its length
/// when none does).
pub(crate) fn closing(text: &str, open: char, close: char) -> usize {
    let mut depth = 1usize;
    for (i, c) in text.char_indices() {
        if c == open {
            depth += 1;
        } else if c == close {
            depth -= 1;
            if depth == 0 {
                return i;
            }
        }
    }
    text.len()
}

/// `&NAME[IDX], STRIDE` (the text after a builtin's value argument) → (NAME, IDX, STRIDE).
fn pointer_args(args: &str) -> (String, String, String) {
    let rest = args.trim_start().trim_start_matches('&');
    let open = rest.find('[').unwrap_or(rest.len());
    let name = rest[..open].trim().to_string();
    let idx_end = open + 1 + closing(&rest[open + 1..], '[', ']');
    let idx = rest[open + 1..idx_end].to_string();
    let stride = rest[idx_end + 1..]
        .trim_start()
        .trim_start_matches(',')
        .trim()
        .to_string();
    (name, idx, stride)
}

/// `source` (a composed coop kernel with side `size`) with the cooperative matrices emulated.
///
/// With `wide` (the subgroups themselves emulated, wider than the hardware's: the GPU
/// stand-in), the lanes of one subgroup run in several hardware subgroups, one after the
/// other, and each emulated load and store is every lane's own: a lane could then store a
/// matrix (a kernel that reads a block, adds to it and stores it back, as `flash_coop`'s
/// did before it held O in its subgroups' matrices) before another lane of its subgroup has
/// loaded it, and that lane would add to it twice. Since a cooperative
/// matrix is seen only through its stores, the first lane of each subgroup alone stores
/// (the others' copies are the same, or wrong only where they read what it stored), which is
/// what one collective store does.
pub(crate) fn rewrite(source: &str, size: u32, wide: bool) -> String {
    let mut text: String = source
        .lines()
        .filter(|l| {
            !(l.starts_with("enable wgpu_cooperative_matrix")
                || l.starts_with("alias CA =")
                || l.starts_with("alias CB =")
                || l.starts_with("alias CC ="))
        })
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        .replace("coopMultiplyAdd(", "emu_mad(");
    let mut loaded = std::collections::BTreeSet::new();
    let mut stored = std::collections::BTreeSet::new();
    for (call, store) in [
        ("coopLoadT<", false),
        ("coopLoad<", false),
        ("coopStoreT(", true),
        ("coopStore(", true),
    ] {
        let row_major = call.contains('T');
        while let Some(at) = text.find(call) {
            let after = at + call.len();
            // Loads: skip the type argument `CA>(`.
            let args_start = match store {
                true => after,
                false => after + text[after..].find('(').map_or(0, |i| i + 1),
            };
            let args_end = args_start + closing(&text[args_start..], '(', ')');
            let args = text[args_start..args_end].to_string();
            let replacement = if store {
                let (value, ptr) = args.split_once(',').unwrap_or((&args, ""));
                let (name, idx, stride) = pointer_args(ptr);
                stored.insert(name.clone());
                format!(
                    "emu_store_{name}({}, {idx}, {stride}, {row_major})",
                    value.trim()
                )
            } else {
                let (name, idx, stride) = pointer_args(&args);
                loaded.insert(name.clone());
                format!("emu_load_{name}({idx}, {stride}, {row_major})")
            };
            text.replace_range(at..args_end + 1, &replacement);
        }
    }
    // Straight-line code, no loops: lavapipe stops an invocation's loops after 65,535
    // iterations in all (`src/kernels/loops.rs`), and looped multiplies (S³ + S² + S
    // iterations each) crossed that within a few key tiles of `flash_coop`, silently.
    let s = size as usize;
    let ss = s * s;
    let mut mad = String::new();
    for i in 0..s {
        for j in 0..s {
            let ij = i * s + j;
            mad.push_str(&format!("    s = r.v[{ij}];"));
            for k in 0..s {
                mad.push_str(&format!(
                    " s = fma(a.v[{}], b.v[{}], s);",
                    i * s + k,
                    k * s + j
                ));
            }
            mad.push_str(&format!(" r.v[{ij}] = s;\n"));
        }
    }
    text.push_str(&format!(
        "\nconst EMU_S: u32 = {size}u;\nstruct EmuMat {{ v: array<f32, {ss}> }}\n\
         alias CA = EmuMat;\nalias CB = EmuMat;\nalias CC = EmuMat;\n\
         fn emu_mad(a: EmuMat, b: EmuMat, c: EmuMat) -> EmuMat {{\n\
         \x20   var r = c;\n\
         \x20   var s = 0.0;\n{mad}\
         \x20   return r;\n}}\n"
    ));
    // Element (i, j) of a matrix at `off`: row-major i·stride + j, else j·stride + i.
    let each = |stmt: &dyn Fn(usize, String) -> String| -> String {
        let mut out = String::new();
        for i in 0..s {
            for j in 0..s {
                let at = format!(
                    "select(off + {j}u * stride + {i}u, off + {i}u * stride + {j}u, row_major)"
                );
                out.push_str(&stmt(i * s + j, at));
            }
        }
        out
    };
    for name in loaded {
        let body = each(&|ij, at| format!("    m.v[{ij}] = f32({name}[{at}]);\n"));
        text.push_str(&format!(
            "fn emu_load_{name}(off: u32, stride: u32, row_major: bool) -> EmuMat {{\n\
             \x20   var m: EmuMat;\n{body}\
             \x20   return m;\n}}\n"
        ));
    }
    // Wide: the first lane of each subgroup alone stores (see the function's docs).
    let (open, close) = match wide {
        true => ("    if emu_li % EMU_SG == 0u {\n", "    }\n"),
        false => ("", ""),
    };
    for name in stored {
        let body = each(&|ij, at| format!("    {name}[{at}] = m.v[{ij}];\n"));
        text.push_str(&format!(
            "fn emu_store_{name}(m: EmuMat, off: u32, stride: u32, row_major: bool) {{\n\
             {open}{body}{close}}}\n"
        ));
    }
    text
}
