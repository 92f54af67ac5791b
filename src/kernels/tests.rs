//! Every kernel's description against what naga reads in its WGSL, without a GPU: the full
//! source parses and validates (f32 and f16, odd constants), the generated `Params` has the
//! Rust struct's offsets and size, the bindings have the declared names and kinds, and the
//! workgroup size is the declared one.

use super::*;

/// Small odd constants: the shaders must not assume powers of two.
const ODD: u32 = 3;

fn parse(info: &KernelInfo, source: &str) -> naga::Module {
    let module = naga::front::wgsl::parse_str(source)
        .unwrap_or_else(|e| panic!("{}: {}", info.file, e.emit_to_string(source)));
    let mut caps = naga::valid::Capabilities::SHADER_FLOAT16;
    if info.subgroups || info.subgroups_if.is_some() || info.coop {
        caps |= naga::valid::Capabilities::SUBGROUP;
    }
    if info.coop {
        caps |= naga::valid::Capabilities::COOPERATIVE_MATRIX;
    }
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
        .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
        .subgroup_operations(naga::valid::SubgroupOperationSet::all())
        .validate(&module)
        .unwrap_or_else(|e| panic!("{}: {e:?}", info.file));
    module
}

fn odd_constants(info: &KernelInfo) -> Vec<u32> {
    info.constants.iter().map(|_| ODD).collect()
}

#[test]
fn every_kernel_parses_and_validates_with_naga() {
    for id in KernelId::ALL {
        let info = id.info();
        let consts = odd_constants(&info);
        parse(&info, &info.source_with(&consts, 0));
        // Every element type f16, as `--dtype f16` builds them.
        let all_f16 = ((1u32 << info.dtypes.len()) - 1) as u8;
        if all_f16 != 0 {
            parse(&info, &info.source_with(&consts, all_f16));
        }
        // The `// unroll` markers are an optimization: the loops must be valid as written
        // (the `// if` lines kept or dropped as the constants say).
        let named: Vec<(&str, u32)> = info.constants.iter().map(|n| (*n, ODD)).collect();
        let kept = wgsl::drop_disabled(info.source, &named);
        let rolled = wgsl::compose("", info.dtypes, 0, &named, &(info.params)(), true)
            + &kept
            + &crate::gpu::subgroups::native(&kept);
        let rolled = info.with_coop(rolled, &named);
        parse(&info, &mods::with_modifiers(rolled, info.source, 0));
    }
}

#[test]
fn every_kernel_matches_its_description() {
    for id in KernelId::ALL {
        let info = id.info();
        let module = parse(&info, &info.source_with(&odd_constants(&info), 0));
        let entry = module
            .entry_points
            .iter()
            .find(|e| e.name == info.entry)
            .unwrap_or_else(|| panic!("{} has no `{}` entry point", info.file, info.entry));
        let size = info.workgroup.map(|d| match d {
            Dim::Fixed(n) => n,
            Dim::Const(_) => ODD,
        });
        assert_eq!(entry.workgroup_size, size, "{}: workgroup size", info.file);

        let mut globals: Vec<_> = module
            .global_variables
            .iter()
            .filter_map(|(_, g)| Some((g.binding.as_ref()?.binding, g)))
            .collect();
        globals.sort_by_key(|(b, _)| *b);
        assert_eq!(
            globals.len(),
            info.bindings.len() + 1,
            "{}: bindings",
            info.file
        );
        // Binding 0: the uniform, laid out as the Rust struct.
        let (_, params) = globals[0];
        assert_eq!(params.space, naga::AddressSpace::Uniform, "{}", info.file);
        let naga::TypeInner::Struct { members, span } = &module.types[params.ty].inner else {
            panic!("{}: the uniform is not a struct", info.file);
        };
        let wgsl: Vec<(String, usize)> = members
            .iter()
            .map(|m| (m.name.clone().unwrap_or_default(), m.offset as usize))
            .collect();
        let rust: Vec<(String, usize)> = info
            .fields
            .iter()
            .map(|(n, _, o)| (n.to_string(), *o))
            .collect();
        assert_eq!(wgsl, rust, "{}: uniform field offsets", info.file);
        assert_eq!(
            *span as usize, info.params_size,
            "{}: uniform size",
            info.file
        );

        for (slot, (binding, g)) in info.bindings.iter().zip(&globals[1..]) {
            let (name, ok) = match (*slot, g.space, &module.types[g.ty].inner) {
                (Slot::Read(n), naga::AddressSpace::Storage { access }, _) => {
                    (n, !access.contains(naga::StorageAccess::STORE))
                }
                (Slot::ReadWrite(n), naga::AddressSpace::Storage { access }, _) => {
                    (n, access.contains(naga::StorageAccess::STORE))
                }
                (Slot::Texture(n), _, naga::TypeInner::Image { class, .. }) => {
                    (n, matches!(class, naga::ImageClass::Sampled { .. }))
                }
                (Slot::StorageTexture(n), _, naga::TypeInner::Image { class, .. }) => {
                    (n, matches!(class, naga::ImageClass::Storage { .. }))
                }
                (slot, ..) => panic!("{}: binding {binding} is not a {slot:?}", info.file),
            };
            assert!(ok, "{}: binding {binding} is not a {slot:?}", info.file);
            assert_eq!(
                g.name.as_deref(),
                Some(name),
                "{}: binding {binding}",
                info.file
            );
        }
    }
}

