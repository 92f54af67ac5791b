//! Small kernels with one defect planted each: the sanitizer reports it with its kind and
//! line; the same kernels without the defect report nothing and compute the right answer.

use wgsl_sanitizer::{Dispatch, FindingKind, Report, Resource, Shader};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The 1-based line of the first line of `src` containing `marker`.
fn line_of(src: &str, marker: &str) -> u32 {
    src.lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("marker {marker} not in the source")) as u32
        + 1
}

fn run(src: &str, groups: [u32; 3], sg: u32, bufs: &[(u32, Vec<u8>)]) -> (Report, Dispatch) {
    let shader = Shader::parse(src).unwrap_or_else(|e| panic!("{e}"));
    let mut d = Dispatch::new("main", groups);
    d.subgroup_size = sg;
    for (b, bytes) in bufs {
        d.bind(0, *b, Resource::Buffer(bytes.clone()));
    }
    let report = shader.run(&mut d).unwrap_or_else(|e| panic!("{e}"));
    (report, d)
}

fn assert_finding(report: &Report, kind: FindingKind, line: u32) {
    assert!(
        report
            .findings
            .iter()
            .any(|f| f.kind == kind && f.location.map(|l| l.0) == Some(line)),
        "expected {kind:?} at line {line}, found:\n{report}"
    );
}

const REDUCE: &str = "
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
var<workgroup> tile: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    tile[lid] = x[wid.x * 64u + lid];
    workgroupBarrier(); // FIRST
    var step = 32u;
    loop {
        if step == 0u { break; }
        if lid < step {
            tile[lid] = tile[lid] + tile[lid + step]; // SUM
        }
        workgroupBarrier(); // LOOP
        step = step / 2u;
    }
    if lid == 0u {
        out[wid.x] = tile[0]; // OUT
    }
}
";

fn reduce_input(groups: u32) -> Vec<f32> {
    (0..64 * groups).map(|i| (i % 7) as f32 - 2.5).collect()
}

#[test]
fn clean_reduction_reports_nothing_and_sums_right_at_every_subgroup_width() {
    let groups = 3;
    let x = reduce_input(groups);
    for sg in [16, 32, 64] {
        for seed in 0..3 {
            let shader = Shader::parse(REDUCE).unwrap();
            let mut d = Dispatch::new("main", [groups, 1, 1]);
            d.subgroup_size = sg;
            d.seed = seed;
            d.bind(0, 0, Resource::Buffer(f32_bytes(&x)));
            d.bind(0, 1, Resource::Buffer(f32_bytes(&[f32::NAN; 3])));
            let report = shader.run(&mut d).unwrap();
            assert!(report.findings.is_empty(), "{report}");
            let out = f32s(d.buffer(0, 1).unwrap());
            for g in 0..groups as usize {
                let want: f32 = x[g * 64..(g + 1) * 64].iter().sum();
                assert_eq!(out[g], want, "workgroup {g}, {sg} lanes, seed {seed}");
            }
            assert!(report.lane_ops > 0);
        }
    }
}

#[test]
fn removed_barrier_is_a_workgroup_race_at_its_line() {
    for marker in ["// FIRST", "// LOOP"] {
        let src = REDUCE.replace(&format!("workgroupBarrier(); {marker}"), "");
        let x = reduce_input(1);
        let (report, _) = run(
            &src,
            [1, 1, 1],
            32,
            &[(0, f32_bytes(&x)), (1, f32_bytes(&[0.0]))],
        );
        // One side of the race is the tree's read; which side is the later one depends on
        // the subgroups' order.
        let sum = line_of(&src, "// SUM");
        let f = report
            .findings
            .iter()
            .find(|f| {
                f.kind == FindingKind::WorkgroupRace
                    && (f.location.unwrap().0 == sum || f.other_location.unwrap().0 == sum)
            })
            .unwrap_or_else(|| panic!("no race at line {sum}:\n{report}"));
        assert!(f.invocation.is_some() && f.other.is_some(), "{f}");
        assert_ne!(f.invocation, f.other);
    }
}

#[test]
fn race_between_two_lanes_of_one_subgroup_is_found() {
    // Lanes 0 and 1 of one subgroup: lane 1 writes what lane 0 reads, no barrier.
    let src = "
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
var<workgroup> t: array<f32, 32>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) lid: u32) {
    t[lid] = f32(lid);
    workgroupBarrier();
    let v = t[(lid + 1u) % 32u]; // READ
    t[lid] = v * 2.0; // WRITE
    out[lid] = v;
}
";
    let (report, _) = run(src, [1, 1, 1], 32, &[(0, f32_bytes(&[0.0; 32]))]);
    // Lane l writes t[l] while lane l - 1 reads it in the same interval.
    assert!(
        report
            .findings
            .iter()
            .any(|f| f.kind == FindingKind::WorkgroupRace
                && f.invocation.unwrap().subgroup == f.other.unwrap().subgroup),
        "{report}"
    );
}

