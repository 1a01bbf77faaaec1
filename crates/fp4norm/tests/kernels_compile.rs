//! CI's kernel check (no GPU needed): every kernel specialisation the GPU tests use
//! (the fused kernels of the sweep, direct and split swizzled writes with their swizzle
//! passes, every flag combination of the 512-thread shapes, the copy yardstick, the codec
//! self-check)
//! compiles with NVRTC for sm_90 (software E2M1) and sm_100a (hardware E2M1) with zero
//! spills and zero local memory; a representative part of them for the other
//! Blackwell-class targets (sm_103a, sm_110a, sm_120a, sm_121a). Compiled cubins land in the disk cache
//! (`FP4NORM_CACHE_DIR`), which the device script carries to the GPU machine.
//!
//! Without NVRTC the test says SKIPPED; `FP4NORM_REQUIRE_NVRTC=1` (set by .ci/run) makes
//! that a failure.
#![cfg(feature = "cuda")]

mod sweep;

use std::collections::BTreeSet;
use std::io::Write;

use fp4norm::cuda::internal::{self, Fp8KernelScaling, Fp8Spec, KernelConfig, KernelKind};
use fp4norm::cuda::DeviceLimits;
use rayon::prelude::*;

/// The device the launch shapes are planned for (the H200 the GPU tests run on).
const PLAN: DeviceLimits = DeviceLimits::H200;

/// The fused kernel a call of `p` uses on the planned GPU, as `internal::config` builds it (the
/// H200 compiles sm_90 kernels without the NaN fix-up, see `Gpu::new`).
fn planned(
    p: &fp4norm::Problem,
    gs: fp4norm::cuda::GsMode,
    aligned: bool,
    hw_e2m1: bool,
    clusters: bool,
) -> KernelConfig {
    let limits = if clusters {
        PLAN
    } else {
        DeviceLimits {
            max_cluster: 1,
            ..PLAN
        }
    };
    let mut cfg = KernelConfig::fused(p, gs, aligned, hw_e2m1, &limits);
    cfg.hw_canonical_nan = !hw_e2m1;
    cfg
}

/// Hidden sizes of common LLMs (Qwen2 0.5B … Llama 3 405B), every one a multiple of 128.
const MODEL_HIDDEN_SIZES: [usize; 14] = [
    896, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 12288, 16384,
];

/// Row counts of every bucket of the launch table on the planned GPU: one row, a few per
/// SM's share, and 8, 31 and 124 rows per SM.
const MODEL_ROWS: [usize; 6] = [1, 16, 128, 1024, 4096, 16384];

