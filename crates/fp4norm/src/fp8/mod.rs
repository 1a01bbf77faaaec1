//! The FP8 members of the family (SPEC.md §8): residual add + RMSNorm (with an optional
//! weight bias) + FP8 quantisation, E4M3 or E5M2 elements, with a per-tensor static scale
//! or dynamic scales per group (per token, or groups of 32, 64, 128; f32 or UE8M0 scales).
//!
//! ```text
//! residual ← RNdt(input + residual)                            (in place)
//! y        ← RN32(RN32(residual · rstd) · w')                   w' = RN32(w + weight_bias)
//! q        ← FP8(RN32(y · inv))                                 inv = RN32(1/s) per tensor or group
//! ```
//!
//! Steps 1–4 of SPEC.md §1 are shared with the FP4 op, so `y` (and `y_out`) is bit for bit
//! the FP4 op's for the same inputs. The entry points mirror the FP4 op's:
//! [`cpu`] (rows in parallel; also re-exported here) and [`reference`](mod@reference) (the
//! spec, step by step), plus [`dequantize`]. [`Fp8Problem`] gives every buffer length, so
//! callers never compute one by hand.
//!
//! Readings of SPEC.md §8 where its text leaves a choice (each one tested):
//! * A zero `weight_bias` (either sign) leaves the weight unchanged, so that `-0` weights
//!   keep their sign as §8 promises ([`biased_weight`]).
//! * The per-tensor scale's dequantisation multiplies by `s`: `q = FP8(y · RN32(1/s))`
//!   is undone by `RN32(fp8_value(q) · s)` (§8's Dequantisation line writes `/ s`, which
//!   would give `y / s²`).
//! * Any per-tensor `s` is accepted and flows through the formula (like `gs`, it is read
//!   from device memory on a GPU); `s_min` must be finite and ≥ 0; `weight_bias` finite.
//! * Per-token scales and the per-tensor scale accept any `H ≥ 1`; the swizzled layout is
//!   allowed whenever the group is 32 elements, also per token with `H = 32`; the packed
//!   column-major layout only for groups of 32, 64 or 128 (not per token, whatever `H`:
//!   its words hold several groups of a row).
//! * Column-major padding rows (packed or not), the packed layout's bytes past `H/G` and
//!   swizzled padding are 0 (f32 `+0.0`, or UE8M0 code 0).
//!
//! ```
//! use fp4norm::fp8::{self, Fp8Element, Fp8Options, Fp8Out, Fp8Problem, Fp8Scales};
//! use fp4norm::{bf16, DType, MatMut, MatRef};
//!
//! let (m, h) = (2, 64);
//! let x = vec![bf16::from_f32(0.25); m * h];
//! let mut residual = vec![bf16::from_f32(0.75); m * h];
//! let weight = vec![bf16::ONE; h];
//! // Per-token dynamic scales (G = H), f32, row-major: one scale per row.
//! let opts = Fp8Options::per_token(Fp8Element::E4M3).with_eps(0.0);
//! let p = Fp8Problem::new(m, h, DType::BF16, &opts)?;
//! let mut q = vec![0u8; p.q_len()];
//! let mut scales = vec![0f32; p.scales_len()];
//! fp8::add_rmsnorm_fp8quant(
//!     MatRef::new(&x, m, h)?,
//!     MatMut::new(&mut residual, m, h)?,
//!     &weight,
//!     Fp8Out { q: &mut q, scales: Fp8Scales::F32(&mut scales), y_out: None },
//!     &opts,
//! )?;
//! // Every h is 1.0, so rstd = 1 and y = 1: s = RN32(1/448), and 1 · RN32(1/s) → E4M3 448.
//! assert_eq!(residual[0], bf16::ONE);
//! assert_eq!(scales, vec![1.0f32 / 448.0; 2]);
//! assert_eq!(q[0], 0x7E);
//! # Ok::<(), fp4norm::Error>(())
//! ```

pub mod cpu;
pub mod raw;
pub mod reference;

use rayon::prelude::*;

use crate::codec::{
    e4m3_decode, e4m3_encode, e5m2_decode, e5m2_encode, ue8m0_decode, E4M3_MAX, E5M2_MAX,
};
use crate::layout::{swizzled_len, swizzled_offset};
use crate::{DType, Element, Error, MatMut, MatRef};

