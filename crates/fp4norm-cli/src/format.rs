//! The formats `--format` names: the FP4 op's (SPEC.md §1: `nvfp4`, `mxfp4`, block/scale
//! pairings) and the FP8 family's (SPEC.md §8: a per-tensor static scale, or dynamic
//! scales per token or per group, f32 or UE8M0, in a row-major, column-major, swizzled or
//! packed column-major layout; E4M3 or E5M2 elements).
//!
//! FP8 names: the presets engines use, `fp8-tensor`, `fp8-token`, `fp8-group128` (and
//! `fp8-group32`, `fp8-group64`), `mxfp8`, or any combination spelled out as
//! `fp8-<token|g32|g64|g128>-<f32|ue8m0>-<row-major|column-major|swizzled|column-major-packed>`
//! (packed: DeepGEMM's UE8M0 words, `fp8-g128-ue8m0-column-major-packed`). Elements are
//! E4M3 unless the name ends in `-e5m2` (`-e4m3` may be written too). Every name printed
//! (tables, JSON, messages) is the canonical one, which `--format` reads back.

use fp4norm::fp8::{Fp8Element, Fp8Group, Fp8Options, Fp8ScaleFormat, Fp8ScaleLayout, Fp8Scaling};
use fp4norm::Fp4Format;

/// The valid FP8 spellings, for messages.
pub const FP8_NAMES: &str = "fp8-tensor, fp8-token, fp8-group32, fp8-group64, fp8-group128, \
mxfp8, or fp8-<token|g32|g64|g128>-<f32|ue8m0>-<row-major|column-major|swizzled|\
column-major-packed>; append -e5m2 for E5M2 elements (E4M3 otherwise)";

/// How an FP8 format's scales are found and stored, without their values (the per-tensor
/// scale and the f32 floor are options of their own).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8Kind {
    /// One static scale for the whole tensor, no scale output.
    PerTensor,
    /// A scale per group, from the group's amax.
    Dynamic {
        /// Elements per scale.
        group: Fp8Group,
        /// UE8M0 codes (else f32 values).
        ue8m0: bool,
        /// Where the scales go.
        layout: Fp8ScaleLayout,
    },
}

/// An FP8 format: element and scaling kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fp8Format {
    /// E4M3 or E5M2.
    pub element: Fp8Element,
    /// Static per-tensor or dynamic per-group scales.
    pub kind: Fp8Kind,
}

impl Fp8Format {
    /// The library options of this format: `static_scale` for a per-tensor scale, `s_min`
    /// for f32 dynamic scales; eps and weight bias are the library's defaults.
    pub fn options(&self, static_scale: f32, s_min: f32) -> Fp8Options {
        match self.kind {
            Fp8Kind::PerTensor => Fp8Options::per_tensor(self.element, static_scale),
            Fp8Kind::Dynamic {
                group,
                ue8m0,
                layout,
            } => Fp8Options::dynamic(
                self.element,
                group,
                if ue8m0 {
                    Fp8ScaleFormat::UE8M0
                } else {
                    Fp8ScaleFormat::F32 { s_min }
                },
                layout,
            ),
        }
    }

    /// The format of `opts` (the scale values and the floor left out).
    pub fn of(opts: &Fp8Options) -> Fp8Format {
        Fp8Format {
            element: opts.element,
            kind: match opts.scaling {
                Fp8Scaling::PerTensor(_) => Fp8Kind::PerTensor,
                Fp8Scaling::Dynamic {
                    group,
                    format,
                    layout,
                } => Fp8Kind::Dynamic {
                    group,
                    ue8m0: format == Fp8ScaleFormat::UE8M0,
                    layout,
                },
            },
        }
    }

    /// `static`, `f32` or `ue8m0`.
    pub fn scale_format_name(&self) -> &'static str {
        match self.kind {
            Fp8Kind::PerTensor => "static",
            Fp8Kind::Dynamic { ue8m0: true, .. } => "ue8m0",
            Fp8Kind::Dynamic { ue8m0: false, .. } => "f32",
        }
    }

    /// The scale layout's name, `none` for a per-tensor scale.
    pub fn layout_name(&self) -> &'static str {
        match self.kind {
            Fp8Kind::PerTensor => "none",
            Fp8Kind::Dynamic { layout, .. } => layout.name(),
        }
    }
}

impl std::fmt::Display for Fp8Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use Fp8Group::*;
        use Fp8ScaleLayout::*;
        let base = match self.kind {
            Fp8Kind::PerTensor => "fp8-tensor".to_string(),
            Fp8Kind::Dynamic {
                group: PerToken,
                ue8m0: false,
                layout: RowMajor,
            } => "fp8-token".into(),
            Fp8Kind::Dynamic {
                group: g @ (G32 | G64 | G128),
                ue8m0: false,
                layout: ColumnMajor,
            } => format!("fp8-group{}", g.size(0)),
            Fp8Kind::Dynamic {
                group: G32,
                ue8m0: true,
                layout: Swizzled,
            } => "mxfp8".into(),
            Fp8Kind::Dynamic {
                group,
                ue8m0,
                layout,
            } => format!(
                "fp8-{}-{}-{}",
                match group {
                    PerToken => "token".to_string(),
                    g => format!("g{}", g.size(0)),
                },
                if ue8m0 { "ue8m0" } else { "f32" },
                layout.name()
            ),
        };
        match self.element {
            Fp8Element::E4M3 => f.write_str(&base),
            Fp8Element::E5M2 => write!(f, "{base}-e5m2"),
        }
    }
}

