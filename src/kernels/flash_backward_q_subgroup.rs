//! `shaders/flash_backward_q_subgroup.wgsl`: the fused backward's dQ for adapters where
//! textures and subgroup shuffles are fast (lavapipe), `R` query rows per lane, K and V
//! packed into textures. Recorded by [`Flash::dispatch_backward_subgroup`] after the dK/dV
//! kernel, with the same constants.
//!
//! [`Flash::dispatch_backward_subgroup`]: super::flash_tiled::Flash::dispatch_backward_subgroup

use super::flash_backward_kv_subgroup::BackwardSubgroupConsts;
use super::flash_tiled::FlashParams;
use super::{Dim, Kernel, KernelId, Slot};

/// The kernel.
pub(crate) struct Shader;

impl Kernel for Shader {
    const ID: KernelId = KernelId::FlashBackwardQSubgroup;
    const WORKGROUP: [Dim; 3] = [Dim::Const("SG"), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("q_buf"),
        Slot::Texture("k_tex"),
        Slot::Texture("v_tex"),
        Slot::Read("do_buf"),
        Slot::Read("stats"),
        Slot::ReadWrite("dq_buf"),
        Slot::Read("mask"),
    ];
    /// Q is f16 (K and V are widened as they are packed).
    const DTYPES: &'static [&'static str] = &["Q_T"];
    const SUBGROUPS: bool = true;
    type Consts = BackwardSubgroupConsts;
    type Params = FlashParams;
}