pub use cpu::{add_rmsnorm_fp8quant, rmsnorm_fp8quant};
pub use raw::{run_host_fp8, Fp8Checked, RawFp8Call};

/// The FP8 element format of `q`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8Element {
    /// E4M3 (fn): bias 7, max 448, no infinities (SPEC.md §2).
    E4M3,
    /// E5M2: bias 15, max 57344 (SPEC.md §8); the encoder saturates, never writes ±Inf.
    E5M2,
}

impl Fp8Element {
    /// Both formats.
    pub const ALL: [Fp8Element; 2] = [Fp8Element::E4M3, Fp8Element::E5M2];

    /// `FMAX`, the largest finite magnitude: 448 or 57344.
    pub fn max(self) -> f32 {
        match self {
            Fp8Element::E4M3 => E4M3_MAX,
            Fp8Element::E5M2 => E5M2_MAX,
        }
    }

    /// The saturating encoder of SPEC.md §8 ([`e4m3_encode`] or [`e5m2_encode`]).
    #[inline(always)]
    pub fn encode(self, v: f32) -> u8 {
        match self {
            Fp8Element::E4M3 => e4m3_encode(v),
            Fp8Element::E5M2 => e5m2_encode(v),
        }
    }

    /// The exact value of a code (NaN codes give NaN, E5M2's `0x7C`/`0xFC` ±Inf).
    #[inline(always)]
    pub fn decode(self, code: u8) -> f32 {
        match self {
            Fp8Element::E4M3 => e4m3_decode(code),
            Fp8Element::E5M2 => e5m2_decode(code),
        }
    }

    /// The short name (`e4m3`, `e5m2`).
    pub fn name(self) -> &'static str {
        match self {
            Fp8Element::E4M3 => "e4m3",
            Fp8Element::E5M2 => "e5m2",
        }
    }
}

impl std::fmt::Display for Fp8Element {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Elements per dynamic scale: per token (`G = H`) or 32, 64, 128.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8Group {
    /// One scale per row: `G = H`.
    PerToken,
    /// Groups of 32 (MXFP8 with UE8M0 scales).
    G32,
    /// Groups of 64.
    G64,
    /// Groups of 128 (DeepSeek-style per-group activations).
    G128,
}

impl Fp8Group {
    /// Every group choice.
    pub const ALL: [Fp8Group; 4] = [
        Fp8Group::PerToken,
        Fp8Group::G32,
        Fp8Group::G64,
        Fp8Group::G128,
    ];

    /// `G` for hidden size `h`.
    pub fn size(self, h: usize) -> usize {
        match self {
            Fp8Group::PerToken => h,
            Fp8Group::G32 => 32,
            Fp8Group::G64 => 64,
            Fp8Group::G128 => 128,
        }
    }
}

impl TryFrom<usize> for Fp8Group {
    type Error = Error;
    /// 32, 64 or 128 (per token is [`Fp8Group::PerToken`], not a number).
    fn try_from(g: usize) -> Result<Self, Error> {
        match g {
            32 => Ok(Fp8Group::G32),
            64 => Ok(Fp8Group::G64),
            128 => Ok(Fp8Group::G128),
            _ => Err(Error::InvalidGroupSize(g)),
        }
    }
}

/// How a dynamic group scale is stored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fp8ScaleFormat {
    /// `s = max(RN32(amax / FMAX), s_min)` as f32; `s_min` finite and ≥ 0 (0: no floor).
    F32 {
        /// The scale floor (vLLM's per-token quant uses `1/(448·512)`).
        s_min: f32,
    },
    /// A power-of-two UE8M0 code, rounded up (SPEC.md §1.6's rule with `FMAX` for 6).
    UE8M0,
}

impl Fp8ScaleFormat {
    /// f32 scales without a floor.
    pub const F32_NO_FLOOR: Fp8ScaleFormat = Fp8ScaleFormat::F32 { s_min: 0.0 };

    /// The short name (`f32`, `ue8m0`).
    pub fn name(self) -> &'static str {
        match self {
            Fp8ScaleFormat::F32 { .. } => "f32",
            Fp8ScaleFormat::UE8M0 => "ue8m0",
        }
    }
}

