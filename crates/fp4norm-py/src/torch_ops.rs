//! The `fp4norm::*` PyTorch operators' CPU and CUDA kernels, registered with the
//! dispatcher through PyTorch's stable C ABI (the `aoti_torch_*` / `torch_*` functions of
//! libtorch; no torch headers, no C++ extension build).
//!
//! The schemas are defined in Python (`fp4norm/_ops.py`, with their fake kernels); this
//! module registers boxed kernels for them. A kernel reads its arguments off the
//! dispatcher's stack, checks them (tensor metadata here, then the one validator of its
//! op, [`fp4norm::RawCall::validate`] or [`fp4norm::fp8::RawFp8Call::validate`]) before
//! anything is written, runs the CPU backend or enqueues the CUDA kernel on PyTorch's
//! current stream, and returns its outputs. A failure becomes a C++ exception that PyTorch
//! raises in Python as RuntimeError; its message starts with `fp4norm.<PythonClass>: ` so
//! that the Python layer can re-raise it as that class.
//!
//! Stack conventions (PyTorch ≥ 2.10, `torch/csrc/shim_common.cpp`): a Tensor argument is
//! an owning tensor handle; an optional argument is null or a heap box holding the value,
//! freed by the kernel; a `str` is an owning string handle; outputs are owning handles
//! that PyTorch takes over; a `Tensor[]` is an owning list handle whose items are owning
//! tensor handles (the kernel frees the list and each tensor). From 2.13 libtorch allocates
//! the boxes with `torch_new_stable_ivalue` and asks for `torch_delete_stable_ivalue`, used
//! where present (before, `delete` of the C++ shim); from 2.13 a failing libtorch call no
//! longer logs its cause, which `torch_exception_get_what_without_backtrace` then gives.

use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::OnceLock;

use fp4norm::cuda::{Gpu, LaunchOptions, RawStream};
use fp4norm::fp8::{
    run_host_fp8, Fp8Element, Fp8Problem, Fp8ScaleFormat, Fp8ScaleLayout, RawFp8Call,
};
use fp4norm::raw::{run_host, HostEngine};
use fp4norm::{
    BlockSize, DType, Error, Fp4Format, Options, Problem, RawBuf, RawCall, RawDequant,
    RawGlobalScale, RawMat, ScaleFormat, ScaleLayout, ScaleOut,
};

use crate::{args, Fail};

type Handle = *mut c_void;
type Code = i32;
type Status = i32;

extern "C-unwind" {
    fn fp4norm_delete_boxed_ivalue(boxed: *mut u64);
    fn fp4norm_throw(message: *const c_char, len: usize) -> !;
}

/// The stable-ABI version whose stack conventions these kernels follow (2.10).
const STABLE_ABI_2_10: u64 = (2 << 56) | (10 << 48);

/// The dtype codes of float8_e8m0fnu and float4_e2m1fn_x2 where libtorch has no getter for
/// them (2.10; `torch_dtype_float8_e8m0fnu` / `torch_dtype_float4_e2m1fn_x2` came in 2.11):
/// their `c10::ScalarType` numbers, which are fixed (AOTInductor serialises them) and what
/// the getters return.
const SCALAR_TYPE_E8M0: Code = 44;
const SCALAR_TYPE_FP4X2: Code = 45;

