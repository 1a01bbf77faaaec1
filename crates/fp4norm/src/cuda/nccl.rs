//! Tensor parallelism from Rust (SPEC.md §9): one rank's handle over an NCCL communicator,
//! which moves the ranks' inputs to the fused all-reduce kernels — by NCCL's all-gather
//! into a buffer of its own (any size), or over peer access to the other ranks' buffers
//! (CUDA IPC handles exchanged through NCCL; one-shot and two-shot schedules) — so that
//! every rank writes the bytes of `reference::allreduce_*`.
//!
//! NCCL is loaded at run time, like the driver and NVRTC. Its library is looked for as
//! `$FP4NORM_NCCL_LIB`, then `libnccl.so.2` (the runtime package's and PyTorch's wheel's
//! name), then `libnccl.so`: cudarc's loader asks for unversioned names only, which a
//! runtime install does not have, so the few entry points used here are bound by hand.
//!
//! Every rank makes the same calls in the same order (shape, format, options, transport),
//! as with any collective: the decisions below depend only on the call and on facts the
//! ranks exchanged when the handle was made.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use cudarc::driver::sys;

use super::raw::{self, PeerStrategy, RawPeers};
use super::{Gpu, LaunchOptions};
use crate::fp8::RawFp8Call;
use crate::{Error, RawCall, RawMat};

/// `ncclUniqueId`: what rank 0 creates and every rank passes to [`NcclRanks::new`].
#[repr(C)]
#[derive(Clone, Copy)]
struct RawUniqueId {
    internal: [c_char; 128],
}

type NcclComm = *mut c_void;
/// `ncclResult_t` (0 is success), read as an integer: a value this code does not know is
/// still an error with NCCL's message.
type NcclResult = u32;
/// `ncclUint8`: the transports move bytes, never reduce.
const NCCL_UINT8: c_int = 1;

struct NcclLib {
    _lib: libloading::Library,
    get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    get_unique_id: unsafe extern "C" fn(*mut RawUniqueId) -> NcclResult,
    comm_init_rank: unsafe extern "C" fn(*mut NcclComm, c_int, RawUniqueId, c_int) -> NcclResult,
    all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        NcclComm,
        sys::CUstream,
    ) -> NcclResult,
    comm_destroy: unsafe extern "C" fn(NcclComm) -> NcclResult,
    error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
}

/// The NCCL library, loaded once (an error names what was tried).
fn nccl() -> Result<&'static NcclLib, Error> {
    static LIB: OnceLock<Result<NcclLib, String>> = OnceLock::new();
    LIB.get_or_init(load)
        .as_ref()
        .map_err(|m| Error::NcclUnavailable(m.clone()))
}

fn load() -> Result<NcclLib, String> {
    let mut names: Vec<String> = Vec::new();
    if let Some(p) = std::env::var_os("FP4NORM_NCCL_LIB") {
        names.push(p.to_string_lossy().into_owned());
    }
    names.extend(["libnccl.so.2".to_string(), "libnccl.so".to_string()]);
    let mut tried = Vec::new();
    for name in &names {
        // SAFETY: loading NCCL runs its initialisers, which have no preconditions.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return bind(lib).map_err(|e| format!("NCCL ({name}): {e}")),
            Err(e) => tried.push(e.to_string()), // libloading's message names the file
        }
    }
    Err(format!(
        "{} (set FP4NORM_NCCL_LIB to libnccl.so.2's path)",
        tried.join("; ")
    ))
}

fn bind(lib: libloading::Library) -> Result<NcclLib, String> {
    // SAFETY: each symbol is NCCL's C entry point of that name, with the signature of
    // nccl.h (2.x) written on the field.
    unsafe {
        macro_rules! sym {
            ($name:literal) => {
                *lib.get($name).map_err(|e| e.to_string())?
            };
        }
        Ok(NcclLib {
            get_version: sym!(b"ncclGetVersion\0"),
            get_unique_id: sym!(b"ncclGetUniqueId\0"),
            comm_init_rank: sym!(b"ncclCommInitRank\0"),
            all_gather: sym!(b"ncclAllGather\0"),
            comm_destroy: sym!(b"ncclCommDestroy\0"),
            error_string: sym!(b"ncclGetErrorString\0"),
            _lib: lib,
        })
    }
}