/// Where dynamic group scales go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8ScaleLayout {
    /// `[M, H/G]`: scale `(row, g)` at `row · (H/G) + g`.
    RowMajor,
    /// `[H/G, Mp4]` with `Mp4 = 4 · ceil(M/4)`: scale `(row, g)` at `g · Mp4 + row`; rows
    /// `M..Mp4` are written as 0 (the per-group layout Hopper FP8 GEMMs read).
    ColumnMajor,
    /// The swizzled 128×4 layout of SPEC.md §3, padding 0: UE8M0 with `G = 32` only (MXFP8).
    Swizzled,
    /// `[ceil(H/G / 4), Mp4]` 32-bit words of four UE8M0 codes: code `(row, g)` in byte
    /// `g % 4` of word `(g / 4) · Mp4 + row` (byte `4 · ((g/4) · Mp4 + row) + g % 4`); rows
    /// `M..Mp4` and the bytes of groups `H/G..` are 0. UE8M0 in groups of 32, 64 or 128 only:
    /// DeepGEMM's MN-major, TMA-aligned packed UE8M0 scales, what its SM100 FP8 GEMMs read.
    ColumnMajorPacked,
}

impl Fp8ScaleLayout {
    /// Every layout.
    pub const ALL: [Fp8ScaleLayout; 4] = [
        Fp8ScaleLayout::RowMajor,
        Fp8ScaleLayout::ColumnMajor,
        Fp8ScaleLayout::Swizzled,
        Fp8ScaleLayout::ColumnMajorPacked,
    ];

    /// The short name (`row-major`, `column-major`, `swizzled`, `column-major-packed`).
    pub fn name(self) -> &'static str {
        match self {
            Fp8ScaleLayout::RowMajor => "row-major",
            Fp8ScaleLayout::ColumnMajor => "column-major",
            Fp8ScaleLayout::Swizzled => "swizzled",
            Fp8ScaleLayout::ColumnMajorPacked => "column-major-packed",
        }
    }
}

/// How `inv`, the factor every `y_i` is multiplied by before encoding, is found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fp8Scaling {
    /// One static scale `s` for the whole tensor: `inv = RN32(1 / s)`, no scale output
    /// (FlashInfer's `rmsnorm_quant` / `fused_add_rmsnorm_quant`). Any `s` is accepted and
    /// flows through the formula, as a global scale does (SPEC.md §5): `s = 0` gives
    /// `inv = +Inf`, a NaN `s` NaN codes.
    PerTensor(f32),
    /// A scale per group of `G` consecutive elements of a row, computed from the group's amax.
    Dynamic {
        /// `G`.
        group: Fp8Group,
        /// f32 (with an optional floor) or UE8M0.
        format: Fp8ScaleFormat,
        /// Where the scales go.
        layout: Fp8ScaleLayout,
    },
}

/// Options of one FP8 call besides the tensors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fp8Options {
    /// E4M3 or E5M2 elements.
    pub element: Fp8Element,
    /// Static per-tensor or dynamic per-group scaling.
    pub scaling: Fp8Scaling,
    /// RMSNorm epsilon (finite, ≥ 0). Default 1e-6.
    pub eps: f32,
    /// Added to every weight (finite); 0 (the default) for RMSNorm, 1 for Gemma-style norms.
    pub weight_bias: f32,
}

impl Fp8Options {
    /// A per-tensor static scale `s`, eps 1e-6, no weight bias.
    pub fn per_tensor(element: Fp8Element, scale: f32) -> Self {
        Fp8Options {
            element,
            scaling: Fp8Scaling::PerTensor(scale),
            eps: 1e-6,
            weight_bias: 0.0,
        }
    }

    /// Dynamic scales, eps 1e-6, no weight bias.
    pub fn dynamic(
        element: Fp8Element,
        group: Fp8Group,
        format: Fp8ScaleFormat,
        layout: Fp8ScaleLayout,
    ) -> Self {
        Fp8Options {
            element,
            scaling: Fp8Scaling::Dynamic {
                group,
                format,
                layout,
            },
            eps: 1e-6,
            weight_bias: 0.0,
        }
    }

