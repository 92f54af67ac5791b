//! `shaders/flash_backward_q_subgroup.wgsl`: the fused backward's dQ for adapters where
//! textures and subgroup shuffles are fast (lavapipe), `R` query rows per lane, K and V
//! packed into textures. Recorded by [`Flash::dispatch_backward_subgroup`] after the dK/dV
//! kernel, with the same constants.
//!
//! [`Flash::dispatch_backward_subgroup`]: super::flash_tiled::Flash::dispatch_backward_subgroup

use super::flash_backward_kv_subgroup::BackwardSubgroupConsts;
use super::flash_tiled::FlashParams;
use super::loops::{run, strided, Build};
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

    /// The key-tile loop over the rows' keys in steps of SG (`⌈n_kv / SG⌉`; causal: at most
    /// up to the last row) around `// unroll` loops only: K's and V's texel loads, and per
    /// key of the tile (SG) the scores (DK4 × R), dP (DV4 × R) and per row (R) dQ (DK4);
    /// before it Q's and dO's loads (R × DK4 and DV4, `load4`'s 4 each), after it dQ's store
    /// (R × DK4 × 4). The `// unroll` loops count only where they stay loops
    /// (`Build::marked`): natively the count is the key loop's alone.
    fn loops(c: &BackwardSubgroupConsts, p: &FlashParams, b: Build) -> u64 {
        let m = |n| b.marked(n);
        let (sg, r) = (u64::from(c.sg.max(1)), u64::from(c.per_lane));
        let (dk4, dv4) = (u64::from(c.dk4), u64::from(c.dv4));
        let per_key = m(dk4) + dk4 * m(r) + m(dv4) + dv4 * m(r) + m(r) + r * m(dk4);
        let tile = m(dk4) + m(dv4) + m(sg) + sg * per_key;
        let keys = match p.causal {
            0 => p.n_kv,
            _ => p.n_kv.min(p.n_q),
        };
        let tiles = strided(u64::from(keys), sg);
        let loads = m(r) + r * (m(dk4) + dk4 * m(4) + m(dv4) + dv4 * m(4));
        let stores = m(r) + r * (m(dk4) + dk4 * m(4));
        loads + run(tiles) + tiles * tile + stores
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::hardware::Emulation;

    #[test]
    fn loops_step_a_subgroup_of_keys_at_a_time() {
        let c = BackwardSubgroupConsts {
            sg: 8,
            per_lane: 2,
            dk4: 4,
            dv4: 4,
            mask: 0,
        };
        let p = |n_kv, causal| FlashParams {
            n_q: 16,
            n_kv,
            causal,
            kv_ratio: 1,
            ..Default::default()
        };
        let native = Build::of(Emulation::default());
        // Natively the key loop alone: ⌈70,000 / 8⌉ trips and its end; causal, up to row 16.
        assert_eq!(Shader::loops(&c, &p(70_000, 0), native), 8751);
        assert_eq!(Shader::loops(&c, &p(70_000, 1), native), 3);
        let rolled = Build::of(Emulation {
            subgroup: 8,
            coop: 0,
        });
        assert!(Shader::loops(&c, &p(64, 0), rolled) > 8 * 8 * 4 * 3);
    }
}