#[test]
fn index_one_past_the_end_is_out_of_bounds_at_its_line() {
    let src = "
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
var<workgroup> tile: array<f32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32) {
    tile[lid] = x[lid + 1u]; // PAST
    workgroupBarrier();
    out[lid] = tile[min(lid + 1u, 64u)]; // TILE
}
";
    let (report, d) = run(
        src,
        [1, 1, 1],
        32,
        &[(0, f32_bytes(&[1.0; 64])), (1, f32_bytes(&[9.0; 64]))],
    );
    assert_finding(&report, FindingKind::OutOfBounds, line_of(src, "// PAST"));
    assert_finding(&report, FindingKind::OutOfBounds, line_of(src, "// TILE"));
    // Not clamped: the access past the end reads zero.
    let out = f32s(d.buffer(0, 1).unwrap());
    assert_eq!(out[63], 0.0);
    assert_eq!(out[0], 1.0);
}

#[test]
fn store_past_the_end_of_a_buffer_is_dropped_and_reported() {
    let src = "
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(16)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    out[g.x + 1u] = g.x; // STORE
}
";
    let (report, d) = run(src, [1, 1, 1], 16, &[(0, vec![0xff; 64])]);
    assert_finding(&report, FindingKind::OutOfBounds, line_of(src, "// STORE"));
    assert_eq!(d.buffer(0, 0).unwrap().len(), 64);
    assert_eq!(report.errors().count(), 1, "{report}");
}

#[test]
fn barrier_inside_a_divergent_branch_is_reported() {
    let src = "
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
var<workgroup> t: array<u32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32) {
    t[lid] = lid;
    if lid < 16u {
        workgroupBarrier(); // DIVERGENT
    }
    out[lid] = lid;
}
";
    match Shader::parse(src) {
        // naga's uniformity analysis may reject it statically; that is a finding too.
        Err(e) => panic!("naga rejected the kernel: {e}"),
        Ok(_) => {
            let (report, _) = run(src, [1, 1, 1], 32, &[(0, vec![0; 256])]);
            assert_finding(
                &report,
                FindingKind::DivergentBarrier,
                line_of(src, "// DIVERGENT"),
            );
        }
    }
}

#[test]
fn read_of_unwritten_workgroup_memory_is_reported() {
    let src = "
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
var<workgroup> t: array<f32, 64>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) lid: u32) {
    t[lid] = 1.0;
    workgroupBarrier();
    out[lid] = t[lid + 32u]; // UNWRITTEN
}
";
    let (report, _) = run(src, [1, 1, 1], 32, &[(0, f32_bytes(&[0.0; 32]))]);
    assert_finding(
        &report,
        FindingKind::UninitializedRead,
        line_of(src, "// UNWRITTEN"),
    );
    assert_eq!(report.errors().count(), 1, "{report}");
}

#[test]
fn shuffle_from_an_inactive_lane_is_reported() {
    let src = "
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(32)
fn main(@builtin(subgroup_invocation_id) lane: u32) {
    var v = f32(lane);
    if lane < 16u {
        v = subgroupShuffle(v, lane + 16u); // SHUFFLE
    }
    out[lane] = v;
}
";
    let (report, _) = run(src, [1, 1, 1], 32, &[(0, f32_bytes(&[0.0; 32]))]);
    assert_finding(
        &report,
        FindingKind::InactiveLaneRead,
        line_of(src, "// SHUFFLE"),
    );
    // The same shuffle with every lane active is fine.
    let clean = src
        .replace("if lane < 16u {", "if true {")
        .replace("lane + 16u", "(lane + 16u) % 32u");
    let (report, d) = run(&clean, [1, 1, 1], 32, &[(0, f32_bytes(&[0.0; 32]))]);
    assert!(report.findings.is_empty(), "{report}");
    let out = f32s(d.buffer(0, 0).unwrap());
    assert_eq!(out[0], 16.0);
    assert_eq!(out[31], 15.0);
}

#[test]
fn two_workgroups_writing_one_element_is_a_storage_race() {
    let src = "
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(8)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    if lid == 0u {
        out[0] = wid.x; // SAME
    }
    out[1u + wid.x * 8u + lid] = lid;
}
";
    let (report, _) = run(src, [2, 1, 1], 16, &[(0, vec![0; 4 * 17])]);
    assert_finding(&report, FindingKind::StorageRace, line_of(src, "// SAME"));
    let f = report
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::StorageRace)
        .unwrap();
    assert_ne!(f.invocation.unwrap().workgroup, f.other.unwrap().workgroup);
    assert_eq!(report.errors().count(), 1, "{report}");
}