macro_rules! api {
    ($($field:ident: $sym:literal => fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// libtorch's stable-ABI functions the kernels call.
        struct Api {
            $($field: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
        }
        impl Api {
            /// # Safety
            /// `lib` must be libtorch (its symbols have these signatures).
            unsafe fn load(lib: &libloading::Library) -> Result<Self, String> {
                Ok(Api {
                    // SAFETY: the caller's guarantee: each symbol has the declared type.
                    $($field: unsafe {
                        *lib.get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>(
                            concat!($sym, "\0").as_bytes()
                        ).map_err(|e| format!("{}: {e}", $sym))?
                    },)*
                })
            }
        }
    };
}

api! {
    abi_version: "aoti_torch_abi_version" => fn() -> u64;
    delete_tensor: "aoti_torch_delete_tensor_object" => fn(Handle) -> Status;
    data_ptr: "aoti_torch_get_data_ptr" => fn(Handle, *mut *mut c_void) -> Status;
    dim: "aoti_torch_get_dim" => fn(Handle, *mut i64) -> Status;
    sizes: "aoti_torch_get_sizes" => fn(Handle, *mut *mut i64) -> Status;
    strides: "aoti_torch_get_strides" => fn(Handle, *mut *mut i64) -> Status;
    dtype: "aoti_torch_get_dtype" => fn(Handle, *mut Code) -> Status;
    device_type: "aoti_torch_get_device_type" => fn(Handle, *mut Code) -> Status;
    device_index: "aoti_torch_get_device_index" => fn(Handle, *mut i32) -> Status;
    layout: "aoti_torch_get_layout" => fn(Handle, *mut Code) -> Status;
    storage_offset: "aoti_torch_get_storage_offset" => fn(Handle, *mut i64) -> Status;
    storage_nbytes: "aoti_torch_get_storage_size" => fn(Handle, *mut i64) -> Status;
    empty_strided: "aoti_torch_empty_strided" =>
        fn(i64, *const i64, *const i64, Code, Code, i32, *mut Handle) -> Status;
    string_length: "torch_string_length" => fn(*mut c_void, *mut usize) -> Status;
    string_c_str: "torch_string_c_str" => fn(*mut c_void, *mut *const c_char) -> Status;
    delete_string: "torch_delete_string" => fn(*mut c_void) -> Status;
    list_size: "torch_list_size" => fn(*mut c_void, *mut usize) -> Status;
    list_get_item: "torch_list_get_item" => fn(*mut c_void, usize, *mut u64) -> Status;
    delete_list: "torch_delete_list" => fn(*mut c_void) -> Status;
    create_device_guard: "aoti_torch_create_device_guard" => fn(i32, *mut *mut c_void) -> Status;
    delete_device_guard: "aoti_torch_delete_device_guard" => fn(*mut c_void) -> Status;
    library_init_impl: "aoti_torch_library_init_impl" =>
        fn(*const c_char, *const c_char, *const c_char, u32, *mut *mut c_void) -> Status;
    library_impl: "torch_library_impl" =>
        fn(*mut c_void, *const c_char, extern "C-unwind" fn(*mut u64, u64, u64), u64) -> Status;
    dtype_bf16: "aoti_torch_dtype_bfloat16" => fn() -> Code;
    dtype_f16: "aoti_torch_dtype_float16" => fn() -> Code;
    dtype_f32: "aoti_torch_dtype_float32" => fn() -> Code;
    dtype_f64: "aoti_torch_dtype_float64" => fn() -> Code;
    dtype_u8: "aoti_torch_dtype_uint8" => fn() -> Code;
    dtype_i8: "aoti_torch_dtype_int8" => fn() -> Code;
    dtype_i16: "aoti_torch_dtype_int16" => fn() -> Code;
    dtype_i32: "aoti_torch_dtype_int32" => fn() -> Code;
    dtype_i64: "aoti_torch_dtype_int64" => fn() -> Code;
    dtype_bool: "aoti_torch_dtype_bool" => fn() -> Code;
    dtype_e4m3: "aoti_torch_dtype_float8_e4m3fn" => fn() -> Code;
    dtype_e5m2: "aoti_torch_dtype_float8_e5m2" => fn() -> Code;
    device_cpu: "aoti_torch_device_type_cpu" => fn() -> Code;
    device_cuda: "aoti_torch_device_type_cuda" => fn() -> Code;
    layout_strided: "aoti_torch_layout_strided" => fn() -> Code;
}

/// The dtypes, device types and layout codes of this libtorch, read once.
struct Codes {
    bf16: Code,
    f16: Code,
    f32: Code,
    u8: Code,
    e4m3: Code,
    e5m2: Code,
    e8m0: Code,
    fp4x2: Code,
    cpu: Code,
    cuda: Code,
    strided: Code,
    /// (code, name) of every dtype a message may need to name.
    names: Vec<(Code, &'static str)>,
}

impl Codes {
    /// The dtypes a scale output may have; the first is what fp4norm allocates
    /// (FlashInfer's: float8_e4m3fn for E4M3, uint8 for UE8M0).
    fn scale_dtypes(&self, format: ScaleFormat) -> [Code; 2] {
        match format {
            ScaleFormat::E4M3 => [self.e4m3, self.u8],
            ScaleFormat::UE8M0 => [self.u8, self.e8m0],
        }
    }
}

struct Torch {
    api: Api,
    codes: Codes,
    /// `aoti_torch_get_current_cuda_stream`, from libtorch_cuda where PyTorch has CUDA.
    current_cuda_stream: Option<unsafe extern "C" fn(i32, *mut *mut c_void) -> Status>,
    /// `torch_delete_stable_ivalue` (PyTorch 2.13 on): frees an optional argument's box.
    delete_box: Option<unsafe extern "C" fn(*mut u64) -> Status>,
    /// `torch_exception_get_what_without_backtrace` (PyTorch 2.13 on): the message of this
    /// thread's last libtorch exception.
    last_error: Option<unsafe extern "C" fn() -> *const c_char>,
    /// `aoti_torch_is_defined`: whether a tensor argument is defined (None passed for a
    /// `Tensor` argument reaches a kernel as an undefined tensor).
    is_defined: Option<unsafe extern "C" fn(Handle, *mut bool) -> Status>,
    /// The libraries stay loaded (and the registrations alive) for the process.
    _libs: Vec<libloading::Library>,
}

static TORCH: OnceLock<Torch> = OnceLock::new();

fn torch() -> &'static Torch {
    TORCH.get().expect("kernels run only after register()")
}

/// Loads libtorch's stable ABI from `libtorch_cpu` (and `libtorch_cuda`, where PyTorch has
/// CUDA) and registers the CPU and CUDA kernels of the `fp4norm` operators, whose schemas
/// the caller has defined. Returns the stable-ABI version of this PyTorch.
pub fn register(libtorch_cpu: &str, libtorch_cuda: Option<&str>) -> Result<u64, String> {
    if let Some(t) = TORCH.get() {
        // SAFETY: a loaded libtorch function without arguments.
        return Ok(unsafe { (t.api.abi_version)() });
    }
    // SAFETY: the caller names PyTorch's own libraries, already loaded by `import torch`;
    // opening them again only adds a reference.
    let cpu = unsafe { libloading::Library::new(libtorch_cpu) }
        .map_err(|e| format!("{libtorch_cpu}: {e}"))?;
    // SAFETY: this is libtorch; the api! table declares its functions' C signatures.
    let api = unsafe { Api::load(&cpu)? };
    // SAFETY: a libtorch function without arguments.
    let version = unsafe { (api.abi_version)() };
    if version < STABLE_ABI_2_10 {
        return Err(format!(
            "PyTorch's stable ABI is {:#x}; fp4norm's operators need PyTorch 2.10 or newer",
            version
        ));
    }
    // SAFETY (both): the symbols' C signatures, as declared in stable/c/shim.h (2.13 on);
    // absent before, which leaves the older conventions in force.
    let delete_box = unsafe {
        cpu.get::<unsafe extern "C" fn(*mut u64) -> Status>(b"torch_delete_stable_ivalue\0")
            .ok()
            .map(|f| *f)
    };
    let last_error = unsafe {
        cpu.get::<unsafe extern "C" fn() -> *const c_char>(
            b"torch_exception_get_what_without_backtrace\0",
        )
        .ok()
        .map(|f| *f)
    };
    // SAFETY: the symbol's C signature, as declared in aoti_torch/c/shim.h.
    let is_defined = unsafe {
        cpu.get::<unsafe extern "C" fn(Handle, *mut bool) -> Status>(b"aoti_torch_is_defined\0")
            .ok()
            .map(|f| *f)
    };
    let dtype_or = |symbol: &[u8], fixed: Code| -> Code {
        // SAFETY: a dtype getter's C signature (stable/c/shim.h, 2.11 on), without arguments.
        unsafe { cpu.get::<unsafe extern "C" fn() -> Code>(symbol) }
            .map(|f| unsafe { f() })
            .unwrap_or(fixed)
    };
    let e8m0 = dtype_or(b"torch_dtype_float8_e8m0fnu\0", SCALAR_TYPE_E8M0);
    let fp4x2 = dtype_or(b"torch_dtype_float4_e2m1fn_x2\0", SCALAR_TYPE_FP4X2);
    let mut libs = vec![cpu];
    let mut current_cuda_stream = None;
    if let Some(path) = libtorch_cuda {
        // SAFETY: as for libtorch_cpu.
        let cuda = unsafe { libloading::Library::new(path) }.map_err(|e| format!("{path}: {e}"))?;
        // SAFETY: the symbol's C signature, as declared in aoti_torch/c/shim.h.
        current_cuda_stream = Some(unsafe {
            *cuda
                .get::<unsafe extern "C" fn(i32, *mut *mut c_void) -> Status>(
                    b"aoti_torch_get_current_cuda_stream\0",
                )
                .map_err(|e| format!("{path}: {e}"))?
        });
        libs.push(cuda);
    }
    // SAFETY (all below): libtorch functions without arguments.
    let codes = unsafe {
        Codes {
            bf16: (api.dtype_bf16)(),
            f16: (api.dtype_f16)(),
            f32: (api.dtype_f32)(),
            u8: (api.dtype_u8)(),
            e4m3: (api.dtype_e4m3)(),
            e5m2: (api.dtype_e5m2)(),
            e8m0,
            fp4x2,
            cpu: (api.device_cpu)(),
            cuda: (api.device_cuda)(),
            strided: (api.layout_strided)(),
            names: vec![
                ((api.dtype_bf16)(), "bfloat16"),
                ((api.dtype_f16)(), "float16"),
                ((api.dtype_f32)(), "float32"),
                ((api.dtype_f64)(), "float64"),
                ((api.dtype_u8)(), "uint8"),
                ((api.dtype_i8)(), "int8"),
                ((api.dtype_i16)(), "int16"),
                ((api.dtype_i32)(), "int32"),
                ((api.dtype_i64)(), "int64"),
                ((api.dtype_bool)(), "bool"),
                ((api.dtype_e4m3)(), "float8_e4m3fn"),
                ((api.dtype_e5m2)(), "float8_e5m2"),
                (e8m0, "float8_e8m0fnu"),
                (fp4x2, "float4_e2m1fn_x2"),
            ],
        }
    };
    let t = Torch {
        api,
        codes,
        current_cuda_stream,
        delete_box,
        last_error,
        is_defined,
        _libs: libs,
    };
    let t = TORCH.get_or_init(|| t);
    for key in ["CPU", "CUDA"] {
        let mut lib: *mut c_void = std::ptr::null_mut();
        let ns = CString::new("fp4norm").expect("no NUL");
        let k = CString::new(key).expect("no NUL");
        let file = CString::new(file!()).expect("no NUL");
        // SAFETY: valid C strings and an out-pointer; the library object is never freed,
        // so the registrations last for the process.
        let status = unsafe {
            (t.api.library_init_impl)(ns.as_ptr(), k.as_ptr(), file.as_ptr(), line!(), &mut lib)
        };
        if status != 0 || lib.is_null() {
            return Err(format!("registering the fp4norm {key} kernels failed"));
        }
        // Each family's kernel is one function, its overloads told apart by its const
        // parameters (see each: a residual, the overload, the fused all-reduce's inputs).
        let kernels: [(&str, extern "C-unwind" fn(*mut u64, u64, u64)); 19] = [
            ("add_rmsnorm_fp4quant", functional::<true, false, false>),
            ("add_rmsnorm_fp4quant.both", functional::<true, true, false>),
            ("add_rmsnorm_fp4quant.out", out_form::<true, false>),
            ("rmsnorm_fp4quant", functional::<false, false, false>),
            ("rmsnorm_fp4quant.both", functional::<false, true, false>),
            ("rmsnorm_fp4quant.out", out_form::<false, false>),
            ("dequantize", boxed_dequantize),
            ("rmsnorm_quant", static_quant::<false, false>),
            ("fused_add_rmsnorm_quant", static_quant::<true, false>),
            ("add_rmsnorm_fp8quant", dynamic_quant::<true, false, false>),
            (
                "add_rmsnorm_fp8quant.out",
                dynamic_quant::<true, true, false>,
            ),
            ("rmsnorm_fp8quant", dynamic_quant::<false, false, false>),
            ("rmsnorm_fp8quant.out", dynamic_quant::<false, true, false>),
            // The fused all-reduce (SPEC.md §9): `Tensor[] inputs` in input's place.
            (
                "allreduce_add_rmsnorm_fp4quant",
                functional::<true, false, true>,
            ),
            (
                "allreduce_add_rmsnorm_fp4quant.both",
                functional::<true, true, true>,
            ),
            ("allreduce_add_rmsnorm_fp4quant.out", out_form::<true, true>),
            (
                "allreduce_add_rmsnorm_fp8quant",
                dynamic_quant::<true, false, true>,
            ),
            (
                "allreduce_add_rmsnorm_fp8quant.out",
                dynamic_quant::<true, true, true>,
            ),
            (
                "allreduce_fused_add_rmsnorm_quant",
                static_quant::<true, true>,
            ),
        ];
        for (name, f) in kernels {
            let cname = CString::new(name).expect("no NUL");
            // SAFETY: a live library object, a C string and a boxed kernel of the right type.
            let status = unsafe { (t.api.library_impl)(lib, cname.as_ptr(), f, STABLE_ABI_2_10) };
            if status != 0 {
                return Err(format!("registering fp4norm::{name} for {key} failed"));
            }
        }
    }
    Ok(version)
}

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

fn value<T>(msg: String) -> Result<T, Fail> {
    Err(Fail::Value(msg))
}

/// A libtorch call's status as a result; a failure names the step, and its cause where
/// libtorch keeps it (2.13 on).
fn status(s: Status, what: &str) -> Result<(), Fail> {
    if s == 0 {
        return Ok(());
    }
    // SAFETY: a libtorch function without arguments; its result is null or a C string
    // valid until this thread's next libtorch exception, copied here at once.
    let cause = torch()
        .last_error
        .map(|f| unsafe { f() })
        .filter(|p| !p.is_null())
        .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
    Err(Fail::Runtime(match cause {
        Some(c) if !c.is_empty() => format!("libtorch failed in {what}: {c}"),
        _ => format!("libtorch failed in {what}"),
    }))
}

/// Runs a kernel body and turns its failure (or a panic) into the C++ exception the
/// dispatcher propagates. Nothing of the body is alive when the exception is thrown.
fn run_boxed(body: impl FnOnce() -> Result<(), Fail>) {
    let failure = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => return,
        Ok(Err(f)) => f.message(),
        Err(_) => "fp4norm.RuntimeError: internal error (a panic in fp4norm; please report it)"
            .to_string(),
    };
    let bytes = failure.into_bytes();
    // SAFETY: a valid buffer; the shim copies it before throwing.
    unsafe { fp4norm_throw(bytes.as_ptr() as *const c_char, bytes.len()) }
}

// ---------------------------------------------------------------------------------------
// Tensors off the stack
// ---------------------------------------------------------------------------------------

/// An owned tensor handle (released on drop).
struct Tensor(Handle);

impl Drop for Tensor {
    fn drop(&mut self) {
        // SAFETY: an owning handle, released once.
        unsafe { (torch().api.delete_tensor)(self.0) };
    }
}

impl Tensor {
    /// Gives up ownership (to the dispatcher, as an output).
    fn into_raw(self) -> u64 {
        let h = self.0;
        std::mem::forget(self);
        h as u64
    }
}

/// The stack of one call: the arguments in schema order, then the outputs.
struct Stack {
    slots: *mut u64,
    len: usize,
}

impl Stack {
    fn slot(&self, i: usize) -> u64 {
        assert!(i < self.len, "argument {i} of {}", self.len);
        // SAFETY: in bounds of the dispatcher's stack.
        unsafe { *self.slots.add(i) }
    }

    fn set(&mut self, i: usize, v: u64) {
        assert!(i < self.len, "output {i} of {}", self.len);
        // SAFETY: in bounds of the dispatcher's stack.
        unsafe { *self.slots.add(i) = v }
    }

    fn tensor(&self, i: usize) -> Tensor {
        Tensor(self.slot(i) as Handle)
    }

    /// Unboxes an optional argument (freeing the box).
    fn optional(&self, i: usize) -> Option<u64> {
        let boxed = self.slot(i) as *mut u64;
        if boxed.is_null() {
            return None;
        }
        // SAFETY: a box libtorch allocated for this argument, read and freed once.
        let v = unsafe { *boxed };
        match torch().delete_box {
            // SAFETY: as above; the function libtorch names for freeing it.
            Some(delete) => unsafe {
                delete(boxed);
            },
            // SAFETY: as above (before 2.13 libtorch allocated it with `new`).
            None => unsafe { fp4norm_delete_boxed_ivalue(boxed) },
        }
        Some(v)
    }

    fn optional_tensor(&self, i: usize) -> Option<Tensor> {
        self.optional(i).map(|h| Tensor(h as Handle))
    }

    fn f64(&self, i: usize) -> f64 {
        f64::from_bits(self.slot(i))
    }

    fn i64(&self, i: usize) -> i64 {
        self.slot(i) as i64
    }

    fn bool(&self, i: usize) -> bool {
        self.slot(i) & 0xFF != 0
    }

    fn optional_bool(&self, i: usize) -> Option<bool> {
        self.optional(i).map(|v| v & 0xFF != 0)
    }

    /// An optional `str` (freeing its string handle).
    fn optional_str(&self, i: usize) -> Result<Option<String>, Fail> {
        match self.optional(i) {
            None => Ok(None),
            Some(handle) => take_string(handle as *mut c_void).map(Some),
        }
    }

    /// A `str` (freeing its string handle).
    fn string(&self, i: usize) -> Result<String, Fail> {
        take_string(self.slot(i) as *mut c_void)
    }

    /// A `Tensor[]`: its tensors, owned (the list handle is freed here).
    fn tensor_list(&self, i: usize) -> Result<Vec<Tensor>, Fail> {
        let api = &torch().api;
        let list = self.slot(i) as *mut c_void;
        let mut n = 0usize;
        // SAFETY: an owning list handle of this call's stack; read, then freed once below.
        let sized = status(unsafe { (api.list_size)(list, &mut n) }, "reading a list");
        let mut tensors = Vec::with_capacity(n);
        let mut read = sized;
        if read.is_ok() {
            for k in 0..n {
                let mut item = 0u64;
                // SAFETY: an index below the list's size; the item is an owning tensor handle.
                read = status(
                    unsafe { (api.list_get_item)(list, k, &mut item) },
                    "reading a list",
                );
                if read.is_err() {
                    break;
                }
                tensors.push(Tensor(item as Handle));
            }
        }
        // SAFETY: the list handle, freed once (its items are owned by `tensors` now).
        unsafe { (api.delete_list)(list) };
        read.map(|()| tensors)
    }
}

/// The text of an owning string handle, which is released (also when reading fails).
fn take_string(h: *mut c_void) -> Result<String, Fail> {
    let api = &torch().api;
    let (mut len, mut data) = (0usize, std::ptr::null());
    // SAFETY: an owning string handle; read, then released once.
    let read = unsafe {
        status((api.string_length)(h, &mut len), "reading a string")
            .and_then(|_| status((api.string_c_str)(h, &mut data), "reading a string"))
            .map(|_| {
                String::from_utf8_lossy(std::slice::from_raw_parts(data.cast::<u8>(), len))
                    .into_owned()
            })
    };
    // SAFETY: as above.
    unsafe { (api.delete_string)(h) };
    read
}

const MAX_DIMS: usize = 8;

/// What a kernel needs to know of a tensor argument.
struct Meta {
    name: &'static str,
    ptr: u64,
    dim: usize,
    sizes: [i64; MAX_DIMS],
    strides: [i64; MAX_DIMS],
    dtype: Code,
    device_type: Code,
    device_index: i32,
    layout: Code,
    storage_offset: i64,
    storage_nbytes: i64,
}

impl Meta {
    fn read(name: &'static str, t: &Tensor) -> Result<Meta, Fail> {
        let api = &torch().api;
        let h = t.0;
        let mut m = Meta {
            name,
            ptr: 0,
            dim: 0,
            sizes: [0; MAX_DIMS],
            strides: [0; MAX_DIMS],
            dtype: -1,
            device_type: -1,
            device_index: -1,
            layout: -1,
            storage_offset: 0,
            storage_nbytes: 0,
        };
        let (mut ptr, mut dim) = (std::ptr::null_mut(), 0i64);
        let (mut sizes, mut strides) = (std::ptr::null_mut(), std::ptr::null_mut());
        // An undefined tensor (None for a `Tensor` argument) fails one of these reads; only
        // then is definedness asked, which keeps a shim call per tensor off every call.
        let mut read = || -> Result<(), Fail> {
            // SAFETY (every call): a live tensor handle and out-pointers of the declared
            // types; sizes and strides are borrowed for the handle's life and copied at once.
            unsafe {
                status((api.layout)(h, &mut m.layout), "reading a tensor")?;
                if m.layout != torch().codes.strided {
                    return Err(Fail::Type(format!(
                        "{name} must be a dense (strided) tensor"
                    )));
                }
                status((api.data_ptr)(h, &mut ptr), "reading a tensor")?;
                status((api.dim)(h, &mut dim), "reading a tensor")?;
                status((api.sizes)(h, &mut sizes), "reading a tensor")?;
                status((api.strides)(h, &mut strides), "reading a tensor")?;
                status((api.dtype)(h, &mut m.dtype), "reading a tensor")?;
                status((api.device_type)(h, &mut m.device_type), "reading a tensor")?;
                status(
                    (api.device_index)(h, &mut m.device_index),
                    "reading a tensor",
                )?;
                status(
                    (api.storage_offset)(h, &mut m.storage_offset),
                    "reading a tensor",
                )?;
                status(
                    (api.storage_nbytes)(h, &mut m.storage_nbytes),
                    "reading a tensor",
                )?;
                if dim < 0 || dim as usize > MAX_DIMS {
                    return value(format!(
                        "{name} has {dim} dimensions; fp4norm takes at most {MAX_DIMS}"
                    ));
                }
                m.dim = dim as usize;
                for d in 0..m.dim {
                    m.sizes[d] = *sizes.add(d);
                    m.strides[d] = *strides.add(d);
                }
                Ok(())
            }
        };
        read().map_err(|e| Self::undefined(name, h).unwrap_or(e))?;
        m.ptr = ptr as u64;
        Ok(m)
    }

    /// The error for an undefined tensor `h`, if it is one.
    fn undefined(name: &'static str, h: Handle) -> Option<Fail> {
        let is_defined = torch().is_defined?;
        let mut defined = true;
        // SAFETY: a live tensor handle and an out-pointer.
        if unsafe { is_defined(h, &mut defined) } != 0 || defined {
            return None;
        }
        let hint = if name == "residual" {
            " (the op adds it; use the rmsnorm_* form for no residual)"
        } else {
            ""
        };
        Some(Fail::Type(format!("{name} is required, got None{hint}")))
    }

    fn shape(&self) -> &[i64] {
        &self.sizes[..self.dim]
    }

    fn stride(&self) -> &[i64] {
        &self.strides[..self.dim]
    }

    fn numel(&self) -> usize {
        self.shape().iter().map(|&s| s as usize).product()
    }

    fn dtype_name(&self) -> String {
        dtype_name(self.dtype)
    }

    fn need_dtype(&self, allowed: &[Code]) -> Result<(), Fail> {
        if allowed.contains(&self.dtype) {
            return Ok(());
        }
        let names: Vec<String> = allowed.iter().map(|&c| dtype_name(c)).collect();
        Err(Fail::Type(format!(
            "{} has dtype {}; expected {}",
            self.name,
            self.dtype_name(),
            names.join(" or ")
        )))
    }

    fn element_size(&self) -> usize {
        let c = &torch().codes;
        if self.dtype == c.bf16 || self.dtype == c.f16 {
            2
        } else if self.dtype == c.f32 {
            4
        } else {
            1
        }
    }

    /// Refuses a tensor whose elements are not all inside its storage (a storage freed or
    /// shrunk under a live view, as FSDP-style code does) or that has negative strides.
    fn check_storage(&self) -> Result<(), Fail> {
        if self.numel() == 0 {
            return Ok(());
        }
        let mut span: i64 = 1;
        for (&n, &st) in self.shape().iter().zip(self.stride()) {
            if st < 0 {
                return value(format!(
                    "{}: negative strides {:?} are not supported",
                    self.name,
                    self.stride()
                ));
            }
            span = span.saturating_add((n - 1).saturating_mul(st));
        }
        let need =
            (self.storage_offset.saturating_add(span)).saturating_mul(self.element_size() as i64);
        if need > self.storage_nbytes {
            return value(format!(
                "{}: its elements reach byte {need} of a storage of {} bytes (the storage was \
                 freed or resized under this view)",
                self.name, self.storage_nbytes
            ));
        }
        if self.ptr == 0 {
            // A wrapper subclass (or a meta / fake tensor) reports a storage of the right
            // size whose data pointer is null: there is no memory to read or write.
            return value(format!(
                "{} has no storage (a tensor subclass or a meta/fake tensor?): fp4norm's kernels \
                 read and write a tensor's memory; pass a plain tensor, or call the operator \
                 through torch.ops so that the subclass sees it",
                self.name
            ));
        }
        Ok(())
    }

    /// Whether the tensor is one dense block in row-major order. A tensor without
    /// elements is, whatever its strides (as PyTorch's `is_contiguous` says): torch
    /// allocates `[2, 0, H]` with strides `[H, H, 1]`.
    fn is_contiguous(&self) -> bool {
        if self.shape().contains(&0) {
            return true;
        }
        let mut expected = 1i64;
        for d in (0..self.dim).rev() {
            if self.sizes[d] != 1 && self.strides[d] != expected {
                return false;
            }
            expected *= self.sizes[d];
        }
        true
    }

    /// An output as one flat buffer (it must be contiguous).
    fn flat(&self) -> Result<RawBuf, Fail> {
        self.flat_as("written")
    }

    /// An input read as one flat buffer (it must be contiguous).
    fn flat_read(&self) -> Result<RawBuf, Fail> {
        self.flat_as("read")
    }

    fn flat_as(&self, how: &str) -> Result<RawBuf, Fail> {
        if !self.is_contiguous() {
            return value(format!(
                "{} must be contiguous (shape {:?}, strides {:?}): it is {how} as one flat buffer",
                self.name,
                self.shape(),
                self.stride()
            ));
        }
        Ok(RawBuf::new(self.ptr, self.numel()))
    }

    /// A 2-D `[M, H]` or 3-D `[B, S, H]` tensor as `M` evenly spaced rows of `H` contiguous
    /// elements (never a copy: a layout that is not such rows is refused).
    fn rows(&self) -> Result<RawMat, Fail> {
        if self.dim != 2 && self.dim != 3 {
            return value(format!(
                "{} must be 2-D [M, H] or 3-D [B, S, H]; got shape {:?}",
                self.name,
                self.shape()
            ));
        }
        let cols = self.sizes[self.dim - 1] as usize;
        let rows: usize = self.sizes[..self.dim - 1]
            .iter()
            .map(|&s| s as usize)
            .product();
        if rows == 0 || cols == 0 {
            return Ok(RawMat::contiguous(self.ptr, rows, cols));
        }
        if cols > 1 && self.strides[self.dim - 1] != 1 {
            return value(format!(
                "{}: the last (hidden) dimension must be contiguous (stride 1); got strides {:?} \
                 (in elements). Rows may be strided, elements may not; fp4norm never copies a \
                 tensor behind your back",
                self.name,
                self.stride()
            ));
        }
        let mut row_stride: Option<i64> = None;
        let mut expected = 0i64;
        for d in (0..self.dim - 1).rev() {
            let (size, stride) = (self.sizes[d], self.strides[d]);
            if size == 1 {
                continue;
            }
            match row_stride {
                None => row_stride = Some(stride),
                Some(_) if stride != expected => {
                    return value(format!(
                        "{}: the leading dimensions of shape {:?} with strides {:?} cannot be \
                         flattened into evenly spaced rows; pass a tensor whose rows are one \
                         stride apart",
                        self.name,
                        self.shape(),
                        self.stride()
                    ))
                }
                Some(_) => {}
            }
            expected = stride * size;
        }
        let row_stride = row_stride.unwrap_or(cols as i64);
        if row_stride < 0 {
            return value(format!("{}: negative row stride {row_stride}", self.name));
        }
        let mat = RawMat {
            ptr: self.ptr,
            rows,
            cols,
            row_stride: row_stride as usize,
            len: None,
        };
        Ok(RawMat {
            len: Some(mat.extent(self.name)?),
            ..mat
        })
    }
}

fn dtype_name(code: Code) -> String {
    torch()
        .codes
        .names
        .iter()
        .find(|(c, _)| *c == code)
        .map_or_else(|| format!("(dtype code {code})"), |(_, n)| n.to_string())
}

/// The name of a `c10::DeviceType` (fixed numbers: serialised by AOTInductor), as
/// `torch.device` writes it.
fn device_type_name(code: Code) -> String {
    const NAMES: [&str; 21] = [
        "cpu",
        "cuda",
        "mkldnn",
        "opengl",
        "opencl",
        "ideep",
        "hip",
        "fpga",
        "maia",
        "xla",
        "vulkan",
        "metal",
        "xpu",
        "mps",
        "meta",
        "hpu",
        "ve",
        "lazy",
        "ipu",
        "mtia",
        "privateuseone",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("of type code {code}"), |n| n.to_string())
}

/// Where a call runs: the input's device.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Cpu,
    Cuda(i32),
}

