//! Typed knobs of the op: element dtype, block size, scale format, presets and options.

use crate::codec::{f32_to_bf16_bits, f32_to_f16_bits};
use crate::Error;
use half::{bf16, f16};

/// The input/output element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// bfloat16.
    BF16,
    /// IEEE binary16.
    F16,
}

impl DType {
    /// Bytes per element (`e` in SPEC.md §6).
    pub fn size(self) -> usize {
        2
    }

    /// The short name (`bf16`, `f16`).
    pub fn name(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" => Ok(DType::BF16),
            "f16" | "fp16" | "float16" | "half" => Ok(DType::F16),
            _ => Err(Error::UnsupportedDType(s.to_string())),
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// An input element type: [`half::bf16`] or [`half::f16`]. Sealed.
pub trait Element:
    Copy + Send + Sync + Default + PartialEq + std::fmt::Debug + sealed::Sealed + 'static
{
    /// The runtime tag of this type.
    const DTYPE: DType;
    /// Exact widening to f32.
    fn to_f32(self) -> f32;
    /// `RNdt`: round to nearest even, overflow to ±Inf, NaN to the canonical NaN.
    fn round_from_f32(v: f32) -> Self;
    /// The raw bits.
    fn to_bits(self) -> u16;
    /// From raw bits.
    fn from_bits(bits: u16) -> Self;
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[inline(always)]
    fn round_from_f32(v: f32) -> Self {
        bf16::from_bits(f32_to_bf16_bits(v))
    }
    #[inline(always)]
    fn to_bits(self) -> u16 {
        bf16::to_bits(self)
    }
    #[inline(always)]
    fn from_bits(bits: u16) -> Self {
        bf16::from_bits(bits)
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16_bits_to_f32(f16::to_bits(self))
    }
    #[inline(always)]
    fn round_from_f32(v: f32) -> Self {
        f16::from_bits(f32_to_f16_bits(v))
    }
    #[inline(always)]
    fn to_bits(self) -> u16 {
        f16::to_bits(self)
    }
    #[inline(always)]
    fn from_bits(bits: u16) -> Self {
        f16::from_bits(bits)
    }
}

/// Exact f16 → f32 without branches (vectorises): shift the exponent and mantissa into
/// place and rescale by 2^112, which is exact for normals and subnormals alike; Inf and
/// NaN get the all-ones exponent back.
#[inline(always)]
pub(crate) fn f16_bits_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let em = (h & 0x7FFF) << 13;
    let scaled = f32::from_bits(em) * f32::from_bits((127 + 112) << 23);
    let bits = if h & 0x7C00 == 0x7C00 {
        em | 0x7F80_0000
    } else {
        scaled.to_bits()
    };
    f32::from_bits(bits | sign)
}

/// Elements per block: 16 or 32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockSize {
    /// 16 elements (NVFP4).
    B16,
    /// 32 elements (MXFP4).
    B32,
}

impl BlockSize {
    /// The number of elements.
    pub fn get(self) -> usize {
        match self {
            BlockSize::B16 => 16,
            BlockSize::B32 => 32,
        }
    }
}

impl TryFrom<usize> for BlockSize {
    type Error = Error;
    fn try_from(b: usize) -> Result<Self, Error> {
        match b {
            16 => Ok(BlockSize::B16),
            32 => Ok(BlockSize::B32),
            _ => Err(Error::InvalidBlockSize(b)),
        }
    }
}

/// How a block's scale is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleFormat {
    /// FP8 E4M3 (fn) scale times the global scale (NVFP4).
    E4M3,
    /// Power-of-two UE8M0 scale, rounded up; the global scale is not used (MXFP4).
    UE8M0,
}

impl ScaleFormat {
    /// The short name (`e4m3`, `ue8m0`).
    pub fn name(self) -> &'static str {
        match self {
            ScaleFormat::E4M3 => "e4m3",
            ScaleFormat::UE8M0 => "ue8m0",
        }
    }
}

impl std::str::FromStr for ScaleFormat {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "e4m3" | "fp8" | "e4m3fn" => Ok(ScaleFormat::E4M3),
            "ue8m0" | "e8m0" => Ok(ScaleFormat::UE8M0),
            _ => Err(Error::UnknownScaleFormat(s.to_string())),
        }
    }
}