impl NcclLib {
    fn check(&self, r: NcclResult, context: &'static str) -> Result<(), Error> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static C string for any value.
        let msg = unsafe { CStr::from_ptr((self.error_string)(r)) };
        Err(Error::Cuda {
            context,
            message: format!("NCCL error {r}: {}", msg.to_string_lossy()),
        })
    }
}

/// The NCCL version the process loaded, as NCCL encodes it (e.g. 22703 for 2.27.3).
pub fn nccl_version() -> Result<i32, Error> {
    let lib = nccl()?;
    let mut v: c_int = 0;
    // SAFETY: an out-parameter.
    lib.check(unsafe { (lib.get_version)(&mut v) }, "ncclGetVersion")?;
    Ok(v)
}

/// The rendezvous of a communicator: rank 0 creates it ([`UniqueId::new`]) and sends its
/// bytes to every rank (by any means: a store, a file, an environment variable).
#[derive(Clone, Copy)]
pub struct UniqueId(RawUniqueId);

impl UniqueId {
    /// A new id (rank 0).
    pub fn new() -> Result<UniqueId, Error> {
        let lib = nccl()?;
        let mut id = RawUniqueId { internal: [0; 128] };
        // SAFETY: an out-parameter.
        lib.check(unsafe { (lib.get_unique_id)(&mut id) }, "ncclGetUniqueId")?;
        Ok(UniqueId(id))
    }

    /// The id's bytes, to send to the other ranks.
    pub fn to_bytes(&self) -> [u8; 128] {
        // `c_char` is i8 on x86-64 and u8 on aarch64: the cast is a no-op on one of them.
        #[allow(clippy::unnecessary_cast)]
        self.0.internal.map(|c| c as u8)
    }

    /// The id received from rank 0.
    pub fn from_bytes(bytes: [u8; 128]) -> UniqueId {
        UniqueId(RawUniqueId {
            internal: bytes.map(|b| b as c_char),
        })
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

/// How [`NcclRanks`] moves the ranks' inputs (each gives the same bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Peer access where every rank mapped every other's buffers and the call has at most
    /// one row per SM and [`PEER_MAX_ROWS`] rows, its schedule by
    /// [`PeerStrategy::for_call`]; the all-gather otherwise.
    Auto,
    /// NCCL's all-gather of the inputs into this handle's buffer, then the kernel over the
    /// gathered rows: any size.
    Gather,
    /// The peer-access kernel with this schedule (refused where peers are not mapped or
    /// the call has more rows than SMs).
    Peer(PeerStrategy),
}

/// [`Transport::Auto`] takes peer access up to this many rows: the decode sizes, where one
/// kernel without a collective launch wins.
pub const PEER_MAX_ROWS: usize = 128;

/// The op of a call.
#[derive(Clone, Copy)]
enum Op<'a> {
    Fp4(&'a RawCall),
    Fp8(&'a RawFp8Call),
}

/// A device allocation of this handle (freed on drop, after the device is idle).
struct DevMem {
    ptr: u64,
    bytes: usize,
}

/// This rank's peer workspace: its buffer and signal pad, every rank's as mapped here, and
/// the IPC mappings to close.
struct PeerSpace {
    buffer: DevMem,
    pad: DevMem,
    buffers: Vec<u64>,
    pads: Vec<u64>,
    pad_words: usize,
    opened: Vec<u64>,
    /// The primary contexts of same-process peers' GPUs, held while their memory is read.
    peer_ctxs: Vec<std::sync::Arc<cudarc::driver::CudaContext>>,
}

/// What a rank tells the others about its workspace: its process (a token drawn once per
/// process: pids repeat across containers and hosts), GPU (UUID, ordinal in its process,
/// SM count, compute capability: equal launch shapes need equal GPUs), whether it
/// allocated its workspace, and the buffer's and pad's addresses and IPC handles.
#[repr(C)]
#[derive(Clone, Copy)]
struct PeerRecord {
    process: u64,
    uuid: [c_char; 16],
    ordinal: u32,
    sm_count: u32,
    capability: u32,
    ok: u32,
    buffer: u64,
    pad: u64,
    buffer_handle: [c_char; 64],
    pad_handle: [c_char; 64],
}

/// This process's token for [`PeerRecord::process`]: the time, the pid and an address,
/// hashed once.
fn process_token() -> u64 {
    static TOKEN: OnceLock<u64> = OnceLock::new();
    *TOKEN.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        h.write_usize(&TOKEN as *const _ as usize);
        h.finish()
    })
}

