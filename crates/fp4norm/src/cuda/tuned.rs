//! Launch shapes measured on this machine: `fp4norm tune` times generic candidate shapes
//! ([`candidates`]) over buckets of row counts ([`buckets`]) for each kernel class, row
//! length and dtype and writes the fastest per bucket to a table in the cache directory; a
//! [`Gpu`] of the same device, fp4norm version and kernel source reads it when it opens the
//! device and takes its shapes before the built-in launch table's. A shape never changes the
//! bytes a call writes, only its speed; a call takes a tuned shape only where it is one of
//! [`candidates`] for the call (the shapes the compile check and the GPU tests cover) and
//! fits it (`KernelConfig::try_launch_shape`), else the built-in one runs. A file that does
//! not parse is refused whole, with a warning, and `fp4norm tune` will not overwrite it.
//!
//! The file is text, one row per line after `#` comments:
//! `class dtype h m_from m_to threads_per_row rows_per_cta ctas_per_row`, the class one of
//! [`ShapeClass`]'s names (a line without one is the FP4 op's).
//!
//! One `fp4norm tune` runs per table at a time ([`lock`]): two would each merge their rows
//! into the file the other is about to replace (and, on one card, time each other's kernels).

use std::path::PathBuf;

use super::kernel::{fnv1a, shape_fits, source_fingerprint};
use super::{knobs, DeviceLimits, Gpu};
use crate::{DType, Error};

/// The calls one tuned shape is for: the kernels whose launch shapes the built-in table
/// chooses alike. The FP4 op (either format); the FP8 op per tensor, per token, and per
/// group of each size (a group's amax is reduced within the row's threads, so a shape fits
/// only the groups its threads' vectors line up with).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShapeClass {
    /// The FP4 op, NVFP4 or MXFP4 (`fp4`).
    Fp4,
    /// The FP8 op with one static scale (`fp8-tensor`).
    Fp8PerTensor,
    /// The FP8 op with one dynamic scale per row (`fp8-token`): a second reduction a row.
    Fp8PerToken,
    /// The FP8 op with dynamic scales per group of this many elements (`fp8-g32`, ...).
    Fp8Group(usize),
}

impl std::fmt::Display for ShapeClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShapeClass::Fp4 => f.write_str("fp4"),
            ShapeClass::Fp8PerTensor => f.write_str("fp8-tensor"),
            ShapeClass::Fp8PerToken => f.write_str("fp8-token"),
            ShapeClass::Fp8Group(g) => write!(f, "fp8-g{g}"),
        }
    }
}

impl std::str::FromStr for ShapeClass {
    type Err = ();
    /// [`ShapeClass`]'s `Display` names; groups of 32, 64 or 128 (SPEC.md §8).
    fn from_str(s: &str) -> Result<Self, ()> {
        Ok(match s {
            "fp4" => ShapeClass::Fp4,
            "fp8-tensor" => ShapeClass::Fp8PerTensor,
            "fp8-token" => ShapeClass::Fp8PerToken,
            "fp8-g32" => ShapeClass::Fp8Group(32),
            "fp8-g64" => ShapeClass::Fp8Group(64),
            "fp8-g128" => ShapeClass::Fp8Group(128),
            _ => return Err(()),
        })
    }
}

