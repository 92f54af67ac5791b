//! The driver process. The main process starts this same binary with [`ARG`] and RADV's
//! environment (a null device of the chosen GPU family, wave32); it opens the device once,
//! builds each job's compute pipeline and reports the compiler's statistics through
//! `VK_KHR_pipeline_executable_properties` (the figures `RADV_DEBUG=shaderstats` prints come
//! from the same query). Records go to stderr, between whatever the driver prints there.

use crate::wgsl::{self, Kernel, Resource, Target};
use crate::wire::{Compiled, Failure, Record, Statistic};
use ash::vk;
use std::ffi::{CStr, CString, OsStr, OsString};
use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The first argument that makes the binary the driver process.
pub const ARG: &str = "--driver-process";

/// One job's argument: `c:PATH` (with wgpu's runtime checks) or `u:PATH` (unchecked).
pub fn job_arg(path: &Path, checked: bool) -> OsString {
    let mut arg = OsString::from(if checked { "c:" } else { "u:" });
    arg.push(path.as_os_str());
    arg
}

/// Runs the driver process on its arguments (after [`ARG`]): `[--entry NAME] JOB...`.
pub fn main(args: Vec<OsString>) -> ExitCode {
    let mut entry = None;
    let mut jobs = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--entry" {
            entry = args.next().and_then(|e| e.into_string().ok());
            continue;
        }
        let bytes = arg.into_vec();
        match bytes.split_at_checked(2) {
            Some((b"c:", path)) => jobs.push((true, PathBuf::from(OsStr::from_bytes(path)))),
            Some((b"u:", path)) => jobs.push((false, PathBuf::from(OsStr::from_bytes(path)))),
            _ => {
                emit(&Record::Fatal(
                    "the driver process got a malformed job".into(),
                ));
                return ExitCode::from(2);
            }
        }
    }

    // SAFETY: the loader is loaded once, and every Vulkan object is destroyed before it.
    let gpu = match unsafe { Gpu::open() } {
        Ok(gpu) => gpu,
        Err(message) => {
            emit(&Record::Fatal(message));
            return ExitCode::from(2);
        }
    };
    emit(&Record::Device(gpu.name.clone()));
    for (i, (checked, path)) in jobs.iter().enumerate() {
        emit(&Record::Start(i));
        emit(&Record::Done(i, gpu.run(path, *checked, entry.as_deref())));
    }
    ExitCode::SUCCESS
}