impl Place {
    fn of(m: &Meta) -> Result<Place, Fail> {
        let c = &torch().codes;
        if m.device_type == c.cpu {
            Ok(Place::Cpu)
        } else if m.device_type == c.cuda {
            Ok(Place::Cuda(m.device_index.max(0)))
        } else {
            value(format!(
                "{} is on device {}: fp4norm runs on CPU and CUDA tensors only",
                m.name,
                device_type_name(m.device_type)
            ))
        }
    }

    fn name(self) -> String {
        match self {
            Place::Cpu => "cpu".into(),
            Place::Cuda(i) => format!("cuda:{i}"),
        }
    }

    fn device_code(self) -> (Code, i32) {
        match self {
            Place::Cpu => (torch().codes.cpu, -1),
            Place::Cuda(i) => (torch().codes.cuda, i),
        }
    }

    fn check(self, m: &Meta, input: &Meta) -> Result<(), Fail> {
        let p = Place::of(m)?;
        if p != self {
            return value(format!(
                "{} is on {} but {} is on {}: put all tensors of one call on one device",
                m.name,
                p.name(),
                input.name,
                self.name()
            ));
        }
        m.check_storage()
    }
}

/// A new contiguous tensor on `place`.
fn empty(shape: &[i64], dtype: Code, place: Place) -> Result<Tensor, Fail> {
    let mut strides = [0i64; MAX_DIMS];
    let mut acc = 1i64;
    for d in (0..shape.len()).rev() {
        strides[d] = acc;
        acc = acc.saturating_mul(shape[d].max(1));
    }
    let (dev, index) = place.device_code();
    let mut h: Handle = std::ptr::null_mut();
    // SAFETY: sizes and strides of `shape.len()` dims, an out-pointer.
    status(
        unsafe {
            (torch().api.empty_strided)(
                shape.len() as i64,
                shape.as_ptr(),
                strides.as_ptr(),
                dtype,
                dev,
                index,
                &mut h,
            )
        },
        "allocating an output",
    )?;
    Ok(Tensor(h))
}

