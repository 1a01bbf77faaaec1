//! Compiles one fused-kernel specialisation and prints ptxas' report; with a third
//! argument, writes the cubin there (for `cuobjdump -sass`).
//! `cargo run -p fp4norm --example compile_one -- sm_90 4096 [out.cubin] [m]`
use fp4norm::cuda::{nvrtc, GsMode, KernelConfig};
use fp4norm::*;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arch = args.get(1).map(|s| s.as_str()).unwrap_or("sm_90");
    let h: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let m: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(16384);
    let p = Problem::new(m, h, DType::BF16, ScaleLayout::RowMajor, &Options::nvfp4())
        .expect("valid shape");
    let cfg = KernelConfig::fused(&p, GsMode::Uniform, true, arch.ends_with('a'), 132, true);
    match nvrtc::compile(&cfg.source(), arch, &cfg.describe()) {
        Ok(c) => {
            println!("{}", cfg.describe());
            println!("{:?}", nvrtc::resource_usage(&c.log, "fp4norm_fused"));
            if let Some(out) = args.get(3) {
                std::fs::write(out, &c.cubin).expect("writing the cubin");
            }
        }
        Err(e) => println!("{e}"),
    }
}