/// One rank of a tensor-parallel group over NCCL, bound to one GPU: the communicator, the
/// all-gather's buffer and the peer workspace, grown as calls need (growing is collective:
/// every rank grows at the same call, since every rank makes the same calls). Buffers of
/// earlier sizes are kept until drop, since a captured CUDA graph holds their addresses;
/// none can grow during capture (make one eager call of the largest shape first).
///
/// The calls of one handle share its buffers and pads: make them on one stream (or on
/// streams ordered one after the other). A rank whose call fails before its collective
/// (an allocation of the gather's buffer, say) leaves the others waiting in NCCL, as any
/// NCCL collective does; the arguments' checks come before it and fail alike on every
/// rank that makes the same call.
///
/// `NcclRanks` is `Send` but not `Sync`: move it to the thread that drives its rank; its
/// calls take `&mut self`, which keeps one call at a time on its buffers.
pub struct NcclRanks {
    lib: &'static NcclLib,
    comm: NcclComm,
    rank: usize,
    world: usize,
    ordinal: usize,
    ctx: std::sync::Arc<cudarc::driver::CudaContext>,
    /// This GPU's SMs, and the fewest of any rank's GPU (so that every rank decides alike).
    sm_count: u32,
    min_sm_count: u32,
    gathered: Option<DevMem>,
    peers: Option<PeerSpace>,
    /// Whether the peer workspace could be mapped on every rank (None: not tried yet).
    peer_ok: Option<bool>,
    retired: Vec<DevMem>,
    retired_peers: Vec<PeerSpace>,
}

// SAFETY: the communicator and the device addresses are plain handles; every use binds the
// GPU's context first, and `&mut self` serialises the calls of one handle.
unsafe impl Send for NcclRanks {}

fn cu(r: sys::CUresult, context: &'static str) -> Result<(), Error> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda {
            context,
            message: format!("{r:?}"),
        })
    }
}

fn alloc(bytes: usize) -> Result<DevMem, Error> {
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: an out-parameter; the context is bound by the caller.
    cu(
        unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(256)) },
        "allocating a tensor-parallel buffer",
    )?;
    Ok(DevMem { ptr, bytes })
}

