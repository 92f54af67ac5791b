//! `shaders/flash_backward_dot.wgsl`: the first pass of the fused backward, `D_i = dO_i·O_i`
//! for every query row, into the second half of the row statistics the forward saved (the
//! first half holds each row's log-sum-exp). Same [`Flash`] problem and uniform as the fused
//! forward (`flash_tiled.rs`); the backward kernels' shared parts are here too.

use super::flash_backward_kv_subgroup::BackwardSubgroupConsts;
use super::flash_tiled::{Flash, FlashParams};
use super::loops::{run, strided, Build};
use super::wgsl::NoConstants;
use super::{flash_backward_kv, flash_backward_kv_subgroup};
use super::{flash_backward_q, flash_backward_q_subgroup};
use super::{record, Dim, Kernel, KernelId, Slot};
use crate::error::{Error, Limit, Result};
use crate::gpu::Gpu;

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

    /// The passes over the workgroup's rows (`ROWS / TR`, TR = 32 threads per row), each
    /// over the row's `d_v` values in steps of TR; then the sum of a row's TR partials.
    fn loops(_: &NoConstants, p: &FlashParams, _: Build) -> u64 {
        const TR: u64 = 32;
        let passes = strided(ROWS, ROWS / TR);
        run(passes) + passes * run(strided(u64::from(p.dv_h), TR)) + run(TR)
    }
}

/// The tile shape of a backward kernel: a workgroup owns `owners` keys (`flash_backward_kv`)
/// or query rows (`flash_backward_q`), `split` threads each (every thread holding a share of
/// the head's columns, so registers stay bounded on GPUs), and streams `tile` rows of the
/// other side (query rows, keys) through workgroup memory at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BackwardTiles {
    /// Keys or query rows per workgroup.
    pub owners: u32,
    /// Threads per key or row.
    pub split: u32,
    /// Rows per workgroup-memory tile (shrunk to fit the device's workgroup memory).
    pub tile: u32,
}

impl BackwardTiles {
    /// On a GPU: 32 keys or rows of 4 threads (16 registers of columns each at d = 64),
    /// tiles of 16 rows.
    pub const GPU: Self = BackwardTiles {
        owners: 32,
        split: 4,
        tile: 16,
    };
    /// On a CPU adapter (lavapipe runs a workgroup as a loop over 8-lane SIMD batches, and
    /// registers are cheap): 64 keys or rows of one thread, tiles of 32 rows.
    pub const CPU: Self = BackwardTiles {
        owners: 64,
        split: 1,
        tile: 32,
    };

    /// The shape for `ctx`'s adapter.
    pub fn for_adapter(ctx: &Gpu) -> Self {
        match ctx.hardware().decide.backward_gpu_tiles {
            true => Self::GPU,
            false => Self::CPU,
        }
    }

    /// This shape for heads `w4` vec4s wide (the wider of d_k and d_v): with threads split
    /// per key or row at all, enough of them that each holds at most 4 vec4 columns of an
    /// operand (more spills on RDNA3: d = 128 with 4 threads, 177 registers), the threads
    /// per workgroup kept.
    pub fn for_width(self, w4: u32) -> Self {
        if self.split <= 1 {
            return self;
        }
        let split = self.split.max(w4.div_ceil(4));
        BackwardTiles {
            owners: (self.threads() / split).max(1),
            split,
            tile: self.tile,
        }
    }

    /// Threads per workgroup.
    pub fn threads(&self) -> u32 {
        self.owners * self.split
    }

    /// This shape with the owners halved until the threads fit `limits`, then the tile
    /// halved until `bytes_per_row(shape) · tile` fits its workgroup memory.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when not even a one-row tile fits.
    pub fn fit(
        self,
        limits: &wgpu::Limits,
        bytes_per_row: impl Fn(&BackwardTiles) -> u64,
        what: &str,
    ) -> Result<Self> {
        let max_threads = limits
            .max_compute_invocations_per_workgroup
            .min(limits.max_compute_workgroup_size_x);
        let mut t = BackwardTiles {
            split: self.split.clamp(1, max_threads.max(1)),
            owners: self.owners.max(1),
            tile: self.tile.max(1),
        };
        while t.owners > 1 && t.threads() > max_threads {
            t.owners /= 2;
        }
        let limit = u64::from(limits.max_compute_workgroup_storage_size);
        let row = bytes_per_row(&t);
        while t.tile > 1 && u64::from(t.tile) * row > limit {
            t.tile /= 2;
        }
        if u64::from(t.tile) * row > limit {
            return Err(Error::LimitExceeded {
                what: format!("{what} workgroup tile"),
                needed: format!("{row} bytes"),
                limit: format!("{limit} bytes"),
                limit_name: Limit::MaxComputeWorkgroupStorageSize,
            });
        }
        Ok(t)
    }
}

