//! Hostile-input harness shared by `tests/hostile.rs` (proptest) and the cargo-fuzz target
//! `fuzz/fuzz_targets/host_api.rs` (which includes this file by path).
//!
//! [`check`] decodes arbitrary bytes into calls of the public host API — shapes (`M`, `H`
//! including 0, non-multiples of the block and sizes near `usize::MAX`), row strides (too
//! small, overflowing), dtypes, the four format pairings, the three layouts, `eps`
//! (NaN, ±Inf, negative), global scales (uniform, per row, wrong lengths), buffer sizes
//! (exact, too small, too large), `y_out` on/off, both variants — and runs each call through
//! `fp4norm::cpu` **and** `fp4norm::reference` on identical copies of every buffer, plus
//! `fp4norm::dequantize` and `Problem::new`. It asserts SPEC.md §5:
//!
//! * nothing panics (a panic is the failure the fuzzer reports);
//! * a call that returns `Err` left every output buffer and the residual byte-identical
//!   to its snapshot, and both backends return the same error;
//! * a call that returns `Ok` returned `Ok` on both backends with byte-identical outputs,
//!   wrote nothing outside the views (strided gaps, `M = 0`), and zeroed the swizzled padding;
//! * `dequantize` writes nothing on `Err`, and on `Ok` writes exactly SPEC.md §4's values;
//! * `Problem::new` never panics, and a `Problem` it accepts answers every size query.
//!
//! Bytes are consumed front to back; an exhausted input reads as zeros, and a zero byte
//! always selects the ordinary (valid) choice, so short inputs are valid calls and every
//! extra byte can only add a corruption.
#![allow(dead_code)]

mod fp8;
pub use fp8::check_fp8;

use fp4norm::codec::{e2m1_decode, e4m3_decode, ue8m0_decode};
use fp4norm::layout::{row_major_len, swizzled_len, swizzled_offset};
use fp4norm::{
    bf16, cpu, dequantize, f16, reference, DType, Element, Error, Fp4Format, Fp4Out, GlobalScale,
    MatMut, MatRef, Options, Problem, ScaleFormat, ScaleIn, ScaleLayout, ScaleOut,
};

/// Largest buffer (in elements) the harness allocates; larger requests get a short buffer.
pub const CAP: usize = 1 << 16;

/// What one [`check`] exercised, for counting in tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The fused call returned `Ok` on both backends.
    pub fused_ok: bool,
    /// A view constructor (`MatRef`/`MatMut::with_stride`) refused its arguments.
    pub view_err: bool,
    /// `dequantize` returned `Ok`.
    pub dequant_ok: bool,
}

/// A byte reader that never fails: past the end it reads zeros.
pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    /// Reads `data` from the start.
    pub fn new(data: &'a [u8]) -> Self {
        Input { data, pos: 0 }
    }
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }
    fn u64(&mut self) -> u64 {
        (self.u32() as u64) | ((self.u32() as u64) << 32)
    }
    /// A value in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        self.u16() as usize % n
    }
    /// One of `items`; a zero byte picks the first.
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.byte() as usize % items.len()]
    }
    /// A selector in `0..n`: a zero byte (and most others) select 0, the common case.
    fn sel(&mut self, n: u8) -> u8 {
        let b = self.byte();
        if b < 128 {
            0
        } else {
            1 + (b - 128) % (n - 1)
        }
    }
}

/// splitmix64: fills buffers from one seed so that big buffers need no input bytes.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Element bits: mostly moderate finite values, sometimes NaN/Inf/zero/subnormal/max.
    fn elem(&mut self, f16: bool) -> u16 {
        let r = self.next();
        if r % 16 == 0 {
            let specials: [u16; 10] = if f16 {
                [
                    0x7E00, 0xFE00, 0x7C01, 0x7C00, 0xFC00, 0x0000, 0x8000, 0x0001, 0x7BFF, 0xFBFF,
                ]
            } else {
                [
                    0x7FC0, 0xFFC0, 0x7F81, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x7F7F, 0xFF7F,
                ]
            };
            specials[(r >> 8) as usize % specials.len()]
        } else if r % 16 == 1 {
            (r >> 16) as u16 // any bits
        } else {
            // |v| in about [2^-4, 2^4): exponent near the bias, random mantissa and sign.
            let sign = ((r >> 20) as u16 & 1) << 15;
            if f16 {
                sign | ((11 + (r >> 24) % 8) as u16) << 10 | ((r >> 32) as u16 & 0x3FF)
            } else {
                sign | ((123 + (r >> 24) % 8) as u16) << 7 | ((r >> 32) as u16 & 0x7F)
            }
        }
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Awkward f32 values for `eps` and global scales.
const SPECIAL_F32: [f32; 14] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    0.0,
    -0.0,
    -1.0,
    -1e-6,
    1e-45,
    f32::MIN_POSITIVE,
    f32::MAX,
    448.0 * 6.0,
    1e30,
    0.5,
    3.0,
];