impl NcclRanks {
    /// Joins the communicator of `world` ranks as `rank` on `gpu` (collective: every rank
    /// calls it with the same id), then exchanges the facts the ranks decide by.
    pub fn new(gpu: &Gpu, id: &UniqueId, rank: usize, world: usize) -> Result<NcclRanks, Error> {
        if !(1..=8).contains(&world) || rank >= world {
            return Err(Error::Unsupported(format!(
                "rank {rank} of {world}: the fused all-reduce takes 1 to 8 ranks"
            )));
        }
        let lib = nccl()?;
        bind_ctx(gpu)?;
        let mut comm: NcclComm = std::ptr::null_mut();
        // SAFETY: an out-parameter; the id is the one rank 0 created.
        lib.check(
            unsafe { (lib.comm_init_rank)(&mut comm, world as c_int, id.0, rank as c_int) },
            "ncclCommInitRank",
        )?;
        let mut me = NcclRanks {
            lib,
            comm,
            rank,
            world,
            ordinal: gpu.ordinal(),
            ctx: gpu.context().clone(),
            sm_count: gpu.sm_count(),
            min_sm_count: gpu.sm_count(),
            gathered: None,
            peers: None,
            peer_ok: None,
            retired: Vec::new(),
            retired_peers: Vec::new(),
        };
        let mine = (gpu.sm_count()).to_le_bytes();
        let all = me.exchange(&mine)?;
        me.min_sm_count = all
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .min()
            .unwrap_or(0);
        Ok(me)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// Whether every rank mapped every other's peer workspace (None before the first
    /// peer call or [`NcclRanks::map_peers`]).
    pub fn peers_mapped(&self) -> Option<bool> {
        self.peer_ok
    }

    /// All-gathers `mine` (the same length on every rank) into rank order, synchronously,
    /// on a stream of its own.
    fn exchange(&self, mine: &[u8]) -> Result<Vec<u8>, Error> {
        let stream = self.ctx.new_stream().map_err(|e| Error::Cuda {
            context: "a stream for the ranks' exchange",
            message: e.to_string(),
        })?;
        let n = mine.len();
        let buf = alloc(n * (self.world + 1))?;
        let recv = buf.ptr + n as u64;
        let res = (|| {
            // SAFETY: `buf` holds n + world·n bytes; the copy is ordered before the
            // all-gather on the same stream, and `mine` outlives the stream's sync below.
            unsafe {
                cu(
                    sys::cuMemcpyHtoDAsync_v2(
                        buf.ptr,
                        mine.as_ptr() as *const c_void,
                        n,
                        stream.cu_stream(),
                    ),
                    "the ranks' exchange",
                )?;
                self.lib.check(
                    (self.lib.all_gather)(
                        buf.ptr as *const c_void,
                        recv as *mut c_void,
                        n,
                        NCCL_UINT8,
                        self.comm,
                        stream.cu_stream(),
                    ),
                    "ncclAllGather (the ranks' exchange)",
                )?;
            }
            stream.synchronize().map_err(|e| Error::Cuda {
                context: "the ranks' exchange",
                message: e.to_string(),
            })?;
            let mut all = vec![0u8; n * self.world];
            // SAFETY: `all` has world·n bytes, the gathered records.
            cu(
                unsafe { sys::cuMemcpyDtoH_v2(all.as_mut_ptr() as *mut c_void, recv, all.len()) },
                "the ranks' exchange",
            )?;
            Ok(all)
        })();
        // SAFETY: the stream is synchronised (or failed); nothing else uses `buf`.
        unsafe { sys::cuMemFree_v2(buf.ptr) };
        res
    }

    /// Maps every rank's peer workspace of at least `bytes` per buffer and `pad_words`
    /// words per pad (collective; every rank calls it alike, as the calls do). Returns
    /// whether every rank mapped every other's: where one could not (no peer access with
    /// native atomics between the GPUs, GPUs that differ, another node, an allocation that
    /// failed), none uses peer access, now or later.
    pub fn map_peers(&mut self, bytes: usize, pad_words: usize) -> Result<bool, Error> {
        match (&self.peers, self.peer_ok) {
            (_, Some(false)) => return Ok(false),
            (Some(p), Some(true)) if p.buffer.bytes >= bytes && p.pad_words >= pad_words => {
                return Ok(true)
            }
            _ => {}
        }
        bind_ctx_of(&self.ctx)?;
        let bytes = bytes.max(1 << 20).next_power_of_two();
        let pad_words = pad_words.max(1 << 16).next_power_of_two();
        // A step that fails here only marks this rank's record: every rank still takes
        // part in both exchanges, so no failure leaves the others waiting in NCCL.
        let (buffer, pad) = (alloc(bytes).ok(), alloc(pad_words * 4).ok());
        let capability = self
            .ctx
            .compute_capability()
            .map_or(0, |(a, b)| (a * 10 + b) as u32);
        let uuid = self.ctx.uuid().map(|u| u.bytes).unwrap_or([0; 16]);
        let mut rec = PeerRecord {
            process: process_token(),
            uuid,
            ordinal: self.ordinal as u32,
            sm_count: self.sm_count,
            capability,
            ok: 0,
            buffer: buffer.as_ref().map_or(0, |b| b.ptr),
            pad: pad.as_ref().map_or(0, |b| b.ptr),
            buffer_handle: [0; 64],
            pad_handle: [0; 64],
        };
        if let (Some(buffer), Some(pad)) = (&buffer, &pad) {
            // The pad is 0 before any rank can know its address (the exchange follows).
            // SAFETY: `pad` holds pad_words words; synchronous.
            let zeroed = unsafe { sys::cuMemsetD32_v2(pad.ptr, 0, pad_words) }
                == sys::CUresult::CUDA_SUCCESS
                // SAFETY: waits for the memset (on the legacy stream) before the exchange.
                && unsafe { sys::cuCtxSynchronize() } == sys::CUresult::CUDA_SUCCESS;
            rec.ok = zeroed as u32;
            for (ptr, out) in [
                (buffer.ptr, &mut rec.buffer_handle),
                (pad.ptr, &mut rec.pad_handle),
            ] {
                // SAFETY: zeroed plain data, then an out-parameter for an allocation of
                // cuMemAlloc.
                let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
                if unsafe { sys::cuIpcGetMemHandle(&mut h, ptr) } == sys::CUresult::CUDA_SUCCESS {
                    *out = h.reserved;
                } else {
                    rec.ok = 0;
                }
            }
        }
        let all = self.exchange(as_bytes(&rec))?;
        let recs: Vec<PeerRecord> = all
            .chunks(std::mem::size_of::<PeerRecord>())
            .map(from_bytes)
            .collect();
        // Equal GPUs: the built-in launch table then gives every rank the same grid.
        let mut ok = recs
            .iter()
            .all(|r| r.ok == 1 && r.sm_count == rec.sm_count && r.capability == rec.capability);
        let mut space = match (buffer, pad) {
            (Some(buffer), Some(pad)) => Some(PeerSpace {
                buffer,
                pad,
                buffers: Vec::with_capacity(self.world),
                pads: Vec::with_capacity(self.world),
                pad_words,
                opened: Vec::new(),
                peer_ctxs: Vec::new(),
            }),
            (b, p) => {
                b.into_iter().chain(p).for_each(free);
                None
            }
        };
        if let (true, Some(space)) = (ok, space.as_mut()) {
            ok = self.map_records(&recs, space);
        }
        // Every rank learns whether every rank mapped every peer.
        let verdicts = self.exchange(&[ok as u8])?;
        let all_ok = verdicts.iter().all(|&v| v == 1);
        if let Some(space) = space {
            if let Some(old) = self.peers.replace(space) {
                self.retired_peers.push(old);
            }
        }
        self.peer_ok = Some(all_ok);
        Ok(all_ok)
    }

    /// Every rank's buffer and pad as addresses of this GPU, into `space`; false where a
    /// peer cannot be reached with native atomics (the signal pads' compare-and-swaps).
    fn map_records(&self, recs: &[PeerRecord], space: &mut PeerSpace) -> bool {
        let me = self.ctx.cu_device();
        for (k, r) in recs.iter().enumerate() {
            if k == self.rank {
                space.buffers.push(space.buffer.ptr);
                space.pads.push(space.pad.ptr);
                continue;
            }
            if r.process == process_token() {
                // A rank of this process (one thread per GPU): its addresses are valid
                // here once this context may access its device.
                let Ok(peer) = cudarc::driver::CudaContext::new(r.ordinal as usize) else {
                    return false;
                };
                // (Opening the peer's context made it current: this rank's again.)
                if bind_ctx_of(&self.ctx).is_err()
                    || !native_atomics(me, peer.cu_device())
                    || !enable_peer_access(&peer, me)
                {
                    return false;
                }
                space.peer_ctxs.push(peer);
                space.buffers.push(r.buffer);
                space.pads.push(r.pad);
                continue;
            }
            match device_with_uuid(&r.uuid) {
                Some(theirs) if native_atomics(me, theirs) => {}
                _ => return false,
            }
            for (handle, to_pads) in [(r.buffer_handle, false), (r.pad_handle, true)] {
                let mut ptr: sys::CUdeviceptr = 0;
                let h = sys::CUipcMemHandle { reserved: handle };
                // SAFETY: a handle another rank made for its live allocation.
                let res = unsafe {
                    sys::cuIpcOpenMemHandle_v2(
                        &mut ptr,
                        h,
                        sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                    )
                };
                if res != sys::CUresult::CUDA_SUCCESS {
                    return false;
                }
                space.opened.push(ptr);
                if to_pads {
                    space.pads.push(ptr);
                } else {
                    space.buffers.push(ptr);
                }
            }
        }
        true
    }

    /// The transport a call of `m` rows of `h` elements of `dtype` takes under `t` (the
    /// same on every rank).
    fn route(&self, t: Transport, m: usize, h: usize, dtype: crate::DType) -> Transport {
        match t {
            Transport::Auto => {
                if m <= PEER_MAX_ROWS
                    && m <= self.min_sm_count as usize
                    && self.peer_ok != Some(false)
                {
                    Transport::Peer(PeerStrategy::for_call(m, h, dtype, self.world))
                } else {
                    Transport::Gather
                }
            }
            other => other,
        }
    }

    /// Maps (or grows) the peer workspace for a peer call of `m` rows of `h`; whether
    /// every rank mapped every other's (an explicit peer transport is refused where not).
    fn peers_for(
        &mut self,
        m: usize,
        h: usize,
        elem: usize,
        strategy: PeerStrategy,
        explicit: bool,
    ) -> Result<bool, Error> {
        // A word per CTA and rank: at most 16 CTAs per row (a cluster).
        let words = RawPeers::signal_words_needed(m.max(1) * 16, self.world);
        let ok = self.map_peers(m * h * elem, words)?;
        if !ok && explicit {
            return Err(Error::Unsupported(format!(
                "peer access ({strategy:?}): not every rank could map every other's buffers \
                 (no peer access between the GPUs?); use Transport::Gather"
            )));
        }
        Ok(ok)
    }

    /// The gathered inputs' buffer of `bytes` per rank (grown, the old one kept).
    fn gather_buffer(&mut self, bytes: usize) -> Result<u64, Error> {
        let need = bytes * self.world;
        if self.gathered.as_ref().is_none_or(|g| g.bytes < need) {
            bind_ctx_of(&self.ctx)?;
            let mem = alloc(need.max(1 << 20).next_power_of_two())?;
            if let Some(old) = self.gathered.replace(mem) {
                self.retired.push(old);
            }
        }
        Ok(self.gathered.as_ref().unwrap().ptr)
    }

    /// All-gathers `x` (`m` rows of `h`, `e`-byte elements) into the gathered buffer on
    /// `stream`; the ranks' inputs as mats over it, rank order.
    ///
    /// # Safety
    /// `x` is a live, validated device matrix of this GPU.
    unsafe fn gather(
        &mut self,
        stream: sys::CUstream,
        x: &RawMat,
        e: usize,
    ) -> Result<Vec<RawMat>, Error> {
        let (m, h) = (x.rows, x.cols);
        let slot = m * h * e;
        let base = self.gather_buffer(slot)?;
        bind_ctx_of(&self.ctx)?;
        let own = base + (self.rank * slot) as u64;
        let send = if x.row_stride == h || m <= 1 {
            x.ptr
        } else {
            // Strided rows: packed into this rank's slot first (NCCL's in-place gather).
            let copy = sys::CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                srcHost: std::ptr::null(),
                srcDevice: x.ptr,
                srcArray: std::ptr::null_mut(),
                srcPitch: x.row_stride * e,
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstHost: std::ptr::null_mut(),
                dstDevice: own,
                dstArray: std::ptr::null_mut(),
                dstPitch: h * e,
                WidthInBytes: h * e,
                Height: m,
            };
            // SAFETY: source rows validated by the caller; the slot holds m·h elements.
            cu(
                unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream) },
                "packing strided rows for the all-gather",
            )?;
            own
        };
        // SAFETY: `send` holds m·h elements, the buffer world of them.
        self.lib.check(
            unsafe {
                (self.lib.all_gather)(
                    send as *const c_void,
                    base as *mut c_void,
                    slot,
                    NCCL_UINT8,
                    self.comm,
                    stream,
                )
            },
            "ncclAllGather (the ranks' inputs)",
        )?;
        Ok((0..self.world)
            .map(|k| RawMat {
                ptr: base + (k * slot) as u64,
                rows: m,
                cols: h,
                row_stride: h,
                len: Some(m * h),
            })
            .collect())
    }

    /// The FP4 op with the ranks' all-reduce fused in front (SPEC.md §9, then §1), on
    /// `stream`: `call.x` is this rank's input, the residual (required), weight and
    /// outputs this rank's. Every rank makes the same call. Returns the transport taken.
    /// Every argument is checked before any collective or write.
    ///
    /// # Safety
    /// As for [`Gpu::launch_raw_with`]; `gpu` is this handle's GPU.
    pub unsafe fn allreduce_add_rmsnorm_fp4quant_raw(
        &mut self,
        gpu: &Gpu,
        stream: sys::CUstream,
        call: &RawCall,
        transport: Transport,
        opts: &LaunchOptions,
    ) -> Result<Transport, Error> {
        // SAFETY: forwarded.
        unsafe { self.run(gpu, stream, Op::Fp4(call), transport, opts) }
    }

    /// [`NcclRanks::allreduce_add_rmsnorm_fp4quant_raw`] for the FP8 op (SPEC.md §9, then
    /// §8; a residual required).
    ///
    /// # Safety
    /// As for [`Gpu::launch_fp8_raw`]; `gpu` is this handle's GPU.
    pub unsafe fn allreduce_add_rmsnorm_fp8quant_raw(
        &mut self,
        gpu: &Gpu,
        stream: sys::CUstream,
        call: &RawFp8Call,
        transport: Transport,
        opts: &LaunchOptions,
    ) -> Result<Transport, Error> {
        // SAFETY: forwarded.
        unsafe { self.run(gpu, stream, Op::Fp8(call), transport, opts) }
    }

    /// A call of either op: checked, routed, then moved and launched.
    ///
    /// # Safety
    /// As for the two entry points.
    unsafe fn run(
        &mut self,
        gpu: &Gpu,
        stream: sys::CUstream,
        op: Op,
        transport: Transport,
        opts: &LaunchOptions,
    ) -> Result<Transport, Error> {
        self.check_gpu(gpu)?;
        let (m, h) = match op {
            Op::Fp4(c) => raw::precheck(gpu, c, opts)?,
            Op::Fp8(c) => raw::precheck_fp8(gpu, c, opts)?,
        };
        let (x, dtype, has_residual) = match op {
            Op::Fp4(c) => (c.x, c.dtype, c.residual.is_some()),
            Op::Fp8(c) => (c.x, c.dtype, c.residual.is_some()),
        };
        // The kernels' own refusals that every rank makes alike, here before any
        // collective (the residual; peer access past one row per SM of the smallest GPU).
        if !has_residual {
            return Err(Error::Unsupported(
                "the fused all-reduce on the GPU needs a residual (it keeps the ranks' sum there)"
                    .into(),
            ));
        }
        if matches!(transport, Transport::Peer(_)) && m > self.min_sm_count as usize {
            return Err(Error::Unsupported(format!(
                "{m} rows over peer access: at most {} (one per SM of the smallest GPU), \
                 where every CTA of a rank's grid is resident at once; use Transport::Gather",
                self.min_sm_count
            )));
        }
        let mut taken = self.route(transport, m, h, dtype);
        if let Transport::Peer(strategy) = taken {
            if !self.peers_for(m, h, dtype.size(), strategy, transport != Transport::Auto)? {
                taken = Transport::Gather;
            }
        }
        match taken {
            Transport::Peer(strategy) => {
                let space = self.peers.as_ref().expect("mapped by peers_for");
                let peers = RawPeers {
                    buffers: &space.buffers,
                    row_stride: h,
                    signal_pads: &space.pads,
                    signal_pad_words: space.pad_words,
                    rank: self.rank,
                    strategy,
                };
                // SAFETY: forwarded; every rank's buffer and pad is mapped here.
                unsafe {
                    match op {
                        Op::Fp4(c) => gpu.launch_allreduce_peer_raw(stream, c, &peers, opts)?,
                        Op::Fp8(c) => gpu.launch_fp8_allreduce_peer_raw(stream, c, &peers, opts)?,
                    }
                }
            }
            _ => {
                // SAFETY: `x` was validated by the precheck.
                let mats = unsafe { self.gather(stream, &x, dtype.size())? };
                // SAFETY: forwarded; the gathered rows are this handle's live buffer.
                unsafe {
                    match op {
                        Op::Fp4(c) => {
                            let c = RawCall { x: mats[0], ..*c };
                            gpu.launch_allreduce_raw(stream, &c, &mats[1..], opts)?
                        }
                        Op::Fp8(c) => {
                            let c = RawFp8Call { x: mats[0], ..*c };
                            gpu.launch_fp8_allreduce_raw(stream, &c, &mats[1..], opts)?
                        }
                    }
                }
            }
        }
        Ok(taken)
    }

    fn check_gpu(&self, gpu: &Gpu) -> Result<(), Error> {
        if gpu.ordinal() != self.ordinal {
            return Err(Error::DeviceMismatch {
                name: "the GPU of a tensor-parallel call",
                expected: format!("cuda:{}", self.ordinal),
                got: format!("cuda:{}", gpu.ordinal()),
            });
        }
        Ok(())
    }
}

