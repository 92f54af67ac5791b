//! `shaders/coop_matmul.wgsl`: the [`Matmul`] problem of `matmul.rs` (same uniform, same
//! bindings) on cooperative matrices (tensor cores): 64 × 64 output tiles per workgroup of
//! 128 invocations, each subgroup a 2 × 2 square of `S × S` matrices, inputs converted to f16
//! (or f32 where the adapter's only shape is f32) in workgroup memory, accumulated in f32.
//! Runs only where [`crate::Context::coop_shape`] is `Some`.

use super::matmul::{Matmul, MatmulParams};
use super::wgsl::constants;
use super::{record, Dim, Kernel, KernelId, Slot};
use crate::error::Result;
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

/// [`Matmul::f16`]-style bit of the cooperative matrices' input type `AB_T` (after
/// `matmul.rs`'s A, B and C bits).
pub(crate) const F16_AB: u8 = 8;

constants! {
    /// Specialisation of `coop_matmul.wgsl`.
    pub(crate) struct CoopConsts {
        /// The side of one cooperative matrix (8 or 16).
        size => "S",
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::CoopMatmul;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(128), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("a"),
        Slot::Read("b"),
        Slot::Read("bias"),
        Slot::ReadWrite("c"),
    ];
    /// Bits as `matmul.rs`'s `F16_A`, `F16_B`, `F16_C`, then [`F16_AB`].
    const DTYPES: &'static [&'static str] = &["A_T", "B_T", "C_T", "AB_T"];
    const COOP: bool = true;
    type Consts = CoopConsts;
    type Params = MatmulParams;

    /// Rounds of output blocks (one subgroup at least each: every round counted), each over
    /// K in steps of 16 with its staging, then its four-part epilogue.
    fn loops(c: &CoopConsts, p: &MatmulParams, _b: super::loops::Build) -> u64 {
        let run = super::loops::run;
        let s = u64::from(c.size).max(1);
        let blocks = (64 / (2 * s)).pow(2);
        let step = 1 + run(64 * 16 / 128) + run(16 / s);
        let epilogue = run(4) + 4 * run((s * s * 4).div_ceil(128));
        let round = 1 + run(u64::from(p.k).div_ceil(16) * step) + epilogue;
        run(blocks * round)
    }
}

/// What the host puts around a coop kernel's composed `source`: the
/// `enable wgpu_cooperative_matrix;` directive first, and the aliases `CA`, `CB` (inputs, of
/// type `AB_T`) and `CC` (the f32 accumulator) of `coop_mat{size}x{size}` (16 × 16 unless
/// `size` is 8: the only two sides WGSL has).
pub(crate) fn coop_header(source: String, size: u32) -> String {
    let n = if size == 8 { 8 } else { 16 };
    let ty = format!("coop_mat{n}x{n}");
    format!(
        "enable wgpu_cooperative_matrix;\n{source}\n\
         alias CA = {ty}<AB_T, A>;\nalias CB = {ty}<AB_T, B>;\nalias CC = {ty}<f32, C>;\n"
    )
}

/// Records `c ← a·b (+ bias)` for `mm` on cooperative matrices.
///
/// # Errors
/// [`crate::Error::Unsupported`] where the device has no usable cooperative-matrix shape;
/// size limits.
pub(crate) fn dispatch(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    mm: &Matmul,
    (a, b, bias, c): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
) -> Result<()> {
    let shape = ctx.require_coop()?;
    let (params, workgroups) = mm.params()?;
    let f16 = mm.f16 | if shape.f16_inputs { F16_AB } else { 0 };
    record::<Shader>(
        ctx,
        encoder,
        &CoopConsts { size: shape.size },
        f16,
        &params,
        &[a.into(), b.into(), bias.into(), c.into()],
        workgroups,
    )
}

/// The variants `shaders --out` writes (`DIR/coop/<stem>.wgsl`): 16 × 16 f16 inputs (the
/// shape of NVIDIA's, AMD RDNA3's and Intel's tensor cores) with f32 storage, f16 A and B
/// (the scores, `--dtype f16`) and f16 everything (the input projections at f16), and
/// 8 × 8 f32 inputs (wgpu's Vulkan and Metal minimum) with f32 storage.
pub(crate) fn sources() -> Vec<(String, super::PipelineKey)> {
    use super::matmul::{F16_A, F16_B, F16_C};
    [
        ("coop-matmul-16-f32", 16, F16_AB),
        ("coop-matmul-16-f16-ab", 16, F16_AB | F16_A | F16_B),
        ("coop-matmul-16-f16-abc", 16, F16_AB | F16_A | F16_B | F16_C),
        ("coop-matmul-8-f32in", 8, 0),
    ]
    .into_iter()
    .map(|(stem, size, bits)| {
        let key = super::PipelineKey::of::<Shader>(&CoopConsts { size }, bits);
        (stem.to_string(), key)
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_enables_the_extension_first_and_sizes_the_aliases() {
        let text = coop_header("alias AB_T = f16;\n".into(), 8);
        assert!(
            text.starts_with("enable wgpu_cooperative_matrix;\n"),
            "{text}"
        );
        assert!(text.contains("alias CC = coop_mat8x8<f32, C>;"), "{text}");
        assert!(coop_header(String::new(), 16).contains("coop_mat16x16<AB_T, A>"));
    }
}