fn special_or_bits(inp: &mut Input<'_>) -> f32 {
    if inp.byte() & 1 == 0 {
        inp.pick(&SPECIAL_F32)
    } else {
        f32::from_bits(inp.u32())
    }
}

/// `M`: mostly small, sometimes at the 128-row tile edges, sometimes absurd.
fn decode_m(inp: &mut Input<'_>) -> usize {
    match inp.sel(8) {
        0 => inp.below(20),
        1 => 0,
        2 => 127 + inp.below(3),
        3 => 255 + inp.below(3),
        4 => inp.below(300),
        5 => inp.pick(&[
            usize::MAX,
            usize::MAX / 2 + 1,
            1 << 40,
            1 << 32,
            1 << 31,
            (1 << 31) + 1,
        ]),
        6 => inp.u64() as usize,
        _ => 1,
    }
}

/// `H`: mostly a multiple of the block, sometimes 0, a non-multiple, or absurd.
fn decode_h(inp: &mut Input<'_>, block: usize) -> usize {
    match inp.sel(7) {
        0 => block * (1 + inp.below(8)),
        1 => 0,
        2 => 16 * (1 + inp.below(16)), // a non-multiple when the block is 32 and this is odd
        3 => block * (1 + inp.below(8)) + 1 + inp.below(block - 1), // never a multiple
        4 => inp.pick(&[usize::MAX, usize::MAX - 15, 1 << 62, 1 << 40, 1 << 31]),
        5 => inp.u64() as usize,
        _ => inp.below(100),
    }
}

/// Elements a view spans (`None` if it overflows).
fn span(rows: usize, cols: usize, stride: usize) -> Option<usize> {
    if rows == 0 {
        Some(0)
    } else {
        (rows - 1).checked_mul(stride)?.checked_add(cols)
    }
}

/// A buffer length near `expected`: exact, short, long or empty; short if `expected` is
/// unknown (overflowed) or too big to allocate.
fn decode_len(inp: &mut Input<'_>, expected: Option<usize>) -> usize {
    let s = inp.sel(5);
    match expected {
        Some(e) if e <= CAP => match s {
            0 => e,
            1 if e > 0 => e - 1 - inp.below(e),
            2 => e + 1 + inp.below(40),
            3 => 0,
            _ => e.saturating_sub(1),
        },
        _ => inp.below(64),
    }
}

/// One matrix argument: shape, row stride and buffer length (all possibly wrong).
#[derive(Clone, Copy, Debug)]
pub struct MatSpec {
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
    /// Buffer length in elements.
    pub len: usize,
}

fn decode_mat(inp: &mut Input<'_>, m: usize, h: usize, may_reshape: bool) -> MatSpec {
    let (mut rows, mut cols) = (m, h);
    if may_reshape {
        match inp.sel(5) {
            1 => rows = m.wrapping_add(1),
            2 => rows = m.saturating_sub(1),
            3 => cols = h.wrapping_add(16),
            4 => cols = h.saturating_sub(1),
            _ => {}
        }
    }
    let stride = match inp.sel(8) {
        0 => cols,
        1 => cols.wrapping_add(1 + inp.below(9)),
        2 => cols.saturating_sub(1 + inp.below(cols.clamp(1, 64))),
        3 => 0,
        4 => inp.pick(&[usize::MAX, usize::MAX / 2, 1 << 62, 1 << 32]),
        5 => inp.u64() as usize,
        6 => cols.wrapping_add(16 * inp.below(4)),
        _ => cols,
    };
    let len = decode_len(inp, span(rows, cols, stride));
    MatSpec {
        rows,
        cols,
        stride,
        len,
    }
}