// ---------------------------------------------------------------------------------------
// The fused op
// ---------------------------------------------------------------------------------------

/// Options of one call, as the schema passes them.
struct OpArgs {
    eps: f64,
    block_size: i64,
    scale_format: Option<String>,
    swizzled: bool,
    enable_pdl: Option<bool>,
    weight_bias: f64,
}

impl OpArgs {
    fn options(&self) -> Result<Options, Fail> {
        let block = match self.block_size {
            16 => BlockSize::B16,
            32 => BlockSize::B32,
            b => {
                return value(format!(
                    "block_size = {b} is not supported: use 16 (NVFP4) or 32 (MXFP4)"
                ))
            }
        };
        let scale = match self.scale_format.as_deref() {
            None => match block {
                BlockSize::B16 => ScaleFormat::E4M3,
                BlockSize::B32 => ScaleFormat::UE8M0,
            },
            Some(s) => args::fp4_scale_format(s)?,
        };
        Ok(Options {
            format: Fp4Format::new(block, scale),
            eps: args::eps32(self.eps)?,
            weight_bias: args::bias32(self.weight_bias)?,
        })
    }
}

/// The row tensors of one call, off the stack (all owned: released on every path), which
/// every op of the family takes alike: the input, the residual (where the op has one), the
/// weight and `y_out`. For a fused all-reduce (SPEC.md §9) the input is rank 0's, named
/// `inputs[0]` in messages, and `ranks` are the other ranks' inputs (none for the other ops).
struct RowTensors {
    input: Tensor,
    input_name: &'static str,
    ranks: Vec<Tensor>,
    residual: Option<Tensor>,
    weight: Tensor,
    y_out: Option<Tensor>,
}

impl RowTensors {
    /// The row tensors, taken off the stack after every other argument (so that all are
    /// released on any path): the input is argument `at`, or, with `list` (a fused
    /// all-reduce's `Tensor[] inputs`, read from argument `at`), its first tensor, the others
    /// being the other ranks' (1 to 8 ranks in all).
    fn new(
        s: &Stack,
        at: usize,
        list: RankList,
        residual: Option<Tensor>,
        weight: Tensor,
        y_out: Option<Tensor>,
    ) -> Result<Self, Fail> {
        let (input, input_name, ranks) = match list {
            None => (s.tensor(at), "input", Vec::new()),
            Some(list) => {
                let mut inputs = list?;
                let most = fp4norm::raw::RANK_INPUT_NAMES.len() + 1;
                if inputs.is_empty() {
                    return value(
                        "inputs is empty: the all-reduce needs the input of at least one rank"
                            .into(),
                    );
                }
                if inputs.len() > most {
                    return value(format!(
                        "{} ranks: the fused all-reduce sums 1 to {most}",
                        inputs.len()
                    ));
                }
                (inputs.remove(0), "inputs[0]", inputs)
            }
        };
        Ok(RowTensors {
            input,
            input_name,
            ranks,
            residual,
            weight,
            y_out,
        })
    }
}

