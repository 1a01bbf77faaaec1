//! Launch shapes measured on this machine: `fp4norm tune` times generic candidate shapes
//! ([`candidates`]) over buckets of row counts ([`buckets`]) for each row length and dtype
//! and writes the fastest per bucket to a table in the cache directory; a [`Gpu`] of the
//! same device, fp4norm version and kernel source reads it when it opens the device and
//! takes its shapes before the built-in launch table's. A shape never changes the bytes a
//! call writes, only its speed, so a stale or odd table can only be slow: every shape is
//! still checked to fit the call (`shape_fits`), else the built-in one runs.
//!
//! The file is text, one row per line after `#` comments:
//! `dtype h m_from m_to threads_per_row rows_per_cta ctas_per_row`.

use std::path::PathBuf;

use super::kernel::{fnv1a, shape_fits, source_fingerprint};
use super::{knobs, DeviceLimits, Gpu};
use crate::{DType, Error};

/// One tuned shape: calls of `m_from..=m_to` rows of `h` elements of `dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TunedRow {
    /// Element dtype of the calls.
    pub dtype: DType,
    /// Row length.
    pub h: usize,
    /// First row count of the bucket.
    pub m_from: usize,
    /// Last row count of the bucket (`usize::MAX`: no end).
    pub m_to: usize,
    /// Threads per row, rows per CTA, CTAs per row.
    pub shape: (u32, u32, u32),
}

/// A device's tuned shapes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TunedTable {
    /// The rows, in the file's order; the first that matches a call wins.
    pub rows: Vec<TunedRow>,
}

impl TunedTable {
    /// The tuned shape for a call of `m` rows of `h` elements of `dtype` in blocks of
    /// `block`, if the table has one that fits on a device with `limits`.
    pub fn lookup(
        &self,
        dtype: DType,
        h: usize,
        m: usize,
        block: usize,
        limits: &DeviceLimits,
    ) -> Option<(u32, u32, u32)> {
        self.rows
            .iter()
            .find(|r| r.dtype == dtype && r.h == h && (r.m_from..=r.m_to).contains(&m))
            .map(|r| r.shape)
            .filter(|&s| shape_fits(h, block, s, limits))
    }

    /// The table as the file's text, with a header naming what it was tuned for.
    pub fn to_text(&self, about: &str) -> String {
        let mut s = format!(
            "# fp4norm launch shapes tuned by `fp4norm tune` for {about}\n\
             # dtype h m_from m_to threads_per_row rows_per_cta ctas_per_row (m_to 0: no end)\n"
        );
        for r in &self.rows {
            let to = if r.m_to == usize::MAX { 0 } else { r.m_to };
            s += &format!(
                "{} {} {} {} {} {} {}\n",
                r.dtype, r.h, r.m_from, to, r.shape.0, r.shape.1, r.shape.2
            );
        }
        s
    }

    /// Parses [`TunedTable::to_text`]'s format; `None` on any malformed line (the whole
    /// file is then ignored, as if absent).
    pub fn parse(text: &str) -> Option<TunedTable> {
        let mut rows = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() != 7 {
                return None;
            }
            let dtype = match f[0] {
                "bf16" => DType::BF16,
                "f16" => DType::F16,
                _ => return None,
            };
            let n = |i: usize| f[i].parse::<usize>().ok();
            let u = |i: usize| f[i].parse::<u32>().ok();
            let m_to = match n(3)? {
                0 => usize::MAX,
                v => v,
            };
            rows.push(TunedRow {
                dtype,
                h: n(1)?,
                m_from: n(2)?,
                m_to,
                shape: (u(4)?, u(5)?, u(6)?),
            });
        }
        Some(TunedTable { rows })
    }
}

/// The buckets of row counts a table has a shape for, on a device of `sm_count` SMs, with
/// the row count each is measured at: one row; up to an eighth, a half and all of the SMs
/// (the latency shapes, whose rows spread over clusters); then 16, 32, 64 rows per SM and
/// beyond (the boundaries of the built-in table's many-row splits).
pub fn buckets(sm_count: u32) -> Vec<(usize, usize, usize)> {
    let s = sm_count.max(16) as usize;
    vec![
        (1, 1, 1),
        (2, s / 8, (s / 16).max(2)),
        (s / 8 + 1, s / 2, s / 4),
        (s / 2 + 1, s, s),
        (s + 1, 16 * s, 8 * s),
        (16 * s + 1, 32 * s, 24 * s),
        (32 * s + 1, 64 * s, 48 * s),
        (64 * s + 1, usize::MAX, 96 * s),
    ]
}

/// Generic launch shapes for rows of `h` elements in blocks of `block` on a device with
/// `limits`: 1 to 8 CTAs per row (a cluster, where the device has them) and 1, 2, 4, 8 or
/// 16 vectors per thread (more where a CTA would exceed the device's), rows shared by
/// CTAs of fewer than 128 threads. No measured table goes into them. A CTA of 128 threads
/// or fewer takes at most 2 vectors per thread and one of 256 at most 4: the kernel's
/// launch bound for those sizes (ten and five resident CTAs per SM) leaves 48 and 51
/// registers, where more vectors spill (the compile check shows it).
pub fn candidates(h: usize, block: usize, limits: &DeviceLimits) -> Vec<(u32, u32, u32)> {
    let nv = (h / 8).max(1);
    let max_threads = limits.max_threads_per_block.clamp(32, 1024) as usize / 32 * 32;
    let mut out = Vec::new();
    for c in 1..=8usize {
        if nv % c != 0 {
            continue;
        }
        let nvc = nv / c;
        let least = nvc.div_ceil(max_threads);
        for vpt in [1usize, 2, 4, 8, 16].map(|v| v.max(least)) {
            let g = nvc.div_ceil(vpt).div_ceil(32) * 32;
            let r = if c == 1 { (128 / g).max(1) } else { 1 };
            let threads = g * r;
            let most = if threads <= 128 {
                2
            } else if threads <= 256 {
                4
            } else {
                usize::MAX
            };
            if nvc.div_ceil(g) > most {
                continue;
            }
            let shape = (g as u32, r as u32, c as u32);
            if shape_fits(h, block, shape, limits) && !out.contains(&shape) {
                out.push(shape);
            }
        }
    }
    out
}

