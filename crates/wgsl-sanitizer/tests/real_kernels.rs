//! Two of wgpu-attention's kernels as its `shaders --out` writes them (copied into
//! tests/kernels/): the storage matmul and one `flash_blocked` variant, run on small odd sizes
//! and compared with a plain CPU computation. They report nothing, at 16, 32 and 64 lanes;
//! with a barrier removed they report a race at the right line.

use std::time::Instant;

use wgsl_sanitizer::{Dispatch, FindingKind, Resource, Shader};

const MATMUL: &str = include_str!("kernels/matmul-f32.wgsl");
const FLASH: &str = include_str!("kernels/flash-blocked-32x64-d32-f32.wgsl");

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

struct Mm {
    m: usize,
    n: usize,
    k: usize,
}

fn matmul_dispatch(src: &str, mm: &Mm, sg: u32) -> (Dispatch, Vec<f32>, Vec<f32>, f64, u64) {
    let (m, n, k) = (mm.m, mm.n, mm.k);
    let a = values(m * k, 1);
    let b = values(k * n, 2);
    let tiles_m = m.div_ceil(64) as u32;
    let tiles_n = n.div_ceil(64) as u32;
    // Params: m n k heads groups tiles_m tiles_n flags, a_off a_batch a_head a_row a_col,
    // b_off b_batch b_head b_row b_col, c_off c_batch c_head c_row, b_ratio, pad.
    let (m32, n32, k32) = (m as u32, n as u32, k as u32);
    let params = [
        m32, n32, k32, 1, 1, tiles_m, tiles_n, 0, 0, 0, 0, k32, 1, 0, 0, 0, n32, 1, 0, 0, 0, n32,
        1, 0,
    ];
    let shader = Shader::parse(src).unwrap();
    let mut d = Dispatch::new("main", [tiles_m * tiles_n, 1, 1]);
    d.subgroup_size = sg;
    // Three schedules (seeds 0, 1, 2); the report and results are the last one's.
    d.seeds = 3;
    d.bind(0, 0, Resource::Buffer(u32_bytes(&params)));
    d.bind(0, 1, Resource::Buffer(f32_bytes(&a)));
    d.bind(0, 2, Resource::Buffer(f32_bytes(&b)));
    d.bind(0, 3, Resource::Buffer(f32_bytes(&[0.0; 4])));
    d.bind(0, 4, Resource::Buffer(f32_bytes(&vec![f32::NAN; m * n])));
    let t = Instant::now();
    let report = shader.run(&mut d).unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert!(report.findings.is_empty(), "{sg} lanes:\n{report}");
    (d, a, b, secs, report.lane_ops)
}

#[test]
fn storage_matmul_is_clean_and_right_at_16_32_and_64_lanes() {
    let mm = Mm {
        m: 70,
        n: 67,
        k: 37,
    };
    for sg in [16, 32, 64] {
        let (d, a, b, secs, ops) = matmul_dispatch(MATMUL, &mm, sg);
        let c = f32s(d.buffer(0, 4).unwrap());
        for i in 0..mm.m {
            for j in 0..mm.n {
                let want: f64 = (0..mm.k)
                    .map(|kk| a[i * mm.k + kk] as f64 * b[kk * mm.n + j] as f64)
                    .sum();
                let got = c[i * mm.n + j] as f64;
                assert!(
                    (got - want).abs() < 1e-4,
                    "c[{i}][{j}] = {got}, want {want}"
                );
            }
        }
        println!(
            "matmul {}x{}x{} at {sg} lanes: {ops} lane-ops in {secs:.3} s ({:.1} M lane-ops/s)",
            mm.m,
            mm.n,
            mm.k,
            ops as f64 / secs / 1e6
        );
    }
}

#[test]
fn storage_matmul_without_its_staging_barrier_races() {
    // The first barrier after staging the tiles, removed.
    let marker = "workgroupBarrier();";
    let at = MATMUL.find(marker).unwrap();
    let src = format!("{}{}", &MATMUL[..at], &MATMUL[at + marker.len()..]);
    let shader = Shader::parse(&src).unwrap();
    let mm = Mm {
        m: 20,
        n: 20,
        k: 20,
    };
    let (m, n, k) = (mm.m as u32, mm.n as u32, mm.k as u32);
    let params = [
        m, n, k, 1, 1, 1, 1, 0, 0, 0, 0, k, 1, 0, 0, 0, n, 1, 0, 0, 0, n, 1, 0,
    ];
    let mut d = Dispatch::new("main", [1, 1, 1]);
    d.bind(0, 0, Resource::Buffer(u32_bytes(&params)));
    d.bind(0, 1, Resource::Buffer(f32_bytes(&values(400, 1))));
    d.bind(0, 2, Resource::Buffer(f32_bytes(&values(400, 2))));
    d.bind(0, 3, Resource::Buffer(f32_bytes(&[0.0; 4])));
    d.bind(0, 4, Resource::Buffer(f32_bytes(&[0.0; 400])));
    let report = shader.run(&mut d).unwrap();
    assert!(
        report
            .findings
            .iter()
            .any(|f| f.kind == FindingKind::WorkgroupRace),
        "{report}"
    );
}

