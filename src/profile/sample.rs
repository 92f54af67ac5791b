//! Which workgroups of a fused-kernel dispatch the profile interprets, and what each stands
//! for. The host knows exactly how many key tiles each workgroup of `flash_blocked.wgsl`
//! visits (its query block, the causal diagonal, a key range of a split, a window's span),
//! and every count of a workgroup is its fixed part plus a part per tile. So the lightest
//! workgroups are interpreted (a few tiles each instead of a causal grid's average of half
//! the keys) and weighted so that the weights sum to the workgroups and, times the tiles,
//! to the tiles the grid visits: exact for counts affine in the tiles, whatever the tiles'
//! spread over the grid (a stratified random sample of a causal grid is not: 6 workgroups
//! misjudged its FLOPs by up to 1.6×).

use crate::kernels::flash_tiled::FlashParams;
use crate::kernels::Captured;

/// Key tiles per workgroup of one dispatch.
#[derive(Debug, Clone, PartialEq)]
pub struct Tiles {
    /// Tiles each workgroup visits (by linear workgroup index).
    pub visits: Vec<u32>,
    /// Tiles each would visit with a window's block map off (every key up to the diagonal),
    /// where that differs from `visits`: the profile reads the map as the host made it (or
    /// as its kernel wrote it), so these run as `visits` unless the map is off (one past a
    /// binding's size); such workgroups are left out of the sample either way.
    pub run: Vec<u32>,
    /// Keys in the range each workgroup visits (a partial last tile's products past the
    /// range's end are skipped: its P·V work follows the keys, its Q·Kᵀ the tiles).
    pub keys: Vec<u32>,
}

impl Tiles {
    /// The visited tiles of every workgroup together.
    pub fn total(&self) -> u64 {
        self.visits.iter().map(|&t| u64::from(t)).sum()
    }
}

/// The grid order a causal `flash_blocked` dispatch walks its query blocks in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CausalOrder {
    /// Last rows (the heaviest) first: today's kernel (since c4b005b).
    HeaviestFirst,
    /// First rows first, as d646ab0 dispatched them: the heaviest blocks end the grid.
    LightestFirst,
}

/// The key tiles of each workgroup of a captured `flash_blocked.wgsl` dispatch with blocks
/// of `rows` × `keys`, its query blocks in `order`, a left window of `window` keys (with
/// causal; the block map rounds its span's start down to `map_keys`).
pub(crate) fn flash_blocked_tiles(
    c: &Captured,
    rows: u32,
    keys: u32,
    window: Option<u32>,
    map_keys: u32,
    order: CausalOrder,
) -> Option<Tiles> {
    let size = std::mem::size_of::<FlashParams>();
    if c.label != "flash_blocked.wgsl" || c.params.len() < size || keys == 0 {
        return None;
    }
    let p: FlashParams = bytemuck::pod_read_unaligned(&c.params[..size]);
    let nwg = c.workgroups;
    let total = nwg.iter().map(|&x| x as usize).product::<usize>();
    let split = c.variant.contains("split: 1");
    let splits = if split { p.splits.max(1) } else { 1 };
    let causal = p.causal != 0;
    let mut visits = Vec::with_capacity(total);
    let mut run = Vec::with_capacity(total);
    let mut in_range = Vec::with_capacity(total);
    for id in 0..total as u64 {
        if id >= u64::from(p.groups) * u64::from(p.blocks) * u64::from(splits) {
            visits.push(0);
            run.push(0);
            in_range.push(0);
            continue;
        }
        let id = id as u32;
        let part = id % splits;
        let mut blk = id / splits % p.blocks;
        if causal && order == CausalOrder::HeaviestFirst {
            blk = p.blocks - 1 - blk;
        }
        let row0 = blk * rows;
        let mut end = p.n_kv;
        if causal {
            end = end.min((row0 + rows).min(p.n_q));
        }
        let mut lo = part * p.split_keys;
        if split {
            end = end.min(lo + p.split_keys);
        }
        let tiles = |lo: u32| end.saturating_sub(lo).div_ceil(keys);
        run.push(tiles(lo));
        if let Some(w) = window {
            lo = lo.max(row0.saturating_sub(w) / map_keys * map_keys);
        }
        visits.push(tiles(lo));
        in_range.push(end.saturating_sub(lo));
    }
    Some(Tiles {
        visits,
        run,
        keys: in_range,
    })
}

/// Up to `k` workgroups and their weights: the lightest non-empty ones of the grid whose run
/// visits what the call would, one per distinct (tiles, keys), weighted to stand for every
/// non-empty workgroup, visited tile and key (the least-norm weights with Σ w = workgroups,
/// Σ w·t = tiles, Σ w·keys = keys), and one empty workgroup for all the empty ones. A
/// weight may be negative (the estimate extrapolates from light blocks).
pub fn choose(tiles: &Tiles, k: usize) -> Vec<(u64, f64)> {
    let k = k.max(2);
    let mut out = Vec::new();
    let empty: Vec<u64> = (0..tiles.visits.len() as u64)
        .filter(|&i| tiles.visits[i as usize] == 0 && tiles.run[i as usize] == 0)
        .collect();
    let n_empty = tiles.visits.iter().filter(|&&t| t == 0).count();
    if let Some(&first) = empty.first() {
        out.push((first, n_empty as f64));
    }
    // The lightest, one per distinct (tiles, keys): the fewest that tell the fixed, per
    // tile and per key parts apart.
    let mut cands: Vec<(u32, u32, u64)> = (0..tiles.visits.len())
        .filter(|&i| tiles.visits[i] > 0 && tiles.visits[i] == tiles.run[i])
        .map(|i| (tiles.visits[i], tiles.keys[i], i as u64))
        .collect();
    cands.sort_unstable();
    cands.dedup_by_key(|c| (c.0, c.1));
    let picked: Vec<(u32, u64)> = cands.iter().take(k).map(|c| (c.0, c.2)).collect();
    if picked.is_empty() {
        return out;
    }
    // Least-norm weights w = Aᵀ(AAᵀ)⁻¹b for the constraints A w = b: workgroups, tiles and
    // keys (the keys dropped where they follow the tiles, the tiles where all are equal).
    let full: Vec<usize> = (0..tiles.visits.len())
        .filter(|&i| tiles.visits[i] > 0)
        .collect();
    let feats = |i: usize| [1.0, f64::from(tiles.visits[i]), f64::from(tiles.keys[i])];
    let mut b = [0.0; 3];
    for &i in &full {
        for (bj, f) in b.iter_mut().zip(feats(i)) {
            *bj += f;
        }
    }
    let rows: Vec<[f64; 3]> = picked.iter().map(|p| feats(p.1 as usize)).collect();
    for used in [3, 2, 1] {
        if let Some(l) = solve_gram(&rows, &b, used) {
            for (p, f) in picked.iter().zip(&rows) {
                let w: f64 = (0..used).map(|j| l[j] * f[j]).sum();
                out.push((p.1, w));
            }
            return out;
        }
    }
    out
}