#[test]
fn every_shader_file_is_a_registered_kernel() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".wgsl") && !SHARED_WGSL.contains(&n.as_str()))
        .collect();
    on_disk.sort();
    let mut known: Vec<String> = KernelId::ALL
        .iter()
        .map(|k| k.info().file.to_string())
        .collect();
    known.sort();
    assert_eq!(on_disk, known);
}

#[test]
fn pipeline_keys_differ_by_constants_and_types() {
    use flash_tiled::FlashTiledConsts as C;
    let c = C {
        keys: 32,
        dk4: 16,
        dv4: 16,
        mask: 0,
        lse: 0,
    };
    let a = PipelineKey::of::<flash_tiled::Shader>(&c, 0);
    assert_eq!(a, PipelineKey::of::<flash_tiled::Shader>(&c, 0));
    assert_ne!(a, PipelineKey::of::<flash_tiled::Shader>(&c, 3));
    assert_ne!(
        a,
        PipelineKey::of::<flash_tiled::Shader>(&C { mask: 1, ..c }, 0)
    );
    assert!(a.source().contains("const BK: u32 = 32u;"));
}

#[test]
fn grid_covers_count_exactly_or_more() {
    for &(count, max) in &[
        (1u64, 65535u32),
        (65535, 65535),
        (65536, 65535),
        (10_000_000, 65535),
        (3, 2),
    ] {
        let (x, y) = grid(count, max).unwrap();
        assert!(x <= max && y <= max);
        assert!(u64::from(x) * u64::from(y) >= count);
        assert!(u64::from(x) * u64::from(y - 1) < count, "one row too many");
    }
}

#[test]
fn grid_rejects_what_cannot_fit() {
    assert!(matches!(grid(5, 2), Err(Error::LimitExceeded { .. })));
    assert_eq!(grid(0, 65535).unwrap(), (0, 0));
}

#[test]
fn trusted_kernels_and_only_they_say_so_in_their_first_lines() {
    for id in KernelId::ALL {
        let info = id.info();
        let says = info
            .source
            .lines()
            .take(5)
            .any(|l| l.contains(TRUSTED_MARKER.trim_start_matches("// ")));
        assert_eq!(
            says,
            info.trusted,
            "{}: `Kernel::TRUSTED` is {} but its first five lines {} `runtime checks: off`",
            info.file,
            info.trusted,
            if says { "say" } else { "do not say" }
        );
        // The composed source (what `shaders --out` writes) starts with the marker.
        let composed = info.source_with(&odd_constants(&info), 0);
        assert_eq!(
            composed.starts_with(TRUSTED_MARKER),
            info.trusted,
            "{}",
            info.file
        );
    }
}