/// softmax(Q Kᵀ / √d) V in f64, one head, row-major n × d.
fn attention(q: &[f32], k: &[f32], v: &[f32], n: usize, d: usize) -> Vec<f64> {
    let scale = 1.0 / (d as f64).sqrt();
    let mut o = vec![0.0; n * d];
    for i in 0..n {
        let s: Vec<f64> = (0..n)
            .map(|j| {
                (0..d)
                    .map(|c| q[i * d + c] as f64 * k[j * d + c] as f64)
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let mx = s.iter().cloned().fold(f64::MIN, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
        let z: f64 = e.iter().sum();
        for c in 0..d {
            o[i * d + c] = (0..n).map(|j| e[j] / z * v[j * d + c] as f64).sum();
        }
    }
    o
}

fn flash_dispatch(src: &str, n: usize, sg: u32, seed: u64) -> (Dispatch, u64, f64) {
    let d = 32usize;
    let (q, k, v) = (values(n * d, 3), values(n * d, 4), values(n * d, 5));
    let blocks = n.div_ceil(32) as u32;
    let (n32, d32) = (n as u32, d as u32);
    let nd = n32 * d32;
    let scale_log2 = (1.0 / (d as f32).sqrt()) * std::f32::consts::LOG2_E;
    // Params: n_q n_kv heads groups blocks causal dk_h dv_h, q/o/k/v (off batch head row),
    // k_shift k_rows v_shift v_rows, scale_log2, kv_ratio splits split_keys, mask strides.
    let mut params = vec![n32, n32, 1, 1, blocks, 0, d32, d32];
    for _ in 0..4 {
        params.extend([0, nd, nd, d32]);
    }
    params.extend([0, 0, 0, 0, scale_log2.to_bits(), 1, 1, 0, 0, 0, 0, 0]);
    let shader = Shader::parse(src).unwrap();
    let mut dsp = Dispatch::new("main", [blocks, 1, 1]);
    dsp.subgroup_size = sg;
    dsp.seed = seed;
    dsp.bind(0, 0, Resource::Buffer(u32_bytes(&params)));
    dsp.bind(0, 1, Resource::Buffer(f32_bytes(&q)));
    dsp.bind(0, 2, Resource::Buffer(f32_bytes(&k)));
    dsp.bind(0, 3, Resource::Buffer(f32_bytes(&v)));
    dsp.bind(0, 4, Resource::Buffer(f32_bytes(&vec![f32::NAN; n * d])));
    dsp.bind(0, 5, Resource::Buffer(f32_bytes(&[0.0; 4])));
    dsp.bind(0, 6, Resource::Buffer(f32_bytes(&[0.0; 4])));
    let t = Instant::now();
    let report = shader.run(&mut dsp).unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(report.errors().count(), 0, "{sg} lanes:\n{report}");
    let out = f32s(dsp.buffer(0, 4).unwrap());
    let want = attention(&q, &k, &v, n, d);
    for (i, (g, w)) in out.iter().zip(&want).enumerate() {
        assert!(
            (*g as f64 - w).abs() < 1e-5,
            "{sg} lanes: out[{}][{}] = {g}, want {w}",
            i / d,
            i % d
        );
    }
    (dsp, report.lane_ops, secs)
}

#[test]
fn flash_blocked_is_clean_and_right_at_16_32_and_64_lanes() {
    for (sg, seed) in [(16, 1), (32, 2), (64, 3)] {
        let (_, ops, secs) = flash_dispatch(FLASH, 37, sg, seed);
        println!(
            "flash_blocked 32x64 d32, n 37, at {sg} lanes: {ops} lane-ops in {secs:.3} s ({:.1} M lane-ops/s)",
            ops as f64 / secs / 1e6
        );
    }
}

#[test]
fn flash_blocked_without_any_one_of_its_barriers_races() {
    // The lines of the barriers this variant runs (DBUF = 0, SGR = 0); the others sit in
    // branches of constants that are off. Each removed in turn must be found. Line 1259
    // (after a Q/K chunk's products, before the next chunk is staged) is left out: at d 32
    // the chunk loop runs once, and the softmax's own barrier orders the last reads before
    // V is staged, so removing it leaves no race here (wider heads need it).
    let marker = "workgroupBarrier();";
    let lines: Vec<&str> = FLASH.lines().collect();
    assert!(lines[1259 - 1].contains(marker));
    for line in [448, 1549, 1611, 1805, 1817] {
        assert!(lines[line - 1].contains(marker), "line {line}");
        let mut edited = lines.clone();
        let removed = lines[line - 1].replace(marker, "");
        edited[line - 1] = &removed;
        let src = edited.join("\n");
        let shader = Shader::parse(&src).unwrap();
        let mut found = Vec::new();
        for seed in 0..2 {
            let mut d = flash_inputs(100, seed);
            let report = shader.run(&mut d).unwrap();
            found.extend(report.findings.into_iter().filter(|f| {
                matches!(
                    f.kind,
                    FindingKind::WorkgroupRace | FindingKind::UninitializedRead
                )
            }));
        }
        assert!(
            found.iter().any(|f| f.kind == FindingKind::WorkgroupRace),
            "no race with the barrier of line {line} removed"
        );
        println!("barrier of line {line} removed: {}", found[0]);
    }
}

fn flash_inputs(n: usize, seed: u64) -> Dispatch {
    let d = 32usize;
    let blocks = n.div_ceil(32) as u32;
    let (n32, d32) = (n as u32, d as u32);
    let nd = n32 * d32;
    let mut params = vec![n32, n32, 1, 1, blocks, 0, d32, d32];
    for _ in 0..4 {
        params.extend([0, nd, nd, d32]);
    }
    params.extend([0, 0, 0, 0, 0.25f32.to_bits(), 1, 1, 0, 0, 0, 0, 0]);
    let mut dsp = Dispatch::new("main", [blocks, 1, 1]);
    dsp.seed = seed;
    dsp.bind(0, 0, Resource::Buffer(u32_bytes(&params)));
    for (b, s) in [(1, 3), (2, 4), (3, 5)] {
        dsp.bind(0, b, Resource::Buffer(f32_bytes(&values(n * d, s))));
    }
    dsp.bind(0, 4, Resource::Buffer(f32_bytes(&vec![0.0; n * d])));
    dsp.bind(0, 5, Resource::Buffer(f32_bytes(&[0.0; 4])));
    dsp.bind(0, 6, Resource::Buffer(f32_bytes(&[0.0; 4])));
    dsp
}

const COOP: &str = include_str!("kernels/coop-matmul-16-f16-ab.wgsl");

#[test]
fn coop_matmul_16x16_f16_is_clean_and_right_at_16_32_and_64_lanes() {
    let (m, n, k) = (70usize, 67usize, 37usize);
    let h = |v: Vec<f32>| -> Vec<half::f16> { v.into_iter().map(half::f16::from_f32).collect() };
    let (a, b) = (h(values(m * k, 1)), h(values(k * n, 2)));
    let bytes = |v: &[half::f16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (tiles_m, tiles_n) = (m.div_ceil(64) as u32, n.div_ceil(64) as u32);
    let (m32, n32, k32) = (m as u32, n as u32, k as u32);
    let params = [
        m32, n32, k32, 1, 1, tiles_m, tiles_n, 0, 0, 0, 0, k32, 1, 0, 0, 0, n32, 1, 0, 0, 0, n32,
        1, 0,
    ];
    let shader = Shader::parse(COOP).unwrap();
    // 16 lanes: eight subgroups for four blocks, four of them spare (they stored into one
    // shared spare slot, a write-write race, until they stored nothing).
    for sg in [16, 32, 64] {
        let mut d = Dispatch::new("main", [tiles_m * tiles_n, 1, 1]);
        d.subgroup_size = sg;
        d.seeds = 3;
        d.bind(0, 0, Resource::Buffer(u32_bytes(&params)));
        d.bind(0, 1, Resource::Buffer(bytes(&a)));
        d.bind(0, 2, Resource::Buffer(bytes(&b)));
        d.bind(0, 3, Resource::Buffer(vec![0; 8]));
        d.bind(0, 4, Resource::Buffer(f32_bytes(&vec![f32::NAN; m * n])));
        let report = shader.run(&mut d).unwrap();
        assert!(report.findings.is_empty(), "{sg} lanes:\n{report}");
        let c = f32s(d.buffer(0, 4).unwrap());
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|kk| a[i * k + kk].to_f64() * b[kk * n + j].to_f64())
                    .sum();
                let got = c[i * n + j] as f64;
                assert!(
                    (got - want).abs() < 1e-4,
                    "{sg} lanes: c[{i}][{j}] = {got}, want {want}"
                );
            }
        }
    }
}
