//! Block sparsity of the mask presets, on the host: for a block of query rows × keys, whether
//! a preset leaves no pair visible, every pair, or some, from its definition (a window's
//! distances, a prefix, the documents' ids) in O(1) or O(ids) per block, instead of the
//! O(rows · keys) evaluations that a caller's own `mask_mod` needs on the device
//! (`shaders/block_map.wgsl`). The result has that kernel's layout.
//!
//! Each preset's cover of a rectangle is exact; several masks (causal included) are and-ed
//! block by block, which is exact where one of them is empty or all are full and otherwise
//! says partial: safe (a partial block is evaluated pair by pair), at worst a little slower.

use std::ops::Range;

use super::{Modifiers, Preset, Role};

/// Which pairs of a block are visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cover {
    Empty = 0,
    Full = 1,
    Partial = 2,
}

impl Cover {
    fn of(any: bool, all: bool) -> Self {
        match (any, all) {
            (false, _) => Cover::Empty,
            (true, true) => Cover::Full,
            (true, false) => Cover::Partial,
        }
    }

    fn and(self, other: Cover) -> Self {
        match (self, other) {
            (Cover::Empty, _) | (_, Cover::Empty) => Cover::Empty,
            (Cover::Full, Cover::Full) => Cover::Full,
            _ => Cover::Partial,
        }
    }
}

/// A block map's shape: `rows` × `keys` blocks over `n_q` × `n_kv`, `groups` (batch, head)
/// maps (`gb` batch indices, `gh` heads: 1 along an axis no mask reads).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grid {
    pub rows: usize,
    pub keys: usize,
    pub n_q: usize,
    pub n_kv: usize,
    pub causal: bool,
    pub gb: usize,
    pub gh: usize,
}

/// The sorted distinct values of `ids[range]`.
fn distinct(ids: &[i32], range: Range<usize>) -> Vec<i32> {
    let mut v = ids[range].to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

/// A documents preset's distinct ids per row block and per key block.
type DocBlocks = (Vec<Vec<i32>>, Vec<Vec<i32>>);

/// Whether two sorted lists share a value.
fn meet(a: &[i32], b: &[i32]) -> bool {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => return true,
        }
    }
    false
}

/// Whether `j ≤ q` (causal) holds for some / every pair of the block.
fn causal_cover(q: &Range<usize>, k: &Range<usize>) -> Cover {
    Cover::of(k.start < q.end, k.end - 1 <= q.start)
}

impl Modifiers {
    /// The block map of `grid` as `block_map.wgsl` lays it out (states, then spans), made
    /// on the host: `None` when a caller's own `mask_mod` is present (only evaluating it
    /// tells) or for a part of a split call.
    pub(crate) fn preset_block_map(&self, grid: Grid) -> Option<Vec<u32>> {
        // A part of a split call: its indices are not the presets' (the device's map adds
        // the part's origin where it calls them).
        if self.mask_mod.is_some() || self.origin != [0; 3] {
            return None;
        }
        let masks: Vec<&Preset> = self
            .presets
            .iter()
            .filter(|p| p.role() == Role::Mask)
            .collect();
        let nqb = grid.n_q.div_ceil(grid.rows);
        let nkb = grid.n_kv.div_ceil(grid.keys);
        let groups = grid.gb * grid.gh;
        let rows = |i: usize| i * grid.rows..((i + 1) * grid.rows).min(grid.n_q);
        let keys = |i: usize| i * grid.keys..((i + 1) * grid.keys).min(grid.n_kv);
        let mut states = Vec::with_capacity(groups * nqb * nkb + 2 * groups * nqb);
        let mut spans = Vec::with_capacity(2 * groups * nqb);
        for g in 0..groups {
            let b = g / grid.gh;
            // Per preset of documents: each block's distinct ids (rows, keys) in batch b.
            let docs: Vec<Option<DocBlocks>> = masks
                .iter()
                .map(|p| match p {
                    Preset::Documents { ids, n } => {
                        let row = &ids[b * *n as usize..(b + 1) * *n as usize];
                        Some((
                            (0..nqb).map(|i| distinct(row, rows(i))).collect(),
                            (0..nkb).map(|i| distinct(row, keys(i))).collect(),
                        ))
                    }
                    _ => None,
                })
                .collect();
            for qb in 0..nqb {
                let q = rows(qb);
                let (mut lo, mut hi) = (0, 0);
                for kb in 0..nkb {
                    let k = keys(kb);
                    let mut cover = if grid.causal {
                        causal_cover(&q, &k)
                    } else {
                        Cover::Full
                    };
                    for (p, doc) in masks.iter().zip(&docs) {
                        if cover == Cover::Empty {
                            break;
                        }
                        cover = cover.and(preset_cover(p, doc.as_ref(), (qb, kb), &q, &k));
                    }
                    if cover != Cover::Empty {
                        if hi == 0 {
                            lo = kb;
                        }
                        hi = kb + 1;
                    }
                    states.push(cover as u32);
                }
                spans.push((lo * grid.keys) as u32);
                spans.push((hi * grid.keys) as u32);
            }
        }
        states.extend(spans);
        Some(states)
    }
}

