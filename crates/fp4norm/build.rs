//! `cfg(fp4norm_simd)`: the explicit x86-64 SIMD paths of the CPU backend
//! (`src/cpu/x86.rs`) need Rust 1.89 (AVX-512 intrinsics and target features); an older
//! compiler, which the workspace's rust-version still admits, builds the portable path only.
//! `cfg(fp4norm_file_lock)`: `fp4norm tune`'s lock on its table ([`std::fs::File::try_lock`],
//! Rust 1.89); an older compiler builds `tune` without it.

use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(fp4norm_simd)");
    println!("cargo::rustc-check-cfg=cfg(fp4norm_file_lock)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=RUSTC");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let minor = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            v.split_whitespace()
                .nth(1)?
                .split('.')
                .nth(1)?
                .parse::<u32>()
                .ok()
        });
    if minor.is_some_and(|m| m >= 89) {
        println!("cargo::rustc-cfg=fp4norm_simd");
        println!("cargo::rustc-cfg=fp4norm_file_lock");
    }
}
