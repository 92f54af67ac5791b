//! `shaders/block_map.wgsl`: which tiles of a fused kernel's key loop a mask modifier leaves
//! empty (skipped), full (the modifier not evaluated) or partial: block sparsity.
//! A [`BlockMap`] is made once per modifiers and kernel shape ([`super::mods::ModsUpload`]
//! caches it) and bound with the modifiers at `@group(1)`, where the generated `wa_block`
//! reads it.

use super::loops::{run, strided, Build};
use super::wgsl::{constants, uniform};
use super::{record_with, u32_of, Dim, Kernel, KernelId, Slot};
use crate::error::Result;
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

uniform! {
    /// The uniform block of `block_map.wgsl`.
    pub(crate) struct BlockMapParams {
        n_q: u32,
        n_kv: u32,
        causal: u32,
        nqb: u32,
        nkb: u32,
        gh: u32,
        query_blocks: u32,
        span_base: u32,
    }
}

constants! {
    /// Specialisation of `block_map.wgsl`: the fused kernel's block shape.
    pub(crate) struct BlockMapConsts {
        /// Query rows per block.
        rows => "QR",
        /// Keys per tile.
        keys => "KB",
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::BlockMap;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(64), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[Slot::ReadWrite("blocks")];
    type Consts = BlockMapConsts;
    type Params = BlockMapParams;

    /// The loop over the key blocks in chunks of [`CHUNK`] (`⌈nkb / CHUNK⌉`), each chunk
    /// clearing and then reading its flags (`⌈CHUNK / WG⌉` each) and running the loop over
    /// its key blocks: the thread's keys of each (`⌈KB / WG⌉`) × the block's rows (QR).
    fn loops(c: &BlockMapConsts, p: &BlockMapParams, _: Build) -> u64 {
        let nkb = u64::from(p.nkb);
        let chunks = strided(nkb, CHUNK);
        let flags = run(strided(CHUNK, WG));
        let keys = strided(u64::from(c.keys), WG);
        let per_block = run(keys) + keys * run(u64::from(c.rows));
        // Each chunk's key-block loop ends once: its iterations add up to `nkb`.
        run(chunks) + chunks * (2 * flags + 1) + nkb * (1 + per_block)
    }
}

/// `block_map.wgsl`'s threads per workgroup (`WG`) and key blocks per chunk (`CHUNK`).
const WG: u64 = 64;
const CHUNK: u64 = 256;

/// What a block map is computed for: its block shape and the problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct MapShape {
    /// Query rows per block: the kernel's rows per workgroup.
    pub rows: u32,
    /// Keys per block: a multiple of the kernel's keys per tile (at least 64, so that a
    /// kernel's loop reads one state per 64 keys or fewer).
    pub keys: u32,
    pub batch: u32,
    pub heads: u32,
    pub n_q: u32,
    pub n_kv: u32,
    pub causal: bool,
}

impl MapShape {
    /// The keys per block of a map for a kernel with tiles of `tile` keys: 64 when the tile
    /// divides it, else the tile.
    pub(crate) fn keys_for(tile: u32) -> u32 {
        if tile > 0 && 64 % tile == 0 {
            64
        } else {
            tile
        }
    }
}

/// A block map on the device: one `u32` state per block, then two per query block (its
/// span of keys), and the uniform the generated `wa_block` and `wa_span` index it with,
/// `[(batch stride, head stride, query blocks, key blocks), (rows, keys, span base, on)]`
/// in groups and blocks; `on = 0` when the map would not fit in one binding, or when made
/// on the device its kernel's loops would pass the adapter's loop cap (every tile is then
/// partial: correct, only slower).
#[derive(Debug)]
pub(crate) struct BlockMap {
    pub blocks: wgpu::Buffer,
    pub uniform: wgpu::Buffer,
    /// What the host wrote: the uniform's words and, for a map made on the host, the map's
    /// (`kernels::capture` hands them to the profile, whose buffers otherwise start as
    /// zeros: a map read as zeros is off, and the kernel walks every tile).
    written: ([u32; 8], Option<std::sync::Arc<[u32]>>),
}

