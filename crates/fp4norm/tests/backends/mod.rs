//! One call through every front a user can reach: the scalar reference, the CPU backend
//! (and its root re-exports), the raw host entry that the Python binding and the PyTorch
//! operators' CPU kernels use ([`fp4norm::raw::run_host`]), and the CUDA raw entry
//! ([`fp4norm::cuda::Gpu::launch_raw`], over device copies of the same buffers, lengths
//! included). `backend_tests!` defines one test per backend from a function of the backend;
//! the CUDA one prints `SKIPPED (no CUDA device)` without a GPU (`FP4NORM_REQUIRE_GPU=1`
//! makes that a failure).
#![allow(dead_code)]

use fp4norm::raw::{run_host, HostEngine};
use fp4norm::{
    cpu, reference, Element, Error, Fp4Out, GlobalScale, MatMut, MatRef, Options, RawBuf, RawCall,
    RawGlobalScale, RawMat, ScaleLayout, ScaleOut,
};

/// Where a test's call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `fp4norm::reference::*` over slices.
    Reference,
    /// `fp4norm::cpu::*` and the root re-exports over slices (both run; they must agree).
    Cpu,
    /// `fp4norm::raw::run_host` over the slices' addresses.
    HostRaw,
    /// `Gpu::launch_raw` over device copies.
    CudaRaw,
}

impl Backend {
    /// Whether the call goes through a [`RawCall`] (so raw-only rules apply: aliasing,
    /// null and misaligned pointers).
    pub fn is_raw(self) -> bool {
        matches!(self, Backend::HostRaw | Backend::CudaRaw)
    }
}

/// Defines, for each `name`, a module `name` with one test per backend, each calling the
/// test file's `fn name(backend: Backend)`. `raw:` before the list restricts it to the raw
/// entries.
#[macro_export]
macro_rules! backend_tests {
    (raw: $($name:ident),* $(,)?) => { $(
        mod $name {
            use super::backends::Backend;
            #[test]
            fn host_raw() { super::$name(Backend::HostRaw) }
            #[test]
            fn cuda_raw() {
                if super::backends::cuda_missing(concat!(stringify!($name), " (CUDA raw entry)")) {
                    return;
                }
                super::$name(Backend::CudaRaw)
            }
        }
    )* };
    ($($name:ident),* $(,)?) => { $(
        mod $name {
            use super::backends::Backend;
            #[test]
            fn reference() { super::$name(Backend::Reference) }
            #[test]
            fn cpu() { super::$name(Backend::Cpu) }
            #[test]
            fn host_raw() { super::$name(Backend::HostRaw) }
            #[test]
            fn cuda_raw() {
                if super::backends::cuda_missing(concat!(stringify!($name), " (CUDA raw entry)")) {
                    return;
                }
                super::$name(Backend::CudaRaw)
            }
        }
    )* };
}

/// Whether there is no CUDA device (then it says so on the real stderr, which the test
/// harness does not capture). Panics instead where `FP4NORM_REQUIRE_GPU=1`.
pub fn cuda_missing(what: &str) -> bool {
    #[cfg(feature = "cuda")]
    if cuda::gpu().is_some() {
        return false;
    }
    #[cfg(not(feature = "cuda"))]
    assert!(
        std::env::var_os("FP4NORM_REQUIRE_GPU").is_none_or(|v| v == "0"),
        "FP4NORM_REQUIRE_GPU is set but fp4norm was built without the cuda feature"
    );
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED (no CUDA device): {what}");
    true
}

/// A matrix argument: buffer, rows, cols, row stride.
#[derive(Clone, Debug, PartialEq)]
pub struct Mat<T> {
    pub data: Vec<T>,
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
}

impl<T: Element> Mat<T> {
    /// A contiguous `rows × cols` matrix.
    pub fn new(data: Vec<T>, rows: usize, cols: usize) -> Self {
        Mat {
            data,
            rows,
            cols,
            stride: cols,
        }
    }

