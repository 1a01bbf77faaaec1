//! Finding NVRTC and compiling kernels to cubins (no GPU needed to compile).

use std::ffi::{c_char, c_int, CString};
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::{result as nvrtc_result, sys as nvrtc_sys};

use super::knobs;
use crate::Error;

const NVRTC_NAMES: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// Folders where NVRTC usually lives: CUDA toolkits and the `nvidia-cuda-nvrtc` wheel
/// in the usual Python environments.
fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Some(root) = std::env::var_os(var) {
            let root = PathBuf::from(root);
            dirs.push(root.join("lib64"));
            dirs.push(root.join("lib"));
            dirs.push(root.join("targets/x86_64-linux/lib"));
        }
    }
    for root in [
        "/usr/local/cuda",
        "/usr/local/cuda-13.0",
        "/usr/local/cuda-13",
        "/usr/local/cuda-12",
    ] {
        dirs.push(Path::new(root).join("lib64"));
        dirs.push(Path::new(root).join("targets/x86_64-linux/lib"));
    }
    dirs.push("/usr/lib/x86_64-linux-gnu".into());
    // Python environments: the wheel puts the libraries in site-packages/nvidia/cu13/lib.
    let mut envs: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(p) = std::env::var_os(var) {
            envs.push(p.into());
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        envs.push(PathBuf::from(home).join(".local"));
    }
    envs.extend(
        ["/usr/local", "/usr", "/opt/torch/.venv", "/opt/conda"]
            .iter()
            .map(PathBuf::from),
    );
    if let Ok(exe) = std::env::current_exe() {
        // A binary inside a virtualenv's bin/ (e.g. a Python process) shares its prefix.
        if let Some(prefix) = exe.parent().and_then(|p| p.parent()) {
            envs.push(prefix.to_path_buf());
        }
    }
    for env in envs {
        for lib in ["lib", "lib64"] {
            let Ok(entries) = std::fs::read_dir(env.join(lib)) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name();
                if name.to_string_lossy().starts_with("python3") {
                    for sp in ["site-packages", "dist-packages"] {
                        dirs.push(e.path().join(sp).join("nvidia/cu13/lib"));
                        dirs.push(e.path().join(sp).join("nvidia/cuda_nvrtc/lib"));
                    }
                }
            }
        }
    }
    dirs
}

/// Loads `libnvrtc` and its builtins library from `dir` (by absolute path, kept loaded
/// for the life of the process) so that cudarc's later load by name finds them.
fn load_from(dir: &Path) -> Result<(), String> {
    let builtins = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            n.starts_with("libnvrtc-builtins.so") && !n.contains(".alt.")
        })
        .max();
    let main = NVRTC_NAMES.iter().map(|n| dir.join(n)).find(|p| p.exists());
    let (Some(builtins), Some(main)) = (builtins, main) else {
        return Err(format!(
            "{} has no libnvrtc.so.* and libnvrtc-builtins.so.*",
            dir.display()
        ));
    };
    for lib in [&builtins, &main] {
        // SAFETY: loading a shared library runs its initialisers; these are NVIDIA's NVRTC
        // libraries, loaded once and never unloaded.
        let l = unsafe { libloading::os::unix::Library::open(Some(lib), libc_flags()) }
            .map_err(|e| format!("{}: {e}", lib.display()))?;
        std::mem::forget(l);
    }
    Ok(())
}

fn libc_flags() -> std::os::raw::c_int {
    // RTLD_NOW | RTLD_GLOBAL: later loads by soname (cudarc's, NVRTC's own) find these.
    libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL
}

/// Makes NVRTC loadable, once per process: `FP4NORM_NVRTC_DIR` if set, else the
/// library search path, else the usual toolkit and Python-wheel folders.
pub fn ensure_loaded() -> Result<(), Error> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            if let Some(dir) = knobs::nvrtc_dir() {
                return load_from(Path::new(&dir)).map_err(|e| format!("FP4NORM_NVRTC_DIR: {e}"));
            }
            let mut tried = Vec::new();
            for dir in candidate_dirs() {
                if dir.is_dir() {
                    match load_from(&dir) {
                        Ok(()) => return Ok(()),
                        Err(e) => tried.push(e),
                    }
                }
            }
            // Last, whatever the dynamic loader finds on its own (LD_LIBRARY_PATH, ldconfig).
            // SAFETY: probing for the library only loads it.
            if unsafe { nvrtc_sys::is_culib_present() } {
                return Ok(());
            }
            Err(if tried.is_empty() {
                "no libnvrtc.so found on the library path or in the usual CUDA and Python folders"
                    .into()
            } else {
                tried.join("; ")
            })
        })
        .clone()
        .map_err(Error::NvrtcUnavailable)
}