/// The row tensors of a call, checked: `input` (bf16 or f16, on CPU or CUDA, 2-D or 3-D
/// rows), `residual`, `y_out` and the other ranks' inputs (its shape, dtype and device) and
/// `weight` (`[H]`, contiguous, same dtype and device).
struct Rows {
    x: Meta,
    place: Place,
    dtype: DType,
    x_rows: RawMat,
    residual: Option<RawMat>,
    weight: RawBuf,
    y_out: Option<RawMat>,
    /// The other ranks' inputs of a fused all-reduce (see [`rank_rows`]).
    ranks: Vec<RawMat>,
}

fn read_rows(t: &RowTensors) -> Result<Rows, Fail> {
    let c = &torch().codes;
    let x = Meta::read(t.input_name, &t.input)?;
    x.need_dtype(&[c.bf16, c.f16])?;
    let place = Place::of(&x)?;
    x.check_storage()?;
    let dtype = if x.dtype == c.bf16 {
        DType::BF16
    } else {
        DType::F16
    };
    let x_rows = x.rows()?;
    let h = x_rows.cols;
    let rule = "input, residual, weight and y_out must share one dtype";
    let same_rows = |name, t| rows_like(name, t, place, &x, rule);
    let residual = t
        .residual
        .as_ref()
        .map(|r| same_rows("residual", r))
        .transpose()?;
    let w = Meta::read("weight", &t.weight)?;
    same_kind(place, &x, &w, rule)?;
    if w.dim != 1 || w.sizes[0] as usize != h {
        return value(format!(
            "weight has shape {:?}; expected ({h},), one value per hidden element",
            w.shape()
        ));
    }
    if h > 1 && w.strides[0] != 1 {
        return value(format!(
            "weight must be contiguous (stride 1), got stride {}",
            w.strides[0]
        ));
    }
    let weight = RawBuf::new(w.ptr, w.numel());
    let y_out = t
        .y_out
        .as_ref()
        .map(|y| same_rows("y_out", y))
        .transpose()?;
    let ranks = rank_rows(place, &x, &t.ranks)?;
    Ok(Rows {
        x,
        place,
        dtype,
        x_rows,
        residual,
        weight,
        y_out,
        ranks,
    })
}

/// The tensors of one fused call, off the stack (all owned: released on every path).
struct FusedTensors {
    rows: RowTensors,
    global_scale: Option<Tensor>,
    /// Preallocated outputs (`.out`): y_fp4, block_scale, block_scale_unswizzled.
    outputs: Option<(Tensor, Tensor, Option<Tensor>)>,
}

/// Checks the tensors' dtypes, devices and views and runs the call; with `alloc`, first
/// allocates the outputs (returned), else writes the preallocated ones.
fn fused(t: &FusedTensors, args: &OpArgs, both: bool) -> Result<Option<[Option<Tensor>; 3]>, Fail> {
    let c = &torch().codes;
    let opts = args.options()?;
    let Rows {
        x,
        place,
        dtype,
        x_rows,
        residual,
        weight,
        y_out,
        ranks: rank_rows,
    } = read_rows(&t.rows)?;
    let (m, h) = (x_rows.rows, x_rows.cols);
    let global_scale = match &t.global_scale {
        Some(g) => {
            let meta = Meta::read("global_scale", g)?;
            place.check(&meta, &x)?;
            meta.need_dtype(&[c.f32])?;
            let n = meta.numel();
            if meta.dim > 1 || (n != 1 && n != m) {
                return value(format!(
                    "global_scale has shape {:?}: pass shape (1,) (one scale) or ({m},) (one per \
                     row; M = {m})",
                    meta.shape()
                ));
            }
            let buf = meta.flat_read()?;
            RawGlobalScale::from_count(buf.ptr, n)
        }
        None => RawGlobalScale::None,
    };
    let layout = if both {
        ScaleLayout::Both
    } else if args.swizzled {
        ScaleLayout::Swizzled
    } else {
        ScaleLayout::RowMajor
    };
    let scale_codes = &c.scale_dtypes(opts.format.scale);
    // Outputs: allocated to the sizes of the checked problem, or the caller's (checked).
    let mut allocated = None;
    let (y_fp4, block_scale, unswizzled) = match &t.outputs {
        Some((q, s, u)) => {
            // Shapes where H allows the problem (else its own error follows): `[..., H/2]`
            // codes and `[..., H/B]` row-major scales; the swizzled scales any shape.
            let block = opts.format.block.get();
            let shaped = h > 0 && h % block == 0;
            let q = Meta::read("y_fp4", q)?;
            place.check(&q, &x)?;
            q.need_dtype(&[c.u8, c.fp4x2])?;
            if shaped {
                need_row_shape(&q, &x, h / 2)?;
            }
            let s = Meta::read("block_scale", s)?;
            place.check(&s, &x)?;
            s.need_dtype(scale_codes)?;
            if shaped && layout == ScaleLayout::RowMajor {
                need_row_shape(&s, &x, h / block)?;
            }
            let u = match u {
                Some(u) => {
                    let u = Meta::read("block_scale_unswizzled", u)?;
                    place.check(&u, &x)?;
                    u.need_dtype(scale_codes)?;
                    if shaped {
                        need_row_shape(&u, &x, h / block)?;
                    }
                    Some(u.flat()?)
                }
                None => None,
            };
            (q.flat()?, s.flat()?, u)
        }
        None => {
            let p = Problem::new(m, h, dtype, layout, &opts)?;
            let lead = &x.shape()[..x.dim - 1];
            let with_last = |last: usize| -> Vec<i64> {
                let mut v = lead.to_vec();
                v.push(last as i64);
                v
            };
            let scale_dtype = scale_codes[0];
            let q = empty(&with_last(h / 2), c.fp4x2, place)?;
            let s = if layout.has_swizzled() {
                empty(&[p.swizzled_scales_len() as i64], scale_dtype, place)?
            } else {
                empty(&with_last(p.n_blocks()), scale_dtype, place)?
            };
            let u = if both {
                Some(empty(&with_last(p.n_blocks()), scale_dtype, place)?)
            } else {
                None
            };
            let bufs = (
                Meta::read("y_fp4", &q)?.flat()?,
                Meta::read("block_scale", &s)?.flat()?,
                match &u {
                    Some(u) => Some(Meta::read("block_scale_unswizzled", u)?.flat()?),
                    None => None,
                },
            );
            allocated = Some([Some(q), Some(s), u]);
            bufs
        }
    };
    let scales = match (layout, unswizzled) {
        (ScaleLayout::RowMajor, None) => ScaleOut::RowMajor(block_scale),
        (ScaleLayout::Swizzled, None) => ScaleOut::Swizzled(block_scale),
        (_, Some(u)) => ScaleOut::Both {
            row_major: u,
            swizzled: block_scale,
        },
        (ScaleLayout::Both, None) => unreachable!("both layouts come with an unswizzled buffer"),
    };
    let call = RawCall {
        dtype,
        x: x_rows,
        residual,
        weight,
        y_fp4,
        scales,
        y_out,
        global_scale,
        options: opts,
    };
    match place {
        // SAFETY: every address and extent comes from a live CPU tensor of this call (the
        // ranks' inputs too); run_host validates the call before touching them.
        Place::Cpu if rank_rows.is_empty() => unsafe { run_host(&call, HostEngine::Cpu)? },
        // SAFETY: as above; the ranks' inputs are read (summed) only once the call is
        // validated and none of them overlaps a buffer it writes.
        Place::Cpu => unsafe {
            call.validate()
                .and_then(|c| fp4norm::raw::check_rank_inputs(&c.ranges, dtype, &rank_rows))
                .and_then(|()| {
                    on_host_sum(dtype, x_rows, &rank_rows, |x| {
                        run_host(&RawCall { x, ..call }, HostEngine::Cpu)
                    })
                })
                .map_err(with_rank0_name)?
        },
        Place::Cuda(index) => launch_cuda(index, args.enable_pdl, |gpu, stream, opts| {
            // SAFETY: live CUDA tensors of device `index` (their metadata says so) and
            // PyTorch's current stream of that device; validated before launching.
            unsafe {
                if rank_rows.is_empty() {
                    gpu.launch_raw_with(stream, &call, opts)
                } else {
                    gpu.launch_allreduce_raw(stream, &call, &rank_rows, opts)
                        .map_err(with_rank0_name)
                }
            }
        })?,
    }
    Ok(allocated)
}

/// Refuses a caller's output laid out in rows (FP4 codes, row-major scales, FP8 codes of
/// dynamic scales) unless its shape is `[..., last]` with `x`'s leading dimensions, `[M,
/// last]` (the rows flattened, as FlashInfer views a 3-D call's outputs) or one flat buffer
/// of `M·last`: a buffer of the right size but another shape (`[32, 3]` for `[3, 32]`) would
/// be read in another layout than the one written.
fn need_row_shape(meta: &Meta, x: &Meta, last: usize) -> Result<(), Fail> {
    // On the stack: this runs for every given output of every call.
    let mut want = [0i64; MAX_DIMS];
    let lead = x.dim.saturating_sub(1);
    want[..lead].copy_from_slice(&x.shape()[..lead]);
    want[lead] = last as i64;
    need_shape(meta, &want[..=lead], true, "")
}

/// Refuses a caller's output whose shape is not `want`, nor (`rows`) its rows flattened,
/// nor one flat buffer of its size; `what` names the layout in the message.
fn need_shape(meta: &Meta, want: &[i64], rows: bool, what: &str) -> Result<(), Fail> {
    let n: i64 = want.iter().product();
    let last = want.last().copied().unwrap_or(1);
    let got = meta.shape();
    if got == want || got == [n] || (rows && want.len() > 2 && got == [n / last.max(1), last]) {
        return Ok(()); // without allocating: the common case of every call
    }
    let mut ok = vec![want.to_vec()];
    if rows && want.len() > 2 {
        ok.push(vec![n / want[want.len() - 1].max(1), want[want.len() - 1]]);
    }
    ok.push(vec![n]);
    if ok.iter().any(|s| s.as_slice() == meta.shape()) {
        return Ok(());
    }
    let names: Vec<String> = ok.iter().map(|s| format!("{s:?}")).collect();
    let what = if what.is_empty() {
        String::new()
    } else {
        format!(" ({what})")
    };
    value(format!(
        "{} has shape {:?}; expected {}{what}",
        meta.name,
        meta.shape(),
        names.join(" or ")
    ))
}