/// A block size and scale format. Any pairing is allowed; NVFP4 and MXFP4 are presets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fp4Format {
    /// Elements per block.
    pub block: BlockSize,
    /// How each block's scale is encoded.
    pub scale: ScaleFormat,
}

impl Fp4Format {
    /// NVFP4: 16-element blocks, E4M3 scales times a global scale.
    pub const NVFP4: Fp4Format = Fp4Format {
        block: BlockSize::B16,
        scale: ScaleFormat::E4M3,
    };
    /// MXFP4: 32-element blocks, UE8M0 power-of-two scales.
    pub const MXFP4: Fp4Format = Fp4Format {
        block: BlockSize::B32,
        scale: ScaleFormat::UE8M0,
    };

    /// Every block size and scale format pairing: NVFP4, MXFP4, then the mixed pairings
    /// (16-element blocks with UE8M0 scales, 32-element blocks with E4M3 scales).
    pub const ALL: [Fp4Format; 4] = [
        Fp4Format::NVFP4,
        Fp4Format::MXFP4,
        Fp4Format {
            block: BlockSize::B16,
            scale: ScaleFormat::UE8M0,
        },
        Fp4Format {
            block: BlockSize::B32,
            scale: ScaleFormat::E4M3,
        },
    ];

    /// A format from its parts.
    pub fn new(block: BlockSize, scale: ScaleFormat) -> Self {
        Fp4Format { block, scale }
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        self.block.get()
    }

    /// A short name: `nvfp4`, `mxfp4`, or `b16-ue8m0` / `b32-e4m3` for the mixed pairings.
    pub fn name(self) -> String {
        match self {
            Fp4Format::NVFP4 => "nvfp4".into(),
            Fp4Format::MXFP4 => "mxfp4".into(),
            f => format!("b{}-{}", f.block.get(), f.scale.name()),
        }
    }
}

impl std::fmt::Display for Fp4Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl std::str::FromStr for Fp4Format {
    type Err = Error;
    /// `nvfp4`, `mxfp4`, or `b16-ue8m0` / `b32-e4m3` style pairings.
    fn from_str(s: &str) -> Result<Self, Error> {
        let l = s.to_ascii_lowercase();
        match l.as_str() {
            "nvfp4" => return Ok(Fp4Format::NVFP4),
            "mxfp4" => return Ok(Fp4Format::MXFP4),
            _ => {}
        }
        let (b, f) = l
            .strip_prefix('b')
            .and_then(|r| r.split_once('-'))
            .ok_or_else(|| Error::UnknownFormat(s.to_string()))?;
        let block = b
            .parse::<usize>()
            .map_err(|_| Error::UnknownFormat(s.to_string()))?;
        Ok(Fp4Format {
            block: BlockSize::try_from(block)?,
            scale: f.parse()?,
        })
    }
}

/// Options of one call besides the tensors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Options {
    /// Block size and scale format.
    pub format: Fp4Format,
    /// RMSNorm epsilon (finite, ≥ 0). Default 1e-6.
    pub eps: f32,
    /// Added to every weight before it multiplies (SPEC.md §8: `w' = RN32(w + bias)`; 0,
    /// of either sign, leaves the weight as it is). Gemma-family models normalise with
    /// `(1 + w)`: 1.0. Finite. Default 0.
    pub weight_bias: f32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            format: Fp4Format::NVFP4,
            eps: 1e-6,
            weight_bias: 0.0,
        }
    }
}

impl Options {
    /// NVFP4 with eps 1e-6.
    pub fn nvfp4() -> Self {
        Options {
            format: Fp4Format::NVFP4,
            ..Default::default()
        }
    }
    /// MXFP4 with eps 1e-6.
    pub fn mxfp4() -> Self {
        Options {
            format: Fp4Format::MXFP4,
            ..Default::default()
        }
    }
    /// The same options with another eps.
    #[must_use = "returns a new value; the original is unchanged"]
    pub fn with_eps(self, eps: f32) -> Self {
        Options { eps, ..self }
    }
    /// The same options with another format.
    #[must_use = "returns a new value; the original is unchanged"]
    pub fn with_format(self, format: Fp4Format) -> Self {
        Options { format, ..self }
    }
    /// The same options with another weight bias (1.0 for Gemma's `(1 + w)`).
    #[must_use = "returns a new value; the original is unchanged"]
    pub fn with_weight_bias(self, weight_bias: f32) -> Self {
        Options {
            weight_bias,
            ..self
        }
    }
}
