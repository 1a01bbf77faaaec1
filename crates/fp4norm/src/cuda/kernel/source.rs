//! The CUDA C++ that NVRTC compiles, embedded in the crate from `cu/`: the shared header
//! `common.cuh` (conversions, codecs, memory access, PTX helpers) and one file per kernel.
//! A specialisation's program is its kernel's file with the configuration's `#define`s
//! prepended; the file's `#include "common.cuh"` is resolved by NVRTC from the header
//! handed over by name (`nvrtcCreateProgram`), never from the file system.
//!
//! Every program is named `fp4norm.cu`, the name of the one source file the kernels came
//! from: NVRTC 12.x names internal symbols of the cubin after the program (the constants
//! of its `nv/target` header), so another name would change the cubin's bytes. A `#line`
//! directive makes NVRTC's messages cite the kernel file and its lines instead.
//!
//! The measurement knob `FP4NORM_KERNEL_SOURCE=PATH` compiles other sources, for A/B
//! variants timed by the same binary in the same run (`scripts/gpu-check.sh ab`):
//! * a file replaces the fused kernel's `fused.cu` (it may include `common.cuh`, the
//!   embedded one, or stand alone);
//! * a directory replaces each of the files named in `cu/` that it holds (a copy of
//!   `src/cuda/kernel/cu/` with edits, or only the edited files); it must hold one at least.
//!
//! What was replaced is said on stderr once; a path that cannot be read is an error of
//! every compile, never a silent fallback to the embedded files. A variant must keep the
//! host's parameter structs.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::config::{KernelConfig, KernelKind};
use crate::cuda::knobs;
use crate::Error;

/// The shared header's name, as the kernel files include it.
const HEADER: &str = "common.cuh";

/// The embedded files by name: the header, then each kernel's.
const EMBEDDED: [(&str, &str); 7] = [
    (HEADER, include_str!("cu/common.cuh")),
    ("fused.cu", include_str!("cu/fused.cu")),
    ("dequant.cu", include_str!("cu/dequant.cu")),
    ("copy.cu", include_str!("cu/copy.cu")),
    ("codec_check.cu", include_str!("cu/codec_check.cu")),
    ("swizzle.cu", include_str!("cu/swizzle.cu")),
    ("column_scales.cu", include_str!("cu/column_scales.cu")),
];

/// The file that holds a kernel.
fn kernel_file(kind: KernelKind) -> &'static str {
    match kind {
        KernelKind::Fused => "fused.cu",
        KernelKind::Dequant => "dequant.cu",
        KernelKind::Copy => "copy.cu",
        KernelKind::CodecCheck => "codec_check.cu",
        KernelKind::Swizzle => "swizzle.cu",
        KernelKind::ColumnScales => "column_scales.cu",
    }
}

/// The name of every program (see the module doc).
pub const PROGRAM_NAME: &str = "fp4norm.cu";

/// What NVRTC compiles for one specialisation.
pub struct Program {
    /// The kernel file's name.
    pub name: &'static str,
    /// The configuration's `#define`s ([`KernelConfig::defines`]).
    pub defines: String,
    /// The kernel file.
    pub file: &'static str,
    /// The headers the file may include, by name.
    pub headers: [(&'static str, &'static str); 1],
}

impl Program {
    /// The program of `cfg`, from the files this process compiles.
    pub fn of(cfg: &KernelConfig) -> Result<Self, Error> {
        let files = files()?;
        let text = |name: &str| {
            files
                .iter()
                .find(|(n, _)| *n == name)
                .map(|&(_, t)| t)
                .expect("every kernel file is in EMBEDDED")
        };
        let name = kernel_file(cfg.kind);
        Ok(Program {
            name,
            defines: cfg.defines(),
            file: text(name),
            headers: [(HEADER, text(HEADER))],
        })
    }

    /// The program's text: the defines, then the kernel file from its line 1.
    pub fn text(&self) -> String {
        format!("{}\n#line 1 \"{}\"\n{}", self.defines, self.name, self.file)
    }

    /// Every source file of the program by name, the kernel file first (for the cache key).
    pub fn files(&self) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
        std::iter::once((self.name, self.file)).chain(self.headers.iter().copied())
    }
}

