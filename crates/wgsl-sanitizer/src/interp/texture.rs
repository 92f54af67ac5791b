//! 2D textures of one level: `textureLoad`, `textureStore` (checked for bounds and races
//! per texel) and `textureDimensions`, in the texel formats of [`crate::TexelFormat`].

use naga::{Expression, Handle, Span};

use super::memory::{site, GMem};
use super::shadow::{Acc, Race};
use super::{data, expr_span, internal, lanes, take_buf, Exec, Frame, Ptr, Res, Val};
use crate::findings::FindingKind as FK;
use crate::math;
use crate::types::K;
use crate::Texture;

impl Exec<'_, '_> {
    /// `textureDimensions`.
    pub(super) fn image_query(
        &mut self,
        fr: &mut Frame,
        h: Handle<Expression>,
        image: Handle<Expression>,
        query: naga::ImageQuery,
        mask: u64,
    ) -> Res<()> {
        let Val::Img(gi) = fr.vals[image.index()] else {
            return Err(internal("texture expected"));
        };
        if let naga::ImageQuery::Size { level: Some(l) } = query {
            self.ensure(fr, l)?;
        }
        let (tw, th) = match &self.g().mem[gi as usize] {
            GMem::Tex { tex, .. } => (tex.width, tex.height),
            _ => return Err(internal("texture memory")),
        };
        let mut out = take_buf(fr, h, self.w() * 2);
        for l in lanes(mask) {
            out[l * 2] = tw;
            out[l * 2 + 1] = th;
        }
        fr.vals[h.index()] = Val::D(out);
        Ok(())
    }

    pub(super) fn image_load(
        &mut self,
        fr: &mut Frame,
        h: Handle<Expression>,
        image: Handle<Expression>,
        coordinate: Handle<Expression>,
        level: Option<Handle<Expression>>,
        mask: u64,
    ) -> Res<()> {
        let w = self.w();
        let Val::Img(gi) = fr.vals[image.index()] else {
            return Err(internal("texture expected"));
        };
        let span = expr_span(fr, h);
        let mut out = take_buf(fr, h, w * 4);
        let coords = data(fr, coordinate).to_vec();
        let levels = level.map(|lv| data(fr, lv).to_vec());
        let mut bad: Vec<(usize, u32, u32, u32)> = Vec::new();
        let order = self.instruction(Some(Ptr { mem: gi, off: 0 }), mask, false)?;
        self.tally_add(|c| &mut c.texture_reads, u64::from(mask.count_ones()));
        self.tally_load_wait();
        let mut texels: Vec<(u32, u32)> = Vec::new();
        let (tw, th, tb) = {
            let g = self.g.as_mut().expect("the baton");
            let GMem::Tex { tex, .. } = &g.mem[gi as usize] else {
                return Err(internal("texture memory"));
            };
            for l in order {
                let (x, y) = (coords[l * 2], coords[l * 2 + 1]);
                let lev = levels.as_ref().map_or(0, |v| v[l]);
                let dst = &mut out[l * 4..l * 4 + 4];
                if x >= tex.width || y >= tex.height || lev != 0 {
                    dst.fill(0);
                    bad.push((l, x, y, lev));
                    continue;
                }
                read_texel(tex, x, y, dst);
                texels.push((x, y));
            }
            (tex.width, tex.height, tex.format.bytes() as u64)
        };
        self.tally_texels(&texels, tw, tb, false);
        for (l, x, y, lev) in bad {
            let name = self.mem_name(fr, Ptr { mem: gi, off: 0 });
            self.finding(FK::OutOfBounds, span, Some(l), None, None, || {
                format!(
                    "textureLoad of texel ({}, {}) level {lev} of {name}, {tw}×{th}",
                    x as i32, y as i32
                )
            });
        }
        fr.vals[h.index()] = Val::D(out);
        Ok(())
    }

