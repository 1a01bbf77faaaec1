//! Which instruction set the fast CPU backend computes with, chosen at run time.
//!
//! Every path produces the same bytes (SPEC.md); they differ in speed only. The choice is
//! the best the CPU supports, unless `FP4NORM_CPU_ISA` (`portable`, `avx2`, `avx512` or
//! `auto`; read once per process) asks for a lower one — a knob for checks and A/B
//! timings, e.g. `FP4NORM_CPU_ISA=portable fp4norm verify`. A request the CPU cannot run
//! falls back to the best path below it. The SIMD paths are compiled with Rust 1.89 or
//! later (`build.rs`); an older compiler has the portable path only. Unit tests force a path per call and thread
//! (`with_isa`), so every path is compared with the reference on one machine.

use std::sync::OnceLock;

/// A compute path of [`crate::cpu`]; ordered from slowest to fastest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Isa {
    /// Plain Rust that the compiler vectorises for the baseline target; every platform.
    Portable,
    /// x86-64 AVX2 (+ F16C): 8 f32 lanes.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL (+ AVX2, FMA, F16C): 16 f32 lanes and mask registers.
    Avx512,
}

/// The environment variable that caps the path (see the module docs).
pub(crate) const ISA_ENV: &str = "FP4NORM_CPU_ISA";

impl Isa {
    /// Every path, slowest first.
    #[cfg(test)]
    pub(crate) const ALL: [Isa; 3] = [Isa::Portable, Isa::Avx2, Isa::Avx512];

    /// The name used by `FP4NORM_CPU_ISA`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run the path (the target features its kernels enable).
    pub(crate) fn supported(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(all(target_arch = "x86_64", fp4norm_simd))]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(all(target_arch = "x86_64", fp4norm_simd))]
            Isa::Avx512 => {
                Isa::Avx2.supported()
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
            }
            #[cfg(not(all(target_arch = "x86_64", fp4norm_simd)))]
            _ => false,
        }
    }

    /// The best supported path not above `cap`.
    fn best_up_to(cap: Isa) -> Isa {
        [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .find(|&i| i <= cap && i.supported())
            .unwrap_or(Isa::Portable)
    }

    /// The process-wide path: the best supported, capped by `FP4NORM_CPU_ISA`.
    pub(crate) fn selected() -> Isa {
        static SELECTED: OnceLock<Isa> = OnceLock::new();
        *SELECTED.get_or_init(|| {
            let cap = match std::env::var(ISA_ENV) {
                Ok(v) => match v.to_ascii_lowercase().as_str() {
                    "portable" | "scalar" | "none" => Isa::Portable,
                    "avx2" => Isa::Avx2,
                    "avx512" | "avx-512" | "auto" | "" => Isa::Avx512,
                    other => {
                        eprintln!(
                            "fp4norm: {ISA_ENV}={other:?} is not one of portable, avx2, avx512, auto; using auto"
                        );
                        Isa::Avx512
                    }
                },
                Err(_) => Isa::Avx512,
            };
            Isa::best_up_to(cap)
        })
    }

    /// The path of a call made on this thread now: a test's override, else [`Isa::selected`].
    pub(crate) fn for_call() -> Isa {
        #[cfg(test)]
        if let Some(isa) = OVERRIDE.with(|o| o.get()) {
            return isa;
        }
        Isa::selected()
    }
}

#[cfg(test)]
thread_local! {
    static OVERRIDE: std::cell::Cell<Option<Isa>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with every CPU call made on this thread computing on `isa` (which must be
/// supported). Test-only: the calls read it on the calling thread and hand it to their
/// worker threads.
#[cfg(test)]
pub(crate) fn with_isa<R>(isa: Isa, f: impl FnOnce() -> R) -> R {
    assert!(isa.supported(), "{} is not supported here", isa.name());
    let prev = OVERRIDE.with(|o| o.replace(Some(isa)));
    let out = f();
    OVERRIDE.with(|o| o.set(prev));
    out
}
