//! What a device allows a launch: the attributes the launch shapes are derived from, read
//! from the device by [`Gpu::new`](super::Gpu::new), and the same figures for GPUs not at
//! hand ([`DeviceLimits::part`]) so that tests can show every shape the launch table picks
//! is launchable there.

use cudarc::driver::sys::CUdevice_attribute as A;
use cudarc::driver::CudaContext;

use crate::Error;

/// The launch limits of one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Threads per CTA.
    pub max_threads_per_block: u32,
    /// Resident threads per SM (2048 on Hopper and data-centre Blackwell, 1536 on sm_120).
    pub max_threads_per_sm: u32,
    /// 32-bit registers per SM.
    pub registers_per_sm: u32,
    /// Static shared memory per CTA, in bytes (what a kernel gets without opting in).
    pub shared_per_block: u32,
    /// CTAs per thread-block cluster that fp4norm launches at most: 8 (the portable
    /// cluster size) where the device launches clusters, 1 where it has none.
    pub max_cluster: u32,
    /// L2 cache, in bytes (the L2 prefetch keeps its rows ahead within half of it).
    pub l2_bytes: u64,
    /// Peak DRAM bandwidth in bytes per second (memory clock × 2 × bus width), 0 where the
    /// device does not report it: how fast rows stream past the L2, which decides whether
    /// one L2 request per 4-byte scale is hidden behind them.
    pub dram_bytes_per_s: u64,
}

impl DeviceLimits {
    /// The NVIDIA H200 (sm_90) the launch table was measured on.
    pub const H200: DeviceLimits = DeviceLimits {
        sm_count: 132,
        max_threads_per_block: 1024,
        max_threads_per_sm: 2048,
        registers_per_sm: 65536,
        shared_per_block: 48 << 10,
        max_cluster: 8,
        l2_bytes: 60 << 20,
        dram_bytes_per_s: 4_800_000_000_000,
    };

    /// Reads the limits of the device behind `ctx`.
    pub(crate) fn of(ctx: &CudaContext) -> Result<Self, Error> {
        let get = |a: A, what: &'static str| {
            ctx.attribute(a)
                .map_err(super::driver_err(what))
                .map(|v| v.max(0) as u32)
        };
        let clusters = get(
            A::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH,
            "reading cluster support",
        )?;
        Ok(DeviceLimits {
            sm_count: get(
                A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                "reading the SM count",
            )?
            .max(1),
            max_threads_per_block: get(
                A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                "reading the threads per block",
            )?,
            max_threads_per_sm: get(
                A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
                "reading the threads per SM",
            )?,
            registers_per_sm: get(
                A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
                "reading the registers per SM",
            )?,
            shared_per_block: get(
                A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
                "reading the shared memory per block",
            )?,
            max_cluster: if clusters != 0 { 8 } else { 1 },
            l2_bytes: get(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, "reading the L2 size")? as u64,
            // Both attributes are informational: a driver that does not report them leaves
            // the bandwidth unknown (0), not the device unusable.
            dram_bytes_per_s: match (
                ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
                ctx.attribute(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH),
            ) {
                (Ok(khz), Ok(bits)) if khz > 0 && bits > 0 => {
                    (khz as u64 * 1000 * 2).saturating_mul(bits as u64 / 8)
                }
                _ => 0,
            },
        })
    }

    /// The limits of a GPU by name, from NVIDIA's published figures, for planning and
    /// testing launches on parts not at hand, with the NVRTC target fp4norm compiles for
    /// them: `"h200"`, `"b200"` (sm_100a), `"b300"` (sm_103a), `"rtx5090"` and
    /// `"rtx-pro-6000"` (sm_120a), `"gb10"` (sm_121a), `"a100"` (sm_80, no clusters),
    /// `"l40s"` (sm_89, no clusters).
    pub fn part(name: &str) -> Option<(&'static str, DeviceLimits)> {
        let h = DeviceLimits::H200;
        const G: u64 = 1_000_000_000;
        // Every part: 64 K registers and 48 KiB of static shared memory per CTA; portable
        // clusters of 8 from sm_90 on, none before; sm_89 and sm_12x have 1536 threads per SM.
        #[rustfmt::skip]
        let parts: [(&str, &str, DeviceLimits); 8] = [
            ("h200", "sm_90", h),
            ("b200", "sm_100a", DeviceLimits { sm_count: 148, l2_bytes: 126 << 20, dram_bytes_per_s: 8_000 * G, ..h }),
            ("b300", "sm_103a", DeviceLimits { sm_count: 160, l2_bytes: 126 << 20, dram_bytes_per_s: 8_000 * G, ..h }),
            ("rtx5090", "sm_120a", DeviceLimits { sm_count: 170, max_threads_per_sm: 1536, l2_bytes: 96 << 20, dram_bytes_per_s: 1_792 * G, ..h }),
            ("rtx-pro-6000", "sm_120a", DeviceLimits { sm_count: 188, max_threads_per_sm: 1536, l2_bytes: 128 << 20, dram_bytes_per_s: 1_792 * G, ..h }),
            ("gb10", "sm_121a", DeviceLimits { sm_count: 48, max_threads_per_sm: 1536, l2_bytes: 24 << 20, dram_bytes_per_s: 273 * G, ..h }),
            ("a100", "sm_80", DeviceLimits { sm_count: 108, max_cluster: 1, l2_bytes: 40 << 20, dram_bytes_per_s: 2_039 * G, ..h }),
            ("l40s", "sm_89", DeviceLimits { sm_count: 142, max_threads_per_sm: 1536, max_cluster: 1, l2_bytes: 96 << 20, dram_bytes_per_s: 864 * G, ..h }),
        ];
        parts
            .into_iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, arch, l)| (arch, l))
    }

    /// The names [`DeviceLimits::part`] knows.
    pub const PARTS: [&'static str; 8] = [
        "h200",
        "b200",
        "b300",
        "rtx5090",
        "rtx-pro-6000",
        "gb10",
        "a100",
        "l40s",
    ];

    /// Whether the device launches thread-block clusters.
    pub fn clusters(&self) -> bool {
        self.max_cluster > 1
    }
}
