mod vmm;
use naga::back::spv;
use naga::valid::{Capabilities, ShaderStages, SubgroupOperationSet, ValidationFlags};
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let src = std::fs::read_to_string(&args[1]).unwrap();
    let out = &args[2];
    // optional: "restrict" (default) or "unchecked"
    let policy = match args.get(3).map(|s| s.as_str()) {
        Some("unchecked") => naga::proc::BoundsCheckPolicy::Unchecked,
        _ => naga::proc::BoundsCheckPolicy::Restrict,
    };
    let module = match naga::front::wgsl::parse_str(&src) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("{}", e.emit_to_string(&src));
            std::process::exit(1)
        }
    };
    let caps =
        Capabilities::SHADER_FLOAT16 | Capabilities::SUBGROUP | Capabilities::COOPERATIVE_MATRIX;
    let info = naga::valid::Validator::new(ValidationFlags::all(), caps)
        .subgroup_stages(ShaderStages::all())
        .subgroup_operations(SubgroupOperationSet::all())
        .validate(&module)
        .unwrap_or_else(|e| {
            eprintln!("{}", e.emit_to_string(&src));
            std::process::exit(1)
        });
    use spv::Capability as C;
    // as wgpu-hal 30 vulkan/adapter.rs with SHADER_F16, SUBGROUP, COOPERATIVE_MATRIX
    let capabilities: naga::FastHashSet<C> = [
        C::Shader,
        C::Matrix,
        C::Sampled1D,
        C::Image1D,
        C::ImageQuery,
        C::DerivativeControl,
        C::SampledCubeArray,
        C::SampleRateShading,
        C::StorageImageExtendedFormats,
        C::Float16,
        C::StorageBuffer16BitAccess,
        C::UniformAndStorageBuffer16BitAccess,
        C::StorageInputOutput16,
        C::GroupNonUniform,
        C::GroupNonUniformVote,
        C::GroupNonUniformArithmetic,
        C::GroupNonUniformBallot,
        C::GroupNonUniformShuffle,
        C::GroupNonUniformShuffleRelative,
        C::GroupNonUniformQuad,
        C::CooperativeMatrixKHR,
        C::VulkanMemoryModel,
        C::Float64,
        C::Int64,
    ]
    .into_iter()
    .collect();
    let mut opts = spv::Options::default();
    opts.lang_version = (1, 6);
    opts.flags = spv::WriterFlags::DEBUG
        | spv::WriterFlags::LABEL_VARYINGS
        | spv::WriterFlags::FORCE_POINT_SIZE;
    opts.capabilities = Some(capabilities);
    opts.bounds_check_policies = naga::proc::BoundsCheckPolicies {
        index: policy,
        buffer: policy,
        image_load: policy,
        binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
    };
    opts.zero_initialize_workgroup_memory = spv::ZeroInitializeWorkgroupMemoryMode::Native;
    opts.force_loop_bounding = true;
    opts.use_storage_input_output_16 = true;
    let pipe = spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    let words = spv::write_vec(&module, &info, &opts, Some(&pipe)).unwrap_or_else(|e| {
        eprintln!("spv: {e}");
        std::process::exit(1)
    });
    let words = if std::env::var("VMM_PATCH").is_ok() {
        let (w, n) = vmm::patch(&words);
        eprintln!("vmm patch: {n} accesses");
        w
    } else {
        words
    };
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    std::fs::write(out, bytes).unwrap();
}