/// NVRTC's version (major, minor).
pub fn version() -> Result<(i32, i32), Error> {
    ensure_loaded()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| Error::NvrtcUnavailable(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

/// A compiled kernel image and what ptxas said about it.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The cubin.
    pub cubin: Vec<u8>,
    /// The program log (ptxas resource usage with `-Xptxas=-v`).
    pub log: String,
}

/// Compiles the CUDA C++ program `name` (its text `source`, which may include each of
/// `headers`, given as (name, text)) to a cubin for `arch` (e.g. `sm_90`, `sm_100a`);
/// `config` names the specialisation in errors.
pub fn compile(
    name: &str,
    source: &str,
    headers: &[(&str, &str)],
    arch: &str,
    config: &str,
) -> Result<Compiled, Error> {
    ensure_loaded()?;
    let c_string = |s: &str| {
        CString::new(s).map_err(|_| Error::Compile {
            config: config.into(),
            log: format!("NUL in {name} or its headers"),
        })
    };
    let src = c_string(source)?;
    let prog_name = c_string(name)?;
    let header_texts = headers
        .iter()
        .map(|(_, text)| c_string(text))
        .collect::<Result<Vec<_>, _>>()?;
    let header_names = headers
        .iter()
        .map(|(header, _)| c_string(header))
        .collect::<Result<Vec<_>, _>>()?;
    let text_ptrs: Vec<*const c_char> = header_texts.iter().map(|s| s.as_ptr()).collect();
    let name_ptrs: Vec<*const c_char> = header_names.iter().map(|s| s.as_ptr()).collect();
    let mut prog = MaybeUninit::uninit();
    // SAFETY: every pointer is a NUL-terminated string that outlives the call (NVRTC copies
    // them), and both arrays hold `headers.len()` of them.
    let prog = unsafe {
        nvrtc_sys::nvrtcCreateProgram(
            prog.as_mut_ptr(),
            src.as_ptr(),
            prog_name.as_ptr(),
            headers.len() as c_int,
            text_ptrs.as_ptr(),
            name_ptrs.as_ptr(),
        )
        .result()
        .map_err(|e| Error::Compile {
            config: config.into(),
            log: format!("nvrtcCreateProgram: {e:?}"),
        })?;
        prog.assume_init()
    };
    let options = [
        format!("--gpu-architecture={arch}"),
        // Exactness: no contraction, no flush-to-zero, IEEE division and square root.
        "--fmad=false".to_string(),
        "-ftz=false".to_string(),
        "-prec-div=true".to_string(),
        "-prec-sqrt=true".to_string(),
        "-std=c++17".to_string(),
        "-Xptxas=-v".to_string(),
    ];
    // SAFETY: `prog` is a live program; the log is read before it is destroyed.
    let result = unsafe {
        let compiled = nvrtc_result::compile_program(prog, &options);
        let log = nvrtc_result::get_program_log(prog)
            .map(|l| {
                // `c_char` is i8 on x86-64 and u8 on aarch64: the cast is a no-op on one.
                #[allow(clippy::unnecessary_cast)]
                let bytes: Vec<u8> = l.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_default();
        let out = match compiled {
            Err(e) => Err(Error::Compile {
                config: config.into(),
                log: format!("{e:?}\n{log}"),
            }),
            Ok(()) => {
                let mut size = 0usize;
                let r = nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size);
                if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
                    Err(Error::Compile {
                        config: config.into(),
                        log: format!("no cubin ({r:?}); is {arch} a real architecture?\n{log}"),
                    })
                } else {
                    let mut cubin = vec![0u8; size];
                    nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut _)
                        .result()
                        .map_err(|e| Error::Compile {
                            config: config.into(),
                            log: format!("nvrtcGetCUBIN: {e:?}"),
                        })?;
                    Ok(Compiled { cubin, log })
                }
            }
        };
        let _ = nvrtc_result::destroy_program(prog);
        out
    };
    result
}

/// Register and memory use of one kernel, parsed from ptxas' `-v` log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResourceUsage {
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of spill stores.
    pub spill_stores: u32,
    /// Bytes of spill loads.
    pub spill_loads: u32,
    /// Stack frame (local memory) bytes per thread.
    pub stack_frame: u32,
    /// Static shared memory per CTA, in bytes.
    pub shared: u32,
}

/// Parses ptxas' `-v` output for the kernel `function` (its lines follow
/// `Compiling entry function '<function>'`).
pub fn resource_usage(log: &str, function: &str) -> Option<ResourceUsage> {
    let start = log.find(&format!("'{function}'"))?;
    let tail = &log[start..];
    let end = tail[1..]
        .find("Compiling entry function")
        .map(|i| i + 1)
        .unwrap_or(tail.len());
    let section = &tail[..end];
    let number_before = |key: &str| -> Option<u32> {
        let i = section.find(key)?;
        section[..i].split_whitespace().last()?.parse().ok()
    };
    Some(ResourceUsage {
        registers: number_before("registers")?,
        spill_stores: number_before("bytes spill stores").unwrap_or(0),
        spill_loads: number_before("bytes spill loads").unwrap_or(0),
        stack_frame: number_before("bytes stack frame").unwrap_or(0),
        shared: number_before("bytes smem").unwrap_or(0),
    })
}
