//! The one error type of fp4norm. Every message says what was wrong and what to change.
//! (Variant fields are named for what they hold; the messages document them.)
#![allow(missing_docs)]

/// Everything that can go wrong in a call. Errors are returned before anything is written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The hidden size is zero.
    #[error("hidden size H is 0: H must be a positive multiple of the block size ({block})")]
    ZeroHidden { block: usize },

    /// `H` is not a multiple of the block size.
    #[error("hidden size H = {h} is not a multiple of the block size {block}: use H divisible by {block}, or another block size")]
    HiddenNotMultipleOfBlock { h: usize, block: usize },

    /// A block size other than 16 or 32.
    #[error("block size {0} is not supported: use 16 (NVFP4) or 32 (MXFP4)")]
    InvalidBlockSize(usize),

    /// An unknown scale-format name.
    #[error("unknown scale format {0:?}: use \"e4m3\" or \"ue8m0\"")]
    UnknownScaleFormat(String),

    /// An unknown layout name.
    #[error("unknown scale layout {0:?}: use \"row-major\", \"swizzled\" or \"both\"")]
    UnknownLayout(String),

    /// An unknown dtype name.
    #[error("unsupported dtype {0:?}: use bf16 or f16")]
    UnsupportedDType(String),

    /// An unknown preset name.
    #[error("unknown format {0:?}: use \"nvfp4\" or \"mxfp4\"")]
    UnknownFormat(String),

    /// Tensors of one call do not share a dtype.
    #[error("dtype mismatch: {name} is {got} but input is {expected}; x, residual, weight and y_out must share one dtype")]
    DTypeMismatch {
        name: &'static str,
        expected: &'static str,
        got: &'static str,
    },

    /// Two tensors that must have the same shape do not.
    #[error("shape mismatch: {name} is [{got_rows}, {got_cols}] but input is [{rows}, {cols}]")]
    ShapeMismatch {
        name: &'static str,
        rows: usize,
        cols: usize,
        got_rows: usize,
        got_cols: usize,
    },

    /// The weight does not have `H` elements.
    #[error("weight has {got} elements but H = {expected}: pass one weight per hidden element")]
    WeightLength { expected: usize, got: usize },

    /// An output buffer has the wrong length.
    #[error("{name} has {got} bytes but this call needs exactly {expected} ({what})")]
    OutputSize {
        name: &'static str,
        expected: usize,
        got: usize,
        what: String,
    },

    /// A matrix view's row stride is shorter than its rows.
    #[error(
        "{name}: row stride {stride} is smaller than the row length {cols}; rows must not overlap"
    )]
    StrideTooSmall {
        name: &'static str,
        stride: usize,
        cols: usize,
    },

    /// A matrix view runs past the end of its buffer.
    #[error("{name}: {rows} rows of {cols} with row stride {stride} need {needed} elements but the buffer has {len}")]
    ViewOutOfBounds {
        name: &'static str,
        rows: usize,
        cols: usize,
        stride: usize,
        needed: usize,
        len: usize,
    },

    /// Per-row global scales of the wrong length.
    #[error("per-row global_scale has {got} values but there are M = {expected} rows: pass 1 value or M values")]
    GlobalScaleLength { expected: usize, got: usize },

    /// `eps` negative, NaN or infinite.
    #[error("eps = {0} is invalid: eps must be finite and ≥ 0 (the usual value is 1e-6)")]
    InvalidEps(f32),

    /// An all-reduce (SPEC.md §9) without any rank's input.
    #[error("the all-reduce needs the input of at least one rank")]
    NoRankInputs,

    /// A rank's input of an all-reduce does not have rank 0's shape.
    #[error("shape mismatch: rank {rank}'s input is [{got_rows}, {got_cols}] but rank 0's is [{rows}, {cols}]")]
    RankShapeMismatch {
        rank: usize,
        rows: usize,
        cols: usize,
        got_rows: usize,
        got_cols: usize,
    },

    /// A size computation overflowed the address space.
    #[error("tensor sizes overflow a 64-bit byte count: check M and H")]
    SizeOverflow,

    /// Two buffers of one call overlap in memory.
    #[error("{a} and {b} overlap in memory: outputs must not alias inputs or each other")]
    Overlap { a: &'static str, b: &'static str },

    /// Tensors on different devices (or host and device mixed).
    #[error(
        "{name} is on {got} but input is on {expected}: put all tensors of one call on one device"
    )]
    DeviceMismatch {
        name: &'static str,
        expected: String,
        got: String,
    },

    /// A device pointer without the alignment the kernel needs.
    #[error("{name} at address {address:#x} is not {required}-byte aligned")]
    Misaligned {
        name: &'static str,
        address: u64,
        required: usize,
    },

    /// A null device pointer for a buffer the call needs.
    #[error("{name} is a null pointer")]
    NullPointer { name: &'static str },

    /// A buffer whose address plus length passes the end of the 64-bit address space.
    #[error(
        "{name} at address {address:#x} with {bytes} bytes runs past the end of the address space"
    )]
    AddressOverflow {
        name: &'static str,
        address: u64,
        bytes: usize,
    },

    /// A combination this backend does not implement.
    #[error("not supported: {0}")]
    Unsupported(String),

    /// The CUDA driver library could not be loaded.
    #[error("CUDA driver not available: {0}")]
    CudaUnavailable(String),

    /// The NCCL library could not be loaded (tensor parallel from Rust).
    #[error("NCCL not available: {0}")]
    NcclUnavailable(String),

    /// NVRTC (the CUDA run-time compiler) could not be found.
    #[error("NVRTC not found ({0}). Install it with `pip install nvidia-cuda-nvrtc==13.0.88` or a CUDA toolkit, or set FP4NORM_NVRTC_DIR to the folder holding libnvrtc.so.13 and libnvrtc-builtins.so.13.0")]
    NvrtcUnavailable(String),

    /// The launch table `fp4norm tune` wrote for this device cannot be read or is malformed.
    #[error(
        "the tuned launch table {path}: {message} (rerun `fp4norm tune`, or move the file away)"
    )]
    TunedTable { path: String, message: String },

    /// `fp4norm tune` cannot lock or write its table: the disk cache is off, or the file
    /// system refused.
    #[error("cannot write the tuned launch table: {message} (FP4NORM_CACHE_DIR names the folder)")]
    TunedTableWrite { message: String },

    /// Another `fp4norm tune` is measuring a card of this model and will write the same table.
    #[error(
        "another `fp4norm tune` holds {lock}: it is measuring a card of this model and will write the same table; run again when it has ended"
    )]
    TuneBusy { lock: String },

    /// A kernel failed to compile (a bug in fp4norm: please report it with the log).
    #[error("kernel compilation failed for {config}:\n{log}")]
    Compile { config: String, log: String },

    /// A CUDA driver call failed.
    #[error("CUDA error in {context}: {message}")]
    Cuda {
        context: &'static str,
        message: String,
    },

    /// FP8 ops (SPEC.md §8): the hidden size is zero.
    #[error("hidden size H is 0: the FP8 ops need H > 0 (a positive multiple of the group size)")]
    Fp8ZeroHidden,

    /// FP8 ops: `H` is not a multiple of the scale group size.
    #[error("hidden size H = {h} is not a multiple of the group size {group}: use H divisible by {group}, another group size, or per-token scales (G = H)")]
    HiddenNotMultipleOfGroup { h: usize, group: usize },

    /// FP8 ops: a group size other than 32, 64 or 128 (per-token is its own choice).
    #[error("group size {0} is not supported: use 32, 64 or 128, or per-token scales (G = H)")]
    InvalidGroupSize(usize),

    /// FP8 ops: the swizzled 128×4 scale layout without UE8M0 scales in groups of 32.
    #[error("the swizzled 128x4 scale layout is MXFP8's and needs UE8M0 scales in groups of 32 (got {format} scales in groups of {group}): use UE8M0 with G = 32, or the row-major or column-major layout")]
    SwizzledNeedsMxfp8 { format: &'static str, group: usize },

    /// FP8 ops: the packed column-major scale layout without UE8M0 scales in groups.
    #[error("the packed column-major scale layout (DeepGEMM's packed UE8M0) needs UE8M0 scales in groups of 32, 64 or 128 (got {format} scales in groups of {group}): use UE8M0 with G = 32, 64 or 128, or the row-major or column-major layout")]
    PackedNeedsUe8m0Groups { format: &'static str, group: String },

    /// FP8 ops: the f32 scale floor `s_min` negative, NaN or infinite.
    #[error("s_min = {0} is invalid: the scale floor must be finite and ≥ 0 (0 means no floor; vLLM's per-token quant uses 1/(448·512))")]
    InvalidScaleFloor(f32),

    /// `weight_bias` NaN or infinite.
    #[error("weight_bias = {0} is invalid: it must be finite (0 for plain RMSNorm, 1 for Gemma-style norms)")]
    InvalidWeightBias(f32),

    /// FP8 ops: the scale buffer is of another kind than the options write.
    #[error("the scale output is {got} but these options write {expected}: pass {expected}")]
    Fp8ScaleKind {
        expected: &'static str,
        got: &'static str,
    },

    /// FP8 ops: an f32 buffer (scales, or the output of dequantisation) has the wrong length.
    #[error("{name} has {got} f32 values but this call needs exactly {expected} ({what})")]
    F32Length {
        name: &'static str,
        expected: usize,
        got: usize,
        what: String,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