/// λ with (AAᵀ)λ = b over the first `used` features of `rows` (A's columns), or `None` when
/// AAᵀ is singular or the weights would miss b (a feature the rows do not vary in).
fn solve_gram(rows: &[[f64; 3]], b: &[f64; 3], used: usize) -> Option<[f64; 3]> {
    let mut g = [[0.0; 4]; 3];
    for j in 0..used {
        for k in 0..used {
            g[j][k] = rows.iter().map(|r| r[j] * r[k]).sum();
        }
        g[j][3] = b[j];
    }
    // Gauss-Jordan with partial pivoting.
    for c in 0..used {
        let p = (c..used).max_by(|&x, &y| g[x][c].abs().total_cmp(&g[y][c].abs()))?;
        g.swap(c, p);
        let scale = g[0..used].iter().map(|r| r[c].abs()).fold(0.0, f64::max);
        if g[c][c].abs() <= 1e-9 * scale.max(1e-300) {
            return None;
        }
        let pivot = g[c];
        for (r, row) in g.iter_mut().enumerate().take(used) {
            if r != c {
                let f = row[c] / pivot[c];
                for (x, p) in row.iter_mut().zip(pivot) {
                    *x -= f * p;
                }
            }
        }
    }
    let mut l = [0.0; 3];
    for j in 0..used {
        l[j] = g[j][3] / g[j][j];
    }
    // The dropped features must come out right too (else their totals are missed), but for
    // the last resort, the workgroups alone.
    if used == 1 {
        return Some(l);
    }
    let w: Vec<f64> = rows
        .iter()
        .map(|r| (0..used).map(|j| l[j] * r[j]).sum())
        .collect();
    for j in used..3 {
        let got: f64 = rows.iter().zip(&w).map(|(r, w)| r[j] * w).sum();
        if (got - b[j]).abs() > 1e-6 * b[j].abs().max(1.0) {
            return None;
        }
    }
    Some(l)
}

/// The instructions each workgroup of the grid issues, from the sampled ones' `(tiles,
/// instructions)`: a least-squares line through the non-empty ones (fixed + per tile), an
/// empty workgroup's own count for the empty ones.
pub fn per_workgroup(tiles: &Tiles, fit: &[(u32, f64)]) -> Vec<f64> {
    let full: Vec<(f64, f64)> = fit
        .iter()
        .filter(|f| f.0 > 0)
        .map(|&(t, y)| (f64::from(t), y))
        .collect();
    let empty = fit.iter().find(|f| f.0 == 0).map_or(0.0, |f| f.1);
    let n = full.len().max(1) as f64;
    let (mt, my) = full
        .iter()
        .fold((0.0, 0.0), |a, f| (a.0 + f.0 / n, a.1 + f.1 / n));
    let var: f64 = full.iter().map(|f| (f.0 - mt).powi(2)).sum();
    let cov: f64 = full.iter().map(|f| (f.0 - mt) * (f.1 - my)).sum();
    let slope = if var > 0.0 {
        cov / var
    } else {
        my / mt.max(1.0)
    };
    let fixed = my - slope * mt;
    tiles
        .visits
        .iter()
        .map(|&t| match t {
            0 => empty,
            t => (fixed + slope * f64::from(t)).max(0.0),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_reproduce_the_workgroups_and_the_tiles() {
        // A causal grid of 64 blocks, heaviest first: 64, 63, …, 1 tiles.
        let visits: Vec<u32> = (0..64).rev().map(|b| b + 1).collect();
        let t = Tiles {
            run: visits.clone(),
            keys: visits.iter().map(|t| 64 * t).collect(),
            visits,
        };
        let s = choose(&t, 4);
        assert_eq!(s.len(), 4);
        let n: f64 = s.iter().map(|x| x.1).sum();
        let tiles: f64 = s
            .iter()
            .map(|x| x.1 * f64::from(t.visits[x.0 as usize]))
            .sum();
        assert!((n - 64.0).abs() < 1e-9 && (tiles - t.total() as f64).abs() < 1e-6);
        // The lightest: blocks 0..3, at the end of the grid.
        assert!(s.iter().all(|x| x.0 >= 60), "{s:?}");
        // Equal work: one workgroup stands for all.
        let t = Tiles {
            visits: vec![3; 10],
            run: vec![3; 10],
            keys: vec![192; 10],
        };
        let s = choose(&t, 4);
        assert!(s.len() == 1 && (s[0].1 - 10.0).abs() < 1e-9, "{s:?}");
    }
}