/// One tuned shape: calls of `class` of `m_from..=m_to` rows of `h` elements of `dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TunedRow {
    /// The kernels the shape is for.
    pub class: ShapeClass,
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
    /// The tuned shape for a call of `class` of `m` rows of `h` elements of `dtype`, if the
    /// table has one (the caller checks that it fits the call).
    pub fn lookup(
        &self,
        class: ShapeClass,
        dtype: DType,
        h: usize,
        m: usize,
    ) -> Option<(u32, u32, u32)> {
        self.rows
            .iter()
            .find(|r| {
                r.class == class && r.dtype == dtype && r.h == h && (r.m_from..=r.m_to).contains(&m)
            })
            .map(|r| r.shape)
    }

    /// `self` with `newer`'s rows in place of its own of the same class, dtype and row
    /// length (a later `fp4norm tune` of some classes keeps the others' rows).
    pub fn merged_with(&self, newer: &TunedTable) -> TunedTable {
        let key = |r: &TunedRow| (r.class, r.dtype, r.h);
        let mut rows: Vec<TunedRow> = self
            .rows
            .iter()
            .filter(|r| !newer.rows.iter().any(|n| key(n) == key(r)))
            .copied()
            .collect();
        rows.extend_from_slice(&newer.rows);
        TunedTable { rows }
    }

    /// The table as the file's text, with a header naming what it was tuned for.
    pub fn to_text(&self, about: &str) -> String {
        let mut s = format!(
            "# fp4norm launch shapes tuned by `fp4norm tune` for {about}\n\
             # class dtype h m_from m_to threads_per_row rows_per_cta ctas_per_row (m_to 0: no end)\n"
        );
        for r in &self.rows {
            let to = if r.m_to == usize::MAX { 0 } else { r.m_to };
            s += &format!(
                "{} {} {} {} {} {} {} {}\n",
                r.class, r.dtype, r.h, r.m_from, to, r.shape.0, r.shape.1, r.shape.2
            );
        }
        s
    }

    /// Parses [`TunedTable::to_text`]'s format (and its earlier one, without the class:
    /// the FP4 op's rows). Any malformed line refuses the whole text, the error naming the
    /// line: an unknown class or dtype, a number that is not a plain decimal, `h` or
    /// `m_from` of 0, `m_to` below `m_from`, threads per row not whole warps of at most
    /// 1024, no rows per CTA, CTAs per row outside 1..=8, or row counts that overlap
    /// another line's of the same class, dtype and `h` (the first would win unseen).
    pub fn parse(text: &str) -> Result<TunedTable, String> {
        let mut rows: Vec<TunedRow> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let row = parse_row(line).map_err(|e| format!("line {}: {e}: {line:?}", i + 1))?;
            if let Some(o) = rows.iter().find(|o| {
                (o.class, o.dtype, o.h) == (row.class, row.dtype, row.h)
                    && o.m_from <= row.m_to
                    && row.m_from <= o.m_to
            }) {
                return Err(format!(
                    "line {}: rows {}..{} overlap the rows {}..{} of an earlier line of {} {} H={}",
                    i + 1,
                    row.m_from,
                    row.m_to,
                    o.m_from,
                    o.m_to,
                    row.class,
                    row.dtype,
                    row.h
                ));
            }
            rows.push(row);
        }
        Ok(TunedTable { rows })
    }
}

/// One line of the table's text (not a comment): the row, or what is wrong with it.
fn parse_row(line: &str) -> Result<TunedRow, String> {
    let mut f: Vec<&str> = line.split_whitespace().collect();
    let class = match f.len() {
        7 => ShapeClass::Fp4,
        8 => f.remove(0).parse().map_err(|()| {
            "the class is not fp4, fp8-tensor, fp8-token, fp8-g32, fp8-g64 or fp8-g128".to_string()
        })?,
        n => return Err(format!("{n} fields, not 8 (or 7 without the class)")),
    };
    let dtype = match f[0] {
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        _ => return Err("the dtype is not bf16 or f16".into()),
    };
    // Plain decimals only (`str::parse` would take a leading `+`).
    let n = |i: usize, what: &str| -> Result<usize, String> {
        let v = f[i];
        match v.parse::<usize>() {
            Ok(n) if v.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
            _ => Err(format!("{what} {v:?} is not a decimal number")),
        }
    };
    let (h, m_from) = (n(1, "h")?, n(2, "m_from")?);
    let m_to = match n(3, "m_to")? {
        0 => usize::MAX,
        v => v,
    };
    let mut shape = [0u32; 3];
    for (k, what) in ["threads_per_row", "rows_per_cta", "ctas_per_row"]
        .iter()
        .enumerate()
    {
        shape[k] = u32::try_from(n(4 + k, what)?).map_err(|_| format!("{what} is too large"))?;
    }
    let [g, r, c] = shape;
    if h == 0 || m_from == 0 {
        return Err("h and m_from must be at least 1".into());
    }
    if m_to < m_from {
        return Err(format!("m_to {m_to} is below m_from {m_from}"));
    }
    if g == 0 || g % 32 != 0 || g > 1024 || r == 0 || !(1..=8).contains(&c) {
        return Err(
            "the shape needs whole warps of at most 1024 threads per row, at least one row per \
             CTA and 1 to 8 CTAs per row"
                .into(),
        );
    }
    Ok(TunedRow {
        class,
        dtype,
        h,
        m_from,
        m_to,
        shape: (g, r, c),
    })
}