impl Modifiers {
    /// The fraction of a `batch × n_q × n_kv` call's blocks of 64 query rows × 64 keys that
    /// the mask presets (with `causal`) leave to visit, from their host block map: what a
    /// block-sparse call's fused kernel does of dense attention's work. `None` where the host
    /// cannot tell (a caller's `mask_mod`, a part of a split call) or with no mask modifier.
    pub(crate) fn preset_density(
        &self,
        batch: usize,
        (n_q, n_kv): (usize, usize),
        causal: bool,
    ) -> Option<f64> {
        if !self.presets.iter().any(|p| p.role() == Role::Mask) || n_q == 0 || n_kv == 0 {
            return None;
        }
        let by_batch = self
            .presets
            .iter()
            .any(|p| matches!(p, Preset::Documents { .. }));
        let grid = Grid {
            rows: 64,
            keys: 64,
            n_q,
            n_kv,
            causal,
            gb: if by_batch { batch.max(1) } else { 1 },
            gh: 1,
        };
        let blocks = grid.gb * n_q.div_ceil(64) * n_kv.div_ceil(64);
        let map = self.preset_block_map(grid)?;
        let visited = map[..blocks].iter().filter(|&&state| state != 0).count();
        Some(visited as f64 / blocks as f64)
    }
}

/// One mask preset's cover of rows `q` × keys `k` (block `(qb, kb)`; `docs`: the distinct
/// ids per row block and per key block for documents).
fn preset_cover(
    p: &Preset,
    docs: Option<&DocBlocks>,
    (qb, kb): (usize, usize),
    q: &Range<usize>,
    k: &Range<usize>,
) -> Cover {
    let (q0, q1, k0, k1) = (
        q.start as i64,
        q.end as i64 - 1,
        k.start as i64,
        k.end as i64 - 1,
    );
    match p {
        // j − i over the rectangle takes every value from k0 − q1 to k1 − q0.
        Preset::Window { left, right } => {
            let (lo, hi) = (-i64::from(*left), i64::from(*right));
            let (dmin, dmax) = (k0 - q1, k1 - q0);
            Cover::of(dmax >= lo && dmin <= hi, dmin >= lo && dmax <= hi)
        }
        // j < p or j ≤ i.
        Preset::PrefixLm(p) => {
            let p = i64::from(*p);
            Cover::of(k0 < p || k0 <= q1, k1 < p || k1 <= q0)
        }
        Preset::Documents { .. } => match docs {
            Some((row_ids, key_ids)) => {
                let (r, c) = (&row_ids[qb], &key_ids[kb]);
                Cover::of(meet(r, c), r.len() == 1 && r == c)
            }
            None => Cover::Partial,
        },
        // Score presets mask nothing.
        Preset::Softcap(_) | Preset::Alibi(_) | Preset::RelativeBias { .. } => Cover::Full,
    }
}