/// The global scale argument.
#[derive(Clone, Debug)]
pub enum GsSpec {
    /// `GlobalScale::Uniform`.
    Uniform(f32),
    /// `GlobalScale::PerRow` with this buffer (any length).
    PerRow(Vec<f32>),
}

fn decode_gs(inp: &mut Input<'_>, m: usize) -> GsSpec {
    match inp.sel(4) {
        0 => GsSpec::Uniform(1.0),
        1 => GsSpec::Uniform(special_or_bits(inp)),
        _ => {
            let n = decode_len(inp, Some(m));
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(match inp.sel(3) {
                    0 => 1.0 + inp.below(8) as f32 * 0.25,
                    _ => special_or_bits(inp),
                });
            }
            GsSpec::PerRow(v)
        }
    }
}

/// One fused call, decoded from bytes.
#[derive(Clone, Debug)]
pub struct FusedSpec {
    /// f16 (else bf16).
    pub f16: bool,
    /// Block size and scale format.
    pub format: Fp4Format,
    /// Scale layout(s).
    pub layout: ScaleLayout,
    /// `M` and `H` of the input.
    pub m: usize,
    /// Hidden size.
    pub h: usize,
    pub x: MatSpec,
    pub residual: Option<MatSpec>,
    pub y_out: Option<MatSpec>,
    pub w_len: usize,
    pub q_len: usize,
    pub rm_len: usize,
    pub sw_len: usize,
    pub eps: f32,
    pub gs: GsSpec,
    pub seed: u64,
    /// SPEC.md §8's weight bias: 0, or an awkward f32 (NaN and ±Inf are bad input).
    pub weight_bias: f32,
}

impl FusedSpec {
    /// Decodes one call (valid when every byte read is zero).
    pub fn decode(inp: &mut Input<'_>) -> Self {
        let f16 = inp.byte() & 1 == 1;
        let format = inp.pick(&Fp4Format::ALL);
        let layout = inp.pick(&ScaleLayout::ALL);
        let with_residual = inp.byte() & 1 == 0;
        let with_y_out = inp.byte() & 1 == 1;
        let block = format.block_size();
        let m = decode_m(inp);
        let h = decode_h(inp, block);
        let x = decode_mat(inp, m, h, false);
        let residual = with_residual.then(|| decode_mat(inp, m, h, true));
        let y_out = with_y_out.then(|| decode_mat(inp, m, h, true));
        let w_len = decode_len(inp, Some(h));
        let nb = h / block;
        let q_len = decode_len(inp, m.checked_mul(h / 2));
        let rm_len = decode_len(inp, row_major_len(m, nb).ok());
        let sw_len = decode_len(inp, swizzled_len(m, nb).ok());
        let eps = match inp.sel(3) {
            0 => 1e-6,
            _ => special_or_bits(inp),
        };
        let gs = decode_gs(inp, m);
        let seed = inp.u64();
        // Read last, so that the inputs decoded before it keep their meaning.
        let weight_bias = match inp.sel(3) {
            0 => 0.0,
            _ => special_or_bits(inp),
        };
        FusedSpec {
            f16,
            format,
            layout,
            m,
            h,
            x,
            residual,
            y_out,
            w_len,
            q_len,
            rm_len,
            sw_len,
            eps,
            gs,
            seed,
            weight_bias,
        }
    }
}

/// Every buffer of one call.
#[derive(Clone, Debug, PartialEq)]
struct Buffers<T> {
    x: Vec<T>,
    residual: Vec<T>,
    y_out: Vec<T>,
    w: Vec<T>,
    q: Vec<u8>,
    rm: Vec<u8>,
    sw: Vec<u8>,
}

fn bits<T: Element>(v: &[T]) -> Vec<u16> {
    v.iter().map(|e| e.to_bits()).collect()
}

impl<T: Element> Buffers<T> {
    fn new(s: &FusedSpec) -> Self {
        let mut rng = Rng(s.seed);
        let f16 = T::DTYPE == DType::F16;
        let mut elems =
            |n: usize| -> Vec<T> { (0..n).map(|_| T::from_bits(rng.elem(f16))).collect() };
        let x = elems(s.x.len);
        let residual = elems(s.residual.map_or(0, |r| r.len));
        let w = elems(s.w_len);
        let y_out = elems(s.y_out.map_or(0, |y| y.len));
        let mut rng = Rng(s.seed ^ 0x5555);
        Buffers {
            x,
            residual,
            y_out,
            w,
            q: rng.bytes(s.q_len),
            rm: rng.bytes(if s.layout.has_row_major() {
                s.rm_len
            } else {
                0
            }),
            sw: rng.bytes(if s.layout.has_swizzled() { s.sw_len } else { 0 }),
        }
    }

