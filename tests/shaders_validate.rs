//! Every WGSL kernel parses and validates with naga, without a GPU.

use wgpu_attention::gpu::pipeline::KernelId;

#[test]
fn every_shader_parses_and_validates_with_naga() {
    for id in KernelId::ALL {
        // Small odd constants: the shaders must not assume powers of two.
        let consts: Vec<u32> = id.constants().iter().map(|_| 3).collect();
        validate(id, &id.source_with(&consts, 0));
        // Every element type f16, as `--dtype f16` builds them.
        let all_f16 = ((1u32 << id.element_types().len()) - 1) as u8;
        if all_f16 != 0 {
            validate(id, &id.source_with(&consts, all_f16));
        }
        // The `// unroll` markers are an optimization: the loops must be valid as written.
        let prelude: String = id
            .constants()
            .iter()
            .map(|name| format!("const {name}: u32 = 3u;\n"))
            .chain(
                id.element_types()
                    .iter()
                    .map(|name| format!("alias {name} = f32;\n")),
            )
            .collect();
        validate(id, &(prelude + id.source()));
    }
}

fn validate(id: KernelId, source: &str) {
    {
        let module = naga::front::wgsl::parse_str(source)
            .unwrap_or_else(|e| panic!("{}: {}", id.file_name(), e.emit_to_string(source)));
        let mut caps = naga::valid::Capabilities::SHADER_FLOAT16;
        if id.needs_subgroups() {
            caps |= naga::valid::Capabilities::SUBGROUP;
        }
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
            .subgroup_operations(naga::valid::SubgroupOperationSet::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}: {e:?}", id.file_name()));
        assert!(
            module
                .entry_points
                .iter()
                .any(|e| e.name == KernelId::ENTRY),
            "{} has no `{}` entry point",
            id.file_name(),
            KernelId::ENTRY
        );
    }
}

#[test]
fn every_shader_file_is_a_kernel() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".wgsl"))
        .collect();
    on_disk.sort();
    let mut known: Vec<String> = KernelId::ALL
        .iter()
        .map(|k| k.file_name().to_string())
        .collect();
    known.sort();
    assert_eq!(on_disk, known);
}
