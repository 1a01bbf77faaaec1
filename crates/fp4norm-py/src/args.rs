//! The ops' scalar arguments as the Python layer and the PyTorch operators pass them (names,
//! numbers), checked and turned into fp4norm's options: one parser for both entry points, so
//! a bad value gets the same message from `fp4norm.add_rmsnorm_fp8quant` on NumPy arrays and
//! from `torch.ops.fp4norm.add_rmsnorm_fp8quant`.

use fp4norm::fp8::{Fp8Element, Fp8Group, Fp8Options, Fp8ScaleFormat, Fp8ScaleLayout, Fp8Scaling};
use fp4norm::Error;

use crate::Fail;

/// The group size of per-token scales (`G = H`) where a number is expected: the operators'
/// `group_size` is an `int`, and -1 means "the whole row", as vLLM's group shapes write it.
pub(crate) const PER_TOKEN: i64 = -1;

/// `eps` as the f32 the kernels use: finite and ≥ 0, also after rounding to f32 (every op
/// of the family, FP4 and FP8).
pub(crate) fn eps32(eps: f64) -> Result<f32, Error> {
    let e = eps as f32;
    // An eps that is finite in f64 but overflows f32 is reported with its f32 value (inf).
    if !eps.is_finite() || eps < 0.0 || !e.is_finite() {
        return Err(Error::InvalidEps(e));
    }
    Ok(e)
}

/// `weight_bias` as the f32 of SPEC.md §8: finite, also after rounding to f32 (every op of
/// the family).
pub(crate) fn bias32(weight_bias: f64) -> Result<f32, Error> {
    let b = weight_bias as f32;
    if !weight_bias.is_finite() || !b.is_finite() {
        return Err(Error::InvalidWeightBias(b));
    }
    Ok(b)
}

/// An FP4 scale format as the Python API documents it: `"e4m3"` or `"ue8m0"`, in any case.
/// The core library's parser also takes aliases (`"fp8"`, `"e4m3fn"`, `"e8m0"`); the Python
/// layer and the operators take exactly these two, so that the functions, NumPy, the
/// operators and their fake kernels accept the same spellings.
pub(crate) fn fp4_scale_format(name: &str) -> Result<fp4norm::ScaleFormat, Fail> {
    match name.to_ascii_lowercase().as_str() {
        "e4m3" => Ok(fp4norm::ScaleFormat::E4M3),
        "ue8m0" => Ok(fp4norm::ScaleFormat::UE8M0),
        _ => Err(Fail::Value(format!(
            "scale_format = {name:?} is not supported: use \"e4m3\" or \"ue8m0\""
        ))),
    }
}

/// Lower case, `_` read as `-` (`row_major` is `row-major`).
fn normalise(name: &str) -> String {
    name.trim().to_ascii_lowercase().replace('_', "-")
}

/// `"e4m3"` or `"e5m2"`.
pub(crate) fn element(name: &str) -> Result<Fp8Element, Fail> {
    match normalise(name).as_str() {
        "e4m3" | "e4m3fn" | "float8-e4m3fn" => Ok(Fp8Element::E4M3),
        "e5m2" | "float8-e5m2" => Ok(Fp8Element::E5M2),
        _ => Err(Fail::Value(format!(
            "element = {name:?} is not supported: use \"e4m3\" (float8_e4m3fn) or \"e5m2\" \
             (float8_e5m2)"
        ))),
    }
}

/// -1 (per token), 32, 64 or 128.
pub(crate) fn group(g: i64) -> Result<Fp8Group, Fail> {
    match g {
        PER_TOKEN => Ok(Fp8Group::PerToken),
        32 => Ok(Fp8Group::G32),
        64 => Ok(Fp8Group::G64),
        128 => Ok(Fp8Group::G128),
        _ => Err(Fail::Value(format!(
            "group size {g} is not supported: use per-token scales (group \"token\"; -1 for the \
             operators' group_size), 32, 64 or 128"
        ))),
    }
}