    /// Byte equality (NaN payloads included).
    fn same_bytes(&self, o: &Self) -> bool {
        bits(&self.x) == bits(&o.x)
            && bits(&self.residual) == bits(&o.residual)
            && bits(&self.y_out) == bits(&o.y_out)
            && bits(&self.w) == bits(&o.w)
            && self.q == o.q
            && self.rm == o.rm
            && self.sw == o.sw
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Cpu,
    Reference,
}

/// Why a call did not run: a view constructor refused, or the op returned an error.
#[derive(Debug)]
enum CallErr {
    View(Error),
    Op(Error),
}

fn invoke<T: Element>(s: &FusedSpec, b: &mut Buffers<T>, be: Backend) -> Result<(), CallErr> {
    let Buffers {
        x,
        residual,
        y_out,
        w,
        q,
        rm,
        sw,
    } = b;
    let (xv, rv, yv) = views(
        x,
        &s.x,
        residual,
        s.residual.as_ref(),
        y_out,
        s.y_out.as_ref(),
    )?;
    let scales = match s.layout {
        ScaleLayout::RowMajor => ScaleOut::RowMajor(&mut rm[..]),
        ScaleLayout::Swizzled => ScaleOut::Swizzled(&mut sw[..]),
        ScaleLayout::Both => ScaleOut::Both {
            row_major: &mut rm[..],
            swizzled: &mut sw[..],
        },
    };
    let out = Fp4Out {
        y_fp4: &mut q[..],
        scales,
        y_out: yv,
    };
    let gs = match &s.gs {
        GsSpec::Uniform(g) => GlobalScale::Uniform(*g),
        GsSpec::PerRow(v) => GlobalScale::PerRow(v),
    };
    let opts = Options {
        format: s.format,
        eps: s.eps,
        weight_bias: s.weight_bias,
    };
    let w = &w[..];
    let r = match (be, rv) {
        (Backend::Cpu, Some(r)) => cpu::add_rmsnorm_fp4quant(xv, r, w, out, gs, &opts),
        (Backend::Cpu, None) => cpu::rmsnorm_fp4quant(xv, w, out, gs, &opts),
        (Backend::Reference, Some(r)) => reference::add_rmsnorm_fp4quant(xv, r, w, out, gs, &opts),
        (Backend::Reference, None) => reference::rmsnorm_fp4quant(xv, w, out, gs, &opts),
    };
    r.map_err(CallErr::Op)
}

/// The input, residual and y_out views of one call, as its specs shape them.
type Views<'a, T> = (MatRef<'a, T>, Option<MatMut<'a, T>>, Option<MatMut<'a, T>>);

fn views<'a, T: Element>(
    x: &'a [T],
    x_spec: &MatSpec,
    residual: &'a mut [T],
    residual_spec: Option<&MatSpec>,
    y_out: &'a mut [T],
    y_out_spec: Option<&MatSpec>,
) -> Result<Views<'a, T>, CallErr> {
    let xv =
        MatRef::with_stride(x, x_spec.rows, x_spec.cols, x_spec.stride).map_err(CallErr::View)?;
    let view = |buf: &'a mut [T], spec: Option<&MatSpec>| {
        spec.map(|v| MatMut::with_stride(buf, v.rows, v.cols, v.stride).map_err(CallErr::View))
            .transpose()
    };
    Ok((xv, view(residual, residual_spec)?, view(y_out, y_out_spec)?))
}

/// Both backends refused a call: the same error, neither wrote a byte (`a_kept`, `b_kept`:
/// their buffers equal the snapshot), and the message says something.
fn refused_alike(
    ea: &CallErr,
    eb: &CallErr,
    a_kept: bool,
    b_kept: bool,
    call: &dyn std::fmt::Debug,
) {
    assert_eq!(
        format!("{ea:?}"),
        format!("{eb:?}"),
        "cpu and reference disagree on the error"
    );
    assert!(a_kept, "cpu wrote before returning {ea:?}\n{call:?}");
    assert!(b_kept, "reference wrote before returning {eb:?}\n{call:?}");
    let (CallErr::View(e) | CallErr::Op(e)) = ea;
    assert!(!e.to_string().is_empty());
}

