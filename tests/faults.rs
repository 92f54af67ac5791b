//! Faults come back as `Err` from the call that hits them: a lost device makes the context
//! report itself unusable (every later call errs, nothing panics), and a new context works.

use ndarray::Array2;
use wgpu_attention::{Attention, Context, Error, Inputs};

#[test]
fn a_lost_device_is_an_error_and_a_new_context_works() {
    let x = Array2::from_shape_fn((40, 8), |(i, j)| ((i + j) as f32 * 0.1).sin());
    let op = Attention::new().causal(true);
    let ctx = Context::new().unwrap().with_tuning(false);
    op.run(&ctx, Inputs::x(&x)).unwrap();

    ctx.device().destroy();
    for fused in [false, true] {
        let err = op
            .return_weights(!fused)
            .run(&ctx, Inputs::x(&x))
            .unwrap_err();
        assert!(
            matches!(err, Error::DeviceLost(_)),
            "expected DeviceLost, got {err:?}"
        );
    }
    assert!(ctx.check_alive().is_err(), "the context must stay unusable");

    let fresh = Context::new().unwrap().with_tuning(false);
    let out = op.run(&fresh, Inputs::x(&x)).unwrap();
    assert_eq!(out.context.shape(), &[40, 8]);
}