    /// A contiguous `rows × cols` matrix of one value.
    pub fn filled(rows: usize, cols: usize, bits: u16) -> Self {
        Self::new(vec![T::from_bits(bits); rows * cols], rows, cols)
    }

    fn raw(&self, ptr: u64) -> RawMat {
        RawMat {
            ptr,
            rows: self.rows,
            cols: self.cols,
            row_stride: self.stride,
            len: Some(self.data.len()),
        }
    }
}

/// The global scale of a call.
#[derive(Clone, Debug, PartialEq)]
pub enum Gs {
    /// One value for every row.
    Uniform(f32),
    /// One value per row (any length: tests break it on purpose).
    PerRow(Vec<f32>),
}

/// Every buffer of one fused call, host side, at whatever lengths a test chooses: valid
/// ones, or broken on purpose. Outputs hold sentinels the test picks.
#[derive(Clone, Debug, PartialEq)]
pub struct Buffers<T> {
    pub x: Mat<T>,
    pub residual: Option<Mat<T>>,
    pub w: Vec<T>,
    pub q: Vec<u8>,
    pub layout: ScaleLayout,
    pub rm: Vec<u8>,
    pub sw: Vec<u8>,
    pub y_out: Option<Mat<T>>,
    pub gs: Gs,
    pub opts: Options,
}

/// An element every backend takes (the CUDA one copies it to the device).
#[cfg(feature = "cuda")]
pub trait Elem: Element + cudarc::driver::DeviceRepr {}
#[cfg(feature = "cuda")]
impl<T: Element + cudarc::driver::DeviceRepr> Elem for T {}
/// An element every backend takes.
#[cfg(not(feature = "cuda"))]
pub trait Elem: Element {}
#[cfg(not(feature = "cuda"))]
impl<T: Element> Elem for T {}

impl<T: Elem> Buffers<T> {
    /// Runs the call on `backend`, writing the outputs (and the residual) back into these
    /// buffers.
    pub fn run(&mut self, backend: Backend) -> Result<(), Error> {
        self.run_edited(backend, |_| {})
    }

    /// As [`Buffers::run`]; on the raw entries `edit` changes the [`RawCall`] (addresses,
    /// to alias or misalign buffers) before it is made.
    pub fn run_edited(
        &mut self,
        backend: Backend,
        edit: impl FnOnce(&mut RawCall),
    ) -> Result<(), Error> {
        match backend {
            Backend::Reference | Backend::Cpu => self.run_safe(backend),
            Backend::HostRaw => self.run_host_raw(edit),
            #[cfg(feature = "cuda")]
            Backend::CudaRaw => cuda::run(self, edit),
            #[cfg(not(feature = "cuda"))]
            Backend::CudaRaw => unreachable!("skipped without the cuda feature"),
        }
    }

    fn run_safe(&mut self, backend: Backend) -> Result<(), Error> {
        if backend == Backend::Reference {
            return self.run_safe_path(0);
        }
        // The root re-export must do what cpu:: does, from the same start (compared by
        // their Debug text: NaN options are not PartialEq to themselves).
        let mut root = self.clone();
        let result = self.run_safe_path(1);
        let root_result = root.run_safe_path(2);
        assert_eq!(
            format!("{result:?} {self:?}"),
            format!("{root_result:?} {root:?}"),
            "fp4norm::add_rmsnorm_fp4quant and cpu::add_rmsnorm_fp4quant differ"
        );
        result
    }