/// Only a view's rows are written: the strided gaps of `after` keep `before`'s bytes.
fn gaps_kept<T: Element>(before: &[T], after: &[T], view: Option<&MatSpec>) {
    if let Some(v) = view {
        for i in outside_view(before.len(), v) {
            assert_eq!(
                after[i].to_bits(),
                before[i].to_bits(),
                "gap element {i} written"
            );
        }
    }
}

/// Elements of a `len`-element buffer outside the rows of a `rows × cols` view.
fn outside_view(len: usize, v: &MatSpec) -> Vec<usize> {
    let mut inside = vec![false; len];
    for i in 0..v.rows {
        let start = i * v.stride;
        inside[start..start + v.cols]
            .iter_mut()
            .for_each(|e| *e = true);
    }
    (0..len).filter(|&i| !inside[i]).collect()
}

/// Runs one fused call on both backends and checks the invariants.
pub fn run_spec(s: &FusedSpec) -> Outcome {
    if s.f16 {
        run_fused::<f16>(s)
    } else {
        run_fused::<bf16>(s)
    }
}

fn run_fused<T: Element>(s: &FusedSpec) -> Outcome {
    let before = Buffers::<T>::new(s);
    let mut a = before.clone();
    let mut b = before.clone();
    let ra = invoke(s, &mut a, Backend::Cpu);
    let rb = invoke(s, &mut b, Backend::Reference);
    match (&ra, &rb) {
        (Err(ea), Err(eb)) => {
            refused_alike(ea, eb, a.same_bytes(&before), b.same_bytes(&before), s);
            Outcome {
                view_err: matches!(ea, CallErr::View(_)),
                ..Outcome::default()
            }
        }
        (Ok(()), Ok(())) => {
            assert!(a.same_bytes(&b), "cpu and reference outputs differ\n{s:?}");
            gaps_kept(&before.residual, &a.residual, s.residual.as_ref());
            gaps_kept(&before.y_out, &a.y_out, s.y_out.as_ref());
            if s.m == 0 {
                assert!(a.same_bytes(&before), "M = 0 wrote something\n{s:?}");
            }
            // Swizzled padding is zero (SPEC.md §3).
            if s.layout.has_swizzled() {
                let nb = s.h / s.format.block_size();
                let mut real = vec![false; a.sw.len()];
                for row in 0..s.m {
                    for blk in 0..nb {
                        real[swizzled_offset(row, blk, nb)] = true;
                    }
                }
                for (i, &r) in real.iter().enumerate() {
                    assert!(
                        r || a.sw[i] == 0,
                        "swizzled padding byte {i} is {:#x}",
                        a.sw[i]
                    );
                }
                if s.layout == ScaleLayout::Both {
                    for row in 0..s.m {
                        for blk in 0..nb {
                            assert_eq!(a.rm[row * nb + blk], a.sw[swizzled_offset(row, blk, nb)]);
                        }
                    }
                }
            }
            Outcome {
                fused_ok: true,
                ..Outcome::default()
            }
        }
        _ => panic!("cpu returned {ra:?} but reference returned {rb:?}\n{s:?}"),
    }
}

/// SPEC.md §4 for one element, with the canonical NaN.
fn dequant_value(format: Fp4Format, nibble: u8, code: u8, gs: f32) -> u32 {
    let e = e2m1_decode(nibble);
    let v = match format.scale {
        ScaleFormat::E4M3 => (e * e4m3_decode(code)) / gs,
        ScaleFormat::UE8M0 => e * ue8m0_decode(code),
    };
    if v.is_nan() {
        0x7FFF_FFFF
    } else {
        v.to_bits()
    }
}