impl std::str::FromStr for Fp8Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let lower = s.to_ascii_lowercase();
        let (base, element) = if let Some(b) = lower.strip_suffix("-e5m2") {
            (b, Fp8Element::E5M2)
        } else if let Some(b) = lower.strip_suffix("-e4m3") {
            (b, Fp8Element::E4M3)
        } else {
            (lower.as_str(), Fp8Element::E4M3)
        };
        let dynamic = |group, ue8m0, layout| Fp8Kind::Dynamic {
            group,
            ue8m0,
            layout,
        };
        let kind = match base {
            "fp8-tensor" => Fp8Kind::PerTensor,
            "fp8-token" => dynamic(Fp8Group::PerToken, false, Fp8ScaleLayout::RowMajor),
            "fp8-group32" => dynamic(Fp8Group::G32, false, Fp8ScaleLayout::ColumnMajor),
            "fp8-group64" => dynamic(Fp8Group::G64, false, Fp8ScaleLayout::ColumnMajor),
            "fp8-group128" => dynamic(Fp8Group::G128, false, Fp8ScaleLayout::ColumnMajor),
            "mxfp8" => dynamic(Fp8Group::G32, true, Fp8ScaleLayout::Swizzled),
            _ => {
                let unknown = || format!("unknown FP8 format {s:?}: use {FP8_NAMES}");
                let rest = base.strip_prefix("fp8-").ok_or_else(unknown)?;
                let mut parts = rest.splitn(3, '-');
                let (g, sf, layout) = match (parts.next(), parts.next(), parts.next()) {
                    (Some(g), Some(sf), Some(l)) => (g, sf, l),
                    _ => return Err(unknown()),
                };
                let group = match g {
                    "token" => Fp8Group::PerToken,
                    "g32" => Fp8Group::G32,
                    "g64" => Fp8Group::G64,
                    "g128" => Fp8Group::G128,
                    _ => {
                        return Err(format!(
                            "FP8 format {s:?}: unknown group {g:?}: use token, g32, g64 or g128"
                        ))
                    }
                };
                let ue8m0 = match sf {
                    "f32" => false,
                    "ue8m0" => true,
                    _ => {
                        return Err(format!(
                            "FP8 format {s:?}: unknown scale format {sf:?}: use f32 or ue8m0"
                        ))
                    }
                };
                let layout = match layout {
                    "row-major" => Fp8ScaleLayout::RowMajor,
                    "column-major" => Fp8ScaleLayout::ColumnMajor,
                    "swizzled" => Fp8ScaleLayout::Swizzled,
                    "column-major-packed" => Fp8ScaleLayout::ColumnMajorPacked,
                    _ => {
                        return Err(format!(
                            "FP8 format {s:?}: unknown scale layout {layout:?}: use row-major, \
                             column-major, swizzled or column-major-packed"
                        ))
                    }
                };
                // Packed words hold four UE8M0 codes of a row's groups (DeepGEMM's layout).
                if layout == Fp8ScaleLayout::ColumnMajorPacked
                    && (!ue8m0 || group == Fp8Group::PerToken)
                {
                    return Err(format!(
                        "FP8 format {s:?}: the packed column-major layout (DeepGEMM's packed \
                         UE8M0) needs ue8m0 scales in groups of 32, 64 or 128: use ue8m0 with \
                         g32, g64 or g128, or the row-major or column-major layout"
                    ));
                }
                // The swizzled 128x4 layout holds one byte per group of 32 (MXFP8); per token
                // it fits only rows of 32, which `--h` settles.
                if layout == Fp8ScaleLayout::Swizzled
                    && !(ue8m0 && matches!(group, Fp8Group::G32 | Fp8Group::PerToken))
                {
                    return Err(format!(
                        "FP8 format {s:?}: the swizzled 128x4 scale layout is MXFP8's and needs \
                         ue8m0 scales in groups of 32 (mxfp8 = fp8-g32-ue8m0-swizzled): use \
                         ue8m0 with g32, or the row-major or column-major layout"
                    ));
                }
                dynamic(group, ue8m0, layout)
            }
        };
        Ok(Fp8Format { element, kind })
    }
}

/// A format of `--format`: the FP4 op or an FP8 op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// FP4 (SPEC.md §1).
    Fp4(Fp4Format),
    /// FP8 (SPEC.md §8).
    Fp8(Fp8Format),
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Format::Fp4(x) => x.fmt(f),
            Format::Fp8(x) => x.fmt(f),
        }
    }
}