/// What a table is keyed by: the device, fp4norm's version and the kernel source.
fn about(gpu: &Gpu) -> String {
    format!(
        "{} ({} SMs, {}), fp4norm {}, kernel source {:016x}",
        gpu.name(),
        gpu.sm_count(),
        gpu.arch(),
        env!("CARGO_PKG_VERSION"),
        source_fingerprint()
    )
}

/// Where `gpu`'s tuned table is kept (`None` with the disk cache off).
pub fn table_path(gpu: &Gpu) -> Option<PathBuf> {
    let key = fnv1a(about(gpu).as_bytes());
    knobs::cache_dir().map(|d| d.join("tuned").join(format!("{key:016x}.txt")))
}

/// The tuned table for `gpu`'s device, if `fp4norm tune` wrote one and
/// `FP4NORM_TUNED=off` is not set.
pub(crate) fn load(gpu: &Gpu) -> Option<TunedTable> {
    if !knobs::use_tuned_table() {
        return None;
    }
    let text = std::fs::read_to_string(table_path(gpu)?).ok()?;
    TunedTable::parse(&text)
}

/// Writes `table` as `gpu`'s tuned table (through a temporary file and a rename) and
/// returns its path; a `Gpu` opened afterwards uses it.
pub fn save(gpu: &Gpu, table: &TunedTable) -> Result<PathBuf, Error> {
    let io = |e: std::io::Error| Error::Cuda {
        context: "writing the tuned launch table",
        message: e.to_string(),
    };
    let path = table_path(gpu).ok_or_else(|| Error::Cuda {
        context: "writing the tuned launch table",
        message: "the disk cache is off (FP4NORM_CACHE_DIR=off)".into(),
    })?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, table.to_text(&about(gpu))).map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200: DeviceLimits = DeviceLimits::H200;

    #[test]
    fn buckets_cover_every_row_count_once() {
        for sms in [8u32, 20, 48, 132, 148, 170, 188] {
            let b = buckets(sms);
            assert_eq!(b[0].0, 1);
            assert_eq!(b.last().unwrap().1, usize::MAX);
            for w in b.windows(2) {
                assert_eq!(w[0].1 + 1, w[1].0, "{sms} SMs: {b:?}");
            }
            for &(from, to, at) in &b {
                assert!(from <= to && (from..=to).contains(&at), "{sms} SMs: {b:?}");
            }
        }
    }

    #[test]
    fn candidates_fit_and_include_the_measured_shapes() {
        for h in [
            64usize, 2048, 2816, 4096, 5120, 7168, 8192, 16384, 32768, 65536,
        ] {
            for block in [16, 32] {
                let c = candidates(h, block, &H200);
                assert!(!c.is_empty(), "H={h}");
                for &s in &c {
                    assert!(shape_fits(h, block, s, &H200), "H={h}: {s:?}");
                }
            }
        }
        // The built-in table's shapes come out of the generic rule too.
        let c = candidates(8192, 16, &H200);
        for s in [(256, 1, 2), (128, 1, 8), (512, 1, 1)] {
            assert!(c.contains(&s), "{s:?} not in {c:?}");
        }
        assert!(candidates(32768, 16, &H200).contains(&(256, 1, 8)));
        assert!(candidates(5120, 16, &H200).contains(&(128, 1, 5)));
        assert!(candidates(7168, 16, &H200).contains(&(128, 1, 7)));
        let no_clusters = DeviceLimits {
            max_cluster: 1,
            ..H200
        };
        assert!(candidates(8192, 16, &no_clusters).iter().all(|s| s.2 == 1));
    }

    #[test]
    fn a_table_round_trips_and_is_looked_up_by_bucket() {
        let t = TunedTable {
            rows: vec![
                TunedRow {
                    dtype: DType::BF16,
                    h: 4096,
                    m_from: 1,
                    m_to: 1,
                    shape: (64, 1, 8),
                },
                TunedRow {
                    dtype: DType::BF16,
                    h: 4096,
                    m_from: 133,
                    m_to: usize::MAX,
                    shape: (256, 1, 1),
                },
            ],
        };
        let parsed = TunedTable::parse(&t.to_text("a test")).expect("parses");
        assert_eq!(parsed, t);
        assert_eq!(
            parsed.lookup(DType::BF16, 4096, 1, 16, &H200),
            Some((64, 1, 8))
        );
        assert_eq!(
            parsed.lookup(DType::BF16, 4096, 50_000, 16, &H200),
            Some((256, 1, 1))
        );
        assert_eq!(parsed.lookup(DType::BF16, 4096, 16, 16, &H200), None);
        assert_eq!(parsed.lookup(DType::F16, 4096, 1, 16, &H200), None);
        // A shape that does not fit the call (here: no clusters) is not used.
        let no_clusters = DeviceLimits {
            max_cluster: 1,
            ..H200
        };
        assert_eq!(parsed.lookup(DType::BF16, 4096, 1, 16, &no_clusters), None);
        assert_eq!(TunedTable::parse("bf16 4096 1 1 64 1"), None);
        assert_eq!(TunedTable::parse("bf17 4096 1 1 64 1 8"), None);
    }
}
