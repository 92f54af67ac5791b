//! What a GPU offers, as the time model reads it: one typed description per device.

/// A GPU as the occupancy and time model see it. Rates are for the whole device.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSpec {
    /// Its name, as `profile --device` takes it.
    pub name: &'static str,
    /// Streaming multiprocessors (NVIDIA) or compute units (AMD).
    pub sms: u32,
    /// Subgroup (warp) width.
    pub lanes: u32,
    /// FP32 lanes per SM (an FMA each per clock).
    pub fp32_lanes: u32,
    /// Warp instructions issued per SM per clock (schedulers).
    pub issue_per_clock: u32,
    /// The f32 FMA ceiling in FLOP/s: the clock the model runs at is this over
    /// `sms · fp32_lanes · 2`.
    pub fma_flops: f64,
    /// Cooperative-matrix (tensor core) f16 ceiling, FLOP/s (dense).
    pub coop_flops: f64,
    /// DRAM bandwidth, bytes/s.
    pub dram_bandwidth: f64,
    /// L2 bandwidth, bytes/s (where global sectors are served when they are re-read).
    pub l2_bandwidth: f64,
    /// Workgroup (shared) memory per SM, bytes.
    pub shared_per_sm: u64,
    /// Workgroup memory one workgroup may hold, bytes.
    pub shared_per_workgroup: u64,
    /// Reserved per resident workgroup by the driver, bytes.
    pub shared_reserved: u64,
    /// 32-bit registers per SM.
    pub registers_per_sm: u32,
    /// Registers are allocated per warp in multiples of this.
    pub register_granule: u32,
    /// Resident threads per SM at most.
    pub max_threads: u32,
    /// Resident workgroups per SM at most.
    pub max_workgroups: u32,
    /// Latency of a global load that misses the caches, seconds.
    pub memory_latency: f64,
    /// Latency of a barrier (all warps of a workgroup meeting), clock cycles.
    pub barrier_cycles: f64,
    /// Cycles per dependent instruction of one warp (pipeline latency over the independent
    /// instructions it can overlap).
    pub dependent_cycles: f64,
    /// Fixed cost of one dispatch, seconds.
    pub launch: f64,
}

impl DeviceSpec {
    /// NVIDIA H100 80GB HBM3 (SXM), as measured and published: 132 SMs, 228 KiB of shared
    /// memory and 64 K registers per SM, 2,048 threads and 32 blocks per SM, 3.35 TB/s HBM3;
    /// the f32 FMA ceiling our own `fma_peak.wgsl` measured on it through Vulkan (44.5
    /// TFLOP/s, the first H100 run (docs/RESULTS.md); NVIDIA's 67 TFLOP/s is at 1.98 GHz: the
    /// model runs at the 1.32 GHz this implies); f16 tensor cores ~713 TFLOP/s (torch's f16
    /// matmul there). L2 ~ 2.5× HBM (a published 5.5 TB/s read estimate rounded down);
    /// latencies from microbenchmark papers on Hopper (~ 480 ns to HBM; barriers ~ 20-40
    /// cycles; 4-cycle FMA latency, about 2 independent instructions in flight per warp).
    pub fn h100() -> DeviceSpec {
        DeviceSpec {
            name: "h100",
            sms: 132,
            lanes: 32,
            fp32_lanes: 128,
            issue_per_clock: 4,
            fma_flops: 44.5e12,
            coop_flops: 713e12,
            dram_bandwidth: 3.35e12,
            l2_bandwidth: 8.0e12,
            shared_per_sm: 228 * 1024,
            shared_per_workgroup: 227 * 1024,
            shared_reserved: 1024,
            registers_per_sm: 65536,
            register_granule: 256,
            max_threads: 2048,
            max_workgroups: 32,
            memory_latency: 480e-9,
            barrier_cycles: 30.0,
            dependent_cycles: 2.0,
            launch: 3e-6,
        }
    }

    /// NVIDIA H200 (SXM): the H100's chip (132 SMs, the same clocks, shared memory and
    /// registers, so the same FMA ceiling and tensor cores) with 141 GB of HBM3e at 4.8 TB/s
    /// (NVIDIA's figure). No H200 measurement backs the rest of it.
    pub fn h200() -> DeviceSpec {
        DeviceSpec {
            name: "h200",
            dram_bandwidth: 4.8e12,
            ..DeviceSpec::h100()
        }
    }

    /// The description of the adapter named `adapter` (as wgpu names it: "NVIDIA H100 80GB
    /// HBM3"), where one is shipped: H100 and H200; `None` for any other.
    pub fn for_adapter(adapter: &str) -> Option<DeviceSpec> {
        let name = adapter.to_ascii_uppercase();
        [("H200", DeviceSpec::h200()), ("H100", DeviceSpec::h100())]
            .into_iter()
            .find(|(key, _)| name.contains(key))
            .map(|(_, spec)| spec)
    }

    /// A mid-range discrete GPU of the RDNA3 / Ada class (60 CUs of 64 lanes of FP32, 2.5
    /// GHz, 960 GB/s, 64 KiB LDS per CU), for comparison only: no measurement backs it.
    pub fn generic() -> DeviceSpec {
        DeviceSpec {
            name: "generic",
            sms: 60,
            lanes: 32,
            fp32_lanes: 64,
            issue_per_clock: 2,
            fma_flops: 60.0 * 64.0 * 2.0 * 2.5e9,
            coop_flops: 120e12,
            dram_bandwidth: 0.96e12,
            l2_bandwidth: 3.0e12,
            shared_per_sm: 64 * 1024,
            shared_per_workgroup: 64 * 1024,
            shared_reserved: 0,
            registers_per_sm: 65536,
            register_granule: 256,
            max_threads: 2048,
            max_workgroups: 32,
            memory_latency: 600e-9,
            barrier_cycles: 30.0,
            dependent_cycles: 2.0,
            launch: 5e-6,
        }
    }

    /// The descriptions shipped, by name.
    pub fn all() -> Vec<DeviceSpec> {
        vec![
            DeviceSpec::h100(),
            DeviceSpec::h200(),
            DeviceSpec::generic(),
        ]
    }

    /// The clock the model runs at, Hz: the FMA ceiling over the FMA lanes.
    pub fn clock(&self) -> f64 {
        self.fma_flops / (f64::from(self.sms) * f64::from(self.fp32_lanes) * 2.0)
    }
}

impl std::str::FromStr for DeviceSpec {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Self> {
        DeviceSpec::all()
            .into_iter()
            .find(|d| d.name.eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                crate::Error::invalid("--device", format!("{s:?}: known are h100, h200, generic"))
            })
    }
}