fn configs(hw_e2m1: bool) -> Vec<KernelConfig> {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    for c in sweep::all_cases() {
        let cfg = planned(&c.problem(c.dtype), c.gs_mode(), c.aligned(), hw_e2m1, true);
        if seen.insert(cfg.describe()) {
            out.push(cfg);
        }
        // Its swizzle pass, the split variant the GPU tests force with
        // FP4NORM_SWIZZLE_SPLIT=1 (and its pass), and the direct write with its words kept
        // in L2 (FP4NORM_SWIZZLE_KEEP=1; the default from 2^24 elements).
        let split = KernelConfig {
            swizzle_split: cfg.swizzled && cfg.aligned,
            swizzle_keep: false,
            swizzle_demote_tiles: 0,
            ..cfg
        };
        // (With the demotion of complete tiles that large calls add, at a typical distance.)
        let keep = KernelConfig {
            swizzle_split: false,
            swizzle_keep: cfg.swizzled && cfg.aligned,
            swizzle_demote_tiles: if cfg.swizzled && cfg.aligned { 5 } else { 0 },
            ..cfg
        };
        for c in [cfg, split, keep] {
            for k in [Some(c), c.second_pass()].into_iter().flatten() {
                if seen.insert(k.describe()) {
                    out.push(k);
                }
            }
        }
    }
    // Every flag combination of the 512-thread throughput shapes (H = 16384, 32768; with
    // clusters and, for GPUs without them, the CTA of 512 that re-reads its row), the
    // register-tightest kernels (two CTAs per SM asked of the vector ones), aligned or not.
    for (h, clusters) in [(16384usize, true), (32768, true), (32768, false)] {
        for dtype in [fp4norm::DType::BF16, fp4norm::DType::F16] {
            for format in fp4norm::Fp4Format::ALL {
                for layout in [
                    fp4norm::ScaleLayout::RowMajor,
                    fp4norm::ScaleLayout::Swizzled,
                    fp4norm::ScaleLayout::Both,
                ] {
                    for (aligned, y_out) in
                        [(true, false), (true, true), (false, false), (false, true)]
                    {
                        let opts = fp4norm::Options::default().with_format(format);
                        let p = fp4norm::Problem::new(16384, h, dtype, layout, &opts)
                            .expect("valid problem")
                            .with_y_out(y_out);
                        let cfg = planned(
                            &p,
                            fp4norm::cuda::GsMode::Uniform,
                            aligned,
                            hw_e2m1,
                            clusters,
                        );
                        if seen.insert(cfg.describe()) {
                            out.push(cfg);
                        }
                    }
                }
            }
        }
    }
    // The launch table's many-row shapes, forced at 300 rows by the GPU tests.
    for (c, shape) in sweep::many_row_shape_cases(&PLAN) {
        let mut cfg = planned(&c.problem(c.dtype), c.gs_mode(), c.aligned(), hw_e2m1, true);
        assert!(cfg.try_launch_shape(shape, &PLAN), "{c:?}: {shape:?}");
        for k in [Some(cfg), cfg.second_pass()].into_iter().flatten() {
            if seen.insert(k.describe()) {
                out.push(k);
            }
        }
    }
    // The swizzled padding zeroed by CTAs of its own (`FP4NORM_PAD_SPREAD=0`, which the GPU
    // tests force on the bf16 sweep and the edge cases).
    for c in sweep::sweep(fp4norm::DType::BF16)
        .into_iter()
        .chain(sweep::edge_cases())
    {
        let cfg = planned(&c.problem(c.dtype), c.gs_mode(), c.aligned(), hw_e2m1, true);
        if cfg.pad_spread {
            let own_ctas = KernelConfig {
                pad_spread: false,
                ..cfg
            };
            if seen.insert(own_ctas.describe()) {
                out.push(own_ctas);
            }
        }
    }
    // Every shape `fp4norm tune` may put in a table, forced on the cases the GPU tests run
    // them on.
    for (c, shape) in sweep::tune_candidate_cases(&PLAN) {
        let mut cfg = planned(&c.problem(c.dtype), c.gs_mode(), c.aligned(), hw_e2m1, true);
        assert!(cfg.try_launch_shape(shape, &PLAN), "{c:?}: {shape:?}");
        for k in [Some(cfg), cfg.second_pass()].into_iter().flatten() {
            if seen.insert(k.describe()) {
                out.push(k);
            }
        }
    }
    // The literal-encoder path (a device whose conversion self-test failed) over the cases
    // the GPU tests run on it; its dequantisation kernels come with the Python tests' use.
    for c in sweep::literal_path_cases() {
        let mut cfg = planned(&c.problem(c.dtype), c.gs_mode(), c.aligned(), hw_e2m1, true);
        cfg.literal_codecs = true;
        cfg.hw_e2m1 = false;
        cfg.hw_canonical_nan = false;
        for k in [Some(cfg), cfg.second_pass()].into_iter().flatten() {
            if seen.insert(k.describe()) {
                out.push(k);
            }
        }
    }
    // The FP8 kernels of the GPU tests (tests/gpu_fp8.rs), their literal-encoder variants
    // on the cases that test runs on that path, MXFP8's padding rows zeroed by CTAs of
    // their own (`FP4NORM_PAD_SPREAD=0`, forced on that suite too), and the split
    // column-major write with its pass (`FP4NORM_FP8_SCALES_SPLIT=1`, forced there too).
    let fp8_cases = sweep::fp8::fp8_cases();
    let split_cases = sweep::fp8::split_column_scale_cases();
    for (i, c) in fp8_cases.iter().chain(&split_cases).enumerate() {
        let mut cfg = c.config(&PLAN);
        cfg.hw_canonical_nan = !hw_e2m1;
        let literal = KernelConfig {
            literal_codecs: true,
            hw_canonical_nan: false,
            ..cfg
        };
        let own_ctas = KernelConfig {
            pad_spread: false,
            ..cfg
        };
        let splittable = cfg.fp8.is_some_and(|f| {
            f.column_major
                && f.scaling == Fp8KernelScaling::F32
                && !f.per_token
                && cfg.aligned
                && cfg.h % 256 == 0
                && c.m >= 8
        });
        let split = KernelConfig {
            fp8: cfg.fp8.map(|f| Fp8Spec {
                split_scales: true,
                ..f
            }),
            ..cfg
        };
        let with_literal = i % sweep::fp8::LITERAL_EVERY == 0;
        for k in [
            Some(cfg),
            cfg.second_pass(),
            with_literal.then_some(literal),
            cfg.pad_spread.then_some(own_ctas),
            splittable.then_some(split),
            splittable.then(|| split.second_pass()).flatten(),
        ]
        .into_iter()
        .flatten()
        {
            if seen.insert(k.describe()) {
                out.push(k);
            }
        }
    }
    // Every shape `fp4norm tune` may pick for an FP8 call, forced on the cases the GPU
    // tests run them on.
    for (c, shape) in sweep::fp8::tune_candidate_cases(&PLAN) {
        let mut cfg = c.config(&PLAN);
        cfg.hw_canonical_nan = !hw_e2m1;
        assert!(cfg.try_launch_shape(shape, &PLAN), "{c:?}: {shape:?}");
        for k in [Some(cfg), cfg.second_pass()].into_iter().flatten() {
            if seen.insert(k.describe()) {
                out.push(k);
            }
        }
    }
    // The fused all-reduce's kernels of tests/gpu_allreduce.rs.
    for c in sweep::allreduce::allreduce_cases() {
        let cfg = c.config(&PLAN, hw_e2m1);
        if seen.insert(cfg.describe()) {
            out.push(cfg);
        }
    }
    for c in sweep::allreduce::peer_cases() {
        let one_shot = c.peer_config(&PLAN, hw_e2m1);
        for cfg in [
            one_shot,
            KernelConfig {
                ar_two_shot: true,
                ..one_shot
            },
        ] {
            if seen.insert(cfg.describe()) {
                out.push(cfg);
            }
        }
    }
    // The FP8 op behind the fused all-reduce (tests/gpu_fp8.rs).
    for (ranks, c) in sweep::fp8::allreduce_fp8_cases() {
        let mut cfg = sweep::fp8::allreduce_fp8_config(ranks, &c, &PLAN);
        cfg.hw_canonical_nan = !hw_e2m1;
        if seen.insert(cfg.describe()) {
            out.push(cfg);
        }
    }
    for (ranks, c) in sweep::fp8::peer_fp8_cases() {
        let mut cfg = sweep::fp8::allreduce_fp8_config(ranks, &c, &PLAN);
        cfg.hw_canonical_nan = !hw_e2m1;
        cfg.ar_peer = true;
        for two_shot in [false, true] {
            let cfg = KernelConfig {
                ar_two_shot: two_shot,
                ..cfg
            };
            if seen.insert(cfg.describe()) {
                out.push(cfg);
            }
        }
    }
    // The bench's copy yardstick and the GPU tests' codec self-check.
    out.push(KernelConfig::shapeless(KernelKind::Copy));
    out.push(KernelConfig::shapeless(KernelKind::CodecCheck));
    out
}

