use fp4norm::cuda::{kernel, nvrtc, GsMode, KernelConfig};
use fp4norm::*;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arch = args.get(1).map(|s| s.as_str()).unwrap_or("sm_90");
    let h: usize = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(4096);
    let p = Problem::new(1024, h, DType::BF16, ScaleLayout::Both, &Options::nvfp4())
        .unwrap()
        .with_y_out(true);
    let cfg = KernelConfig::fused(&p, GsMode::Uniform, true, arch.ends_with('a'), 132);
    match nvrtc::compile(&cfg.source(), arch, &cfg.describe()) {
        Ok(c) => {
            println!("{}", c.log);
            println!("{:?}", nvrtc::resource_usage(&c.log, "fp4norm_fused"));
        }
        Err(e) => println!("{e}"),
    }
    let _ = kernel::SOURCE;
}
