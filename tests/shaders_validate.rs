//! Every WGSL kernel parses and validates with naga, without a GPU.

use wgpu_attention::gpu::pipeline::KernelId;

#[test]
fn every_shader_parses_and_validates_with_naga() {
    for id in KernelId::ALL {
        let module = naga::front::wgsl::parse_str(id.source())
            .unwrap_or_else(|e| panic!("{}: {}", id.file_name(), e.emit_to_string(id.source())));
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::empty(),
        )
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