/// A hash of every source file this process compiles (a self-test verdict holds for one
/// source); 0 where `FP4NORM_KERNEL_SOURCE` names files that cannot be read.
pub fn fingerprint() -> u64 {
    let Ok(files) = files() else { return 0 };
    let mut bytes = Vec::new();
    for (name, text) in files.iter() {
        for part in [name, text] {
            bytes.extend_from_slice(part.as_bytes());
            bytes.push(0);
        }
    }
    super::cache::fnv1a(&bytes)
}

/// The files this process compiles: the embedded ones, with those `FP4NORM_KERNEL_SOURCE`
/// replaces (read once).
fn files() -> Result<&'static [(&'static str, &'static str); 7], Error> {
    static FILES: OnceLock<Result<[(&'static str, &'static str); 7], String>> = OnceLock::new();
    FILES
        .get_or_init(|| {
            let mut files = EMBEDDED;
            let Some(path) = knobs::kernel_source().map(PathBuf::from) else {
                return Ok(files);
            };
            let read = |p: &Path| -> Result<&'static str, String> {
                let text = std::fs::read_to_string(p).map_err(|e| {
                    if p == path {
                        format!("FP4NORM_KERNEL_SOURCE={path:?}: {e}")
                    } else {
                        format!("FP4NORM_KERNEL_SOURCE={path:?}: {}: {e}", p.display())
                    }
                })?;
                Ok(Box::leak(text.into_boxed_str()))
            };
            let mut replaced = Vec::new();
            if path.is_dir() {
                for (name, text) in files.iter_mut() {
                    let p = path.join(*name);
                    if p.exists() {
                        *text = read(&p)?;
                        replaced.push(*name);
                    }
                }
                if replaced.is_empty() {
                    let names: Vec<&str> = EMBEDDED.iter().map(|&(n, _)| n).collect();
                    return Err(format!(
                        "FP4NORM_KERNEL_SOURCE={path:?}: a directory without any of {}",
                        names.join(", ")
                    ));
                }
            } else {
                let fused = kernel_file(KernelKind::Fused);
                let slot = files
                    .iter_mut()
                    .find(|(n, _)| *n == fused)
                    .expect("embedded");
                slot.1 = read(&path)?;
                replaced.push(fused);
            }
            eprintln!(
                "fp4norm: FP4NORM_KERNEL_SOURCE={path:?} (a measurement knob): {} replaced",
                replaced.join(", ")
            );
            Ok(files)
        })
        .as_ref()
        .map_err(|log| Error::Compile {
            config: "kernel source".into(),
            log: log.clone(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_file_includes_the_header_and_checks_its_kind() {
        for kind in [
            KernelKind::Fused,
            KernelKind::Dequant,
            KernelKind::Copy,
            KernelKind::CodecCheck,
            KernelKind::Swizzle,
        ] {
            let name = kernel_file(kind);
            let (_, text) = EMBEDDED.iter().find(|(n, _)| *n == name).expect(name);
            assert!(text.contains("#include \"common.cuh\"\n"), "{name}");
            assert!(
                text.contains(&format!("#if FP4_KIND != {}\n#error", kind as u32)),
                "{name}"
            );
        }
    }

    /// The codec self-check proves the rsqrt seed within `RSTD_SEED_MAX_REL_ERROR` by the
    /// bounds `(1 ± err)² − 1 = ±2 err + err²`, written as literals in `codec_check.cu`: they
    /// must follow the constant the decision margin was worked out for.
    #[test]
    fn the_codec_check_proves_the_seed_bound_the_margin_assumes() {
        let err = crate::sumsq::RSTD_SEED_MAX_REL_ERROR;
        let k = err.log2();
        assert_eq!(k.fract(), 0.0, "the bound is a power of two");
        let (two_err, err_sq) = (
            format!("0x1p{}", k as i32 + 1),
            format!("0x1p{}", 2 * k as i32),
        );
        let (_, text) = EMBEDDED
            .iter()
            .find(|(n, _)| *n == "codec_check.cu")
            .unwrap();
        let bounds = format!("q >= -{two_err} + {err_sq} && q <= {two_err} + {err_sq}");
        assert!(text.contains(&bounds), "codec_check.cu lacks `{bounds}`");
    }
}