/// Compiles `cfgs` for `arch` in parallel; the failures (errors, spills, local memory) and
/// a summary line.
fn compile_all(arch: &str, cfgs: &[KernelConfig]) -> (Vec<String>, String) {
    let started = std::time::Instant::now();
    let results: Vec<(
        KernelConfig,
        Result<internal::ResourceUsage, fp4norm::Error>,
    )> = cfgs
        .par_iter()
        .map(|c| (*c, internal::compile_and_report(c, arch)))
        .collect();
    let mut failures = Vec::new();
    let mut max_regs = 0;
    for (cfg, r) in &results {
        match r {
            // 48 KiB: the static shared memory every target gives a CTA.
            Ok(u)
                if u.spill_stores == 0
                    && u.spill_loads == 0
                    && u.stack_frame == 0
                    && u.shared <= 48 << 10 =>
            {
                max_regs = max_regs.max(u.registers)
            }
            Ok(u) => failures.push(format!("{arch} {}: {u:?}", cfg.describe())),
            Err(e) => failures.push(format!("{arch} {}: {e}", cfg.describe())),
        }
    }
    let summary = format!(
        "{arch}: {} specialisations in {:.1}s, max {} registers",
        results.len(),
        started.elapsed().as_secs_f64(),
        max_regs
    );
    (failures, summary)
}

