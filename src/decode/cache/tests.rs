//! The cache's layout: rows over several texture lines, and thread counts of the merge.

use super::*;
use crate::decode::Decoder;
use ndarray::{s, Array4};

#[test]
fn lines_hold_whole_rows_aligned_for_copies() {
    let l = Lines::new("K", 1000, 16, 16, 16384).unwrap();
    assert_eq!((l.per_line, l.lines), (1008, 1));
    let l = Lines::new("K", 100_000, 16, 16, 16384).unwrap();
    assert_eq!((l.per_line, l.lines), (1024, 98));
    // f16 texels: 32 rows per line at least, wider than 64 texels of 3.
    assert!(Lines::new("K", 5, 3, 8, 64).is_err());
    assert!(Lines::new("K", 100_000, 16, 16, 64).is_err());
}

#[test]
fn rows_over_several_texture_lines_decode_as_on_one() {
    // Lines of 32 rows: appends that start and end inside lines, and one that copies two
    // whole lines at once.
    let ctx = crate::context::test_context();
    let spec = KvCacheSpec {
        capacity: 100,
        batch: 1,
        kv_heads: 2,
        d_k: 6,
        d_v: 5,
        dtype: Dtype::F32,
    };
    let f = |salt: usize| {
        move |(a, b, c, d): (usize, usize, usize, usize)| {
            (((a * 31 + b * 17 + c * 7 + d) * (salt + 2)) as f32 * 0.013).sin()
        }
    };
    let q = Array4::from_shape_fn((1, 4, 100, 6), f(1));
    let k = Array4::from_shape_fn((1, 2, 100, 6), f(2));
    let v = Array4::from_shape_fn((1, 2, 100, 5), f(3));
    let mut narrow = KvCache::with_side_limit(ctx, spec, 64).unwrap();
    assert_eq!((narrow.k.lines.per_line, narrow.k.lines.lines), (32, 7));
    let mut wide = KvCache::new(ctx, spec).unwrap();
    let dec = Decoder::new().nan_fill(true);
    let mut at = 0;
    for m in [3, 70, 1, 26] {
        let r = s![.., .., at..at + m, ..];
        narrow.append(ctx, k.slice(r), v.slice(r)).unwrap();
        wide.append(ctx, k.slice(r), v.slice(r)).unwrap();
        let a = dec.step(ctx, &narrow, q.slice(r)).unwrap();
        let b = dec.step(ctx, &wide, q.slice(r)).unwrap();
        assert_eq!(a, b, "after {m} more");
        at += m;
    }
}

#[test]
fn every_thread_count_merges_to_the_same_result() {
    // A GPU runs 64 threads per workgroup, lavapipe one subgroup: the merge must not
    // depend on it (nor on a count that is not a power of two).
    let ctx = crate::context::test_context();
    let spec = KvCacheSpec {
        capacity: 300,
        batch: 2,
        kv_heads: 2,
        d_k: 6,
        d_v: 9,
        dtype: Dtype::F32,
    };
    let f = |salt: usize| {
        move |(a, b, c, d): (usize, usize, usize, usize)| {
            (((a * 31 + b * 17 + c * 7 + d) * (salt + 2)) as f32 * 0.013).sin() * 2.0
        }
    };
    let q = Array4::from_shape_fn((2, 6, 300, 6), f(1));
    let k = Array4::from_shape_fn((2, 2, 300, 6), f(2));
    let v = Array4::from_shape_fn((2, 2, 300, 9), f(3));
    let mut cache = KvCache::new(ctx, spec).unwrap();
    cache.append(ctx, k.view(), v.view()).unwrap();
    let op = crate::attention::Attention::new().causal(true);
    let want = crate::reference::run(&op, &crate::Inputs::qkv(&q, &k, &v))
        .unwrap()
        .context;
    for threads in [1, 3, 8, 64] {
        for block in [64, 1024] {
            let dec = Decoder::new().nan_fill(true).threads(threads).block(block);
            let got = dec.step(ctx, &cache, q.view()).unwrap();
            let (rel, _) = crate::reference::compare(&got.into_dyn(), &want);
            assert!(rel < 1e-5, "{threads} threads, blocks of {block}: {rel:e}");
        }
    }
}

#[test]
fn staging_pieces_cover_every_row_once_within_the_limit() {
    // Two heads of 5 tokens each, the second wrapped (rolling): source rows 0..10.
    let placements = vec![(0, 20..25), (5, 47..50), (8, 40..42)];
    for max_rows in [1, 3, 4, 10, 100] {
        let pieces = staging_pieces(&placements, 10, max_rows);
        let mut dest = Vec::new();
        let mut next = 0;
        for (src, copies) in &pieces {
            assert_eq!(src.start, next);
            assert!(src.len() <= max_rows && !src.is_empty());
            next = src.end;
            for (at, rows) in copies {
                assert!(at + rows.len() <= src.len());
                // The source row of each cache row, as the whole placements say.
                for (i, r) in rows.clone().enumerate() {
                    let s = src.start + at + i;
                    let (p0, pr) = placements
                        .iter()
                        .find(|(p0, pr)| (*p0..p0 + pr.len()).contains(&s))
                        .unwrap();
                    assert_eq!(r, pr.start + s - p0);
                    dest.push(r);
                }
            }
        }
        assert_eq!(next, 10);
        dest.sort_unstable();
        let mut want: Vec<usize> = placements.iter().flat_map(|p| p.1.clone()).collect();
        want.sort_unstable();
        assert_eq!(dest, want, "max {max_rows}");
    }
}