fn run_dequant(inp: &mut Input<'_>) -> bool {
    let format = inp.pick(&Fp4Format::ALL);
    let swz = inp.byte() & 1 == 1;
    let block = format.block_size();
    let m = decode_m(inp);
    let h = decode_h(inp, block);
    let nb = h / block;
    let q_len = decode_len(inp, m.checked_mul(h / 2));
    let sf_len = decode_len(
        inp,
        if swz {
            swizzled_len(m, nb).ok()
        } else {
            row_major_len(m, nb).ok()
        },
    );
    let out_len = decode_len(inp, m.checked_mul(h));
    let gs = decode_gs(inp, m);
    let mut rng = Rng(inp.u64());
    let q = rng.bytes(q_len);
    let sf = rng.bytes(sf_len);
    let before: Vec<u32> = (0..out_len).map(|_| rng.next() as u32).collect();
    let mut out: Vec<f32> = before.iter().map(|&b| f32::from_bits(b)).collect();
    let g = match &gs {
        GsSpec::Uniform(g) => GlobalScale::Uniform(*g),
        GsSpec::PerRow(v) => GlobalScale::PerRow(v),
    };
    let scales = if swz {
        ScaleIn::Swizzled(&sf)
    } else {
        ScaleIn::RowMajor(&sf)
    };
    let after = |out: &[f32]| out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    match dequantize(m, h, format, &q, scales, g, &mut out) {
        Err(e) => {
            assert_eq!(
                after(&out),
                before,
                "dequantize wrote before returning {e:?}"
            );
            false
        }
        Ok(()) => {
            for row in 0..m {
                for i in 0..h {
                    let blk = i / block;
                    let code = if swz {
                        sf[swizzled_offset(row, blk, nb)]
                    } else {
                        sf[row * nb + blk]
                    };
                    let nibble = (q[row * (h / 2) + i / 2] >> (4 * (i % 2))) & 0xF;
                    let want = dequant_value(format, nibble, code, g.row(row));
                    assert_eq!(out[row * h + i].to_bits(), want, "dequantize ({row}, {i})");
                }
            }
            true
        }
    }
}

/// `Problem::new` on any sizes: never panics; an accepted problem answers every query.
pub fn run_problem(inp: &mut Input<'_>) {
    let m = decode_m(inp);
    let format = inp.pick(&Fp4Format::ALL);
    let h = decode_h(inp, format.block_size());
    let layout = inp.pick(&ScaleLayout::ALL);
    let dtype = if inp.byte() & 1 == 1 {
        DType::F16
    } else {
        DType::BF16
    };
    let eps = match inp.sel(3) {
        0 => 1e-6,
        _ => special_or_bits(inp),
    };
    let opts = Options::default().with_format(format).with_eps(eps);
    if let Ok(p) = Problem::new(m, h, dtype, layout, &opts) {
        let (fp4, rm, sw) = (
            p.fp4_len(),
            p.row_major_scales_len(),
            p.swizzled_scales_len(),
        );
        assert_eq!(fp4 as u128, m as u128 * h as u128 / 2);
        assert_eq!(rm as u128, m as u128 * (h / format.block_size()) as u128);
        assert!(sw >= rm);
        for p in [
            p,
            p.without_residual(),
            p.with_y_out(true),
            p.without_residual().with_y_out(true),
        ] {
            let _ = p.scale_bytes_written();
            // SPEC.md §6 in u128: `bytes_moved` must be this figure (it is 64-bit).
            let (mh, e) = (m as u128 * h as u128, 2u128);
            let io = if p.has_residual { 3 } else { 1 };
            let yo = if p.has_y_out { mh * e } else { 0 };
            let scale = (if layout.has_row_major() {
                rm as u128
            } else {
                0
            }) + (if layout.has_swizzled() { sw as u128 } else { 0 });
            let want = mh * io * e + h as u128 * e + mh / 2 + scale + yo;
            let got = p.bytes_moved();
            assert!(
                got as u128 == want || (want > u64::MAX as u128 && got == u64::MAX),
                "bytes_moved {got} for {p:?}, SPEC.md §6 gives {want}"
            );
        }
    }
}

/// Decodes `data` into one fused call, one `dequantize` call and one `Problem::new`, runs
/// them and asserts the invariants above (panicking on a violation).
pub fn check(data: &[u8]) -> Outcome {
    let mut inp = Input::new(data);
    let spec = FusedSpec::decode(&mut inp);
    let mut outcome = run_spec(&spec);
    outcome.dequant_ok = run_dequant(&mut inp);
    run_problem(&mut inp);
    outcome
}