/// Refuses `meta` unless it is on `x`'s device and of its dtype (`rule` says why, in the
/// message).
fn same_kind(place: Place, x: &Meta, meta: &Meta, rule: &str) -> Result<(), Fail> {
    place.check(meta, x)?;
    if meta.dtype != x.dtype {
        return Err(Fail::Type(format!(
            "{} has dtype {} but {} is {}: {rule}",
            meta.name,
            meta.dtype_name(),
            x.name,
            x.dtype_name()
        )));
    }
    Ok(())
}

/// Tensor `t` (argument `name`) as rows, checked to have `x`'s device, dtype ([`same_kind`])
/// and shape: a row tensor of the call besides its input.
fn rows_like(
    name: &'static str,
    t: &Tensor,
    place: Place,
    x: &Meta,
    rule: &str,
) -> Result<RawMat, Fail> {
    let meta = Meta::read(name, t)?;
    same_kind(place, x, &meta, rule)?;
    if meta.shape() != x.shape() {
        return value(format!(
            "{name} has shape {:?} but {} has shape {:?}",
            meta.shape(),
            x.name,
            x.shape()
        ));
    }
    meta.rows()
}

/// The other ranks' inputs of a fused all-reduce (SPEC.md §9), `inputs[1]`, `inputs[2]`, …
/// after `x` (rank 0's, `inputs[0]`), as rows: each of `x`'s dtype, device and shape, named
/// in the error before anything is written (their row strides and overlaps are the
/// validator's, which knows the rows of every buffer of the call).
fn rank_rows(place: Place, x: &Meta, ranks: &[Tensor]) -> Result<Vec<RawMat>, Fail> {
    let rule = "every rank's input must share one dtype";
    ranks
        .iter()
        .zip(fp4norm::raw::RANK_INPUT_NAMES)
        .map(|(r, name)| rows_like(name, r, place, x, rule))
        .collect()
}

/// An error of a fused all-reduce's validator with rank 0's input named as the operator's
/// argument is, `inputs[0]` (the validator calls it `input`).
fn with_rank0_name(e: Error) -> Error {
    let rename = |n: &'static str| if n == "input" { "inputs[0]" } else { n };
    match e {
        Error::Overlap { a, b } => Error::Overlap {
            a: rename(a),
            b: rename(b),
        },
        Error::Misaligned {
            name,
            address,
            required,
        } => Error::Misaligned {
            name: rename(name),
            address,
            required,
        },
        Error::NullPointer { name } => Error::NullPointer { name: rename(name) },
        other => other,
    }
}

/// Runs `op` on the host over the call's input rows: `x` itself, or, with other ranks'
/// inputs (`ranks`, SPEC.md §9), their sum with `x` in rank order, taken first into a fresh
/// contiguous buffer (the host backends take one input; the sum is what every rank's op
/// reads, so the bytes are those of the reference).
///
/// # Safety
/// `x` and every matrix of `ranks` must address live host memory of its extent.
unsafe fn on_host_sum(
    dtype: DType,
    x: RawMat,
    ranks: &[RawMat],
    op: impl FnOnce(RawMat) -> Result<(), Error>,
) -> Result<(), Error> {
    if ranks.is_empty() {
        return op(x);
    }
    // SAFETY: the caller's guarantee.
    let sum = unsafe { host_rank_sum(dtype, x, ranks)? };
    // `sum` (M·H elements) lives until `op` returns.
    op(RawMat::contiguous(sum.as_ptr() as u64, x.rows, x.cols))
}

/// SPEC.md §9's sum, in rank order, of host rows (`first`, then `more`, each `[M, H]` of
/// `dtype`), as a new contiguous buffer of their element bits.
///
/// # Safety
/// Each matrix must address live host memory of its extent.
unsafe fn host_rank_sum(dtype: DType, first: RawMat, more: &[RawMat]) -> Result<Vec<u16>, Error> {
    unsafe fn bits<T: fp4norm::Element>(mats: &[RawMat]) -> Result<Vec<u16>, Error> {
        // SAFETY: the caller's guarantee.
        let sum = unsafe { crate::host_rank_sum::<T>(mats)? };
        Ok(sum.into_iter().map(|v| v.to_bits()).collect())
    }
    let mut mats = vec![first];
    mats.extend_from_slice(more);
    // SAFETY: the caller's guarantee.
    unsafe {
        match dtype {
            DType::BF16 => bits::<fp4norm::bf16>(&mats),
            DType::F16 => bits::<fp4norm::f16>(&mats),
        }
    }
}

/// Runs `launch` on device `index` with PyTorch's current stream, the device made current
/// for the duration (and restored after).
fn launch_cuda(
    index: i32,
    enable_pdl: Option<bool>,
    launch: impl FnOnce(&Gpu, RawStream, &LaunchOptions) -> Result<(), Error>,
) -> Result<(), Fail> {
    let t = torch();
    let Some(current_stream) = t.current_cuda_stream else {
        return Err(Fail::Runtime(
            "this PyTorch has no CUDA: a CUDA tensor cannot reach fp4norm's CUDA kernel".into(),
        ));
    };
    // PyTorch's current device becomes `index` for the call and is restored after it: the
    // device's first use (cudarc opening its primary context) and the launch make that
    // context current, which is what the runtime API takes for the current device.
    let mut guard: *mut c_void = std::ptr::null_mut();
    // SAFETY: an out-pointer; the guard is released below on every path.
    status(
        unsafe { (t.api.create_device_guard)(index, &mut guard) },
        "selecting the device",
    )?;
    let mut stream: *mut c_void = std::ptr::null_mut();
    let result = crate::gpu(index as usize)
        .map_err(Fail::from)
        .and_then(|gpu| {
            // SAFETY: an out-pointer; the stream is borrowed from PyTorch for this call.
            status(
                unsafe { current_stream(index, &mut stream) },
                "reading the current CUDA stream",
            )?;
            // FlashInfer's meaning of enable_pdl: None or true launch with programmatic
            // dependent launch wherever the GPU has it (sm_90+), false never.
            let opts = LaunchOptions {
                pdl: Some(enable_pdl.unwrap_or(true)),
                devices_checked: true,
            };
            launch(&gpu, stream as RawStream, &opts).map_err(Fail::from)
        });
    // SAFETY: the guard created above, released once.
    unsafe { (t.api.delete_device_guard)(guard) };
    result
}

fn op_args(s: &Stack, first: usize) -> Result<OpArgs, Fail> {
    Ok(OpArgs {
        eps: s.f64(first),
        block_size: s.i64(first + 1),
        scale_format: s.optional_str(first + 2)?,
        swizzled: s.bool(first + 3),
        enable_pdl: None,
        weight_bias: 0.0,
    })
}

/// `fp4norm::add_rmsnorm_fp4quant` / `rmsnorm_fp4quant` (functional): allocates and returns
/// `(y_fp4, block_scale)`; their `.both` overloads `(y_fp4, block_scale (swizzled),
/// block_scale_unswizzled)`.
///
/// Schema (with residual): input, residual(a!), weight, global_scale?, eps, block_size,
/// scale_format?, is_sf_swizzled_layout, y_out(b!)?, enable_pdl?, weight_bias. The fused
/// all-reduce's (`ALL_REDUCE`) has `Tensor[] inputs` in input's place. `RESIDUAL`: the op
/// with a residual; `BOTH`: the `.both` overload.
extern "C-unwind" fn functional<const RESIDUAL: bool, const BOTH: bool, const ALL_REDUCE: bool>(
    stack: *mut u64,
    n_args: u64,
    n_out: u64,
) {
    let (with_residual, both, all_reduce) = (RESIDUAL, BOTH, ALL_REDUCE);
    run_boxed(|| {
        let mut s = Stack {
            slots: stack,
            len: n_args.max(n_out) as usize,
        };
        let r = with_residual as usize;
        // Every argument is taken off the stack first, so that all are released on any path.
        let (list, residual, weight) = leading_rows(&s, with_residual, all_reduce);
        let (global_scale, y_out) = (s.optional_tensor(2 + r), s.optional_tensor(7 + r));
        let enable_pdl = s.optional_bool(8 + r);
        let args = op_args(&s, 3 + r);
        let tensors = FusedTensors {
            rows: RowTensors::new(&s, 0, list, residual, weight, y_out)?,
            global_scale,
            outputs: None,
        };
        let mut args = args?;
        args.enable_pdl = enable_pdl;
        args.weight_bias = s.f64(9 + r);
        let outs = fused(&tensors, &args, both)?.expect("functional form allocates");
        drop(tensors);
        for (i, t) in outs.into_iter().flatten().enumerate() {
            s.set(i, t.into_raw());
        }
        Ok(())
    })
}

/// A fused all-reduce's `Tensor[] inputs` as read off the stack (`None` for the other
/// ops; the reading itself may have failed).
type RankList = Option<Result<Vec<Tensor>, Fail>>;

/// The row tensors every op with its input first takes first, off the stack: a fused
/// all-reduce's `Tensor[] inputs` (argument 0; the input itself is read by
/// [`RowTensors::new`] once every argument is off the stack), the residual (argument 1, where the op has one)
/// and the weight (next).
fn leading_rows(
    s: &Stack,
    with_residual: bool,
    all_reduce: bool,
) -> (RankList, Option<Tensor>, Tensor) {
    let list = all_reduce.then(|| s.tensor_list(0));
    let residual = with_residual.then(|| s.tensor(1));
    (list, residual, s.tensor(1 + with_residual as usize))
}