    /// Per-token f32 scales without a floor, row-major (one scale per row).
    pub fn per_token(element: Fp8Element) -> Self {
        Self::dynamic(
            element,
            Fp8Group::PerToken,
            Fp8ScaleFormat::F32_NO_FLOOR,
            Fp8ScaleLayout::RowMajor,
        )
    }

    /// MXFP8: E4M3 elements, groups of 32, UE8M0 scales in the swizzled 128×4 layout.
    pub fn mxfp8() -> Self {
        Self::dynamic(
            Fp8Element::E4M3,
            Fp8Group::G32,
            Fp8ScaleFormat::UE8M0,
            Fp8ScaleLayout::Swizzled,
        )
    }

    /// The same options with another eps.
    #[must_use = "returns a new value; the original is unchanged"]
    pub fn with_eps(self, eps: f32) -> Self {
        Fp8Options { eps, ..self }
    }

    /// The same options with another weight bias.
    #[must_use = "returns a new value; the original is unchanged"]
    pub fn with_weight_bias(self, weight_bias: f32) -> Self {
        Fp8Options {
            weight_bias,
            ..self
        }
    }
}

/// The scale output of one call; the variant must match the options' scaling.
#[derive(Debug)]
pub enum Fp8Scales<'a> {
    /// A per-tensor static scale writes no scales.
    None,
    /// f32 scales, [`Fp8Problem::scales_len`] values in the options' layout.
    F32(&'a mut [f32]),
    /// UE8M0 codes, [`Fp8Problem::scales_len`] bytes in the options' layout.
    UE8M0(&'a mut [u8]),
}

/// The scales [`dequantize`] reads, as [`Fp8Scales`] wrote them.
#[derive(Clone, Copy, Debug)]
pub enum Fp8ScalesIn<'a> {
    /// A per-tensor static scale (its value is in the options).
    None,
    /// f32 scales.
    F32(&'a [f32]),
    /// UE8M0 codes.
    UE8M0(&'a [u8]),
}

/// What a scale buffer variant is called in errors.
const KIND_NONE: &str = "Fp8Scales::None (a per-tensor static scale writes no scales)";
const KIND_F32: &str = "Fp8Scales::F32 (f32 scales)";
const KIND_UE8M0: &str = "Fp8Scales::UE8M0 (UE8M0 codes)";

/// Where the outputs of one FP8 call go (host memory).
#[derive(Debug)]
pub struct Fp8Out<'a, T> {
    /// FP8 codes, `M · H` bytes, row by row.
    pub q: &'a mut [u8],
    /// Group scales in the options' layout (or none for a per-tensor scale).
    pub scales: Fp8Scales<'a>,
    /// Optional `[M, H]` normalised values in the input dtype, before quantisation:
    /// `RNdt(y_i)`, the FP4 op's `y_out` bits.
    pub y_out: Option<MatMut<'a, T>>,
}

/// Shape and options of one FP8 call, checked: every buffer length and the byte count.
/// Built only by [`Fp8Problem::new`] (its fields are public to read); its lengths saturate
/// at `usize::MAX` as [`Problem`](crate::Problem)'s do.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Fp8Problem {
    /// Rows (tokens); leading dimensions already flattened.
    pub m: usize,
    /// Hidden size: elements per row.
    pub h: usize,
    /// Input dtype.
    pub dtype: DType,
    /// Element format, scaling, eps and weight bias.
    pub options: Fp8Options,
    /// Whether the residual is added (and written back).
    pub has_residual: bool,
    /// Whether `y_out` is written.
    pub has_y_out: bool,
}

