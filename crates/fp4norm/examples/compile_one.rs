//! Compiles one fused-kernel specialisation (the one a call on a 132-SM GPU would use)
//! and prints ptxas' report; with an output path, writes the cubin there (for
//! `cuobjdump -sass`). Needs NVRTC, no GPU.
//!
//! `cargo run --release -p fp4norm --example compile_one -- ARCH H [OUT.cubin|-] [M] [LAYOUT] [FLAGS]`
//! ARCH: sm_90, sm_100a, ...; H: the hidden size, or `codec` for the codec self-check
//! kernel (the other arguments but OUT are then ignored); LAYOUT: row-major (default),
//! swizzled, both;
//! FLAGS, comma-separated: f16, mxfp4 (32-element blocks, UE8M0), ue8m0 (16-element blocks
//! with UE8M0 scales), y_out, gemma (weight bias 1).
use fp4norm::cuda::internal::{self, KernelConfig, KernelKind};
use fp4norm::cuda::GsMode;
use fp4norm::*;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arch = args.get(1).map(|s| s.as_str()).unwrap_or("sm_90");
    if args.get(2).map(|s| s.as_str()) == Some("codec") {
        compile_and_report(
            &KernelConfig::shapeless(KernelKind::CodecCheck),
            arch,
            "fp4norm_codec_check",
            args.get(3).filter(|s| s.as_str() != "-"),
        );
        return;
    }
    let h: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let out = args.get(3).filter(|s| s.as_str() != "-");
    let m: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(16384);
    let layout = match args.get(5).map(|s| s.as_str()) {
        Some("swizzled") => ScaleLayout::Swizzled,
        Some("both") => ScaleLayout::Both,
        _ => ScaleLayout::RowMajor,
    };
    let flags: Vec<&str> = args
        .get(6)
        .map(|s| s.split(',').collect())
        .unwrap_or_default();
    let dtype = if flags.contains(&"f16") {
        DType::F16
    } else {
        DType::BF16
    };
    let mut opts = if flags.contains(&"mxfp4") {
        Options::mxfp4()
    } else {
        Options::nvfp4()
    };
    if flags.contains(&"gemma") {
        opts = opts.with_weight_bias(1.0);
    }
    if flags.contains(&"ue8m0") {
        opts.format.scale = ScaleFormat::UE8M0;
    }
    let p = match Problem::new(m, h, dtype, layout, &opts) {
        Ok(p) => p.with_y_out(flags.contains(&"y_out")),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let hw_e2m1 = arch.ends_with('a');
    let limits = fp4norm::cuda::DeviceLimits::H200;
    let mut cfg = KernelConfig::fused(&p, GsMode::Uniform, true, hw_e2m1, &limits);
    // As Gpu::new does on an H200: sm_90 kernels without the NaN fix-up.
    cfg.hw_canonical_nan = arch == "sm_90";
    // FP4NORM_TUNE_SHAPE=G,R,C, as `Gpu` applies it: the forced launch shape's registers.
    if let Some(shape) = internal::tune_shape() {
        if !cfg.try_launch_shape(shape, &limits) {
            eprintln!("FP4NORM_TUNE_SHAPE {shape:?} does not fit H={h}");
            std::process::exit(2);
        }
    }
    compile_and_report(&cfg, arch, "fp4norm_fused", out);
}

fn compile_and_report(cfg: &KernelConfig, arch: &str, entry: &str, out: Option<&String>) {
    match internal::compile(cfg, arch) {
        Ok(c) => {
            println!("{}", cfg.describe());
            println!("{:?}", internal::resource_usage(&c.log, entry));
            if let Some(out) = out {
                std::fs::write(out, &c.cubin).expect("writing the cubin");
            }
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