/// Workgroup memory per tile row for the threads' partial `(s, dP)` under `tiles`: none with
/// one thread per key or row (the scores are computed where they are used), as the shaders
/// declare it.
pub(crate) fn partials(tiles: &BackwardTiles) -> u64 {
    match tiles.split {
        0 | 1 => 0,
        _ => 8 * u64::from(tiles.threads()),
    }
}

impl Flash {
    /// The most loop iterations one invocation of the storage backward's dK/dV or dQ
    /// kernel runs for this problem with `tiles` on `ctx` ([`Kernel::loops`]).
    ///
    /// # Errors
    /// As [`Flash::backward_kv_consts`] and [`Flash::backward_q_consts`].
    pub fn storage_backward_loops(&self, ctx: &Gpu, tiles: BackwardTiles) -> Result<u64> {
        let build = Build::of(ctx.hardware().emulate);
        let kv = self.backward_kv_consts(ctx.limits(), tiles, 0)?;
        let q = self.backward_q_consts(ctx.limits(), tiles, 0)?;
        let (params, _) = self.params(q.rows as usize, [0; 4])?;
        Ok(flash_backward_kv::Shader::loops(&kv, &params, build)
            .max(flash_backward_q::Shader::loops(&q, &params, build)))
    }

    /// As [`Flash::storage_backward_loops`] for the subgroup backward's kernels with
    /// `(kv_per_lane, q_per_lane)`; `None` without a fixed subgroup size.
    pub fn subgroup_backward_loops(&self, ctx: &Gpu, (kv, q): (u32, u32)) -> Option<u64> {
        let build = Build::of(ctx.hardware().emulate);
        let sg = ctx.subgroup_size()?;
        let (dk4, dv4) = self.widths4().ok()?;
        let consts = |per_lane| BackwardSubgroupConsts {
            sg,
            per_lane,
            dk4,
            dv4,
            mask: 0,
        };
        let (params, _) = self.params((sg * q) as usize, [0; 4]).ok()?;
        let kv_loops = flash_backward_kv_subgroup::Shader::loops(&consts(kv), &params, build);
        let q_loops = flash_backward_q_subgroup::Shader::loops(&consts(q), &params, build);
        Some(kv_loops.max(q_loops))
    }

    /// Records `D_i = dO_i·O_i` of every query row into the second half of `stats`
    /// (`2·batch·heads·n_q` f32s); `d_o` and `o` are laid out as [`Flash::o`].
    ///
    /// # Errors
    /// A size that does not fit the grid.
    pub fn dispatch_backward_dot(
        &self,
        ctx: &Gpu,
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
    fn the_dot_loops_over_the_value_width() {
        let p = FlashParams {
            dv_h: 64,
            ..Default::default()
        };
        let build = Build::of(crate::gpu::hardware::Emulation::default());
        // 32 passes of two rows (33), each over 64 columns in steps of 32 (3); the sum of a
        // row's 32 partials (33).
        assert_eq!(Shader::loops(&NoConstants, &p, build), 33 + 32 * 3 + 33);
    }

    #[test]
    fn tiles_shrink_to_fit_threads_and_workgroup_memory() {
        let limits = wgpu::Limits {
            max_compute_workgroup_storage_size: 16 << 10,
            ..wgpu::Limits::default()
        };
        let t = BackwardTiles {
            owners: 128,
            split: 4,
            tile: 32,
        };
        // 512 threads over the default 256: 64 owners of 4.
        let fit = t.fit(&limits, |_| 512, "t").unwrap();
        assert_eq!((fit.owners, fit.split, fit.tile), (64, 4, 32));
        // 2 KiB a row: 8 rows; the row's size may grow with the threads.
        assert_eq!(t.fit(&limits, |_| 2048, "t").unwrap().tile, 8);
        assert_eq!(t.fit(&limits, partials, "t").unwrap().tile, 8);
        assert!(matches!(
            t.fit(&limits, |_| 32 << 10, "t"),
            Err(Error::LimitExceeded { .. })
        ));
        // At most 4 vec4 columns a thread: d = 128 splits a key over 8 threads.
        let gpu = BackwardTiles::GPU.for_width(32);
        assert_eq!((gpu.owners, gpu.split, gpu.threads()), (16, 8, 128));
        assert_eq!(BackwardTiles::GPU.for_width(16), BackwardTiles::GPU);
        assert_eq!(BackwardTiles::CPU.for_width(64), BackwardTiles::CPU);
    }
}
