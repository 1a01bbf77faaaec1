//! Compiling each specialisation once: per device in the process ([`KernelCache`]:
//! thread-safe, one build per specialisation however many callers ask at once), and across
//! processes in the disk cache (one cubin file per specialisation and target, in the
//! folder `FP4NORM_CACHE_DIR` names).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::Ptx;

use super::config::{KernelConfig, KernelKind};
use super::source::{Program, PROGRAM_NAME};
use crate::cuda::{knobs, nvrtc};
use crate::Error;

/// FNV-1a, 64 bits: a stable hash for cache file names (the full key is also stored in
/// the file and compared on load, so a collision cannot load a wrong kernel).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The program of a specialisation and its disk-cache key: everything that determines the
/// cubin (the source files enter as two independent 64-bit hashes, to keep cache files
/// small; the defines in full).
fn keyed_program(cfg: &KernelConfig, arch: &str) -> Result<(String, Program), Error> {
    let nvrtc_version = nvrtc::version()?;
    let program = Program::of(cfg)?;
    let mut files = Vec::new();
    for (name, text) in program.files() {
        for part in [name, text] {
            files.extend_from_slice(part.as_bytes());
            files.push(0);
        }
    }
    let forward = fnv1a(&files);
    files.reverse();
    let key = format!(
        "fp4norm {} nvrtc {:?} {arch} source {:016x}{:016x}\n{}",
        env!("CARGO_PKG_VERSION"),
        nvrtc_version,
        forward,
        fnv1a(&files),
        program.defines
    );
    Ok((key, program))
}

/// `<cache dir>/<arch>/<hash>.cubin`: one folder per target, so one can be shipped alone.
fn cache_file(arch: &str, key: &str) -> Option<PathBuf> {
    knobs::cache_dir().map(|d| {
        d.join(arch)
            .join(format!("{:016x}.cubin", fnv1a(key.as_bytes())))
    })
}

/// A cubin from the disk cache, if present and made for exactly this key.
fn cache_load(arch: &str, key: &str) -> Option<Vec<u8>> {
    let bytes = std::fs::read(cache_file(arch, key)?).ok()?;
    // Layout: key length (u64 LE), key, cubin.
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
    (bytes.len() > 8 + n && bytes.get(8..8 + n)? == key.as_bytes()).then(|| bytes[8 + n..].to_vec())
}

/// Stores a cubin in the disk cache. Best effort: a cache that cannot be written only
/// costs a recompile.
fn cache_store(arch: &str, key: &str, cubin: &[u8]) {
    let Some(f) = cache_file(arch, key) else {
        return;
    };
    let _ = (|| -> std::io::Result<()> {
        std::fs::create_dir_all(f.parent().expect("has parent"))?;
        // A name of its own per process and per store, so two threads writing the same
        // specialisation never share a temporary file; the rename is atomic.
        static STORES: AtomicU64 = AtomicU64::new(0);
        let n = STORES.fetch_add(1, Ordering::Relaxed);
        let tmp = f.with_extension(format!("tmp{}-{n}", std::process::id()));
        let mut data = (key.len() as u64).to_le_bytes().to_vec();
        data.extend_from_slice(key.as_bytes());
        data.extend_from_slice(cubin);
        std::fs::write(&tmp, data)?;
        std::fs::rename(&tmp, f)
    })();
}

fn compile_program(
    program: &Program,
    cfg: &KernelConfig,
    arch: &str,
) -> Result<nvrtc::Compiled, Error> {
    nvrtc::compile(
        PROGRAM_NAME,
        &program.text(),
        &program.headers,
        arch,
        &cfg.describe(),
    )
}

/// Compiles a specialisation for `arch` afresh, past both caches.
pub fn compile(cfg: &KernelConfig, arch: &str) -> Result<nvrtc::Compiled, Error> {
    compile_program(&Program::of(cfg)?, cfg, arch)
}

/// Compiles a specialisation for `arch`, through the disk cache.
fn compile_cached(cfg: &KernelConfig, arch: &str) -> Result<Vec<u8>, Error> {
    let (key, program) = keyed_program(cfg, arch)?;
    if let Some(cubin) = cache_load(arch, &key) {
        return Ok(cubin);
    }
    let compiled = compile_program(&program, cfg, arch)?;
    cache_store(arch, &key, &compiled.cubin);
    Ok(compiled.cubin)
}

/// Compiles a specialisation afresh (past the cache, so that the ptxas report is current),
/// stores it in the disk cache, and returns its resource usage. Needs NVRTC but no GPU:
/// CI uses it to check every specialisation for spills and local memory.
pub fn compile_and_report(cfg: &KernelConfig, arch: &str) -> Result<nvrtc::ResourceUsage, Error> {
    let (key, program) = keyed_program(cfg, arch)?;
    let compiled = compile_program(&program, cfg, arch)?;
    cache_store(arch, &key, &compiled.cubin);
    nvrtc::resource_usage(&compiled.log, cfg.function_name()).ok_or_else(|| Error::Compile {
        config: cfg.describe(),
        log: format!(
            "no resource report for {} in the ptxas log:\n{}",
            cfg.function_name(),
            compiled.log
        ),
    })
}

type Slot = Arc<OnceLock<Result<CudaFunction, String>>>;

/// Loaded kernels of one device, one entry per specialisation. Concurrent callers asking
/// for the same specialisation wait for a single compile.
#[derive(Default)]
pub struct KernelCache {
    slots: Mutex<HashMap<KernelConfig, Slot>>,
    /// Specialisations built (compiled, or read from the disk cache) and loaded.
    builds: AtomicUsize,
}

impl KernelCache {
    /// The loaded function for `cfg`, compiling and loading it on first use.
    pub fn get(
        &self,
        ctx: &Arc<CudaContext>,
        arch: &str,
        cfg: &KernelConfig,
    ) -> Result<CudaFunction, Error> {
        nvrtc::ensure_loaded()?;
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.entry(*cfg).or_default().clone()
        };
        slot.get_or_init(|| {
            self.builds.fetch_add(1, Ordering::Relaxed);
            let cubin = compile_cached(cfg, arch).map_err(|e| e.to_string())?;
            let module = ctx
                .load_module(Ptx::from_binary(cubin))
                .map_err(|e| format!("loading {}: {e}", cfg.describe()))?;
            let f = module
                .load_function(cfg.function_name())
                .map_err(|e| format!("{}: {e}", cfg.function_name()))?;
            // The copy kernel is the bandwidth yardstick: the knob leaves it alone.
            if let Some(percent) = knobs::smem_carveout().filter(|_| cfg.kind != KernelKind::Copy) {
                use cudarc::driver::sys::CUfunction_attribute_enum as A;
                f.set_attribute(
                    A::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                    percent,
                )
                .map_err(|e| format!("{}: shared memory carveout: {e}", cfg.function_name()))?;
            }
            Ok(f)
        })
        .clone()
        .map_err(|log| Error::Compile {
            config: cfg.describe(),
            log,
        })
    }

    /// Number of specialisations compiled (or being compiled) so far.
    pub fn len(&self) -> usize {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Specialisations built and loaded so far: one per specialisation, however many
    /// callers asked for it at once.
    pub fn builds(&self) -> usize {
        self.builds.load(Ordering::Relaxed)
    }
}