/// `fp4norm::add_rmsnorm_fp4quant.out` / `rmsnorm_fp4quant.out`: writes preallocated outputs.
///
/// Schema (with residual): input, residual(a!), weight, y_fp4(b!), block_scale(c!),
/// block_scale_unswizzled(d!)?, global_scale?, eps, block_size, scale_format?,
/// is_sf_swizzled_layout, y_out(e!)?, enable_pdl?, weight_bias. A `block_scale_unswizzled` makes it a
/// both-layouts call (`block_scale` then holds the swizzled layout). `RESIDUAL` and
/// `ALL_REDUCE` as for [`functional`].
extern "C-unwind" fn out_form<const RESIDUAL: bool, const ALL_REDUCE: bool>(
    stack: *mut u64,
    n_args: u64,
    n_out: u64,
) {
    let (with_residual, all_reduce) = (RESIDUAL, ALL_REDUCE);
    run_boxed(|| {
        let s = Stack {
            slots: stack,
            len: n_args.max(n_out) as usize,
        };
        let r = with_residual as usize;
        let (list, residual, weight) = leading_rows(&s, with_residual, all_reduce);
        let unswizzled = s.optional_tensor(4 + r);
        let outputs = Some((s.tensor(2 + r), s.tensor(3 + r), unswizzled));
        let (global_scale, y_out) = (s.optional_tensor(5 + r), s.optional_tensor(10 + r));
        let enable_pdl = s.optional_bool(11 + r);
        let args = op_args(&s, 6 + r);
        let tensors = FusedTensors {
            rows: RowTensors::new(&s, 0, list, residual, weight, y_out)?,
            outputs,
            global_scale,
        };
        let both = tensors.outputs.as_ref().is_some_and(|o| o.2.is_some());
        let mut args = args?;
        args.enable_pdl = enable_pdl;
        args.weight_bias = s.f64(12 + r);
        if both {
            args.swizzled = true;
        }
        fused(&tensors, &args, both)?;
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Dequantisation
// ---------------------------------------------------------------------------------------

/// `fp4norm::dequantize(y_fp4, block_scale, global_scale?, block_size, scale_format?,
/// is_sf_swizzled_layout) -> Tensor`: float32 `[..., H]` for `y_fp4` of shape `[..., H/2]`.
extern "C-unwind" fn boxed_dequantize(stack: *mut u64, n_args: u64, n_out: u64) {
    run_boxed(|| {
        let mut s = Stack {
            slots: stack,
            len: n_args.max(n_out) as usize,
        };
        let q_t = s.tensor(0);
        let sf_t = s.tensor(1);
        let gs_t = s.optional_tensor(2);
        let args = OpArgs {
            eps: 0.0,
            block_size: s.i64(3),
            scale_format: s.optional_str(4)?,
            swizzled: s.bool(5),
            enable_pdl: None,
            weight_bias: 0.0,
        };
        let out = dequantize(&q_t, &sf_t, gs_t.as_ref(), &args)?;
        drop((q_t, sf_t, gs_t));
        s.set(0, out.into_raw());
        Ok(())
    })
}

fn dequantize(
    q_t: &Tensor,
    sf_t: &Tensor,
    gs_t: Option<&Tensor>,
    args: &OpArgs,
) -> Result<Tensor, Fail> {
    let c = &torch().codes;
    let opts = args.options()?;
    let q = Meta::read("y_fp4", q_t)?;
    q.need_dtype(&[c.u8, c.fp4x2])?;
    let place = Place::of(&q)?;
    q.check_storage()?;
    if q.dim < 1 {
        return value("y_fp4 must have a last dimension of H/2 bytes".into());
    }
    let q_buf = q.flat_read()?;
    let h = 2 * q.sizes[q.dim - 1] as usize;
    let m: usize = q.shape()[..q.dim - 1].iter().map(|&s| s as usize).product();
    let sf = Meta::read("block_scale", sf_t)?;
    place.check(&sf, &q)?;
    sf.need_dtype(&c.scale_dtypes(opts.format.scale))?;
    let sf_buf = sf.flat_read()?;
    let global_scale = match gs_t {
        Some(g) => {
            let meta = Meta::read("global_scale", g)?;
            place.check(&meta, &q)?;
            meta.need_dtype(&[c.f32])?;
            let n = meta.numel();
            if meta.dim > 1 || (n != 1 && n != m) {
                return value(format!(
                    "global_scale has shape {:?}: pass shape (1,) or ({m},)",
                    meta.shape()
                ));
            }
            RawGlobalScale::from_count(meta.flat_read()?.ptr, n)
        }
        None => RawGlobalScale::None,
    };
    // Shapes and sizes are checked before the output exists.
    let layout = if args.swizzled {
        ScaleLayout::Swizzled
    } else {
        ScaleLayout::RowMajor
    };
    Problem::new(m, h, DType::BF16, layout, &opts)?;
    let mut shape = q.shape()[..q.dim - 1].to_vec();
    shape.push(h as i64);
    let out_t = empty(&shape, c.f32, place)?;
    let out = Meta::read("out", &out_t)?;
    let call = RawDequant {
        m,
        h,
        format: opts.format,
        y_fp4: q_buf,
        scales: if args.swizzled {
            ScaleOut::Swizzled(sf_buf)
        } else {
            ScaleOut::RowMajor(sf_buf)
        },
        global_scale,
        out: RawBuf::new(out.ptr, out.numel()),
    };
    match place {
        // SAFETY: live CPU tensors of this call; validated before use.
        Place::Cpu => unsafe { fp4norm::raw::dequantize_host(&call)? },
        Place::Cuda(index) => launch_cuda(index, None, |gpu, stream, opts| {
            // SAFETY: live CUDA tensors of device `index`, PyTorch's current stream.
            unsafe { gpu.dequantize_raw_with(stream, &call, opts) }
        })?,
    }
    Ok(out_t)
}

// ---------------------------------------------------------------------------------------
// The FP8 ops (SPEC.md §8)
// ---------------------------------------------------------------------------------------

/// The tensors of one FP8 call, off the stack (all owned: released on every path).
struct Fp8Tensors {
    rows: RowTensors,
    /// The per-tensor static scale (`rmsnorm_quant`, `fused_add_rmsnorm_quant`); none for
    /// dynamic scales.
    scale: Option<Tensor>,
    /// The FP8 codes, where preallocated (the static ops and the `.out` overloads).
    out: Option<Tensor>,
    /// The dynamic scales, where preallocated (the `.out` overloads).
    scales_out: Option<Tensor>,
}

/// How the scales of an FP8 call are found, as its schema gives them.
enum Fp8ScaleArgs {
    /// A per-tensor scale read from the `scale` tensor; `out`'s float8 dtype picks the
    /// element, or `element` where given (then `out` may be uint8).
    Static { element: Option<String> },
    /// Dynamic scales per group.
    Dynamic {
        element: String,
        group_size: i64,
        scale_format: String,
        scale_layout: String,
        s_min: f64,
    },
}

/// The scalar arguments of one FP8 call.
struct Fp8Args {
    scales: Fp8ScaleArgs,
    eps: f64,
    weight_bias: f64,
    enable_pdl: Option<bool>,
}

/// Checks the tensors and options of an FP8 call and runs it (the CPU backend, or the CUDA
/// kernel on PyTorch's current stream); returns `[codes, scales]` where it allocated them
/// (the functional overloads), `None` where they were given.
fn fused_fp8(t: &Fp8Tensors, a: &Fp8Args) -> Result<Option<[Tensor; 2]>, Fail> {
    let c = &torch().codes;
    // The scalar options first, as the FP4 op checks them: a bad one is named before any
    // tensor is read.
    let (dynamic, static_element) = match &a.scales {
        Fp8ScaleArgs::Static { element } => {
            args::eps32(a.eps)?;
            args::bias32(a.weight_bias)?;
            (None, element.as_deref().map(args::element).transpose()?)
        }
        Fp8ScaleArgs::Dynamic {
            element,
            group_size,
            scale_format,
            scale_layout,
            s_min,
        } => (
            Some(args::dynamic_options(
                element,
                *group_size,
                scale_format,
                scale_layout,
                *s_min,
                a.eps,
                a.weight_bias,
            )?),
            None,
        ),
    };
    let Rows {
        x,
        place,
        dtype,
        x_rows,
        residual,
        weight,
        y_out,
        ranks: rank_rows,
    } = read_rows(&t.rows)?;
    let (m, h) = (x_rows.rows, x_rows.cols);
    let out = match &t.out {
        Some(q) => {
            let meta = Meta::read("out", q)?;
            place.check(&meta, &x)?;
            Some(meta)
        }
        None => None,
    };
    let (options, static_scale) = match dynamic {
        Some(o) => (o, None),
        None => {
            let q = out.as_ref().expect("the static ops take out");
            let typed = if q.dtype == c.e4m3 {
                Some(Fp8Element::E4M3)
            } else if q.dtype == c.e5m2 {
                Some(Fp8Element::E5M2)
            } else {
                None
            };
            let element = match (typed, static_element) {
                (Some(t), None) => t,
                (Some(t), Some(e)) if t == e => t,
                (None, Some(e)) if q.dtype == c.u8 => e,
                (Some(_), Some(e)) => {
                    return Err(Fail::Type(format!(
                        "out has dtype {} but element = \"{e}\": pass out of the element's \
                         float8 dtype (or uint8), or leave element None to take out's format",
                        q.dtype_name()
                    )))
                }
                _ => {
                    return Err(Fail::Type(format!(
                        "out has dtype {}; expected float8_e4m3fn or float8_e5m2 (its dtype \
                         picks the FP8 format), or uint8 with element",
                        q.dtype_name()
                    )))
                }
            };
            let scale = t.scale.as_ref().expect("the static ops take a scale");
            let sc = Meta::read("scale", scale)?;
            place.check(&sc, &x)?;
            sc.need_dtype(&[c.f32])?;
            if sc.dim > 1 || sc.numel() != 1 {
                return value(format!(
                    "scale has shape {:?}: pass a float32 tensor of shape (1,) (or 0-d) on the \
                     input's device",
                    sc.shape()
                ));
            }
            let options = args::per_tensor_options(element, 1.0, a.eps, a.weight_bias)?;
            (options, Some(sc.flat_read()?))
        }
    };
    // Shapes and options are checked before any output exists.
    let p = Fp8Problem::new(m, h, dtype, &options)?;
    let code_dtype = match options.element {
        Fp8Element::E4M3 => c.e4m3,
        Fp8Element::E5M2 => c.e5m2,
    };
    let scale_dtypes: &[Code] = match p.scale_format() {
        None => &[],
        Some(Fp8ScaleFormat::F32 { .. }) => &[c.f32],
        Some(Fp8ScaleFormat::UE8M0) => &[c.u8, c.e8m0],
    };
    let mut allocated = None;
    let (q, scales) = match out {
        Some(q) => {
            q.need_dtype(&[code_dtype, c.u8])?;
            // Dynamic scales' outputs have their layout's shape: the codes input's (or
            // [M, H]), row-major scales `[..., H/G]` (or [M, H/G]), column-major exactly
            // `[H/G, 4·ceil(M/4)]`, swizzled any. FlashInfer's static `out` is any shape of
            // M·H codes, as it documents.
            if t.scales_out.is_some() {
                need_row_shape(&q, &x, h)?;
            }
            let scales = match &t.scales_out {
                Some(s) => {
                    let meta = Meta::read("scales_out", s)?;
                    place.check(&meta, &x)?;
                    meta.need_dtype(scale_dtypes)?;
                    let n = p.n_groups();
                    match p.layout() {
                        Some(Fp8ScaleLayout::RowMajor) => need_row_shape(&meta, &x, n)?,
                        Some(Fp8ScaleLayout::ColumnMajor) => {
                            let want = [n as i64, p.scale_rows() as i64];
                            let what = "the column-major layout [H/G, 4*ceil(M/4)]";
                            need_shape(&meta, &want, false, what)?
                        }
                        Some(Fp8ScaleLayout::ColumnMajorPacked) => {
                            let want = [n.div_ceil(4) as i64, 4 * p.scale_rows() as i64];
                            let what =
                                "the packed column-major layout [ceil(H/G/4), 4*4*ceil(M/4)] bytes";
                            need_shape(&meta, &want, false, what)?
                        }
                        _ => {}
                    }
                    Some(meta.flat()?)
                }
                None => None,
            };
            (q.flat()?, scales)
        }
        None => {
            let q = empty(x.shape(), code_dtype, place)?;
            let n = p.n_groups() as i64;
            let shape = match p.layout() {
                Some(Fp8ScaleLayout::ColumnMajor) => vec![n, p.scale_rows() as i64],
                // Words of four codes, as bytes: `.view(torch.int32)` is DeepGEMM's tensor.
                Some(Fp8ScaleLayout::ColumnMajorPacked) => {
                    vec![(n + 3) / 4, 4 * p.scale_rows() as i64]
                }
                Some(Fp8ScaleLayout::Swizzled) => vec![p.scales_len() as i64],
                _ => {
                    let mut v = x.shape()[..x.dim - 1].to_vec();
                    v.push(n);
                    v
                }
            };
            let s = empty(
                &shape,
                scale_dtypes.first().copied().unwrap_or(c.f32),
                place,
            )?;
            let bufs = (
                Meta::read("out", &q)?.flat()?,
                Some(Meta::read("scales_out", &s)?.flat()?),
            );
            allocated = Some([q, s]);
            bufs
        }
    };
    let call = RawFp8Call {
        dtype,
        x: x_rows,
        residual,
        weight,
        q,
        scales,
        static_scale,
        y_out,
        options,
    };
    match place {
        // SAFETY: every address and extent comes from a live CPU tensor of this call (the
        // ranks' inputs too); run_host_fp8 validates the call before touching them.
        Place::Cpu if rank_rows.is_empty() => unsafe {
            run_host_fp8(&call, HostEngine::Cpu).map_err(args::with_py_names)?
        },
        // SAFETY: as above; the ranks' inputs are read (summed) only once the call is
        // validated and none of them overlaps a buffer it writes.
        Place::Cpu => unsafe {
            call.validate()
                .and_then(|c| fp4norm::raw::check_rank_inputs(&c.ranges, dtype, &rank_rows))
                .and_then(|()| {
                    on_host_sum(dtype, x_rows, &rank_rows, |x| {
                        run_host_fp8(&RawFp8Call { x, ..call }, HostEngine::Cpu)
                    })
                })
                .map_err(|e| args::with_py_names(with_rank0_name(e)))?
        },
        Place::Cuda(index) => launch_cuda(index, a.enable_pdl, |gpu, stream, opts| {
            // SAFETY: live CUDA tensors of device `index` (their metadata says so, the ranks'
            // inputs too) and PyTorch's current stream of that device; validated (every
            // rank's input with the rest) before launching.
            unsafe {
                if rank_rows.is_empty() {
                    gpu.launch_fp8_raw(stream, &call, opts)
                } else {
                    gpu.launch_fp8_allreduce_raw(stream, &call, &rank_rows, opts)
                        .map_err(with_rank0_name)
                }
            }
            .map_err(args::with_py_names)
        })?,
    }
    Ok(allocated)
}

/// `fp4norm::rmsnorm_quant` / `fused_add_rmsnorm_quant` (FlashInfer's): writes `out` (and
/// the residual) in place, returns nothing.
///
/// Schema (with residual): out(a!), input, residual(b!), weight, scale, eps, enable_pdl?,
/// y_out(c!)?, weight_bias, element?. The fused all-reduce's (`ALL_REDUCE`,
/// `allreduce_fused_add_rmsnorm_quant`) has `Tensor[] inputs` in input's place. `RESIDUAL`:
/// `fused_add_rmsnorm_quant` rather than `rmsnorm_quant`.
extern "C-unwind" fn static_quant<const RESIDUAL: bool, const ALL_REDUCE: bool>(
    stack: *mut u64,
    n_args: u64,
    n_out: u64,
) {
    let (with_residual, all_reduce) = (RESIDUAL, ALL_REDUCE);
    run_boxed(|| {
        let s = Stack {
            slots: stack,
            len: n_args.max(n_out) as usize,
        };
        let r = with_residual as usize;
        // Every argument is taken off the stack first, so that all are released on any path.
        let list = all_reduce.then(|| s.tensor_list(1));
        let (out, residual) = (s.tensor(0), with_residual.then(|| s.tensor(2)));
        let (weight, scale, y_out) = (s.tensor(2 + r), s.tensor(3 + r), s.optional_tensor(6 + r));
        let enable_pdl = s.optional_bool(5 + r);
        let element = s.optional_str(8 + r);
        let tensors = Fp8Tensors {
            rows: RowTensors::new(&s, 1, list, residual, weight, y_out)?,
            out: Some(out),
            scale: Some(scale),
            scales_out: None,
        };
        let args = Fp8Args {
            scales: Fp8ScaleArgs::Static { element: element? },
            eps: s.f64(4 + r),
            enable_pdl,
            weight_bias: s.f64(7 + r),
        };
        fused_fp8(&tensors, &args)?;
        Ok(())
    })
}

/// `fp4norm::add_rmsnorm_fp8quant` / `rmsnorm_fp8quant` with dynamic scales: the functional
/// overloads allocate and return `(out, scales)`, the `.out` overloads write preallocated
/// ones.
///
/// Schema (with residual): input, residual(a!), weight, [out(b!), scales_out(c!),] element,
/// group_size, scale_format, scale_layout, s_min, eps, y_out(d!)?, enable_pdl?, weight_bias.
/// The fused all-reduce's (`ALL_REDUCE`, `allreduce_add_rmsnorm_fp8quant`) has
/// `Tensor[] inputs` in input's place. `RESIDUAL`: the op with a residual; `OUT`: the `.out`
/// overload.
extern "C-unwind" fn dynamic_quant<
    const RESIDUAL: bool,
    const OUT: bool,
    const ALL_REDUCE: bool,
>(
    stack: *mut u64,
    n_args: u64,
    n_out: u64,
) {
    let (with_residual, out_form, all_reduce) = (RESIDUAL, OUT, ALL_REDUCE);
    run_boxed(|| {
        let mut s = Stack {
            slots: stack,
            len: n_args.max(n_out) as usize,
        };
        let r = with_residual as usize;
        let k = 2 + r + if out_form { 2 } else { 0 };
        // Every argument is taken off the stack first (strings and boxes are freed as they
        // are read), so that all are released on any path.
        let (list, residual, weight) = leading_rows(&s, with_residual, all_reduce);
        let out = out_form.then(|| s.tensor(2 + r));
        let scales_out = out_form.then(|| s.tensor(3 + r));
        let y_out = s.optional_tensor(k + 6);
        let element = s.string(k);
        let scale_format = s.string(k + 2);
        let scale_layout = s.string(k + 3);
        let enable_pdl = s.optional_bool(k + 7);
        let tensors = Fp8Tensors {
            rows: RowTensors::new(&s, 0, list, residual, weight, y_out)?,
            out,
            scales_out,
            scale: None,
        };
        let args = Fp8Args {
            scales: Fp8ScaleArgs::Dynamic {
                element: element?,
                group_size: s.i64(k + 1),
                scale_format: scale_format?,
                scale_layout: scale_layout?,
                s_min: s.f64(k + 4),
            },
            eps: s.f64(k + 5),
            enable_pdl,
            weight_bias: s.f64(k + 8),
        };
        let outs = fused_fp8(&tensors, &args)?;
        drop(tensors);
        if let Some(outs) = outs {
            for (i, t) in outs.into_iter().enumerate() {
                s.set(i, t.into_raw());
            }
        }
        Ok(())
    })
}
