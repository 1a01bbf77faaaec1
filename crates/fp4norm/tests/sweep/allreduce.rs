//! The fused all-reduce's GPU cases (SPEC.md §9), W ranks simulated by W input buffers on
//! one GPU: shared by tests/gpu_allreduce.rs and the CI kernel compile check.

use fp4norm::cuda::internal::KernelConfig;
use fp4norm::cuda::{DeviceLimits, GsMode};
use fp4norm::{DType, Fp4Format, Options, Problem, ScaleLayout};

/// One all-reduce case.
#[derive(Clone, Copy, Debug)]
pub struct ArCase {
    pub ranks: usize,
    pub dtype: DType,
    pub m: usize,
    pub h: usize,
    pub format: Fp4Format,
    pub layout: ScaleLayout,
    /// NaN, ±Inf in one rank's rows 1..4, cancellation between ranks elsewhere.
    pub special: bool,
    /// Element buffers one element into their allocation (the element-wise kernel).
    pub misaligned: bool,
}

impl ArCase {
    pub fn problem(&self) -> Problem {
        Problem::new(
            self.m,
            self.h,
            self.dtype,
            self.layout,
            &Options::default().with_format(self.format),
        )
        .expect("valid all-reduce case")
    }

    /// The kernel the case runs on a device with `limits` (no NaN fix-up where the planned
    /// GPU has no hardware E2M1: the H200's sm_90 kernels, as `Gpu::new` sets them).
    pub fn config(&self, limits: &DeviceLimits, hw_e2m1: bool) -> KernelConfig {
        let gs = if self.format.scale == fp4norm::ScaleFormat::UE8M0 {
            GsMode::None
        } else {
            GsMode::Uniform
        };
        let mut cfg = KernelConfig::fused(&self.problem(), gs, !self.misaligned, hw_e2m1, limits);
        cfg.hw_canonical_nan = !hw_e2m1;
        cfg.ar_ranks = self.ranks as u32;
        cfg
    }

    /// [`ArCase::config`] reading the ranks over peer access (`FP4_AR_PEER`).
    pub fn peer_config(&self, limits: &DeviceLimits, hw_e2m1: bool) -> KernelConfig {
        KernelConfig {
            ar_peer: true,
            ..self.config(limits, hw_e2m1)
        }
    }
}

/// The peer-access cases (W ranks as W grids on W streams of one GPU): every CTA of every
/// rank's grid must be resident at once, since CTA b of each rank waits for CTA b of the
/// others, so W times a grid fits the GPU (a few hundred CTAs at most): decode rows, one
/// rank to eight.
pub fn peer_cases() -> Vec<ArCase> {
    let mut out = Vec::new();
    let shapes: [(usize, usize, &[usize]); 6] = [
        (1, 64, &[1, 2, 8]),
        (7, 2048, &[2, 3, 4]),
        (1, 8192, &[2, 4, 8]),
        (16, 4096, &[2, 8]),
        (3, 16384, &[4]),
        (64, 4096, &[2]),
    ];
    let mut i = 0usize;
    for (m, h, ranks) in shapes {
        for &ranks in ranks {
            out.push(ArCase {
                ranks,
                dtype: if i % 3 == 1 { DType::F16 } else { DType::BF16 },
                m,
                h,
                format: if i % 2 == 0 {
                    Fp4Format::NVFP4
                } else {
                    Fp4Format::MXFP4
                },
                layout: [
                    ScaleLayout::Swizzled,
                    ScaleLayout::RowMajor,
                    ScaleLayout::Both,
                ][i % 3],
                special: i % 4 == 0,
                misaligned: i % 5 == 3,
            });
            i += 1;
        }
    }
    out
}

/// About thirty cases: 2 to 8 ranks, decode rows over a cluster, many rows, every layout,
/// both formats and dtypes.
pub fn allreduce_cases() -> Vec<ArCase> {
    let mut out = Vec::new();
    let shapes = [
        (1usize, 64usize),
        (7, 2048),
        (130, 5120),
        (300, 4096),
        (1, 16384),
        (300, 16384),
    ];
    let mut i = 0usize;
    for ranks in [2usize, 3, 4, 8] {
        for (j, &(m, h)) in shapes.iter().enumerate() {
            if (i + j) % 4 == 3 && ranks != 2 {
                continue;
            }
            out.push(ArCase {
                ranks,
                dtype: if i % 3 == 1 { DType::F16 } else { DType::BF16 },
                m,
                h,
                format: if i % 2 == 0 {
                    Fp4Format::NVFP4
                } else {
                    Fp4Format::MXFP4
                },
                layout: [
                    ScaleLayout::Swizzled,
                    ScaleLayout::RowMajor,
                    ScaleLayout::Both,
                ][i % 3],
                special: i % 4 == 0,
                misaligned: i % 9 == 4,
            });
            i += 1;
        }
    }
    for ranks in [5usize, 6, 7] {
        out.push(ArCase {
            ranks,
            dtype: DType::BF16,
            m: 33,
            h: 4096,
            format: Fp4Format::NVFP4,
            layout: ScaleLayout::Swizzled,
            special: true,
            misaligned: false,
        });
    }
    out
}