/// `FP4NORM_COMPILE_STRIDE`: keep one fused kernel in N of `arch`'s list (a hashed sample,
/// `sampled`; every other kernel is kept), as `N` for every target or `ARCH:N,...` per
/// target (1 where unnamed). CI checks a sample of each target and the device build script
/// every sm_90 specialisation before a GPU run: spills differ by target and shape, which a
/// sample spreads over, and with an older NVRTC the PTX the kernels pick differs by
/// compiler, not specialisation.
fn compile_stride(arch: &str) -> usize {
    let Ok(v) = std::env::var("FP4NORM_COMPILE_STRIDE") else {
        return 1;
    };
    let parse = |n: &str| n.trim().parse::<usize>().ok().filter(|&n| n > 0);
    if let Some(n) = parse(&v) {
        return n;
    }
    v.split(',')
        .filter_map(|part| part.split_once(':'))
        .find(|(a, _)| a.trim() == arch)
        .and_then(|(_, n)| parse(n))
        .unwrap_or(1)
}

/// [`compile_stride`] where `FP4NORM_COMPILE_STRIDE` names `arch`, else `default`.
fn stride_or(arch: &str, default: usize) -> usize {
    if std::env::var("FP4NORM_COMPILE_STRIDE").is_ok_and(|v| v.contains(arch)) {
        compile_stride(arch)
    } else {
        default
    }
}

/// Whether the check covers `arch`: `FP4NORM_COMPILE_ARCHS=sm_90,...` limits it to the
/// targets it names (the device build script and CI's older-NVRTC step use it); unset, all.
fn arch_wanted(arch: &str) -> bool {
    std::env::var("FP4NORM_COMPILE_ARCHS").map_or(true, |o| o.split(',').any(|a| a == arch))
}

/// Whether `cfg` is in `arch`'s sample of one fused kernel in `stride` (every other kernel
/// always is). The sample is drawn by a hash of the target and the specialisation, not by
/// position: the list is built in nested loops, so every Nth entry would keep the same
/// dtype, layout or flag each time; a hash spreads over all of them, and each target
/// checks different ones.
fn sampled(arch: &str, cfg: &KernelConfig, stride: usize) -> bool {
    // FP4NORM_COMPILE_MATCH=TEXT: only the specialisations whose description holds TEXT
    // (a targeted check, e.g. `swz_demote=5`, usually with FP4NORM_COMPILE_STRIDE=1).
    if let Ok(text) = std::env::var("FP4NORM_COMPILE_MATCH") {
        if !cfg.describe().contains(&text) {
            return false;
        }
    }
    if stride <= 1 || cfg.kind != KernelKind::Fused {
        return true;
    }
    // FNV-1a, 64-bit.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in arch.bytes().chain([0]).chain(cfg.describe().bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h % stride as u64 == 0
}