    /// Path 0: reference, 1: cpu, 2: root re-export.
    fn run_safe_path(&mut self, path: u8) -> Result<(), Error> {
        let Buffers {
            x,
            residual,
            w,
            q,
            layout,
            rm,
            sw,
            y_out,
            gs,
            opts,
        } = self;
        let scales = match layout {
            ScaleLayout::RowMajor => ScaleOut::RowMajor(&mut rm[..]),
            ScaleLayout::Swizzled => ScaleOut::Swizzled(&mut sw[..]),
            ScaleLayout::Both => ScaleOut::Both {
                row_major: &mut rm[..],
                swizzled: &mut sw[..],
            },
        };
        let y_out = match y_out {
            Some(y) => Some(MatMut::with_stride(&mut y.data, y.rows, y.cols, y.stride)?),
            None => None,
        };
        let out = Fp4Out {
            y_fp4: &mut q[..],
            scales,
            y_out,
        };
        let gs = match gs {
            Gs::Uniform(g) => GlobalScale::Uniform(*g),
            Gs::PerRow(g) => GlobalScale::PerRow(g),
        };
        let xv = MatRef::with_stride(&x.data, x.rows, x.cols, x.stride)?;
        match residual {
            Some(r) => {
                let rv = MatMut::with_stride(&mut r.data, r.rows, r.cols, r.stride)?;
                match path {
                    0 => reference::add_rmsnorm_fp4quant(xv, rv, w, out, gs, opts),
                    1 => cpu::add_rmsnorm_fp4quant(xv, rv, w, out, gs, opts),
                    _ => fp4norm::add_rmsnorm_fp4quant(xv, rv, w, out, gs, opts),
                }
            }
            None => match path {
                0 => reference::rmsnorm_fp4quant(xv, w, out, gs, opts),
                1 => cpu::rmsnorm_fp4quant(xv, w, out, gs, opts),
                _ => fp4norm::rmsnorm_fp4quant(xv, w, out, gs, opts),
            },
        }
    }

    /// The call by address; `addr` gives each buffer's address.
    fn raw_call(&self, addr: &Addresses) -> RawCall {
        RawCall {
            dtype: T::DTYPE,
            x: self.x.raw(addr.x),
            residual: self.residual.as_ref().map(|r| r.raw(addr.residual)),
            weight: RawBuf::new(addr.w, self.w.len()),
            y_fp4: RawBuf::new(addr.q, self.q.len()),
            scales: match self.layout {
                ScaleLayout::RowMajor => ScaleOut::RowMajor(RawBuf::new(addr.rm, self.rm.len())),
                ScaleLayout::Swizzled => ScaleOut::Swizzled(RawBuf::new(addr.sw, self.sw.len())),
                ScaleLayout::Both => ScaleOut::Both {
                    row_major: RawBuf::new(addr.rm, self.rm.len()),
                    swizzled: RawBuf::new(addr.sw, self.sw.len()),
                },
            },
            y_out: self.y_out.as_ref().map(|y| y.raw(addr.y_out)),
            global_scale: match &self.gs {
                Gs::Uniform(_) => RawGlobalScale::Uniform(RawBuf::new(addr.gs, 1)),
                Gs::PerRow(g) => RawGlobalScale::PerRow(RawBuf::new(addr.gs, g.len())),
            },
            options: self.opts,
        }
    }

    fn run_host_raw(&mut self, edit: impl FnOnce(&mut RawCall)) -> Result<(), Error> {
        let uniform = match &self.gs {
            Gs::Uniform(g) => vec![*g],
            Gs::PerRow(_) => vec![],
        };
        let ptr = |v: *const u8| v as usize as u64;
        let addr = Addresses {
            x: ptr(self.x.data.as_ptr().cast()),
            residual: self
                .residual
                .as_mut()
                .map_or(0, |r| ptr(r.data.as_mut_ptr().cast())),
            w: ptr(self.w.as_ptr().cast()),
            q: ptr(self.q.as_mut_ptr()),
            rm: ptr(self.rm.as_mut_ptr()),
            sw: ptr(self.sw.as_mut_ptr()),
            y_out: self
                .y_out
                .as_mut()
                .map_or(0, |y| ptr(y.data.as_mut_ptr().cast())),
            gs: match &self.gs {
                Gs::Uniform(_) => ptr(uniform.as_ptr().cast()),
                Gs::PerRow(g) => ptr(g.as_ptr().cast()),
            },
        };
        let mut call = self.raw_call(&addr);
        edit(&mut call);
        // SAFETY: every address is one of this struct's live buffers (or what `edit` made
        // of them: run_host validates before touching anything, and edits only alias,
        // misalign or null these buffers' addresses, which validation refuses).
        unsafe { run_host(&call, HostEngine::Cpu) }
    }
}