/// Writes one record, whole, on its own line.
fn emit(record: &Record) {
    let line = format!("{}\n", record.encode());
    // Nothing to do when stderr is gone: the main process sees the missing records.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

fn on(b: vk::Bool32) -> bool {
    b == vk::TRUE
}

struct Gpu {
    // Fields drop after `Drop::drop` has destroyed the device and the instance: the entry
    // keeps the loader library loaded until then.
    instance: ash::Instance,
    device: ash::Device,
    executables: ash::khr::pipeline_executable_properties::Device,
    target: Target,
    /// Whether stages get `ALLOW_VARYING_SUBGROUP_SIZE`, as wgpu gives them where the device
    /// has subgroups and subgroup size control.
    varying_subgroups: bool,
    name: String,
    _entry: ash::Entry,
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: every object made from the device was destroyed after its use.
        unsafe {
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

impl Gpu {
    /// Loads Vulkan and opens RADV's device with the features wgpu enables that change
    /// the code the compiler writes (robustness, workgroup-memory zeroing) or that the
    /// kernels may need (16-bit and 8-bit types, subgroup size control, cooperative matrices).
    unsafe fn open() -> Result<Gpu, String> {
        let entry = ash::Entry::load()
            .map_err(|e| format!("no Vulkan loader ({e}): install mesa-vulkan-drivers"))?;
        let app = vk::ApplicationInfo::default()
            .application_name(c"shader-stats")
            .api_version(vk::API_VERSION_1_3);
        let instance = entry
            .create_instance(
                &vk::InstanceCreateInfo::default().application_info(&app),
                None,
            )
            .map_err(|e| format!("vkCreateInstance failed: {e}"))?;
        match open_device(&instance) {
            Ok((device, target, varying_subgroups, name)) => Ok(Gpu {
                executables: ash::khr::pipeline_executable_properties::Device::new(
                    &instance, &device,
                ),
                instance,
                device,
                target,
                varying_subgroups,
                name,
                _entry: entry,
            }),
            Err(e) => {
                instance.destroy_instance(None);
                Err(e)
            }
        }
    }

    /// One job: the file's figures, or why there are none. naga's long reports go to the
    /// job's log (stderr).
    fn run(&self, path: &Path, checked: bool, entry: Option<&str>) -> Result<Compiled, Failure> {
        let shown = path.display().to_string();
        let source = std::fs::read_to_string(path)
            .map_err(|e| Failure::new("read", format!("cannot read {shown}: {e}")))?;
        let kernel = wgsl::compile(&source, &shown, entry, checked, &self.target).map_err(
            |(failure, report)| {
                if !report.is_empty() {
                    eprintln!("{}", report.trim_end());
                }
                failure
            },
        )?;
        // SAFETY: `build` destroys what it creates, on every path.
        let stats = unsafe { self.build(&kernel) }?;
        Ok(Compiled {
            entry: kernel.entry,
            stats,
        })
    }

    /// Builds the kernel's pipeline as wgpu would (its layout from the bindings, as wgpu's
    /// automatic layout) and reads the compiler's statistics.
    unsafe fn build(&self, kernel: &Kernel) -> Result<Vec<Statistic>, Failure> {
        let failed = |what: &'static str| {
            move |e: vk::Result| Failure::new("driver", format!("{what} failed: {e}"))
        };
        let mut made = Made {
            device: &self.device,
            module: vk::ShaderModule::null(),
            set_layouts: Vec::new(),
            layout: vk::PipelineLayout::null(),
            pipeline: vk::Pipeline::null(),
        };
        let stage = vk::ShaderStageFlags::COMPUTE;

        made.module = self
            .device
            .create_shader_module(
                &vk::ShaderModuleCreateInfo::default().code(&kernel.spirv),
                None,
            )
            .map_err(failed("vkCreateShaderModule"))?;
        let groups = kernel
            .bindings
            .iter()
            .map(|b| b.group + 1)
            .max()
            .unwrap_or(0);
        for group in 0..groups {
            let bindings: Vec<_> = kernel
                .bindings
                .iter()
                .filter(|b| b.group == group)
                .map(|b| {
                    vk::DescriptorSetLayoutBinding::default()
                        .binding(b.binding)
                        .descriptor_type(descriptor_type(b.resource))
                        .descriptor_count(b.count)
                        .stage_flags(stage)
                })
                .collect();
            let info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
            let layout = self
                .device
                .create_descriptor_set_layout(&info, None)
                .map_err(failed("vkCreateDescriptorSetLayout"))?;
            made.set_layouts.push(layout);
        }
        let immediates = [vk::PushConstantRange {
            stage_flags: stage,
            offset: 0,
            size: kernel.immediate_bytes,
        }];
        let immediates = if kernel.immediate_bytes > 0 {
            &immediates[..]
        } else {
            &[]
        };
        let info = vk::PipelineLayoutCreateInfo::default()
            .set_layouts(&made.set_layouts)
            .push_constant_ranges(immediates);
        made.layout = self
            .device
            .create_pipeline_layout(&info, None)
            .map_err(failed("vkCreatePipelineLayout"))?;

        let name = CString::new(kernel.entry.as_str())
            .map_err(|_| Failure::new("entry point", "the entry point's name holds a NUL"))?;
        let flags = if self.varying_subgroups {
            vk::PipelineShaderStageCreateFlags::ALLOW_VARYING_SUBGROUP_SIZE
        } else {
            vk::PipelineShaderStageCreateFlags::empty()
        };
        let info = vk::ComputePipelineCreateInfo::default()
            .flags(vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR)
            .stage(
                vk::PipelineShaderStageCreateInfo::default()
                    .flags(flags)
                    .stage(stage)
                    .module(made.module)
                    .name(&name),
            )
            .layout(made.layout);
        let pipelines = self
            .device
            .create_compute_pipelines(vk::PipelineCache::null(), &[info], None)
            .map_err(|(_, e)| {
                Failure::new(
                    "driver",
                    format!("the driver did not build the pipeline: {e}"),
                )
            })?;
        made.pipeline = pipelines.first().copied().unwrap_or_default();
        if made.pipeline == vk::Pipeline::null() {
            return Err(Failure::new("driver", "the driver returned no pipeline"));
        }

        let executables = self
            .executables
            .get_pipeline_executable_properties(
                &vk::PipelineInfoKHR::default().pipeline(made.pipeline),
            )
            .map_err(failed("vkGetPipelineExecutablePropertiesKHR"))?;
        let index = executables
            .iter()
            .position(|e| e.stages.contains(stage))
            .ok_or_else(|| {
                Failure::new(
                    "driver",
                    "the driver reports no compute executable, so no figures",
                )
            })?;
        let info = vk::PipelineExecutableInfoKHR::default()
            .pipeline(made.pipeline)
            .executable_index(index as u32);
        let stats = self
            .executables
            .get_pipeline_executable_statistics(&info)
            .map_err(failed("vkGetPipelineExecutableStatisticsKHR"))?;
        Ok(stats.iter().map(statistic).collect())
    }
}

/// Picks RADV's device and opens it: the device, the SPIR-V target it implies, whether
/// stages allow varying subgroup sizes, and its name for the user.
unsafe fn open_device(
    instance: &ash::Instance,
) -> Result<(ash::Device, Target, bool, String), String> {
    let family = std::env::var("RADV_FORCE_FAMILY").unwrap_or_default();
    let no_device = || {
        format!("no RADV device (is mesa-vulkan-drivers installed, and does its RADV know the family `{family}`?)")
    };
    let devices = instance
        .enumerate_physical_devices()
        .map_err(|e| format!("vkEnumeratePhysicalDevices failed: {e} ({})", no_device()))?;
    let mut found = None;
    for pd in devices {
        let mut driver = vk::PhysicalDeviceDriverProperties::default();
        let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut driver);
        instance.get_physical_device_properties2(pd, &mut props);
        let props = props.properties;
        if driver.driver_id == vk::DriverId::MESA_RADV {
            let text = |s: Result<&CStr, _>| {
                s.map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default()
            };
            let name = format!(
                "{}, {} {}",
                text(props.device_name_as_c_str()),
                text(driver.driver_name_as_c_str()),
                text(driver.driver_info_as_c_str())
            );
            found = Some((pd, props.api_version, name));
            break;
        }
    }
    let (pd, api, name) = found.ok_or_else(no_device)?;

    let available = instance
        .enumerate_device_extension_properties(pd)
        .map_err(|e| format!("vkEnumerateDeviceExtensionProperties failed: {e}"))?;
    let has = |ext: &CStr| {
        available
            .iter()
            .any(|e| e.extension_name_as_c_str() == Ok(ext))
    };
    let statistics = ash::khr::pipeline_executable_properties::NAME;
    if !has(statistics) {
        return Err(format!(
            "{name} lacks {}, which reports the compiler's figures",
            statistics.to_string_lossy()
        ));
    }
    let robustness2 = has(ash::ext::robustness2::NAME);
    let coop = has(ash::khr::cooperative_matrix::NAME);
    let (v12, v13) = (api >= vk::API_VERSION_1_2, api >= vk::API_VERSION_1_3);

    // What the device has...
    let mut have11 = vk::PhysicalDeviceVulkan11Features::default();
    let mut have12 = vk::PhysicalDeviceVulkan12Features::default();
    let mut have13 = vk::PhysicalDeviceVulkan13Features::default();
    let mut have_robust2 = vk::PhysicalDeviceRobustness2FeaturesEXT::default();
    let mut have_coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
    let mut have = vk::PhysicalDeviceFeatures2::default();
    if v12 {
        have = have.push_next(&mut have11).push_next(&mut have12);
    }
    if v13 {
        have = have.push_next(&mut have13);
    }
    if robustness2 {
        have = have.push_next(&mut have_robust2);
    }
    if coop {
        have = have.push_next(&mut have_coop);
    }
    instance.get_physical_device_features2(pd, &mut have);
    let core = have.features;

    // ... and what is enabled of it (fresh structures: the queried ones are chained).
    let core = vk::PhysicalDeviceFeatures::default()
        .robust_buffer_access(on(core.robust_buffer_access))
        .shader_int16(on(core.shader_int16))
        .shader_int64(on(core.shader_int64))
        .shader_float64(on(core.shader_float64));
    let mut want11 = vk::PhysicalDeviceVulkan11Features::default()
        .storage_buffer16_bit_access(on(have11.storage_buffer16_bit_access))
        .uniform_and_storage_buffer16_bit_access(
            on(have11.uniform_and_storage_buffer16_bit_access),
        );
    let mut want12 = vk::PhysicalDeviceVulkan12Features::default()
        .shader_float16(on(have12.shader_float16))
        .shader_int8(on(have12.shader_int8))
        .storage_buffer8_bit_access(on(have12.storage_buffer8_bit_access))
        .uniform_and_storage_buffer8_bit_access(on(have12.uniform_and_storage_buffer8_bit_access))
        .vulkan_memory_model(on(have12.vulkan_memory_model))
        .vulkan_memory_model_device_scope(on(have12.vulkan_memory_model_device_scope));
    let mut want13 = vk::PhysicalDeviceVulkan13Features::default()
        .robust_image_access(on(have13.robust_image_access))
        .shader_zero_initialize_workgroup_memory(on(have13.shader_zero_initialize_workgroup_memory))
        .subgroup_size_control(on(have13.subgroup_size_control))
        .compute_full_subgroups(on(have13.compute_full_subgroups))
        .shader_integer_dot_product(on(have13.shader_integer_dot_product));
    let mut want_robust2 = vk::PhysicalDeviceRobustness2FeaturesEXT::default()
        .robust_buffer_access2(on(have_robust2.robust_buffer_access2))
        .robust_image_access2(on(have_robust2.robust_image_access2));
    let mut want_coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default()
        .cooperative_matrix(on(have_coop.cooperative_matrix));
    let mut want_statistics = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default()
        .pipeline_executable_info(true);

    let mut extensions = vec![statistics.as_ptr()];
    let queue_family = instance
        .get_physical_device_queue_family_properties(pd)
        .iter()
        .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
        .ok_or_else(|| format!("{name} has no compute queue"))? as u32;
    let priorities = [1.0];
    let queues = [vk::DeviceQueueCreateInfo::default()
        .queue_family_index(queue_family)
        .queue_priorities(&priorities)];
    let mut info = vk::DeviceCreateInfo::default()
        .queue_create_infos(&queues)
        .enabled_features(&core)
        .push_next(&mut want_statistics);
    if v12 {
        info = info.push_next(&mut want11).push_next(&mut want12);
    }
    if v13 {
        info = info.push_next(&mut want13);
    }
    if robustness2 {
        extensions.push(ash::ext::robustness2::NAME.as_ptr());
        info = info.push_next(&mut want_robust2);
    }
    if coop {
        extensions.push(ash::khr::cooperative_matrix::NAME.as_ptr());
        info = info.push_next(&mut want_coop);
    }
    let info = info.enabled_extension_names(&extensions);
    let device = instance
        .create_device(pd, &info, None)
        .map_err(|e| format!("vkCreateDevice on {name} failed: {e}"))?;

    let target = Target {
        // wgpu-hal: the newest SPIR-V the device's Vulkan version guarantees.
        spirv_version: if v13 {
            (1, 6)
        } else if v12 {
            (1, 5)
        } else {
            (1, 3)
        },
        native_zero_init: on(have13.shader_zero_initialize_workgroup_memory),
        robust_buffers: on(have_robust2.robust_buffer_access2),
        robust_images: if robustness2 {
            on(have_robust2.robust_image_access2)
        } else {
            on(have13.robust_image_access)
        },
    };
    Ok((device, target, on(have13.subgroup_size_control), name))
}

fn descriptor_type(resource: Resource) -> vk::DescriptorType {
    match resource {
        Resource::UniformBuffer => vk::DescriptorType::UNIFORM_BUFFER,
        Resource::StorageBuffer => vk::DescriptorType::STORAGE_BUFFER,
        Resource::SampledImage => vk::DescriptorType::SAMPLED_IMAGE,
        Resource::StorageImage => vk::DescriptorType::STORAGE_IMAGE,
        Resource::Sampler => vk::DescriptorType::SAMPLER,
    }
}

fn statistic(s: &vk::PipelineExecutableStatisticKHR) -> Statistic {
    use vk::PipelineExecutableStatisticFormatKHR as Format;
    let text = |s: Result<&CStr, _>| {
        s.map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    // SAFETY: `format` says which member of the union the driver wrote.
    let value = unsafe {
        match s.format {
            Format::BOOL32 => on(s.value.b32).to_string(),
            Format::INT64 => s.value.i64.to_string(),
            Format::UINT64 => s.value.u64.to_string(),
            Format::FLOAT64 => s.value.f64.to_string(),
            _ => "?".into(),
        }
    };
    Statistic {
        name: text(s.name_as_c_str()),
        value,
        description: text(s.description_as_c_str()),
    }
}

/// What one build creates, destroyed when it goes out of scope, whichever step failed.
struct Made<'a> {
    device: &'a ash::Device,
    module: vk::ShaderModule,
    set_layouts: Vec<vk::DescriptorSetLayout>,
    layout: vk::PipelineLayout,
    pipeline: vk::Pipeline,
}

impl Drop for Made<'_> {
    fn drop(&mut self) {
        // SAFETY: nothing else holds these objects; null handles are skipped.
        unsafe {
            if self.pipeline != vk::Pipeline::null() {
                self.device.destroy_pipeline(self.pipeline, None);
            }
            if self.layout != vk::PipelineLayout::null() {
                self.device.destroy_pipeline_layout(self.layout, None);
            }
            for &l in &self.set_layouts {
                self.device.destroy_descriptor_set_layout(l, None);
            }
            if self.module != vk::ShaderModule::null() {
                self.device.destroy_shader_module(self.module, None);
            }
        }
    }
}