impl Fp8Problem {
    /// Checks the shape and options: `H > 0` and a multiple of `G`; the swizzled layout
    /// only with UE8M0 scales in groups of 32, the packed column-major one only with UE8M0
    /// scales in groups of 32, 64 or 128; `s_min` finite and ≥ 0; `eps` finite and
    /// ≥ 0; `weight_bias` finite; every size representable in 64 bits.
    pub fn new(m: usize, h: usize, dtype: DType, opts: &Fp8Options) -> Result<Self, Error> {
        if h == 0 {
            return Err(Error::Fp8ZeroHidden);
        }
        if let Fp8Scaling::Dynamic {
            group,
            format,
            layout,
        } = opts.scaling
        {
            let g = group.size(h);
            if h % g != 0 {
                return Err(Error::HiddenNotMultipleOfGroup { h, group: g });
            }
            if layout == Fp8ScaleLayout::Swizzled && (format != Fp8ScaleFormat::UE8M0 || g != 32) {
                return Err(Error::SwizzledNeedsMxfp8 {
                    format: format.name(),
                    group: g,
                });
            }
            if layout == Fp8ScaleLayout::ColumnMajorPacked
                && (format != Fp8ScaleFormat::UE8M0 || group == Fp8Group::PerToken)
            {
                return Err(Error::PackedNeedsUe8m0Groups {
                    format: format.name(),
                    group: if group == Fp8Group::PerToken {
                        "the row (per token)".into()
                    } else {
                        g.to_string()
                    },
                });
            }
            if let Fp8ScaleFormat::F32 { s_min } = format {
                if !s_min.is_finite() || s_min < 0.0 {
                    return Err(Error::InvalidScaleFloor(s_min));
                }
            }
        }
        if !opts.eps.is_finite() || opts.eps < 0.0 {
            return Err(Error::InvalidEps(opts.eps));
        }
        if !opts.weight_bias.is_finite() {
            return Err(Error::InvalidWeightBias(opts.weight_bias));
        }
        let p = Fp8Problem {
            m,
            h,
            dtype,
            options: *opts,
            has_residual: true,
            has_y_out: false,
        };
        // Every count below must fit (with room for the byte count's factors); checking
        // once here lets the rest use plain arithmetic.
        let elems = m.checked_mul(h).ok_or(Error::SizeOverflow)?;
        elems.checked_mul(8).ok_or(Error::SizeOverflow)?;
        let n = p.n_groups();
        let scales = match p.layout() {
            None => 0,
            Some(Fp8ScaleLayout::RowMajor) => m.checked_mul(n).ok_or(Error::SizeOverflow)?,
            Some(Fp8ScaleLayout::ColumnMajor) => m
                .div_ceil(4)
                .checked_mul(4)
                .and_then(|mp4| mp4.checked_mul(n))
                .ok_or(Error::SizeOverflow)?,
            Some(Fp8ScaleLayout::Swizzled) => swizzled_len(m, n)?,
            Some(Fp8ScaleLayout::ColumnMajorPacked) => m
                .div_ceil(4)
                .checked_mul(4)
                .and_then(|mp4| mp4.checked_mul(n.div_ceil(4) * 4))
                .ok_or(Error::SizeOverflow)?,
        };
        scales.checked_mul(4).ok_or(Error::SizeOverflow)?;
        Ok(p)
    }

    /// The same problem without a residual (`rmsnorm_fp8quant`).
    #[must_use = "returns a new value; the original is unchanged"]
    pub fn without_residual(self) -> Self {
        Fp8Problem {
            has_residual: false,
            ..self
        }
    }

    /// The same problem with (or without) `y_out`.
    #[must_use = "returns a new value; the original is unchanged"]
    pub fn with_y_out(self, y_out: bool) -> Self {
        Fp8Problem {
            has_y_out: y_out,
            ..self
        }
    }

    /// `G`, or `None` for a per-tensor scale.
    pub fn group(&self) -> Option<usize> {
        match self.options.scaling {
            Fp8Scaling::PerTensor(_) => None,
            Fp8Scaling::Dynamic { group, .. } => Some(group.size(self.h)),
        }
    }

    /// Groups per row, `H / G` (0 for a per-tensor scale).
    pub fn n_groups(&self) -> usize {
        self.group()
            .map_or(0, |g| self.h.checked_div(g).unwrap_or(0))
    }

    /// The scale layout, or `None` for a per-tensor scale.
    pub fn layout(&self) -> Option<Fp8ScaleLayout> {
        match self.options.scaling {
            Fp8Scaling::PerTensor(_) => None,
            Fp8Scaling::Dynamic { layout, .. } => Some(layout),
        }
    }

