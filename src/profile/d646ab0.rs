//! What `profile --d646ab0` counts: `flash_blocked` as commit d646ab0 ran it on the H100,
//! its kept text (compressed in `d646ab0/`) put in place of today's captured one once its
//! uniform block and modifier bindings are checked to match.

use super::Problem;
use crate::error::{Error, Result};
use crate::variant::FlashVariant;
use crate::Dtype;

/// Which kernels a profile counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Era {
    /// Today's.
    #[default]
    Today,
    /// `flash_blocked` as commit d646ab0 ran it on the H100 (2026-11-27): its own text as
    /// that commit composed it for the H100 (kept compressed in `src/profile/d646ab0/`: d 64,
    /// f32, its three block shapes; with the window of 511, its text composed with that
    /// window's modifier code), driven by today's host values (the uniform block is checked
    /// to be the same), causal query blocks lightest first as it walked them; the planning
    /// options of that time (scalar loads, Q staged with every key tile).
    D646ab0,
}

impl Era {
    /// Whether the kernels of this era had `variant` (d646ab0: `flash_blocked`'s three block
    /// shapes of that time, no cooperative matrices).
    pub fn had(self, variant: FlashVariant) -> bool {
        match (self, variant) {
            (Era::Today, _) => true,
            (Era::D646ab0, FlashVariant::Blocked { rows, keys }) => D646AB0_BLOCKED
                .iter()
                .any(|(shape, ..)| *shape == (rows, keys)),
            (Era::D646ab0, _) => false,
        }
    }
}

/// `flash_blocked`'s text as commit d646ab0 compiled it for the H100 (its own `shaders --out`
/// on a device of 48 KiB of workgroup memory with 32-lane subgroups: double buffering and
/// subgroup reductions where it offered them), for the H100 run's problems (d 64, f32): by
/// block shape.
/// With each, its RDNA3 VGPRs (`tools/shader-stats`, gfx1100) for the occupancy.
pub(super) const D646AB0_BLOCKED: [((u32, u32), &[u8], u32); 3] = [
    (
        (64, 64),
        include_bytes!("d646ab0/flash-blocked-64x64-d64-f32-dbuf-sgr-wg48k.wgsl.gz"),
        72,
    ),
    (
        (64, 32),
        include_bytes!("d646ab0/flash-blocked-64x32-d64-f32-dbuf-sgr-wg48k.wgsl.gz"),
        96,
    ),
    (
        (32, 64),
        include_bytes!("d646ab0/flash-blocked-32x64-d64-f32.wgsl.gz"),
        72,
    ),
];

/// The generated `struct Params { … }` of a composed kernel.
fn params_struct(source: &str) -> Option<&str> {
    let start = source.find("struct Params {")?;
    let end = source[start..].find('}')?;
    Some(&source[start..start + end])
}

/// The code d646ab0's `ModsUpload::new` made for `Preset::Window { left: 511, right: 0 }`
/// (the H100 run's `bench --sparse` window), which its `with_modifiers` appended to the
/// kernel in place of the identity stubs: the preset's mask, `wa_keep` and `wa_score_log2`
/// around it, and the block map's readers (`wa_block` per key tile, `wa_span` for the loop's
/// keys). Today's code makes the same text (its generator's output has not changed since);
/// it is kept so that a later change does not alter what d646ab0 ran.
const D646AB0_WINDOW_511: &[u8] = include_bytes!("d646ab0/mods-window-511-0.wgsl.gz");

/// The `@group(1)` declarations of a kernel text: the modifiers' bindings.
fn group1(source: &str) -> Vec<&str> {
    source
        .lines()
        .filter(|l| l.starts_with("@group(1)"))
        .collect()
}

/// d646ab0's `flash_blocked` text in place of `captured`'s (today's, for the same problem and
/// block shape): the same bindings and, checked here, the same uniform block, so today's
/// host values drive d646ab0's kernel. With `p`'s window (511, the H100 run's), the text
/// d646ab0 composed for it: its kernel with the window's code in place of the stubs.
///
/// # Errors
/// A problem, window or block shape d646ab0's text is not kept for (d 64 f32 only), or a
/// uniform block or modifier bindings that have changed since.
pub(super) fn d646ab0_source(
    captured: &str,
    p: &Problem,
    (rows, keys): (u32, u32),
) -> Result<String> {
    let fail = |message: String| Error::Sanitizer {
        kernel: "flash_blocked.wgsl".into(),
        message: format!("profile --d646ab0: {message}"),
    };
    if p.d != 64 || p.dtype != Dtype::F32 {
        return Err(fail(format!(
            "d646ab0's text is kept for the H100 run's problems (d 64, f32), not d {} {:?}",
            p.d, p.dtype
        )));
    }
    let gz = D646AB0_BLOCKED
        .iter()
        .find(|(shape, ..)| *shape == (rows, keys))
        .map(|(_, gz, _)| *gz)
        .ok_or_else(|| fail(format!("d646ab0 had no {rows}x{keys} blocks")))?;
    let gunzip = |gz: &[u8]| {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(gz), &mut text)
            .map_err(|e| fail(format!("the kept text does not decompress: {e}")))
            .map(|_| text)
    };
    let mut text = gunzip(gz)?;
    if params_struct(&text) != params_struct(captured) {
        return Err(fail(
            "today's uniform block differs from d646ab0's: its values would be misread".into(),
        ));
    }
    match p.window {
        None => {}
        Some(511) => {
            // `with_modifiers` appended "\n" and the stubs (their first is `wa_keep`) to the
            // composed kernel; the window's code takes their place.
            let stubs = text
                .rfind("fn wa_keep(")
                .ok_or_else(|| fail("the kept text has no modifier stubs".into()))?;
            text = format!("{}{}", &text[..stubs], gunzip(D646AB0_WINDOW_511)?);
            if group1(&text) != group1(captured) {
                return Err(fail(
                    "today's modifier bindings differ from d646ab0's: the block map would be \
                     misread"
                        .into(),
                ));
            }
        }
        Some(w) => {
            return Err(fail(format!(
                "d646ab0's window text is kept for the H100 run's window (511), not {w}"
            )))
        }
    }
    Ok(text)
}