/// `table` without the rows whose shape is not one of [`candidates`] for their class and
/// row length on a device with `limits`: calls take only the shapes `fp4norm tune`
/// measures, which the compile check and the GPU tests cover (a hand-edited row may hold
/// others; the built-in shape serves its rows instead). Checked once, when a `Gpu` reads
/// the table: a block only narrows which generated shapes fit (`shape_fits`), so the
/// candidates of the smallest block, one vector, hold those of every block, and each call
/// still fits the shape to its own block (`KernelConfig::try_launch_shape`).
pub(crate) fn candidates_only(mut table: TunedTable, limits: &DeviceLimits) -> TunedTable {
    table
        .rows
        .retain(|r| candidates(r.class, r.h, 8, limits).contains(&r.shape));
    table
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
/// registers, where more vectors spill (the compile check shows it); a per-token FP8 row
/// split over a cluster (`class`), whose CTAs also exchange its amax, takes at most 2 in a
/// CTA of 256 for the same reason.
pub fn candidates(
    class: ShapeClass,
    h: usize,
    block: usize,
    limits: &DeviceLimits,
) -> Vec<(u32, u32, u32)> {
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
            let exchanges_amax = class == ShapeClass::Fp8PerToken && c > 1;
            let most = if threads <= 128 || (threads <= 256 && exchanges_amax) {
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

/// Held while `fp4norm tune` measures and writes `gpu`'s table: the lock file beside it
/// (`None` with the disk cache off, where nothing is written). A table serves every card of
/// its model, so the lock is per table, not per card. The lock goes with the value or the
/// process; a second run finds it held and stops with [`Error::TuneBusy`] rather than wait.
/// (Built by a Rust older than 1.89 there is no lock: always `None`.)
pub fn lock(gpu: &Gpu) -> Result<Option<TuneLock>, Error> {
    #[cfg(fp4norm_file_lock)]
    return table_path(gpu)
        .map(|p| lock_file(&p.with_extension("lock")))
        .transpose();
    #[cfg(not(fp4norm_file_lock))]
    {
        let _ = gpu;
        Ok(None)
    }
}

/// An exclusive lock on a tuned table's lock file ([`lock`]), released when dropped.
#[derive(Debug)]
pub struct TuneLock {
    _file: std::fs::File,
}

#[cfg(fp4norm_file_lock)]
#[clippy::msrv = "1.89"]
fn lock_file(path: &std::path::Path) -> Result<TuneLock, Error> {
    let io = |e: std::io::Error| Error::TunedTableWrite {
        message: format!("{}: {e}", path.display()),
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => Ok(TuneLock { _file: file }),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::TuneBusy {
            lock: path.display().to_string(),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(io(e)),
    }
}

/// The tuned table for `gpu`'s device, if `fp4norm tune` wrote one and
/// `FP4NORM_TUNED=off` is not set, its rows of candidate shapes ([`candidates_only`]); a
/// file that cannot be read or parsed is the error (the `Gpu` then runs the built-in table
/// and says why, once per process).
pub(crate) fn load(gpu: &Gpu) -> Result<Option<TunedTable>, Error> {
    if !knobs::use_tuned_table() {
        return Ok(None);
    }
    Ok(saved(gpu)?.map(|t| candidates_only(t, gpu.limits())))
}

/// The table `fp4norm tune` last wrote for `gpu`'s device, whether or not it is in use:
/// `None` where there is none (or the disk cache is off), an error where the file cannot be
/// read or does not parse ([`TunedTable::parse`]).
pub fn saved(gpu: &Gpu) -> Result<Option<TunedTable>, Error> {
    let Some(path) = table_path(gpu) else {
        return Ok(None);
    };
    let bad = |message: String| Error::TunedTable {
        path: path.display().to_string(),
        message,
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(bad(e.to_string())),
    };
    TunedTable::parse(&text).map(Some).map_err(bad)
}

/// Writes `table` as `gpu`'s tuned table (through a temporary file and a rename) and
/// returns its path; a `Gpu` opened afterwards uses it.
pub fn save(gpu: &Gpu, table: &TunedTable) -> Result<PathBuf, Error> {
    let path = table_path(gpu).ok_or_else(|| Error::TunedTableWrite {
        message: "the disk cache is off or has no folder".into(),
    })?;
    let io = |e: std::io::Error| Error::TunedTableWrite {
        message: format!("{}: {e}", path.display()),
    };
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

    #[cfg(fp4norm_file_lock)]
    #[test]
    fn one_tune_holds_the_lock_at_a_time() {
        let dir = std::env::temp_dir().join(format!("fp4norm-lock-{}", std::process::id()));
        let path = dir.join("tuned").join("0123.lock");
        let held = lock_file(&path).expect("a free lock is taken");
        match lock_file(&path) {
            Err(Error::TuneBusy { lock }) => assert_eq!(lock, path.display().to_string()),
            other => panic!("a held lock must refuse a second taker, got {other:?}"),
        }
        drop(held);
        let again = lock_file(&path).expect("a dropped lock is free again");
        drop(again);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(fp4norm_file_lock)]
    #[test]
    fn a_lock_that_cannot_be_made_says_where() {
        // The folder the lock goes in is a file: the error names the path, not CUDA.
        let blocker =
            std::env::temp_dir().join(format!("fp4norm-lock-file-{}", std::process::id()));
        std::fs::write(&blocker, b"").unwrap();
        let path = blocker.join("tuned").join("0123.lock");
        match lock_file(&path) {
            Err(e @ Error::TunedTableWrite { .. }) => {
                assert!(e.to_string().contains(&path.display().to_string()), "{e}")
            }
            other => panic!("expected TunedTableWrite, got {other:?}"),
        }
        std::fs::remove_file(&blocker).unwrap();
    }

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
                let c = candidates(ShapeClass::Fp4, h, block, &H200);
                assert!(!c.is_empty(), "H={h}");
                for &s in &c {
                    assert!(shape_fits(h, block, s, &H200), "H={h}: {s:?}");
                }
            }
        }
        // The built-in table's shapes come out of the generic rule too.
        let c = candidates(ShapeClass::Fp4, 8192, 16, &H200);
        for s in [(256, 1, 2), (128, 1, 8), (512, 1, 1)] {
            assert!(c.contains(&s), "{s:?} not in {c:?}");
        }
        assert!(candidates(ShapeClass::Fp4, 32768, 16, &H200).contains(&(256, 1, 8)));
        assert!(candidates(ShapeClass::Fp4, 5120, 16, &H200).contains(&(128, 1, 5)));
        assert!(candidates(ShapeClass::Fp4, 7168, 16, &H200).contains(&(128, 1, 7)));
        let no_clusters = DeviceLimits {
            max_cluster: 1,
            ..H200
        };
        assert!(candidates(ShapeClass::Fp4, 8192, 16, &no_clusters)
            .iter()
            .all(|s| s.2 == 1));
        // A per-token row over a cluster exchanges its amax too: two vectors a thread at
        // most in CTAs of 256 (four spill), four still in one CTA of 512.
        let token = candidates(ShapeClass::Fp8PerToken, 16384, 8, &H200);
        assert!(!token.contains(&(256, 1, 2)), "{token:?}");
        assert!(token.contains(&(256, 1, 4)) && token.contains(&(512, 1, 1)));
        let tensor = candidates(ShapeClass::Fp8PerTensor, 16384, 8, &H200);
        assert!(tensor.contains(&(256, 1, 2)), "{tensor:?}");
    }

    #[test]
    fn a_table_round_trips_and_is_looked_up_by_class_and_bucket() {
        let row = |class, h, m_from, m_to, shape| TunedRow {
            class,
            dtype: DType::BF16,
            h,
            m_from,
            m_to,
            shape,
        };
        let t = TunedTable {
            rows: vec![
                row(ShapeClass::Fp4, 4096, 1, 1, (64, 1, 8)),
                row(ShapeClass::Fp4, 4096, 133, usize::MAX, (256, 1, 1)),
                row(ShapeClass::Fp8PerToken, 4096, 1, 1, (128, 1, 4)),
                row(ShapeClass::Fp8Group(128), 4096, 1, 1, (256, 1, 2)),
                row(ShapeClass::Fp8PerTensor, 4096, 1, 1, (512, 1, 1)),
            ],
        };
        let text = t.to_text("a test");
        assert!(
            text.contains("\nfp8-g128 bf16 4096 1 1 256 1 2\n"),
            "{text}"
        );
        let parsed = TunedTable::parse(&text).expect("parses");
        assert_eq!(parsed, t);
        let fp4 = ShapeClass::Fp4;
        assert_eq!(parsed.lookup(fp4, DType::BF16, 4096, 1), Some((64, 1, 8)));
        assert_eq!(
            parsed.lookup(fp4, DType::BF16, 4096, 50_000),
            Some((256, 1, 1))
        );
        assert_eq!(parsed.lookup(fp4, DType::BF16, 4096, 16), None);
        assert_eq!(parsed.lookup(fp4, DType::F16, 4096, 1), None);
        // Each class has its own rows.
        let token = ShapeClass::Fp8PerToken;
        assert_eq!(
            parsed.lookup(token, DType::BF16, 4096, 1),
            Some((128, 1, 4))
        );
        let g = |n| ShapeClass::Fp8Group(n);
        assert_eq!(
            parsed.lookup(g(128), DType::BF16, 4096, 1),
            Some((256, 1, 2))
        );
        assert_eq!(parsed.lookup(g(32), DType::BF16, 4096, 1), None);
        // The earlier format (no class) is the FP4 op's.
        let old = TunedTable::parse("# old\nbf16 4096 1 1 64 1 8\n").expect("parses");
        assert_eq!(old.rows, vec![row(fp4, 4096, 1, 1, (64, 1, 8))]);
        for class in [fp4, token, ShapeClass::Fp8PerTensor, g(32), g(64), g(128)] {
            assert_eq!(class.to_string().parse::<ShapeClass>(), Ok(class));
        }
    }

    #[test]
    fn a_malformed_line_refuses_the_table_naming_the_line() {
        let good = "fp4 bf16 4096 1 1 64 1 8\n";
        assert!(TunedTable::parse(good).is_ok());
        for (bad, words) in [
            ("bf16 4096 1 1 64 1", "6 fields"),
            ("fp4 bf16 4096 1 1 64 1 8 # mine", "10 fields"),
            ("bf17 4096 1 1 64 1 8", "dtype"),
            ("fp9 bf16 4096 1 1 64 1 8", "class"),
            ("fp8-g0 bf16 4096 1 1 64 1 8", "class"),
            ("fp8-g16 bf16 4096 1 1 64 1 8", "class"),
            ("fp8-g256 bf16 4096 1 1 64 1 8", "class"),
            ("fp8-g+32 bf16 4096 1 1 64 1 8", "class"),
            ("fp4 bf16 +4096 1 1 64 1 8", "h \"+4096\""),
            ("fp4 bf16 4096 1 1 64 1 -8", "ctas_per_row"),
            ("fp4 bf16 99999999999999999999 1 1 64 1 8", "h"),
            (
                "fp4 bf16 4096 1 1 4294967296 1 8",
                "threads_per_row is too large",
            ),
            ("fp4 bf16 0 1 1 64 1 8", "at least 1"),
            ("fp4 bf16 4096 0 1 64 1 8", "at least 1"),
            ("fp4 bf16 4096 9 3 64 1 8", "below m_from"),
            ("fp4 bf16 4096 1 1 48 1 8", "whole warps"),
            ("fp4 bf16 4096 1 1 2048 1 1", "whole warps"),
            ("fp4 bf16 4096 1 1 64 0 8", "whole warps"),
            ("fp4 bf16 4096 1 1 64 1 9", "whole warps"),
            ("fp4 bf16 4096 1 1 64 1 0", "whole warps"),
        ] {
            let e = TunedTable::parse(&format!("# header\n{good}{bad}\n")).unwrap_err();
            assert!(
                e.starts_with("line 3: ") && e.contains(words),
                "{bad:?}: {e}"
            );
        }
        // Overlapping row counts of one class, dtype and H: the first would win unseen.
        let e = TunedTable::parse("fp4 bf16 4096 1 16 64 1 8\nfp4 bf16 4096 16 0 256 1 1\n")
            .unwrap_err();
        assert!(
            e.starts_with("line 2: rows 16..") && e.contains("overlap"),
            "{e}"
        );
        // Another class, dtype or H may cover the same rows.
        let ok = "fp4 bf16 4096 1 16 64 1 8\nfp8-token bf16 4096 1 16 64 1 8\n\
                  fp4 f16 4096 1 16 64 1 8\nfp4 bf16 8192 1 16 64 1 8\nfp4 bf16 4096 17 0 64 1 8\n";
        assert_eq!(TunedTable::parse(ok).map(|t| t.rows.len()), Ok(5));
    }

    #[test]
    fn a_call_takes_only_a_tuned_shape_that_is_a_candidate() {
        let row = |class, h, shape| TunedRow {
            class,
            dtype: DType::BF16,
            h,
            m_from: 1,
            m_to: usize::MAX,
            shape,
        };
        // A candidate stays; one that fits the call but no candidate list holds (128
        // vectors a thread) goes, as does a per-token cluster shape that spills.
        let fp4 = ShapeClass::Fp4;
        assert!(candidates(fp4, 32768, 16, &H200).contains(&(256, 1, 8)));
        assert!(shape_fits(32768, 16, (32, 1, 1), &H200));
        assert!(!candidates(fp4, 32768, 16, &H200).contains(&(32, 1, 1)));
        assert!(shape_fits(16384, 8, (256, 1, 2), &H200));
        let t = TunedTable {
            rows: vec![
                row(fp4, 32768, (256, 1, 8)),
                row(fp4, 16384, (32, 1, 1)),
                row(ShapeClass::Fp8PerToken, 16384, (256, 1, 2)),
                row(ShapeClass::Fp8PerTensor, 16384, (256, 1, 2)),
            ],
        };
        let kept = candidates_only(t.clone(), &H200);
        assert_eq!(kept.rows, vec![t.rows[0], t.rows[3]]);
        // The candidates of one vector hold those of every block, less the shapes that do
        // not fit it: what a call's own fit check leaves.
        let classes = [
            fp4,
            ShapeClass::Fp8PerTensor,
            ShapeClass::Fp8PerToken,
            ShapeClass::Fp8Group(32),
            ShapeClass::Fp8Group(64),
            ShapeClass::Fp8Group(128),
        ];
        for class in classes {
            for h in [128usize, 2048, 4096, 5120, 7168, 8192, 16384, 32768] {
                let all = candidates(class, h, 8, &H200);
                for block in [16usize, 32, 64, 128] {
                    let fitting: Vec<_> = all
                        .iter()
                        .copied()
                        .filter(|&s| shape_fits(h, block, s, &H200))
                        .collect();
                    assert_eq!(
                        candidates(class, h, block, &H200),
                        fitting,
                        "{class} H={h} block {block}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_later_tune_replaces_only_its_own_rows() {
        let row = |class, h, shape| TunedRow {
            class,
            dtype: DType::BF16,
            h,
            m_from: 1,
            m_to: 1,
            shape,
        };
        let old = TunedTable {
            rows: vec![
                row(ShapeClass::Fp4, 4096, (64, 1, 8)),
                row(ShapeClass::Fp4, 8192, (128, 1, 8)),
                row(ShapeClass::Fp8PerToken, 4096, (128, 1, 4)),
            ],
        };
        let newer = TunedTable {
            rows: vec![
                row(ShapeClass::Fp8PerToken, 4096, (64, 1, 8)),
                row(ShapeClass::Fp8PerToken, 8192, (128, 1, 8)),
            ],
        };
        let merged = old.merged_with(&newer);
        assert_eq!(
            merged.rows,
            vec![
                row(ShapeClass::Fp4, 4096, (64, 1, 8)),
                row(ShapeClass::Fp4, 8192, (128, 1, 8)),
                row(ShapeClass::Fp8PerToken, 4096, (64, 1, 8)),
                row(ShapeClass::Fp8PerToken, 8192, (128, 1, 8)),
            ]
        );
    }
}