    /// The scale format, or `None` for a per-tensor scale.
    pub fn scale_format(&self) -> Option<Fp8ScaleFormat> {
        match self.options.scaling {
            Fp8Scaling::PerTensor(_) => None,
            Fp8Scaling::Dynamic { format, .. } => Some(format),
        }
    }

    /// Bytes of `q`: `M · H`.
    pub fn q_len(&self) -> usize {
        self.m.saturating_mul(self.h)
    }

    /// Rows of the scale layout, padding included: `M` (row-major), `Mp4 = 4 · ceil(M/4)`
    /// (column-major, packed or not), `Mp = 128 · ceil(M/128)` (swizzled); 0 for a
    /// per-tensor scale.
    pub fn scale_rows(&self) -> usize {
        match self.layout() {
            None => 0,
            Some(Fp8ScaleLayout::RowMajor) => self.m,
            Some(Fp8ScaleLayout::ColumnMajor | Fp8ScaleLayout::ColumnMajorPacked) => {
                self.m.div_ceil(4).saturating_mul(4)
            }
            Some(Fp8ScaleLayout::Swizzled) => self.m.div_ceil(128).saturating_mul(128),
        }
    }

    /// Elements of the scale buffer (f32 values or UE8M0 bytes), padding included:
    /// `M · H/G`, `H/G · Mp4`, `Mp · nK · 4` or `4 · ceil(H/G / 4) · Mp4` (packed); 0 for a
    /// per-tensor scale.
    pub fn scales_len(&self) -> usize {
        let n = self.n_groups();
        match self.layout() {
            None => 0,
            Some(Fp8ScaleLayout::RowMajor) => self.m.saturating_mul(n),
            Some(Fp8ScaleLayout::ColumnMajor) => self.scale_rows().saturating_mul(n),
            Some(Fp8ScaleLayout::Swizzled) => swizzled_len(self.m, n).unwrap_or(usize::MAX),
            Some(Fp8ScaleLayout::ColumnMajorPacked) => {
                self.scale_rows().saturating_mul(n.div_ceil(4) * 4)
            }
        }
    }

    /// Bytes per scale element: 4 (f32), 1 (UE8M0), 0 (per-tensor: nothing written).
    pub fn scale_element_bytes(&self) -> usize {
        match self.scale_format() {
            None => 0,
            Some(Fp8ScaleFormat::F32 { .. }) => 4,
            Some(Fp8ScaleFormat::UE8M0) => 1,
        }
    }

    /// Scale bytes written, padding included.
    pub fn scale_bytes_written(&self) -> usize {
        self.scales_len().saturating_mul(self.scale_element_bytes())
    }

    /// Where scale `(row, g)` sits in the scale buffer (for `row < M`, `g < H/G`; 0 for a
    /// per-tensor scale).
    #[inline(always)]
    pub fn scale_index(&self, row: usize, g: usize) -> usize {
        let n = self.n_groups();
        match self.layout() {
            None => 0,
            Some(Fp8ScaleLayout::RowMajor) => row * n + g,
            Some(Fp8ScaleLayout::ColumnMajor) => g * self.scale_rows() + row,
            Some(Fp8ScaleLayout::Swizzled) => swizzled_offset(row, g, n),
            Some(Fp8ScaleLayout::ColumnMajorPacked) => {
                4 * ((g / 4) * self.scale_rows() + row) + g % 4
            }
        }
    }

    /// Bytes moved through memory by one call (SPEC.md §6 with 1-byte elements), for
    /// bandwidth figures: `M·H·3·e + H·e + M·H + scale bytes written (+ M·H·e for y_out)`;
    /// without a residual `M·H·e` replaces `M·H·3·e`. f32 scales count 4 bytes each, UE8M0
    /// codes 1; a per-tensor scale writes none. Saturates at `u64::MAX`.
    pub fn bytes_moved(&self) -> u64 {
        let e = self.dtype.size() as u128;
        let mh = (self.m as u128) * (self.h as u128);
        let io = if self.has_residual { 3 } else { 1 };
        let mut bytes = mh * io * e + self.h as u128 * e + mh + self.scale_bytes_written() as u128;
        if self.has_y_out {
            bytes += mh * e;
        }
        u64::try_from(bytes).unwrap_or(u64::MAX)
    }