impl Drop for NcclRanks {
    fn drop(&mut self) {
        if bind_ctx_of(&self.ctx).is_ok() {
            // The device idle first: a queued kernel may still read these buffers.
            let _ = self.ctx.synchronize();
            let spaces = self
                .peers
                .take()
                .into_iter()
                .chain(self.retired_peers.drain(..));
            let mut mems: Vec<DevMem> = self
                .gathered
                .take()
                .into_iter()
                .chain(self.retired.drain(..))
                .collect();
            for s in spaces {
                for p in s.opened {
                    // SAFETY: a mapping this handle opened, not used after the sync.
                    unsafe { sys::cuIpcCloseMemHandle(p) };
                }
                mems.push(s.buffer);
                mems.push(s.pad);
            }
            // (Idle after the sync.)
            mems.into_iter().for_each(free);
        }
        // SAFETY: this handle's communicator, destroyed once.
        unsafe { (self.lib.comm_destroy)(self.comm) };
    }
}

fn bind_ctx(gpu: &Gpu) -> Result<(), Error> {
    bind_ctx_of(gpu.context())
}

fn bind_ctx_of(ctx: &std::sync::Arc<cudarc::driver::CudaContext>) -> Result<(), Error> {
    ctx.bind_to_thread().map_err(|e| Error::Cuda {
        context: "binding the context",
        message: e.to_string(),
    })
}

