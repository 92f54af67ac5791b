//! Problems over a device's texture limit: the subgroup family (operands in textures) says
//! so clearly when forced, and `Kernels::Auto` hands the problem to the storage kernels,
//! which still match the reference. The limit is lowered artificially so this runs anywhere.

use ndarray::Array2;
use wgpu_attention::wgpu;
use wgpu_attention::{reference, Attention, Context, Error, Kernels};

/// A context on the default adapter whose device allows textures of at most `side` texels.
fn context_with_texture_side(side: u32) -> Context {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let adapter = pollster::block_on(instance.request_adapter(&Default::default()))
        .expect("tests need an adapter");
    let mut limits = adapter.limits();
    limits.max_texture_dimension_2d = side;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        required_features: adapter.features() & wgpu::Features::SUBGROUP,
        required_limits: limits,
        ..Default::default()
    }))
    .expect("a device with lowered limits");
    Context::from_parts(adapter, device, queue).with_tuning(false)
}

#[test]
fn over_the_texture_limit_auto_falls_back_and_forced_subgroup_errors() {
    let ctx = context_with_texture_side(64);
    let n = 3000;
    let x = Array2::from_shape_fn((n, 8), |(i, j)| ((i * 8 + j) as f32 * 0.37).sin());
    let auto = Attention::new()
        .causal(true)
        .return_weights(false)
        .nan_fill(true);
    let out = auto.forward(&ctx, x.view().into_dyn(), None).unwrap();
    let want = reference::attention(&auto, x.view().into_dyn(), None).unwrap();
    let (rel, _) = reference::compare(&out.context, &want.context);
    assert!(rel < 1e-5, "rel {rel}");

    if ctx.subgroup_size().is_some() {
        let forced = auto.kernels(Kernels::Subgroup);
        match forced.forward(&ctx, x.view().into_dyn(), None) {
            Err(e @ Error::LimitExceeded { .. }) => {
                assert!(e.to_string().contains("max_texture_dimension_2d"), "{e}")
            }
            other => panic!("expected a texture-limit error, got {other:?}"),
        }
    }
}