    fn what_scales(&self) -> String {
        match self.layout() {
            None => "a per-tensor scale writes none".into(),
            Some(Fp8ScaleLayout::RowMajor) => {
                format!(
                    "row-major M·H/G for M = {}, H/G = {}",
                    self.m,
                    self.n_groups()
                )
            }
            Some(Fp8ScaleLayout::ColumnMajor) => format!(
                "column-major H/G·Mp4 with Mp4 = 4·ceil(M/4) for M = {}, H/G = {}",
                self.m,
                self.n_groups()
            ),
            Some(Fp8ScaleLayout::ColumnMajorPacked) => format!(
                "column-major-packed 4·ceil(H/G/4)·Mp4 bytes (ceil(H/G/4)·Mp4 words of four codes) with Mp4 = 4·ceil(M/4) for M = {}, H/G = {}",
                self.m,
                self.n_groups()
            ),
            Some(Fp8ScaleLayout::Swizzled) => format!(
                "the swizzled 128x4 layout: 128·ceil(M/128)·4·ceil((H/32)/4) for M = {}, H/32 = {}",
                self.m,
                self.n_groups()
            ),
        }
    }

    /// Checks the scale buffer's kind against the options and its length.
    fn check_scales(&self, kind: &'static str, len: usize) -> Result<(), Error> {
        let expected = match self.scale_format() {
            None => KIND_NONE,
            Some(Fp8ScaleFormat::F32 { .. }) => KIND_F32,
            Some(Fp8ScaleFormat::UE8M0) => KIND_UE8M0,
        };
        if kind != expected {
            return Err(Error::Fp8ScaleKind {
                expected,
                got: kind,
            });
        }
        let want = self.scales_len();
        if len != want {
            let what = self.what_scales();
            return Err(if kind == KIND_F32 {
                Error::F32Length {
                    name: "scales",
                    expected: want,
                    got: len,
                    what,
                }
            } else {
                Error::OutputSize {
                    name: "scales",
                    expected: want,
                    got: len,
                    what,
                }
            });
        }
        Ok(())
    }

    fn check_q(&self, len: usize) -> Result<(), Error> {
        if len != self.q_len() {
            return Err(Error::OutputSize {
                name: "q",
                expected: self.q_len(),
                got: len,
                what: format!("M·H for M = {}, H = {}", self.m, self.h),
            });
        }
        Ok(())
    }
}

fn shape(name: &'static str, m: usize, h: usize, rows: usize, cols: usize) -> Result<(), Error> {
    if rows != m || cols != h {
        return Err(Error::ShapeMismatch {
            name,
            rows: m,
            cols: h,
            got_rows: rows,
            got_cols: cols,
        });
    }
    Ok(())
}

/// Checks every argument of one FP8 call — options, shapes, the weight's length, the
/// exact length and kind of every output — and returns its [`Fp8Problem`]. Nothing is
/// read or written; both [`cpu`] and [`reference`](mod@reference) call it first, so a
/// failed call writes nothing. (Safe borrows rule out overlapping buffers.)
pub fn validate<T: Element>(
    x: &MatRef<'_, T>,
    residual: Option<&MatMut<'_, T>>,
    weight: &[T],
    out: &Fp8Out<'_, T>,
    opts: &Fp8Options,
) -> Result<Fp8Problem, Error> {
    let (m, h) = (x.rows(), x.cols());
    let p = Fp8Problem {
        has_residual: residual.is_some(),
        has_y_out: out.y_out.is_some(),
        ..Fp8Problem::new(m, h, T::DTYPE, opts)?
    };
    if let Some(r) = residual {
        shape("residual", m, h, r.rows(), r.cols())?;
    }
    if let Some(y) = &out.y_out {
        shape("y_out", m, h, y.rows(), y.cols())?;
    }
    if weight.len() != h {
        return Err(Error::WeightLength {
            expected: h,
            got: weight.len(),
        });
    }
    p.check_q(out.q.len())?;
    let (kind, len) = match &out.scales {
        Fp8Scales::None => (KIND_NONE, 0),
        Fp8Scales::F32(s) => (KIND_F32, s.len()),
        Fp8Scales::UE8M0(s) => (KIND_UE8M0, s.len()),
    };
    p.check_scales(kind, len)?;
    Ok(p)
}

