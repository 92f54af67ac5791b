//! The counters see planted inefficiencies: a transposed (strided) global load touches a
//! sector per lane, a workgroup stride of 32 words puts every lane on one bank, a padded
//! stride spreads them; FLOPs, barriers and atomics are counted per lane; a sampled
//! dispatch estimates the whole; texels read side by side fill sectors, a row per lane does not.

use wgsl_sanitizer::{Counters, Dispatch, Resource, Sample, Shader, TexelFormat, Texture};

/// Runs `main` of `src` over `groups` workgroups with counters on, binding `buffers` (bytes)
/// at group 0, bindings 0, 1, …
fn count(src: &str, groups: u32, buffers: &[usize], sample: Sample) -> Counters {
    let shader = Shader::parse(src).unwrap();
    let mut d = Dispatch::new("main", [groups, 1, 1]);
    d.counters = true;
    d.sample = sample;
    d.zero_workgroup_memory = true;
    for (i, b) in buffers.iter().enumerate() {
        d.bind(0, i as u32, Resource::Buffer(vec![0; *b]));
    }
    let report = shader.run(&mut d).unwrap();
    assert_eq!(report.errors().count(), 0, "{report}");
    report.counters.unwrap()
}

const COPY: &str = "
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> o: array<f32>;
@compute @workgroup_size(32)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    o[g.x] = a[g.x * STRIDE];
}";

#[test]
fn a_coalesced_load_uses_whole_sectors_and_a_transposed_one_an_eighth() {
    let run = |stride: u32| {
        let src = COPY.replace("STRIDE", &format!("{stride}u"));
        count(&src, 2, &[4 * 64 * 64, 4 * 64], Sample::All)
    };
    let c = run(1);
    let a = c.by_binding[&(0, 0)];
    assert_eq!((a.loads, a.bytes_read, a.sectors_read), (2, 256, 8));
    assert_eq!(a.sector_efficiency(), 1.0);
    assert_eq!(c.global.stores, 2);
    assert_eq!(c.global.sector_efficiency(), 1.0);
    let c = run(64);
    let a = c.by_binding[&(0, 0)];
    assert_eq!((a.loads, a.bytes_read, a.sectors_read), (2, 256, 64));
    assert_eq!(a.sector_efficiency(), 0.125);
    // The store stays coalesced: the whole is in between.
    let e = c.global.sector_efficiency();
    assert!(e > 0.125 && e < 0.5, "{e}");
    assert_eq!(c.global_intervals, 2);
}

const BANKS: &str = "
var<workgroup> s: array<f32, 2048>;
@group(0) @binding(0) var<storage, read_write> o: array<f32>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) i: u32) {
    s[i * STRIDE] = f32(i);
    workgroupBarrier();
    o[i] = s[i * STRIDE] + s[0];
}";

#[test]
fn a_stride_of_32_words_conflicts_32_ways_and_a_padded_one_none() {
    let run = |stride: u32| {
        let src = BANKS.replace("STRIDE", &format!("{stride}u"));
        count(&src, 1, &[4 * 32], Sample::All)
    };
    let c = run(32);
    // Store and load at stride 32: every lane on bank 0; s[0] is a broadcast.
    assert_eq!(c.shared_accesses, 3);
    assert_eq!(c.shared_max_ways, 32);
    assert_eq!((c.shared_wavefronts, c.shared_ideal), (32 + 32 + 1, 3));
    let c = run(33);
    assert_eq!(c.shared_max_ways, 1);
    assert_eq!(c.shared_ways(), 1.0);
    assert_eq!(c.barriers, 1);
    assert_eq!(c.per_lane(c.barriers), 1.0 / 32.0);
}

#[test]
fn a_vec4_per_lane_on_a_padded_row_takes_its_four_wavefronts_only() {
    let src = "
var<workgroup> s: array<vec4<f32>, 1024>;
@group(0) @binding(0) var<storage, read_write> o: array<vec4<f32>>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) i: u32) {
    s[i * STRIDE] = vec4(f32(i));
    workgroupBarrier();
    o[i] = s[i * STRIDE];
}";
    let run = |stride: u32| {
        count(
            &src.replace("STRIDE", &format!("{stride}u")),
            1,
            &[16 * 32],
            Sample::All,
        )
    };
    let c = run(9); // rows of 8 vec4s padded by one: 36 words apart
    assert_eq!((c.shared_wavefronts, c.shared_ideal), (8, 8));
    let c = run(8); // unpadded: every lane's vec4 on banks 0-3
    assert_eq!(c.shared_max_ways, 8);
    // A vec4 store of 32 lanes: 512 bytes, 16 sectors.
    assert_eq!(c.global.sectors_written, 16);
    assert_eq!(c.global.sector_efficiency(), 1.0);
}

#[test]
fn flops_special_functions_and_atomics_are_counted_per_lane() {
    let src = "
@group(0) @binding(0) var<storage, read_write> o: array<f32>;
@group(0) @binding(1) var<storage, read_write> n: atomic<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let x = f32(g.x);
    var acc = 0.0;
    for (var k = 0u; k < 4u; k++) {
        acc = fma(x, acc, 1.0) + exp2(x) * 0.5;
    }
    o[g.x] = acc + dot(vec4(x), vec4(acc));
    atomicAdd(&n, 1u);
}";
    let c = count(src, 2, &[4 * 128, 4], Sample::All);
    // Per lane: 4 × (fma 2 + add 1 + mul 1) + add 1 + dot 8 = 25.
    assert_eq!(c.flops_f32, 25 * 128);
    assert_eq!(c.special, 4 * 128);
    assert_eq!(c.atomics, 128);
    assert_eq!(c.invocations, 128);
    assert_eq!(c.subgroups, 4);
    assert!(c.instructions > 4 * 10 && c.lane_instructions == 32 * c.instructions);
}

