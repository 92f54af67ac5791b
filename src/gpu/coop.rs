//! Cooperative matrices (tensor cores): whether the device has wgpu's
//! `Features::EXPERIMENTAL_COOPERATIVE_MATRIX`, which of the adapter's shapes the coop
//! kernels (`coop_matmul`) are built for, and the error when they cannot run.

pub(crate) mod emulate;

use super::Gpu;
use crate::error::{Error, Result};

/// The cooperative-matrix shape the coop kernels use on a device: square `size × size ×
/// size` products (wgpu's WGSL has `coop_mat8x8` and `coop_mat16x16`), f32 accumulation,
/// the inputs in f16 (`f16_inputs`) or f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct CoopShape {
    /// M = N = K: 8 or 16.
    pub size: u32,
    /// Whether A and B are f16 (else f32); the accumulator is f32 either way.
    pub f16_inputs: bool,
}

impl std::fmt::Display for CoopShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ab = if self.f16_inputs { "f16" } else { "f32" };
        write!(f, "{0}x{0}x{0} {ab}->f32", self.size)
    }
}

/// Whether contexts request the feature: on unless `WGPU_ATTENTION_COOP=off` (wgpu marks it
/// experimental, and on Vulkan enabling it makes every shader use the Vulkan memory model).
pub(crate) fn wanted() -> bool {
    !matches!(
        std::env::var("WGPU_ATTENTION_COOP").as_deref(),
        Ok("off" | "0" | "false")
    )
}

/// What to request of `adapter`: the cooperative-matrix feature when it offers it (and
/// [`wanted`]), with the token experimental features need.
pub(crate) fn request(adapter: &wgpu::Adapter) -> (wgpu::Features, wgpu::ExperimentalFeatures) {
    let feature = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
    if wanted() && adapter.features().contains(feature) {
        // SAFETY: only the cooperative-matrix feature is requested through this token; our
        // coop kernels run only where the adapter reports the shape they are built for
        // (`Gpu::coop_shape`), and every load and store they make is within their
        // workgroup tiles (the proof is in each shader's header).
        (feature, unsafe { wgpu::ExperimentalFeatures::enabled() })
    } else {
        (
            wgpu::Features::empty(),
            wgpu::ExperimentalFeatures::disabled(),
        )
    }
}

/// The shape the coop kernels use among the adapter's `props`: 16×16×16 f16→f32 first (NVIDIA,
/// AMD RDNA3, Intel), then 8×8×8 f16→f32, then 8×8×8 f32→f32 (Apple's simdgroup matrices, and
/// what wgpu's Vulkan backend requires today); f16 inputs only with `f16`
/// (`Features::SHADER_F16`). `None` when none of them is offered.
pub(crate) fn pick(props: &[wgpu::CooperativeMatrixProperties], f16: bool) -> Option<CoopShape> {
    use wgpu::CooperativeScalarType as T;
    let offered = |size: u32, ab: T| {
        props.iter().any(|p| {
            p.m_size == size
                && p.n_size == size
                && p.k_size == size
                && p.ab_type == ab
                && p.cr_type == T::F32
        })
    };
    let preference = [(16, true), (8, true), (16, false), (8, false)];
    preference
        .into_iter()
        .filter(|&(_, half)| f16 || !half)
        .find(|&(size, half)| offered(size, if half { T::F16 } else { T::F32 }))
        .map(|(size, f16_inputs)| CoopShape { size, f16_inputs })
}

/// `devices`' line of an adapter's cooperative-matrix shapes (nothing when it has none).
pub(crate) fn write_shapes(
    f: &mut std::fmt::Formatter<'_>,
    props: &[wgpu::CooperativeMatrixProperties],
) -> std::fmt::Result {
    if props.is_empty() {
        return Ok(());
    }
    let shapes: Vec<String> = props
        .iter()
        .map(|p| {
            format!(
                "{}x{}x{} {:?}->{:?}",
                p.m_size, p.n_size, p.k_size, p.ab_type, p.cr_type
            )
        })
        .collect();
    write!(f, "\n  cooperative matrices: {}", shapes.join(", "))
}

impl Gpu {
    /// The cooperative-matrix configurations the adapter reports (empty without
    /// `Features::EXPERIMENTAL_COOPERATIVE_MATRIX` on the device).
    pub(crate) fn coop_properties(&self) -> Vec<wgpu::CooperativeMatrixProperties> {
        if !self
            .device
            .features()
            .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        {
            return Vec::new();
        }
        self.adapter.cooperative_matrix_properties()
    }

    /// The shape the coop kernels run with here: `Some` when the device has
    /// `Features::EXPERIMENTAL_COOPERATIVE_MATRIX` and `Features::SUBGROUP` and the adapter
    /// reports one of the shapes they are built for ([`CoopShape`]).
    pub(crate) fn coop_shape(&self) -> Option<CoopShape> {
        self.hardware().coop
    }

    /// The coop kernels' shape, or the error saying they cannot run here.
    ///
    /// # Errors
    /// [`Error::Unsupported`] without the cooperative-matrix feature, subgroups, or a shape
    /// the kernels are built for.
    pub(crate) fn require_coop(&self) -> Result<CoopShape> {
        self.coop_shape().ok_or_else(|| Error::Unsupported {
            feature: "the cooperative-matrix kernels (wgpu::Features::\
                      EXPERIMENTAL_COOPERATIVE_MATRIX with 16x16 or 8x8 f16 or f32 products \
                      accumulated in f32, and wgpu::Features::SUBGROUP)"
                .into(),
            adapter: self.adapter_name(),
            hint: "use Kernels::Auto or another variant (CLI --kernels auto); \
                   `wgpu-attention devices` lists the adapters' features"
                .into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wgpu::CooperativeScalarType as T;

    fn prop(size: u32, ab: T, cr: T) -> wgpu::CooperativeMatrixProperties {
        wgpu::CooperativeMatrixProperties {
            m_size: size,
            n_size: size,
            k_size: size,
            ab_type: ab,
            cr_type: cr,
            saturating_accumulation: false,
        }
    }

    #[test]
    fn the_shape_prefers_16_f16_and_needs_f32_accumulation() {
        let rdna3 = [prop(16, T::F16, T::F16), prop(16, T::F16, T::F32)];
        assert_eq!(
            pick(&rdna3, true),
            Some(CoopShape {
                size: 16,
                f16_inputs: true
            })
        );
        // Without SHADER_F16 the f16 shapes are of no use.
        assert_eq!(pick(&rdna3, false), None);
        let apple = [prop(8, T::F32, T::F32), prop(8, T::F16, T::F32)];
        assert_eq!(
            pick(&apple, true).map(|s| (s.size, s.f16_inputs)),
            Some((8, true))
        );
        assert_eq!(
            pick(&apple, false).map(|s| (s.size, s.f16_inputs)),
            Some((8, false))
        );
        assert_eq!(pick(&[prop(16, T::F16, T::F16)], true), None);
        assert_eq!(pick(&[], true), None);
    }
}