/// `--format`: an FP4 or FP8 name, with a message that lists every choice.
pub fn parse_format(s: &str) -> Result<Format, String> {
    let lower = s.to_ascii_lowercase();
    if lower.starts_with("fp8") || lower.starts_with("mxfp8") {
        return s.parse::<Fp8Format>().map(Format::Fp8);
    }
    s.parse::<Fp4Format>().map(Format::Fp4).map_err(|_| {
        format!(
            "unknown format {s:?}: use nvfp4, mxfp4, a block/scale pairing b16-e4m3, b16-ue8m0, \
             b32-e4m3, b32-ue8m0, or an FP8 format: {FP8_NAMES}"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every FP8 format the library accepts at some H.
    fn all_fp8() -> Vec<Fp8Format> {
        let mut v = Vec::new();
        for element in Fp8Element::ALL {
            v.push(Fp8Format {
                element,
                kind: Fp8Kind::PerTensor,
            });
            for group in Fp8Group::ALL {
                for ue8m0 in [false, true] {
                    for layout in Fp8ScaleLayout::ALL {
                        let kind = Fp8Kind::Dynamic {
                            group,
                            ue8m0,
                            layout,
                        };
                        let f = Fp8Format { element, kind };
                        let fits = |h| {
                            fp4norm::fp8::Fp8Problem::new(
                                1,
                                h,
                                fp4norm::DType::BF16,
                                &f.options(1.0, 0.0),
                            )
                            .is_ok()
                        };
                        if fits(32) || fits(128) {
                            v.push(f);
                        }
                    }
                }
            }
        }
        v
    }

    #[test]
    fn every_fp8_name_reads_back_as_its_format() {
        let all = all_fp8();
        assert_eq!(all.len(), 2 * (1 + 4 * 2 * 2 + 2 + 3));
        for f in all {
            let name = f.to_string();
            assert_eq!(parse_format(&name), Ok(Format::Fp8(f)), "{name}");
            assert_eq!(Fp8Format::of(&f.options(0.5, 1e-3)), f);
        }
    }

    #[test]
    fn presets_and_spelled_out_names_agree() {
        for (preset, spelled) in [
            ("fp8-token", "fp8-token-f32-row-major"),
            ("fp8-group128", "fp8-g128-f32-column-major-e4m3"),
            ("fp8-group32-e5m2", "FP8-G32-F32-COLUMN-MAJOR-E5M2"),
            ("mxfp8", "fp8-g32-ue8m0-swizzled"),
            ("mxfp8-e5m2", "fp8-g32-ue8m0-swizzled-e5m2"),
            (
                "fp8-g128-ue8m0-column-major-packed",
                "FP8-G128-UE8M0-COLUMN-MAJOR-PACKED-E4M3",
            ),
        ] {
            assert_eq!(parse_format(preset), parse_format(spelled), "{spelled}");
            assert_eq!(parse_format(spelled).unwrap().to_string(), preset);
        }
        let mx = parse_format("mxfp8").unwrap();
        let Format::Fp8(mx) = mx else { unreachable!() };
        assert_eq!(mx.options(1.0, 0.0), Fp8Options::mxfp8());
        let Format::Fp8(t) = parse_format("fp8-token").unwrap() else {
            unreachable!()
        };
        assert_eq!(t.options(1.0, 0.0), Fp8Options::per_token(Fp8Element::E4M3));
        assert_eq!(parse_format("nvfp4"), Ok(Format::Fp4(Fp4Format::NVFP4)));
        assert_eq!(parse_format("B32-E4M3"), Ok(Format::Fp4(Fp4Format::ALL[3])));
    }

    #[test]
    fn bad_fp8_names_say_what_is_wrong() {
        for (name, says) in [
            ("fp8-g64-f32-swizzled", "needs ue8m0 scales in groups of 32"),
            ("fp8-g32-f32-swizzled", "needs ue8m0 scales in groups of 32"),
            (
                "fp8-g128-ue8m0-swizzled",
                "needs ue8m0 scales in groups of 32",
            ),
            (
                "fp8-g128-f32-column-major-packed",
                "needs ue8m0 scales in groups of 32, 64 or 128",
            ),
            (
                "fp8-token-ue8m0-column-major-packed",
                "needs ue8m0 scales in groups of 32, 64 or 128",
            ),
            ("fp8-g48-f32-row-major", "unknown group"),
            ("fp8-token-e8m0-row-major", "unknown scale format"),
            ("fp8-token-f32-diagonal", "unknown scale layout"),
            ("fp8-token-e6m1", "unknown FP8 format"),
            ("fp8", "unknown FP8 format"),
            ("mxfp8-e3m4", "unknown FP8 format"),
            ("fp5", "unknown format"),
        ] {
            let e = parse_format(name).unwrap_err();
            assert!(e.contains(says), "{name}: {e}");
        }
        assert!(parse_format("fp8-token-ue8m0-swizzled").is_ok());
    }
}