/// Lets the current context (this rank's) access `peer`'s memory; false where it cannot.
fn enable_peer_access(peer: &cudarc::driver::CudaContext, me: sys::CUdevice) -> bool {
    if peer.cu_device() == me {
        return true;
    }
    // SAFETY: a retained primary context of a live device.
    let r = unsafe { sys::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) };
    r == sys::CUresult::CUDA_SUCCESS || r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
}

/// Whether `mine` reaches `theirs` with native atomics (NVLink, or a PCIe path that has
/// them): the signal pads are compare-and-swapped from every rank.
fn native_atomics(mine: sys::CUdevice, theirs: sys::CUdevice) -> bool {
    if mine == theirs {
        return true;
    }
    let mut v: c_int = 0;
    // SAFETY: an out-parameter; device handles of the driver.
    let r = unsafe {
        sys::cuDeviceGetP2PAttribute(
            &mut v,
            sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
            mine,
            theirs,
        )
    };
    r == sys::CUresult::CUDA_SUCCESS && v == 1
}

/// The device of this process with that UUID (None where it is not visible here).
fn device_with_uuid(uuid: &[c_char; 16]) -> Option<sys::CUdevice> {
    let mut n: c_int = 0;
    // SAFETY: out-parameters of the driver's device queries.
    unsafe {
        if sys::cuDeviceGetCount(&mut n) != sys::CUresult::CUDA_SUCCESS {
            return None;
        }
        (0..n).find_map(|i| {
            let mut d: sys::CUdevice = 0;
            let mut u: sys::CUuuid = std::mem::zeroed();
            (sys::cuDeviceGet(&mut d, i) == sys::CUresult::CUDA_SUCCESS
                && sys::cuDeviceGetUuid_v2(&mut u, d) == sys::CUresult::CUDA_SUCCESS
                && u.bytes == *uuid)
                .then_some(d)
        })
    }
}

fn free(m: DevMem) {
    // SAFETY: an allocation of this handle that nothing uses.
    unsafe { sys::cuMemFree_v2(m.ptr) };
}

fn as_bytes(r: &PeerRecord) -> &[u8] {
    // SAFETY: a plain-data repr(C) struct without padding (8 + 16 + 4·4 + 2·8 + 2·64
    // bytes, every field at a multiple of its alignment).
    unsafe {
        std::slice::from_raw_parts(
            r as *const PeerRecord as *const u8,
            std::mem::size_of::<PeerRecord>(),
        )
    }
}

fn from_bytes(b: &[u8]) -> PeerRecord {
    // SAFETY: `b` holds one record's bytes (a chunk of its size); every bit pattern is a
    // valid PeerRecord; read unaligned.
    unsafe { std::ptr::read_unaligned(b.as_ptr() as *const PeerRecord) }
}