/// NVRTC, or the test says SKIPPED (a failure where FP4NORM_REQUIRE_NVRTC=1).
fn nvrtc_present() -> bool {
    let require = std::env::var_os("FP4NORM_REQUIRE_NVRTC").is_some_and(|v| v != "0");
    if let Err(e) = internal::ensure_loaded() {
        assert!(!require, "FP4NORM_REQUIRE_NVRTC is set: {e}");
        let _ = writeln!(std::io::stderr().lock(), "SKIPPED (no NVRTC): {e}");
        return false;
    }
    true
}

/// The other Blackwell-class targets with the hardware E2M1 conversion (B300 sm_103a, Thor
/// sm_110a, RTX 50x0 / RTX PRO sm_120a, GB10 sm_121a): a sixteenth of the fused kernels of the
/// sm_100a list (a spread over shapes, formats, layouts and flags that keeps CI short;
/// `FP4NORM_COMPILE_STRIDE=ARCH:N` sets another) and every other kernel (swizzle passes,
/// copy, codec self-check), with zero spills. Needs NVRTC 13.0 or newer.
#[test]
fn blackwell_family_targets_compile_without_spills() {
    if !nvrtc_present() {
        return;
    }
    if internal::version().is_ok_and(|v| v < (13, 0)) {
        let _ = writeln!(
            std::io::stderr().lock(),
            "SKIPPED (NVRTC before 13.0): the Blackwell family targets"
        );
        return;
    }
    let all = configs(true);
    let mut failures = Vec::new();
    let mut counts = Vec::new();
    for arch in ["sm_103a", "sm_110a", "sm_120a", "sm_121a"] {
        if !arch_wanted(arch) {
            continue;
        }
        // A sixteenth of the fused kernels by default (FP4NORM_COMPILE_STRIDE=ARCH:N sets it).
        let stride = stride_or(arch, 16);
        let cfgs: Vec<KernelConfig> = all
            .iter()
            .filter(|c| sampled(arch, c, stride))
            .copied()
            .collect();
        let (f, summary) = compile_all(arch, &cfgs);
        failures.extend(f);
        counts.push(summary);
    }
    // The shapes the launch table picks on the parts themselves (their SM counts, threads
    // per SM and clusters; `DeviceLimits::part`), for decode and prefill sizes: they build
    // for the part's target without spills, within its static shared memory, and their
    // launch bound fits its threads per SM (the unit test of the launch table checks the
    // shapes on these and smaller limits for every size).
    for part in ["b200", "b300", "rtx5090", "rtx-pro-6000", "gb10"] {
        let (arch, limits) = DeviceLimits::part(part).expect("known part");
        if !arch_wanted(arch) {
            continue;
        }
        let mut seen = BTreeSet::new();
        let mut own = Vec::new();
        for m in [1usize, 16, 128, 1024, 16384] {
            for h in [2048usize, 4096, 5120, 7168, 8192, 16384, 32768] {
                let opts = fp4norm::Options::nvfp4();
                let p = fp4norm::Problem::new(
                    m,
                    h,
                    fp4norm::DType::BF16,
                    fp4norm::ScaleLayout::Swizzled,
                    &opts,
                )
                .expect("valid problem");
                let cfg =
                    KernelConfig::fused(&p, fp4norm::cuda::GsMode::Uniform, true, true, &limits);
                assert!(
                    cfg.block_threads() * cfg.min_ctas_per_sm() <= limits.max_threads_per_sm,
                    "{part}: {}",
                    cfg.describe()
                );
                if seen.insert(cfg.describe()) && sampled(arch, &cfg, 1) {
                    own.push(cfg);
                }
            }
        }
        let (f, summary) = compile_all(arch, &own);
        failures.extend(f);
        counts.push(format!("{part}'s own shapes, {summary}"));
    }
    let _ = writeln!(
        std::io::stderr().lock(),
        "kernel compile check, Blackwell family: {}",
        counts.join("; ")
    );
    assert!(
        failures.is_empty(),
        "{} kernel specialisations failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The pre-Hopper targets (A100 sm_80; L40S and RTX 40x0 sm_89, which add the hardware FP8
/// conversions): no clusters, software E2M1. The kernels such a GPU launches build without
/// spills: a sixteenth of the cluster-free fused kernels of the sm_90 list
/// (`FP4NORM_COMPILE_STRIDE=ARCH:N` sets another), every other kernel, and a quarter of the
/// part's own shapes for models' calls (FP4 and FP8, `DeviceLimits::part`; a fourth of N).
#[test]
fn pre_hopper_targets_compile_without_spills() {
    if !nvrtc_present() {
        return;
    }
    // As `Gpu` builds them there: the NaN fix-up compiled in, and no split column-major
    // scale write (its second kernel waits with PDL, which needs sm_90).
    let pre_hopper = |mut c: KernelConfig| {
        c.hw_canonical_nan = false;
        if let Some(f) = c.fp8.as_mut() {
            f.split_scales = false;
        }
        c
    };
    let sm90: Vec<KernelConfig> = configs(false)
        .into_iter()
        .chain(model_configs(false))
        .filter(|c| c.cluster <= 1)
        .map(pre_hopper)
        .collect();
    let mut failures = Vec::new();
    let mut counts = Vec::new();
    for part in ["a100", "l40s"] {
        let (arch, limits) = DeviceLimits::part(part).expect("known part");
        if !arch_wanted(arch) {
            continue;
        }
        let stride = stride_or(arch, 16);
        let mut seen = BTreeSet::new();
        let mut cfgs: Vec<KernelConfig> = sm90
            .iter()
            .filter(|c| sampled(arch, c, stride))
            .copied()
            .filter(|c| seen.insert(c.describe()))
            .collect();
        let sampled_count = cfgs.len();
        for h in MODEL_HIDDEN_SIZES {
            for m in MODEL_ROWS {
                let mut own = Vec::new();
                for format in fp4norm::Fp4Format::ALL {
                    for layout in [fp4norm::ScaleLayout::RowMajor, fp4norm::ScaleLayout::Both] {
                        let opts = fp4norm::Options::default().with_format(format);
                        let p = fp4norm::Problem::new(m, h, fp4norm::DType::BF16, layout, &opts)
                            .expect("valid problem");
                        let gs = fp4norm::cuda::GsMode::Uniform;
                        own.push(pre_hopper(KernelConfig::fused(
                            &p, gs, true, false, &limits,
                        )));
                    }
                }
                for scaling in sweep::fp8::scalings() {
                    let c = sweep::fp8::base(
                        fp4norm::DType::BF16,
                        m,
                        h,
                        fp4norm::fp8::Fp8Element::E4M3,
                        scaling,
                    );
                    own.push(pre_hopper(c.config(&limits)));
                }
                for cfg in own {
                    assert!(
                        cfg.cluster <= 1
                            && cfg.block_threads() * cfg.min_ctas_per_sm()
                                <= limits.max_threads_per_sm,
                        "{part}: {}",
                        cfg.describe()
                    );
                    for k in [Some(cfg), cfg.second_pass()].into_iter().flatten() {
                        if sampled(arch, &k, stride.div_ceil(4)) && seen.insert(k.describe()) {
                            cfgs.push(k);
                        }
                    }
                }
            }
        }
        let (f, summary) = compile_all(arch, &cfgs);
        failures.extend(f);
        counts.push(format!(
            "{part} ({sampled_count} of the sm_90 list, {} own shapes): {summary}",
            cfgs.len() - sampled_count
        ));
    }
    let _ = writeln!(
        std::io::stderr().lock(),
        "kernel compile check, pre-Hopper targets: {}",
        counts.join("; ")
    );
    assert!(
        failures.is_empty(),
        "{} kernel specialisations failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The kernels of models' own calls, which the sweep's hidden sizes (chosen for kernel
/// paths) do not all reach, less those of [`configs`]: bf16 rows of the hidden sizes of
/// common LLMs at decode and prefill row counts (each bucket of the launch table), residual
/// add, every FP4 format and layout, every FP8 scaling in E4M3 and per-tensor and
/// per-token in E5M2.
fn model_configs(hw_e2m1: bool) -> Vec<KernelConfig> {
    let mut seen: BTreeSet<String> = configs(hw_e2m1).iter().map(|c| c.describe()).collect();
    let mut out = Vec::new();
    for h in MODEL_HIDDEN_SIZES {
        for m in MODEL_ROWS {
            let mut cfgs = Vec::new();
            for format in fp4norm::Fp4Format::ALL {
                for layout in [
                    fp4norm::ScaleLayout::RowMajor,
                    fp4norm::ScaleLayout::Swizzled,
                    fp4norm::ScaleLayout::Both,
                ] {
                    let opts = fp4norm::Options::default().with_format(format);
                    let p = fp4norm::Problem::new(m, h, fp4norm::DType::BF16, layout, &opts)
                        .expect("valid problem");
                    let gs = fp4norm::cuda::GsMode::Uniform;
                    cfgs.push(planned(&p, gs, true, hw_e2m1, true));
                }
            }
            for scaling in sweep::fp8::scalings() {
                let per_group = matches!(scaling, fp4norm::fp8::Fp8Scaling::Dynamic { group, .. }
                    if group != fp4norm::fp8::Fp8Group::PerToken);
                for element in fp4norm::fp8::Fp8Element::ALL {
                    if per_group && element != fp4norm::fp8::Fp8Element::E4M3 {
                        continue;
                    }
                    let c = sweep::fp8::base(fp4norm::DType::BF16, m, h, element, scaling);
                    let mut cfg = c.config(&PLAN);
                    cfg.hw_canonical_nan = !hw_e2m1;
                    cfgs.push(cfg);
                }
            }
            for cfg in cfgs {
                for k in [Some(cfg), cfg.second_pass()].into_iter().flatten() {
                    if seen.insert(k.describe()) {
                        out.push(k);
                    }
                }
            }
        }
    }
    out
}

/// Compiles `configs(hw_e2m1)` for sm_90 and sm_100a (a sample of each: `sampled`) and fails
/// on any error, spill or local memory.
fn check_without_spills(what: &str, configs: fn(bool) -> Vec<KernelConfig>) {
    if !nvrtc_present() {
        return;
    }
    let mut failures = Vec::new();
    let mut counts = Vec::new();
    for (arch, hw) in [("sm_90", false), ("sm_100a", true)] {
        if !arch_wanted(arch) {
            continue;
        }
        let stride = compile_stride(arch);
        let cfgs: Vec<KernelConfig> = configs(hw)
            .into_iter()
            .filter(|c| sampled(arch, c, stride))
            .collect();
        let (f, summary) = compile_all(arch, &cfgs);
        failures.extend(f);
        counts.push(summary);
    }
    let version = internal::version()
        .map(|(major, minor)| format!("NVRTC {major}.{minor}"))
        .unwrap_or_else(|e| format!("NVRTC version unknown ({e})"));
    let _ = writeln!(
        std::io::stderr().lock(),
        "kernel compile check, {what} ({version}): {}",
        counts.join("; ")
    );
    assert!(
        failures.is_empty(),
        "{} kernel specialisations failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_sweep_kernel_compiles_without_spills() {
    check_without_spills("the GPU tests' kernels", configs);
}

/// (Not in the device build's cubin cache: the GPU tests never run these.)
#[test]
fn model_shape_kernels_compile_without_spills() {
    check_without_spills("models' shapes", model_configs);
}