#[test]
fn subgroup_builtins_compute_over_active_lanes() {
    let src = "
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(subgroup_invocation_id) lane: u32,
        @builtin(subgroup_size) size: u32, @builtin(subgroup_id) sid: u32) {
    let sum = subgroupAdd(lane);
    let mx = subgroupMax(lid);
    let x = subgroupShuffleXor(lane, 1u);
    let b = subgroupBroadcast(lid, 3u);
    var odd = 0u;
    if (lane & 1u) == 1u {
        odd = subgroupAdd(1u);
    }
    let ballot = subgroupBallot(lane < 4u);
    out[lid * 6u] = sum;
    out[lid * 6u + 1u] = mx;
    out[lid * 6u + 2u] = x;
    out[lid * 6u + 3u] = b;
    out[lid * 6u + 4u] = odd;
    out[lid * 6u + 5u] = ballot.x + size * 1000u + sid * 100000u;
}
";
    for sg in [16u32, 32, 64] {
        let (report, d) = run(src, [1, 1, 1], sg, &[(0, vec![0; 4 * 6 * 64])]);
        assert!(report.findings.is_empty(), "{report}");
        let out: Vec<u32> = d
            .buffer(0, 0)
            .unwrap()
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        for lid in 0..64u32 {
            let (sid, lane) = (lid / sg, lid % sg);
            let o = &out[lid as usize * 6..lid as usize * 6 + 6];
            assert_eq!(o[0], sg * (sg - 1) / 2);
            assert_eq!(o[1], sid * sg + sg - 1);
            assert_eq!(o[2], lane ^ 1);
            assert_eq!(o[3], sid * sg + 3);
            assert_eq!(o[4], if lane & 1 == 1 { sg / 2 } else { 0 });
            assert_eq!(o[5], 0b1111 + sg * 1000 + sid * 100000);
        }
    }
}

#[test]
fn f16_rounds_after_every_operation() {
    let src = "
enable f16;
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(1)
fn main() {
    var acc = 1.0h;
    for (var i = 0u; i < 100u; i++) {
        acc = acc + 0.0002h; // under half an ulp of 1.0 in f16 (0.000488)
    }
    out[0] = f32(acc);
    out[1] = f32(fma(2049.0h, 1.0h, 0.0h));
}
";
    let (report, d) = run(src, [1, 1, 1], 32, &[(0, f32_bytes(&[0.0; 2]))]);
    assert!(report.findings.is_empty(), "{report}");
    let out = f32s(d.buffer(0, 0).unwrap());
    assert_eq!(out[0], 1.0);
    assert_eq!(out[1], 2048.0);
}

#[test]
fn nan_from_finite_operands_is_a_warning_and_passed_through_nan_is_not() {
    let src = "
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@compute @workgroup_size(1)
fn main() {
    let a = x[0] / x[1]; // DIV
    let b = x[2] + 1.0;
    x[3] = a;
    x[4] = b;
}
";
    let (report, _) = run(
        src,
        [1, 1, 1],
        32,
        &[(0, f32_bytes(&[0.0, 0.0, f32::NAN, 0.0, 0.0]))],
    );
    assert_finding(&report, FindingKind::NonFinite, line_of(src, "// DIV"));
    assert_eq!(report.findings.len(), 1, "{report}");
    assert_eq!(report.errors().count(), 0);
}

#[test]
fn unsupported_things_are_errors_that_name_them() {
    let src = "
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@compute @workgroup_size(1)
fn main() {
    x[0] = determinant(mat2x2<f32>(x[1], x[2], x[3], x[4]));
}
";
    let shader = Shader::parse(src).unwrap();
    let err = shader.check_supported("main").unwrap_err().to_string();
    assert!(err.contains("Determinant"), "{err}");
}

#[test]
fn cooperative_matrices_multiply_16x16_f16_into_f32() {
    let src = "
enable f16;
enable wgpu_cooperative_matrix;
@group(0) @binding(0) var<storage, read> a: array<f16>;
@group(0) @binding(1) var<storage, read> b: array<f16>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
var<workgroup> at: array<f16, 256>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) lid: u32) {
    for (var i = lid; i < 256u; i += 32u) {
        at[i] = a[i];
    }
    workgroupBarrier();
    let ma = coopLoadT<coop_mat16x16<f16, A>>(&at[0], 16u);
    let mb = coopLoadT<coop_mat16x16<f16, B>>(&b[0], 16u);
    var acc = coop_mat16x16<f32, C>();
    acc = coopMultiplyAdd(ma, mb, acc);
    coopStoreT(acc, &c[0], 16u);
}
";
    let h = |x: f32| half::f16::from_f32(x);
    let a: Vec<half::f16> = (0..256)
        .map(|i| h(((i * 7) % 13) as f32 / 8.0 - 0.75))
        .collect();
    let b: Vec<half::f16> = (0..256)
        .map(|i| h(((i * 5) % 11) as f32 / 4.0 - 1.25))
        .collect();
    let bytes = |v: &[half::f16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (report, d) = run(
        src,
        [1, 1, 1],
        32,
        &[
            (0, bytes(&a)),
            (1, bytes(&b)),
            (2, f32_bytes(&[f32::NAN; 256])),
        ],
    );
    assert!(report.findings.is_empty(), "{report}");
    let c = f32s(d.buffer(0, 2).unwrap());
    for i in 0..16 {
        for j in 0..16 {
            let want: f32 = (0..16)
                .map(|k| a[i * 16 + k].to_f32() * b[k * 16 + j].to_f32())
                .sum();
            assert_eq!(c[i * 16 + j], want, "c[{i}][{j}]");
        }
    }
}
