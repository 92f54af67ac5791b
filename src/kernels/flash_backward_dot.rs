//! `shaders/flash_backward_dot.wgsl`: the first pass of the fused backward, `D_i = dO_i·O_i`
//! for every query row, into the second half of the row statistics the forward saved (the
//! first half holds each row's log-sum-exp). Same [`Flash`] problem and uniform as the fused
//! forward (`flash_tiled.rs`); the backward kernels' shared parts are here too.

use super::flash_tiled::{Flash, FlashParams};
use super::wgsl::NoConstants;
use super::{record, Dim, Kernel, KernelId, Slot};
use crate::context::Context;
use crate::error::{Error, Result};

/// The kernel.
pub(crate) struct Shader;

/// Rows per workgroup (the shader's `@workgroup_size`).
const ROWS: u64 = 64;

impl Kernel for Shader {
    const ID: KernelId = KernelId::FlashBackwardDot;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(ROWS as u32), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("do_buf"),
        Slot::Read("o_buf"),
        Slot::ReadWrite("stats"),
    ];
    type Consts = NoConstants;
    type Params = FlashParams;
}

/// The tile shape of a backward kernel: `threads` per workgroup, each owning one key
/// (`flash_backward_kv`) or one query row (`flash_backward_q`), and `tile` rows of the other
/// side (query rows, keys) streamed through workgroup memory at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BackwardTiles {
    /// Threads per workgroup.
    pub threads: u32,
    /// Rows per workgroup-memory tile (shrunk to fit the device's workgroup memory).
    pub tile: u32,
}

impl BackwardTiles {
    /// On a GPU: 128 threads, tiles of 32 rows.
    pub const GPU: Self = BackwardTiles {
        threads: 128,
        tile: 32,
    };
    /// On a CPU adapter (lavapipe runs a workgroup as a loop over 8-lane SIMD batches): 64
    /// threads, tiles of 32 rows.
    pub const CPU: Self = BackwardTiles {
        threads: 64,
        tile: 32,
    };

    /// The shape for `ctx`'s adapter.
    pub fn for_adapter(ctx: &Context) -> Self {
        match ctx.adapter_info().device_type {
            wgpu::DeviceType::Cpu => Self::CPU,
            _ => Self::GPU,
        }
    }

    /// This shape with the tile halved until `bytes_per_row · tile` (plus `extra` per row)
    /// fits `limits`' workgroup memory, and the threads capped at the device's.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when not even a one-row tile fits.
    pub fn fit(self, limits: &wgpu::Limits, bytes_per_row: u64, what: &str) -> Result<Self> {
        let max_threads = limits
            .max_compute_invocations_per_workgroup
            .min(limits.max_compute_workgroup_size_x);
        let threads = self.threads.min(max_threads).max(1);
        let limit = u64::from(limits.max_compute_workgroup_storage_size);
        let mut tile = self.tile.max(1);
        while tile > 1 && u64::from(tile) * bytes_per_row > limit {
            tile /= 2;
        }
        if u64::from(tile) * bytes_per_row > limit {
            return Err(Error::LimitExceeded {
                what: format!("{what} workgroup tile"),
                needed: format!("{bytes_per_row} bytes"),
                limit: format!("{limit} bytes"),
                limit_name: "max_compute_workgroup_storage_size",
            });
        }
        Ok(BackwardTiles { threads, tile })
    }
}

impl Flash {
    /// Records `D_i = dO_i·O_i` of every query row into the second half of `stats`
    /// (`2·batch·heads·n_q` f32s); `d_o` and `o` are laid out as [`Flash::o`].
    ///
    /// # Errors
    /// A size that does not fit the grid.
    pub fn dispatch_backward_dot(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        d_o: &wgpu::Buffer,
        o: &wgpu::Buffer,
        stats: &wgpu::Buffer,
    ) -> Result<()> {
        let (params, _) = self.params(self.n_q, [0; 4])?;
        let rows = (self.batch * self.heads * self.n_q) as u64;
        record::<Shader>(
            ctx,
            encoder,
            &NoConstants,
            0,
            &params,
            &[d_o.into(), o.into(), stats.into()],
            rows.div_ceil(ROWS),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_shrink_to_fit_workgroup_memory() {
        let limits = wgpu::Limits {
            max_compute_workgroup_storage_size: 16 << 10,
            ..wgpu::Limits::default()
        };
        let t = BackwardTiles {
            threads: 512,
            tile: 32,
        };
        // d = 64: a row of q and dO is 512 bytes, 32 of them fit in 16 KiB.
        let fit = t.fit(&limits, 512, "t").unwrap();
        assert_eq!((fit.threads, fit.tile), (256, 32));
        // d = 256: 2 KiB a row, 8 rows.
        assert_eq!(t.fit(&limits, 2048, "t").unwrap().tile, 8);
        assert!(matches!(
            t.fit(&limits, 32 << 10, "t"),
            Err(Error::LimitExceeded { .. })
        ));
    }
}