    pub(super) fn image_store(
        &mut self,
        fr: &mut Frame,
        image: Handle<Expression>,
        coordinate: Handle<Expression>,
        value: Handle<Expression>,
        span: Span,
        mask: u64,
    ) -> Res<()> {
        self.ensure_all(fr, [image, coordinate, value])?;
        let Val::Img(gi) = fr.vals[image.index()] else {
            return Err(internal("texture expected"));
        };
        let vk = fr.prep.metas[value.index()].k.unwrap_or(K::F32);
        let coords = data(fr, coordinate).to_vec();
        let vals = data(fr, value).to_vec();
        let order = self.instruction(Some(Ptr { mem: gi, off: 0 }), mask, true)?;
        self.tally_add(|c| &mut c.texture_writes, u64::from(mask.count_ones()));
        let mut acc = Acc {
            me: 0,
            ep: self.g().st_ep,
            write: true,
            site: site(span),
            storage: true,
            wg_total: self.p.wg_total,
            atomic: false,
        };
        let mut events: Vec<(usize, u32, u32, Option<Race>)> = Vec::new();
        let mut texels: Vec<(u32, u32)> = Vec::new();
        let (tw, tb) = {
            let inv0 = self.inv0;
            let g = self.g.as_mut().expect("the baton");
            let GMem::Tex { tex, shadow, .. } = &mut g.mem[gi as usize] else {
                return Err(internal("texture memory"));
            };
            for l in order {
                let (x, y) = (coords[l * 2], coords[l * 2 + 1]);
                if x >= tex.width || y >= tex.height {
                    events.push((l, x, y, None));
                    continue;
                }
                let mut v = [0f32; 4];
                for (i, vi) in v.iter_mut().enumerate() {
                    *vi = math::to_f64(vk, vals[l * 4 + i]) as f32;
                }
                write_texel(tex, x, y, &v);
                texels.push((x, y));
                let t = (y * tex.width + x) as usize;
                if !shadow.is_empty() {
                    acc.me = inv0 + l as u32;
                    let mut race = None;
                    acc.record(&mut shadow[t..t + 1], &mut race);
                    if race.is_some() {
                        events.push((l, x, y, race));
                    }
                }
            }
            (tex.width, tex.format.bytes() as u64)
        };
        self.tally_texels(&texels, tw, tb, true);
        for (l, x, y, r) in events {
            let name = self.mem_name(fr, Ptr { mem: gi, off: 0 });
            match r {
                None => self.finding(FK::OutOfBounds, span, Some(l), None, None, || {
                    format!("textureStore to texel ({}, {}) of {name}", x as i32, y as i32)
                }),
                Some((other, osite, _)) => {
                    self.race(FK::StorageRace, span, l, (other, osite), || {
                        format!("textureStore to texel ({x}, {y}) of {name} races with an earlier write")
                    })
                }
            }
        }
        Ok(())
    }
}

fn read_texel(tex: &Texture, x: u32, y: u32, dst: &mut [u32]) {
    let t = (y * tex.width + x) as usize;
    let b = tex.format.bytes();
    let d = &tex.data[t * b..(t + 1) * b];
    match tex.format {
        crate::TexelFormat::Rgba32Float => {
            for i in 0..4 {
                dst[i] = u32::from_le_bytes([d[i * 4], d[i * 4 + 1], d[i * 4 + 2], d[i * 4 + 3]]);
            }
        }
        crate::TexelFormat::Rgba16Float => {
            for i in 0..4 {
                let hbits = u16::from_le_bytes([d[i * 2], d[i * 2 + 1]]);
                dst[i] = half::f16::from_bits(hbits).to_f32().to_bits();
            }
        }
        crate::TexelFormat::R32Float => {
            dst[0] = u32::from_le_bytes([d[0], d[1], d[2], d[3]]);
            dst[1] = 0;
            dst[2] = 0;
            dst[3] = 1f32.to_bits();
        }
    }
}

fn write_texel(tex: &mut Texture, x: u32, y: u32, v: &[f32; 4]) {
    let t = (y * tex.width + x) as usize;
    let b = tex.format.bytes();
    let d = &mut tex.data[t * b..(t + 1) * b];
    match tex.format {
        crate::TexelFormat::Rgba32Float => {
            for i in 0..4 {
                d[i * 4..i * 4 + 4].copy_from_slice(&v[i].to_le_bytes());
            }
        }
        crate::TexelFormat::Rgba16Float => {
            for i in 0..4 {
                d[i * 2..i * 2 + 2].copy_from_slice(&half::f16::from_f32(v[i]).to_le_bytes());
            }
        }
        crate::TexelFormat::R32Float => d.copy_from_slice(&v[0].to_le_bytes()),
    }
}