impl BlockMap {
    /// The buffers the host wrote and their bytes: the uniform, and the map where it was
    /// made on the host (one made by `block_map.wgsl` is left out: its kernel writes it).
    pub(crate) fn host_written(&self) -> Vec<(&wgpu::Buffer, Vec<u8>)> {
        let (uniform, blocks) = &self.written;
        let mut out = vec![(&self.uniform, bytemuck::cast_slice(uniform).to_vec())];
        if let Some(words) = blocks {
            out.push((&self.blocks, bytemuck::cast_slice(words).to_vec()));
        }
        out
    }

    /// Computes the map of `shape` for the modifiers `mods`, which read the batch and head
    /// indices as `axes` says: on the host when every mask modifier is a preset, else with
    /// `block_map.wgsl` in a submission of its own (whatever becomes of the call that asked,
    /// a map that is kept has been computed; in a dry run, [`super::collect_keys`], nothing
    /// is).
    ///
    /// # Errors
    /// A size past the grid or u32 indexing; GPU errors.
    pub(crate) fn compute(
        ctx: &Gpu,
        mods: &super::mods::ModsUpload,
        axes: [bool; 2],
        shape: MapShape,
    ) -> Result<Self> {
        let nqb = u64::from(shape.n_q.div_ceil(shape.rows.max(1)));
        let nkb = u64::from(shape.n_kv.div_ceil(shape.keys.max(1)));
        let gb = u64::from(if axes[0] { shape.batch } else { 1 });
        let gh = u64::from(if axes[1] { shape.heads } else { 1 });
        let query_blocks = gb * gh * nqb;
        let span_base = query_blocks * nkb;
        let words = span_base + 2 * query_blocks;
        let bytes = words * 4;
        let fits = query_blocks > 0
            && nkb > 0
            && bytes <= ctx.limits().max_storage_buffer_binding_size
            && words <= u64::from(u32::MAX);
        // Presets only: made on the host from their definitions, O(1) per block.
        let grid = crate::modifiers::Grid {
            rows: shape.rows as usize,
            keys: shape.keys as usize,
            n_q: shape.n_q as usize,
            n_kv: shape.n_kv as usize,
            causal: shape.causal,
            gb: gb as usize,
            gh: gh as usize,
        };
        let on_host = fits.then(|| mods.source.preset_block_map(grid)).flatten();
        let consts = BlockMapConsts {
            rows: shape.rows,
            keys: shape.keys,
        };
        // Made here, its loops must stay within a loop-capped adapter's cap (lavapipe): a
        // longer map is not made, as one that does not fit.
        let hw = ctx.hardware();
        let per_invocation = |nkb: u64| {
            let p = BlockMapParams {
                nkb: u32::try_from(nkb).unwrap_or(u32::MAX),
                ..Default::default()
            };
            <Shader as Kernel>::loops(&consts, &p, Build::of(hw.emulate))
        };
        let fits =
            fits && (on_host.is_some() || hw.loop_cap.is_none_or(|cap| per_invocation(nkb) <= cap));
        let narrow = |v: u64| if fits { v as u32 } else { 0 };
        let uniform = [
            narrow(if axes[0] { gh } else { 0 }),
            narrow(u64::from(axes[1])),
            narrow(nqb),
            narrow(nkb),
            shape.rows,
            shape.keys,
            narrow(span_base),
            u32::from(fits),
        ];
        let uniform_words = uniform;
        let uniform = crate::gpu::buffer::uniform(ctx, "block map", &uniform)?;
        if let Some(words) = on_host {
            let blocks =
                crate::gpu::buffer::upload(ctx, "block map", bytemuck::cast_slice(&words))?;
            return Ok(BlockMap {
                blocks,
                uniform,
                written: (uniform_words, Some(words.into())),
            });
        }
        let blocks = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("block map"),
            size: if fits { bytes } else { 16 },
            // COPY_DST: the WGSL sanitizer writes what its kernel made back.
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let written = (uniform_words, None);
        if !fits {
            return Ok(BlockMap {
                blocks,
                uniform,
                written,
            });
        }
        let params = BlockMapParams {
            n_q: shape.n_q,
            n_kv: shape.n_kv,
            causal: u32::from(shape.causal),
            nqb: nqb as u32,
            nkb: nkb as u32,
            gh: gh as u32,
            query_blocks: u32_of("block map query blocks", query_blocks as usize)?,
            span_base: span_base as u32,
        };
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("block map"),
            });
        record_with::<Shader>(
            ctx,
            &mut encoder,
            (&consts, 0),
            &params,
            &[(&blocks).into()],
            Some(super::mods::ModsBind {
                upload: mods,
                map: None,
            }),
            query_blocks,
        )?;
        ctx.queue.submit([encoder.finish()]);
        Ok(BlockMap {
            blocks,
            uniform,
            written,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loops_count_every_key_block_against_the_rows() {
        let c = BlockMapConsts { rows: 64, keys: 64 };
        let p = |nkb| BlockMapParams {
            nkb,
            ..Default::default()
        };
        let build = Build::of(crate::gpu::hardware::Emulation::default());
        // By hand, 2 key blocks: the chunk loop (1 trip, 2), its flags' two loops (4 trips,
        // 5 each) and the key-block loop's end (1), and per key block its trip (1), the
        // thread's keys (1 trip, 2) and the rows (65): 2 + 11 + 2 · 68.
        assert_eq!(Shader::loops(&c, &p(2), build), 149);
        // About 1,000 key blocks (64,000 keys at 64 rows) pass lavapipe's cap.
        assert!(Shader::loops(&c, &p(1_000), build) > 65_535);
    }
    use crate::gpu::readback;
    use crate::kernels::mods::ModsUpload;
    use crate::modifiers::{BufferData, Modifiers, Preset};

    /// The map of `mods` for `shape` as the device holds it (made there or on the host).
    fn device(ctx: &crate::Context, mods: &Modifiers, shape: MapShape) -> Vec<u32> {
        let upload = ModsUpload::new(ctx, mods).unwrap();
        let map = upload.bind(ctx, shape).unwrap().unwrap();
        let words = map.blocks.size() as usize / 4;
        readback::read_as(ctx, &map.blocks, words, false)
            .unwrap()
            .into_iter()
            .map(f32::to_bits)
            .collect()
    }

    /// The exact map of the mask `presets` for `shape`, pair by pair, per batch index when
    /// `per_batch`.
    fn exact(presets: &[Preset], shape: MapShape, per_batch: bool) -> Vec<u32> {
        let (rows, keys) = (shape.rows as usize, shape.keys as usize);
        let (n_q, n_kv) = (shape.n_q as usize, shape.n_kv as usize);
        let (nqb, nkb) = (n_q.div_ceil(rows), n_kv.div_ceil(keys));
        let gb = if per_batch { shape.batch as usize } else { 1 };
        let visible = |b, q, j| {
            (!shape.causal || j <= q) && presets.iter().all(|p| p.apply(0.0, b, 0, q, j).is_some())
        };
        let (mut states, mut spans) = (Vec::new(), Vec::new());
        for b in 0..gb {
            for qb in 0..nqb {
                let (mut lo, mut hi) = (0, 0);
                for kb in 0..nkb {
                    let (mut seen, mut hidden) = (false, false);
                    for q in qb * rows..((qb + 1) * rows).min(n_q) {
                        for j in kb * keys..((kb + 1) * keys).min(n_kv) {
                            let v = visible(b, q, j);
                            seen |= v;
                            hidden |= !v;
                        }
                    }
                    let state = match (seen, hidden) {
                        (false, _) => 0,
                        (true, false) => 1,
                        (true, true) => 2,
                    };
                    if state != 0 {
                        lo = if hi == 0 { kb } else { lo };
                        hi = kb + 1;
                    }
                    states.push(state);
                }
                spans.extend([(lo * keys) as u32, (hi * keys) as u32]);
            }
        }
        states.extend(spans);
        states
    }

    fn shape(batch: u32, n: u32, rows: u32, causal: bool) -> MapShape {
        MapShape {
            rows,
            keys: 64,
            batch,
            heads: 3,
            n_q: n,
            n_kv: n,
            causal,
        }
    }

    /// Mask presets and the same masks as a caller's WGSL (so made by `block_map.wgsl`), with
    /// the shapes to map them at: n = 1000 (no multiple of a block), more key blocks than
    /// one chunk of the shader's (256) at n = 17000, per-batch documents, rows of 8 to 64.
    fn cases() -> Vec<(Vec<Preset>, Modifiers, MapShape)> {
        let n: usize = 1000;
        let ids: Vec<i32> = (0..2 * n)
            .map(|p| ((p % n) / (150 + p / n * 333)) as i32)
            .collect();
        let window = |l: u32, r: u32| {
            format!(
                "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {{\n    \
                 let d = i32(kv) - i32(q);\n    return d >= -{l}i && d <= {r}i;\n}}\n"
            )
        };
        let docs = Modifiers::new()
            .mask_mod(
                "docs.wgsl",
                format!(
                    "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {{\n    \
                     return doc[b * {n}u + q] == doc[b * {n}u + kv];\n}}\n"
                ),
            )
            .buffer("doc", BufferData::I32(ids.clone()));
        let doc_preset = Preset::Documents { ids, n: n as u32 };
        vec![
            (
                vec![Preset::Window {
                    left: 100,
                    right: 0,
                }],
                Modifiers::new().mask_mod("w.wgsl", window(100, 0)),
                shape(1, 1000, 64, true),
            ),
            (
                vec![Preset::Window {
                    left: 30,
                    right: 70,
                }],
                Modifiers::new().mask_mod("w.wgsl", window(30, 70)),
                shape(1, 1000, 8, false),
            ),
            (
                vec![Preset::Window {
                    left: 511,
                    right: 0,
                }],
                Modifiers::new().mask_mod("w.wgsl", window(511, 0)),
                shape(1, 17000, 64, true),
            ),
            (
                vec![doc_preset.clone()],
                docs.clone(),
                shape(2, 1000, 64, true),
            ),
            (vec![doc_preset], docs, shape(2, 1000, 16, false)),
            (
                vec![
                    Preset::PrefixLm(300),
                    Preset::Window {
                        left: 400,
                        right: 1000,
                    },
                ],
                Modifiers::new().mask_mod(
                    "p.wgsl",
                    "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {\n    \
                     return (kv < 300u || kv <= q) && kv + 400u >= q;\n}\n",
                ),
                shape(1, 1000, 64, false),
            ),
        ]
    }

    #[test]
    fn the_shaders_map_of_a_callers_mask_is_exact() {
        let ctx = crate::Context::new().unwrap().with_tuning(false);
        for (i, (presets, own, shape)) in cases().into_iter().enumerate() {
            let per_batch = own.mask_axes().unwrap()[0];
            let want = exact(&presets, shape, per_batch);
            assert!(
                want.contains(&0),
                "case {i} has no empty block: it tests no skipping"
            );
            assert!(
                device(&ctx, &own, shape) == want,
                "case {i}: the map differs"
            );
        }
    }

    #[test]
    fn the_presets_map_is_safe_and_exact_for_one_preset() {
        let ctx = crate::Context::new().unwrap().with_tuning(false);
        for (i, (presets, _, shape)) in cases().into_iter().enumerate() {
            let mods = presets
                .iter()
                .fold(Modifiers::new(), |m, p| m.preset(p.clone()));
            let per_batch = mods.mask_axes().unwrap()[0];
            let want = exact(&presets, shape, per_batch);
            let got = device(&ctx, &mods, shape);
            assert_eq!(got.len(), want.len(), "case {i}");
            let states = got.len() - 2 * (got.len() / (2 + shape.n_kv.div_ceil(64) as usize));
            // Never empty or full where a pair says otherwise; partial is always safe.
            for (s, (g, w)) in got[..states].iter().zip(&want).enumerate() {
                assert!(g == w || *g == 2, "case {i}, block {s}: {g}, exactly {w}");
            }
            // One mask and no causal: nothing to and, so exact, spans included.
            if presets.len() == 1 && !shape.causal {
                assert!(got == want, "case {i}: the map differs");
            }
        }
    }
}