#[test]
fn a_sample_of_a_large_dispatch_estimates_the_whole() {
    let src = COPY.replace("STRIDE", "1u");
    let groups = 4000;
    let whole = count(&src, groups, &[4 * 32 * 4000, 4 * 32 * 4000], Sample::All);
    let part = count(
        &src,
        groups,
        &[4 * 32 * 4000, 4 * 32 * 4000],
        Sample::Workgroups(12),
    );
    assert_eq!(whole.workgroups_counted, 4000);
    assert!(part.workgroups_counted <= 13, "{}", part.workgroups_counted);
    assert_eq!(part.workgroups, 4000);
    assert_eq!(part.global, whole.global);
    assert_eq!(part.instructions, whole.instructions);
}

#[test]
fn a_load_in_each_loop_iteration_waits_each_time() {
    // One subgroup sums 8 loads: in a loop, each iteration's load waits; written out in one
    // interval, they overlap (one wait).
    let sum = |body: &str| {
        format!(
            "@group(0) @binding(0) var<storage, read> a: array<f32>;
             @group(0) @binding(1) var<storage, read_write> o: array<f32>;
             @compute @workgroup_size(32)
             fn main(@builtin(local_invocation_index) i: u32) {{ {body} }}"
        )
    };
    let looped =
        sum("var s = 0.0; for (var k = 0u; k < 8u; k++) { s += a[k * 32u + i]; } o[i] = s;");
    let flat = sum("o[i] = a[i] + a[32u + i] + a[64u + i] + a[96u + i];");
    let c = count(&looped, 1, &[4 * 256, 4 * 32], Sample::All);
    assert_eq!((c.load_waits, c.global_intervals), (8, 1));
    let c = count(&flat, 1, &[4 * 256, 4 * 32], Sample::All);
    assert_eq!((c.load_waits, c.global_intervals), (1, 1));
}

/// A cooperative matrix is the subgroup's together: a 16 × 16 load, multiply-add and store
/// each count n / (4 w) warp instructions (2 at 32 lanes: a lane moves or multiplies its 8
/// elements 4 at a time, as one 16-byte access or two mma.m16n8k16 on NVIDIA), not one per
/// element (256), while the FLOPs stay the product's.
#[test]
fn a_cooperative_multiply_add_is_a_few_instructions_not_one_per_element() {
    let src = "
enable wgpu_cooperative_matrix;
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> o: array<f32>;
@compute @workgroup_size(32)
fn main() {
    let x = coopLoad<coop_mat16x16<f32, A>>(&a[0], 16u);
    let y = coopLoad<coop_mat16x16<f32, B>>(&a[0], 16u);
    var c = coopLoad<coop_mat16x16<f32, C>>(&a[0], 16u);
    c = coopMultiplyAdd(x, y, c);
    coopStore(c, &o[0], 16u);
}";
    let c = count(src, 1, &[1024, 1024], Sample::All);
    assert_eq!(c.coop_flops, 2 * 16 * 16 * 16);
    let per_lane = c.lane_instructions as f64 / c.invocations as f64;
    assert!(
        per_lane < 24.0,
        "{per_lane} instructions a lane (256 a matrix would be one per element)"
    );
}

const TEXELS: &str = "
@group(0) @binding(0) var t: texture_2d<f32>;
@group(0) @binding(1) var<storage, read_write> o: array<vec4<f32>>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) i: u32) {
    o[i] = textureLoad(t, vec2<i32>(i32(i * STRIDE), 0), 0);
}";

#[test]
fn texels_side_by_side_use_whole_sectors_and_a_key_per_lane_does_not() {
    let run = |stride: u32, format: TexelFormat| {
        let src = TEXELS.replace("STRIDE", &format!("{stride}u"));
        let shader = Shader::parse(&src).unwrap();
        let mut d = Dispatch::new("main", [1, 1, 1]);
        d.counters = true;
        let width = 32 * 32;
        d.bind(
            0,
            0,
            Resource::Texture(Texture {
                width,
                height: 1,
                format,
                data: vec![0; width as usize * format.bytes()],
            }),
        );
        d.bind(0, 1, Resource::Buffer(vec![0; 16 * 32]));
        let report = shader.run(&mut d).unwrap();
        assert_eq!(report.errors().count(), 0, "{report}");
        report.counters.unwrap()
    };
    // Adjacent texels: 32 × 8 bytes in 8 whole sectors.
    let c = run(1, TexelFormat::Rgba16Float);
    assert_eq!(c.texture_reads, 32);
    let t = c.texture;
    assert_eq!((t.loads, t.bytes_read, t.sectors_read), (1, 256, 8));
    assert_eq!(t.sector_efficiency(), 1.0);
    // Each lane its own key of 32 texels (d 128 in f16): a sector per lane, a quarter used.
    let t = run(32, TexelFormat::Rgba16Float).texture;
    assert_eq!((t.loads, t.bytes_read, t.sectors_read), (1, 256, 32));
    assert_eq!(t.sector_efficiency(), 0.25);
    // The same in f32: half of each sector.
    assert_eq!(
        run(32, TexelFormat::Rgba32Float)
            .texture
            .sector_efficiency(),
        0.5
    );
    // Buffers' traffic is apart from the texture's.
    assert_eq!(run(1, TexelFormat::Rgba16Float).global.loads, 0);
}