/// `"f32"` (with the floor `s_min`) or `"ue8m0"` (which has no floor: `s_min` must be 0).
pub(crate) fn scale_format(name: &str, s_min: f64) -> Result<Fp8ScaleFormat, Fail> {
    match normalise(name).as_str() {
        "f32" | "float32" => {
            let s = s_min as f32;
            // A floor that is finite in f64 but overflows f32 is reported with its f32 value.
            if !s_min.is_finite() || s_min < 0.0 || !s.is_finite() {
                return Err(Error::InvalidScaleFloor(s).into());
            }
            Ok(Fp8ScaleFormat::F32 { s_min: s })
        }
        "ue8m0" => {
            if s_min != 0.0 {
                return Err(Fail::Value(format!(
                    "s_min = {s_min} is given with UE8M0 scales, which have no floor: s_min \
                     applies to f32 scales only"
                )));
            }
            Ok(Fp8ScaleFormat::UE8M0)
        }
        _ => Err(Fail::Value(format!(
            "scale_format = {name:?} is not supported for FP8 scales: use \"f32\" or \"ue8m0\""
        ))),
    }
}

/// `"row-major"`, `"column-major"`, `"swizzled"` or `"column-major-packed"`.
pub(crate) fn layout(name: &str) -> Result<Fp8ScaleLayout, Fail> {
    match normalise(name).as_str() {
        "row-major" | "row" => Ok(Fp8ScaleLayout::RowMajor),
        "column-major" | "col-major" | "column" => Ok(Fp8ScaleLayout::ColumnMajor),
        "swizzled" => Ok(Fp8ScaleLayout::Swizzled),
        "column-major-packed" | "packed" => Ok(Fp8ScaleLayout::ColumnMajorPacked),
        _ => Err(Fail::Value(format!(
            "scale_layout = {name:?} is not supported: use \"row-major\", \"column-major\", \
             \"swizzled\" or \"column-major-packed\""
        ))),
    }
}

/// The options of a call with dynamic scales.
#[allow(clippy::too_many_arguments)] // the op's scalar arguments, as the schema lists them
pub(crate) fn dynamic_options(
    element_name: &str,
    group_size: i64,
    format: &str,
    layout_name: &str,
    s_min: f64,
    eps: f64,
    weight_bias: f64,
) -> Result<Fp8Options, Fail> {
    let eps = eps32(eps)?;
    let weight_bias = bias32(weight_bias)?;
    Ok(Fp8Options {
        element: element(element_name)?,
        scaling: Fp8Scaling::Dynamic {
            group: group(group_size)?,
            format: scale_format(format, s_min)?,
            layout: layout(layout_name)?,
        },
        eps,
        weight_bias,
    })
}

/// The options of a call with a per-tensor static scale; `value` is the scale where it is
/// not read from memory (any value: it flows through the formulas, SPEC.md §8).
pub(crate) fn per_tensor_options(
    element: Fp8Element,
    value: f32,
    eps: f64,
    weight_bias: f64,
) -> Result<Fp8Options, Fail> {
    Ok(Fp8Options {
        element,
        scaling: Fp8Scaling::PerTensor(value),
        eps: eps32(eps)?,
        weight_bias: bias32(weight_bias)?,
    })
}

/// The Python argument a buffer name of [`fp4norm::fp8::RawFp8Call::validate`] stands for:
/// its FP8 codes are the `out` argument (FlashInfer's name), its scales `scales_out`.
fn py_name(name: &'static str) -> &'static str {
    match name {
        "q" => "out",
        "scales" => "scales_out",
        other => other,
    }
}

/// An error of the FP8 validator with its buffers named as the Python arguments are.
pub(crate) fn with_py_names(e: Error) -> Error {
    match e {
        Error::OutputSize {
            name,
            expected,
            got,
            what,
        } => Error::OutputSize {
            name: py_name(name),
            expected,
            got,
            what,
        },
        Error::F32Length {
            name,
            expected,
            got,
            what,
        } => Error::F32Length {
            name: py_name(name),
            expected,
            got,
            what,
        },
        Error::Overlap { a, b } => Error::Overlap {
            a: py_name(a),
            b: py_name(b),
        },
        Error::Misaligned {
            name,
            address,
            required,
        } => Error::Misaligned {
            name: py_name(name),
            address,
            required,
        },
        Error::NullPointer { name } => Error::NullPointer {
            name: py_name(name),
        },
        other => other,
    }
}