/// The address of each buffer of a call.
struct Addresses {
    x: u64,
    residual: u64,
    w: u64,
    q: u64,
    rm: u64,
    sw: u64,
    y_out: u64,
    gs: u64,
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::sync::{Arc, OnceLock};

    use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr};
    use fp4norm::cuda::Gpu;
    use fp4norm::{Error, RawCall};

    use super::{Addresses, Buffers, Elem, Gs};

    /// Device 0, opened once (None without a device; a failure where FP4NORM_REQUIRE_GPU=1).
    pub fn gpu() -> Option<&'static (Gpu, Arc<CudaStream>)> {
        static GPU: OnceLock<Option<(Gpu, Arc<CudaStream>)>> = OnceLock::new();
        GPU.get_or_init(|| {
            let require = std::env::var_os("FP4NORM_REQUIRE_GPU").is_some_and(|v| v != "0");
            if fp4norm::cuda::device_count() == 0 {
                assert!(
                    !require,
                    "FP4NORM_REQUIRE_GPU is set but no CUDA device was found"
                );
                return None;
            }
            let g = Gpu::new(0).expect("opening CUDA device 0");
            let s = g.context().new_stream().expect("a stream");
            Some((g, s))
        })
        .as_ref()
    }

    /// A device copy of `v` (one element at least: the raw call carries `v`'s own length).
    fn up<T: DeviceRepr + Copy + Default>(s: &Arc<CudaStream>, v: &[T]) -> CudaSlice<T> {
        let one = [T::default()];
        s.clone_htod(if v.is_empty() { &one[..] } else { v })
            .expect("copy to the device")
    }

    fn down<T: DeviceRepr + Copy + Default>(s: &Arc<CudaStream>, d: &CudaSlice<T>, v: &mut [T]) {
        if !v.is_empty() {
            let all: Vec<T> = s.clone_dtoh(d).expect("copy from the device");
            v.copy_from_slice(&all[..v.len()]);
        }
    }

    pub fn run<T: Elem>(b: &mut Buffers<T>, edit: impl FnOnce(&mut RawCall)) -> Result<(), Error> {
        let (g, s) = gpu().expect("CUDA tests run only with a device");
        let gs: Vec<f32> = match &b.gs {
            Gs::Uniform(v) => vec![*v],
            Gs::PerRow(v) => v.clone(),
        };
        let x = up(s, &b.x.data);
        let r = b.residual.as_ref().map(|m| up(s, &m.data));
        let w = up(s, &b.w);
        let q = up(s, &b.q);
        let rm = up(s, &b.rm);
        let sw = up(s, &b.sw);
        let y = b.y_out.as_ref().map(|m| up(s, &m.data));
        let gsd = up(s, &gs);
        let p = |d: &CudaSlice<T>| d.device_ptr(s).0;
        let p8 = |d: &CudaSlice<u8>| d.device_ptr(s).0;
        let addr = Addresses {
            x: p(&x),
            residual: r.as_ref().map_or(0, p),
            w: p(&w),
            q: p8(&q),
            rm: p8(&rm),
            sw: p8(&sw),
            y_out: y.as_ref().map_or(0, p),
            gs: gsd.device_ptr(s).0,
        };
        let mut call = b.raw_call(&addr);
        edit(&mut call);
        // SAFETY: device buffers of this GPU, alive until after the synchronisation below,
        // each at least as long as the length the call carries (or edited into aliases of
        // each other or misaligned addresses, which validation refuses).
        let result = unsafe { g.launch_raw(s.cu_stream(), &call) };
        s.synchronize().expect("synchronising the test stream");
        if let (Some(m), Some(d)) = (b.residual.as_mut(), r.as_ref()) {
            down(s, d, &mut m.data);
        }
        if let (Some(m), Some(d)) = (b.y_out.as_mut(), y.as_ref()) {
            down(s, d, &mut m.data);
        }
        down(s, &q, &mut b.q);
        down(s, &rm, &mut b.rm);
        down(s, &sw, &mut b.sw);
        result
    }
}