/// `w'_i = RN32(f32(w_i) + weight_bias)` (SPEC.md §8), where a zero bias (either sign)
/// leaves `w` as it is: SPEC.md §8 says a bias of 0 gives the bytes of §1 "also for −0
/// weights", which `-0.0 + 0.0 = +0.0` would not; adding `-0.0` is the identity.
#[inline(always)]
pub fn biased_weight(w: f32, weight_bias: f32) -> f32 {
    if weight_bias == 0.0 {
        w
    } else {
        w + weight_bias
    }
}

/// Dequantisation (SPEC.md §8): `value = RN32(fp8_value(q) · scale)` with the written
/// scale (f32, or `2^(code-127)` for UE8M0) of the element's group, and with the static
/// scale `s` for a per-tensor scale (read as the inverse of `q = FP8(y · RN32(1/s))`:
/// see the module's notes). A NaN result is written as `0x7FFFFFFF` (SPEC.md §4). `opts`
/// are the options of the quantising call (eps, weight bias and `s_min` are not used).
/// Writes `M · H` f32 to `out`.
///
/// ```
/// use fp4norm::fp8::{dequantize, Fp8Element, Fp8Options, Fp8ScalesIn};
/// // One per-token row of 32 E5M2 codes 0x3C (1.0) and 0xC0 (-2.0), scale 0.5.
/// let q: Vec<u8> = (0..32).map(|i| if i % 2 == 0 { 0x3C } else { 0xC0 }).collect();
/// let mut out = [0f32; 32];
/// let opts = Fp8Options::per_token(Fp8Element::E5M2);
/// dequantize(1, 32, &opts, &q, Fp8ScalesIn::F32(&[0.5]), &mut out)?;
/// assert_eq!(&out[..2], &[0.5, -1.0]);
/// # Ok::<(), fp4norm::Error>(())
/// ```
pub fn dequantize(
    m: usize,
    h: usize,
    opts: &Fp8Options,
    q: &[u8],
    scales: Fp8ScalesIn<'_>,
    out: &mut [f32],
) -> Result<(), Error> {
    // Only the element format and the scaling's layout matter here.
    let mut neutral = opts.with_eps(0.0).with_weight_bias(0.0);
    if let Fp8Scaling::Dynamic {
        format: Fp8ScaleFormat::F32 { s_min },
        ..
    } = &mut neutral.scaling
    {
        *s_min = 0.0;
    }
    let p = Fp8Problem::new(m, h, DType::BF16, &neutral)?;
    p.check_q(q.len())?;
    let (kind, len) = match scales {
        Fp8ScalesIn::None => (KIND_NONE, 0),
        Fp8ScalesIn::F32(s) => (KIND_F32, s.len()),
        Fp8ScalesIn::UE8M0(s) => (KIND_UE8M0, s.len()),
    };
    p.check_scales(kind, len)?;
    if out.len() != p.q_len() {
        return Err(Error::F32Length {
            name: "out",
            expected: p.q_len(),
            got: out.len(),
            what: format!("M·H for M = {m}, H = {h}"),
        });
    }
    if m == 0 {
        return Ok(());
    }
    let element = opts.element;
    let g = p.group().unwrap_or(h);
    out.par_chunks_mut(h)
        .zip(q.par_chunks(h))
        .enumerate()
        .for_each(|(row, (o, qr))| {
            for (i, (oi, &c)) in o.iter_mut().zip(qr).enumerate() {
                let scale = match (scales, opts.scaling) {
                    (_, Fp8Scaling::PerTensor(s)) => s,
                    (Fp8ScalesIn::F32(s), _) => s[p.scale_index(row, i / g)],
                    (Fp8ScalesIn::UE8M0(s), _) => ue8m0_decode(s[p.scale_index(row, i / g)]),
                    (Fp8ScalesIn::None, _) => unreachable!("scale kind checked"),
                };
                let v = element.decode(c) * scale;
                // NaN as the canonical 0x7FFFFFFF, as SPEC.md §4 writes it.
                *oi = if v.is_nan() {
                    f32::from_bits(0x7FFF_FFFF)
                } else {
                    v
                };
            }
        });
    Ok(())
}
