//! Compiles the small C++ seam of the PyTorch operators (src/torch_shim.cpp).
fn main() {
    println!("cargo:rerun-if-changed=src/torch_shim.cpp");
    cc::Build::new()
        .cpp(true)
        .file("src/torch_shim.cpp")
        .flag_if_supported("-std=c++17")
        .compile("fp4norm_torch_shim");
}
