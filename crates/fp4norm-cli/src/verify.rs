//! `fp4norm verify`: random and edge-case inputs through every backend, compared byte
//! for byte with `fp4norm::reference`, for the FP4 op (SPEC.md §1) and the FP8 ops (§8;
//! their groups are in [`fp8`]).
//!
//! Verdicts per (case, backend):
//! * the reference accepts the case: the backend must produce identical bytes in every
//!   output (codes, scales with layout padding, residual with strided gaps, y_out);
//!   a backend may refuse a case it does not implement (`Unsupported`, `Misaligned`:
//!   SPEC.md allows refusing with a clear error) — counted as skipped;
//! * the reference rejects the case: the backend must reject it too, having written nothing.

// The case builders index x and the residual with the same element index.
#![allow(clippy::needless_range_loop)]

mod fp8;

use std::time::Instant;

use fp4norm::codec::e4m3_decode;
use fp4norm::{DType, Fp4Format, Options, ScaleLayout};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use crate::args;
use crate::backend::{self, Backend, Device, HostBackend};
use crate::case::{compare, fill_random, to_bits, Case, Gs, Outputs};
use crate::CliError;

#[derive(clap::Args, Debug)]
#[command(
    long_about = "Run random and edge-case inputs through every backend present (the CPU fast \
path, and the CUDA GPU when one can be opened; --device cpu or cuda runs one alone) and compare every output byte for byte with \
fp4norm::reference, the executable form of SPEC.md: codes (packed FP4, or FP8), scales (layout \
padding must be 0), the updated residual (gaps of strided rows must stay untouched) and y_out. \
Every output buffer starts filled with a canary, so a byte a backend forgets to write is caught \
too, and every call runs twice: a backend must be deterministic.\n\n\
FP4 op (SPEC.md §1) groups: every format pairing x layout x dtype x residual x y_out; odd M (0, \
1, 7, 127, 129, ...); NaN/Inf/zero rows and blocks; subnormals; exact ties of every rounding \
step; huge values and overflow; eps from 0 to f32::MAX; weight biases; per-row and extreme \
global scales; strided rows; narrow and wide H; random mixtures (--cases of them); and bad \
inputs, which every backend must reject without writing anything.\n\n\
FP8 op (SPEC.md §8) groups, named fp8-*: both elements (E4M3, E5M2) x every scaling (per-tensor \
static scale; per token and groups of 32, 64, 128 with f32 scales, floored or not, or UE8M0 \
codes, row- or column-major; MXFP8's swizzled layout) x dtype x residual x y_out; then the same \
edge cases as FP4 over each kind of scaling, plus per-tensor scales of every kind (0, negative, \
±Inf, NaN; read from memory and by value), f32 scale floors, H from 1 (per-tensor and per-token \
take any H) to 32768, and FP8 bad inputs (H not a multiple of the group, swizzled without UE8M0 \
in groups of 32, invalid floors). A backend that refuses a valid case it does not implement \
counts it as skipped.\n\n\
--group fp8 runs the FP8 groups only; --group random both random groups.\n\n\
Prints one summary line per group and a final 'N passed, N failed' line; the exit status is 1 \
if anything failed."
)]
pub struct VerifyArgs {
    /// Seed of every random choice (the same seed gives the same cases)
    #[arg(long, default_value_t = 2024, value_parser = args::seed, allow_negative_numbers = true)]
    seed: u64,
    /// Number of cases in each random group, 'random' and 'fp8-random' (the other groups
    /// have a fixed size)
    #[arg(long, default_value_t = 300, value_name = "N", value_parser = args::count0,
          allow_negative_numbers = true)]
    cases: usize,
    /// Only run the groups whose name contains this text (fp8: the FP8 groups)
    #[arg(long, value_name = "TEXT", value_parser = parse_group)]
    group: Option<String>,
    /// Print every case as it runs
    #[arg(long, short)]
    verbose: bool,
    /// Backends to check: auto (the CUDA GPU when one can be opened, and the CPU; stderr
    /// says why CUDA is not used, FP4NORM_REQUIRE_GPU=1 makes that an error), cpu (the CPU
    /// alone) or cuda (the GPU alone; an error if it cannot be opened)
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,
}

const DTYPES: [DType; 2] = [DType::BF16, DType::F16];

/// Cases of a random group made and checked at a time.
const CASE_BATCH: usize = 256;

/// A `--group` filter that matches at least one group (else a bad command line, which
/// lists the groups).
fn parse_group(text: &str) -> Result<String, String> {
    if GROUPS.iter().any(|g| g.name.contains(text)) {
        Ok(text.to_string())
    } else {
        let all: Vec<&str> = GROUPS.iter().map(|g| g.name).collect();
        Err(format!("matches no group; groups: {}", all.join(", ")))
    }
}

struct Group {
    name: &'static str,
    about: &'static str,
    /// Every case must be rejected.
    expect_error: bool,
    /// The group's size is `--cases` (the random groups): made a batch at a time.
    sized_by_cases: bool,
    make: fn(&mut StdRng, usize) -> Vec<Case>,
}

const GROUPS: &[Group] = &[
    Group {
        name: "formats-layouts",
        about: "4 format pairings x 3 layouts x 2 dtypes x residual x y_out",
        expect_error: false,
        sized_by_cases: false,
        make: formats_layouts,
    },
    Group {
        name: "odd-m",
        about: "M = 0, 1, 7, 31..33, 127..129, 255..257, 300",
        expect_error: false,
        sized_by_cases: false,
        make: odd_m,
    },
    Group {
        name: "special-values",
        about: "NaN/Inf/zero rows and blocks, -0, NaN payloads",
        expect_error: false,
        sized_by_cases: false,
        make: special_values,
    },
    Group {
        name: "subnormals",
        about: "subnormal inputs, weights and scales; tiny eps",
        expect_error: false,
        sized_by_cases: false,
        make: subnormals,
    },
    Group {
        name: "ties",
        about: "exact ties in RNdt, E4M3, UE8M0 and E2M1 rounding",
        expect_error: false,
        sized_by_cases: false,
        make: ties,
    },
    Group {
        name: "huge",
        about: "values near dtype max, overflow to Inf, extreme global scales",
        expect_error: false,
        sized_by_cases: false,
        make: huge,
    },
    Group {
        name: "eps",
        about: "eps 0, f32 subnormal, 1e-6, 1, 1e30, f32::MAX",
        expect_error: false,
        sized_by_cases: false,
        make: eps,
    },
    Group {
        name: "weight-bias",
        about: "weight bias 1 (Gemma), -1, ±0, tiny and huge, over random and special weights",
        expect_error: false,
        sized_by_cases: false,
        make: weight_bias,
    },
    Group {
        name: "global-scale",
        about: "per-row global scales incl. 0, -1, tiny, huge, Inf, NaN",
        expect_error: false,
        sized_by_cases: false,
        make: global_scale,
    },
    Group {
        name: "strided",
        about: "row strides > H for x, residual and y_out",
        expect_error: false,
        sized_by_cases: false,
        make: strided_rows,
    },
    Group {
        name: "narrow-wide",
        about: "H = one block .. 32768",
        expect_error: false,
        sized_by_cases: false,
        make: narrow_wide,
    },
    Group {
        name: "random",
        about: "random mixtures of all of the above (--cases)",
        expect_error: false,
        sized_by_cases: true,
        make: random_cases,
    },
    Group {
        name: "bad-input",
        about: "invalid calls: must be rejected, nothing written",
        expect_error: true,
        sized_by_cases: false,
        make: bad_input,
    },
    Group {
        name: "fp8-scalings",
        about: "FP8: 2 elements x 29 scalings (tensor; token/32/64/128 x f32/floored/ue8m0 x row/col; mxfp8; 32/64/128 ue8m0 packed) x 2 dtypes x residual x y_out",
        expect_error: false,
        sized_by_cases: false,
        make: fp8::scalings,
    },
    Group {
        name: "fp8-odd-m",
        about: "FP8: M = 0 .. 300, row-major, column-major and packed (padded to 4 rows) and swizzled (128) scales",
        expect_error: false,
        sized_by_cases: false,
        make: fp8::odd_m,
    },
    Group {
        name: "fp8-special-values",
        about: "FP8: NaN/Inf/zero rows and groups, -0, NaN payloads, special weights",
        expect_error: false,
        sized_by_cases: false,
        make: fp8::special_values,
    },
    Group {
        name: "fp8-subnormals",
        about: "FP8: subnormal inputs, weights, codes and scales; subnormal static scales",
        expect_error: false,
        sized_by_cases: false,
        make: fp8::subnormals,
    },
    Group {
        name: "fp8-ties",
        about: "FP8: exact ties in RNdt and FP8 rounding; UE8M0's round-up boundary",
        expect_error: false,
        sized_by_cases: false,
        make: fp8::ties,
    },
    Group {
        name: "fp8-huge",
        about: "FP8: values near dtype max, overflow, saturation, extreme static scales",
        expect_error: false,
        sized_by_cases: false,
        make: fp8::huge,
    },
    Group {
        name: "fp8-eps",
        about: "FP8: eps 0, f32 subnormal, 1e-6, 1, 1e30, f32::MAX",
        expect_error: false,
        sized_by_cases: false,
        make: fp8::eps,
    },
    Group {
        name: "fp8-weight-bias",
        about: "FP8: weight bias 1 (Gemma), -1, ±0, tiny and huge, over special weights",
        expect_error: false,
        sized_by_cases: false,
        make: fp8::weight_bias,
    },
    Group {
        name: "fp8-static-scale",
        about: "FP8: per-tensor scales 0, -0, -1, tiny, huge, ±Inf, NaN; in memory and by value",
        expect_error: false,
        sized_by_cases: false,
        make: fp8::static_scale,
    },
    Group {
        name: "fp8-scale-floor",
        about: "FP8: f32 scale floors from the smallest subnormal to f32::MAX",
        expect_error: false,
        sized_by_cases: false,
        make: fp8::scale_floor,
    },
    Group {
        name: "fp8-strided",
        about: "FP8: row strides > H for x, residual and y_out",
        expect_error: false,
        sized_by_cases: false,
        make: fp8::strided_rows,
    },
    Group {
        name: "fp8-narrow-wide",
        about: "FP8: H = 1 .. 32768 (any H per tensor and per token), every scaling that fits",
        expect_error: false,
        sized_by_cases: false,
        make: fp8::narrow_wide,
    },
    Group {
        name: "fp8-random",
        about: "FP8: random mixtures of all of the above (--cases)",
        expect_error: false,
        sized_by_cases: true,
        make: fp8::random_cases,
    },
    Group {
        name: "fp8-bad-input",
        about: "FP8: invalid calls: must be rejected, nothing written",
        expect_error: true,
        sized_by_cases: false,
        make: fp8::bad_input,
    },
];

enum Verdict {
    Pass,
    Fail(String),
    Skip(String),
}

pub fn run(a: VerifyArgs) -> Result<bool, CliError> {
    let groups: Vec<(usize, &Group)> = GROUPS
        .iter()
        .enumerate()
        .filter(|(_, g)| a.group.as_deref().is_none_or(|f| g.name.contains(f)))
        .collect();
    if groups.is_empty() {
        let all: Vec<&str> = GROUPS.iter().map(|g| g.name).collect();
        return Err(CliError(format!(
            "--group {:?} matches no group; groups: {}",
            a.group.unwrap_or_default(),
            all.join(", ")
        )));
    }
    let backends = backend::for_verify(a.device)?;
    let names: Vec<String> = backends
        .iter()
        .map(|b| format!("{} ({})", b.name(), b.describe()))
        .collect();
    println!(
        "fp4norm {} verify | backends: {} | oracle: fp4norm::reference | seed {}",
        env!("CARGO_PKG_VERSION"),
        names.join(", "),
        a.seed
    );
    println!(
        "{:<18} {:>6} {:>7} {:>7} {:>8} {:>7}  what",
        "group", "cases", "passed", "failed", "skipped", "time"
    );
    let (mut passed, mut failed, mut skipped) = (0usize, 0usize, 0usize);
    let start = Instant::now();
    for (gi, g) in groups {
        let t = Instant::now();
        // Wrapping: the seeds are the release build's, and a debug build must not trap.
        let mut rng =
            StdRng::seed_from_u64(a.seed ^ (gi as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let (mut p, mut f, mut s) = (0, 0, 0);
        // The random groups a batch at a time from the same generator (the same cases as
        // all at once): memory stays bounded whatever --cases says.
        let mut left = a.cases;
        let mut n_cases = 0usize;
        loop {
            let size = if g.sized_by_cases {
                left.min(CASE_BATCH)
            } else {
                left
            };
            left -= size;
            let cases = (g.make)(&mut rng, size);
            // The oracle's results for the whole batch first, a case per thread (the
            // reference is scalar); every backend is compared with the same results.
            let oracle: Vec<Run> = cases
                .par_iter()
                .map(|case| run_on(&HostBackend::reference(), case))
                .collect();
            for b in &backends {
                b.warm(&cases);
            }
            for (i, (case, expected)) in cases.iter().zip(&oracle).enumerate() {
                let ci = n_cases + i;
                for b in &backends {
                    let verdict = check_case(case, expected, g.expect_error, &**b);
                    let label = format!("{}#{ci} {}: {}", g.name, b.name(), case.describe());
                    match verdict {
                        Verdict::Pass => {
                            p += 1;
                            if a.verbose {
                                println!("  pass {label}");
                            }
                        }
                        Verdict::Skip(why) => {
                            s += 1;
                            if a.verbose || s <= 3 {
                                println!("  skip {label}: {why}");
                            }
                        }
                        Verdict::Fail(why) => {
                            f += 1;
                            if a.verbose || f <= 5 {
                                println!("  FAIL {label}: {why}");
                            }
                        }
                    }
                }
            }
            n_cases += cases.len();
            if !g.sized_by_cases || left == 0 {
                break;
            }
        }
        println!(
            "{:<18} {:>6} {:>7} {:>7} {:>8} {:>6.1}s  {}{}",
            g.name,
            n_cases,
            p,
            f,
            s,
            t.elapsed().as_secs_f64(),
            g.about,
            if f > 0 { "  <-- FAILED" } else { "" }
        );
        passed += p;
        failed += f;
        skipped += s;
    }
    eprintln!("verify took {:.1} s", start.elapsed().as_secs_f64());
    if skipped > 0 {
        println!("{passed} passed, {failed} failed, {skipped} skipped");
    } else {
        println!("{passed} passed, {failed} failed");
    }
    Ok(failed == 0)
}

/// One call's result on one backend: success or the error (its text and, where the op
/// returned it, the error itself), and the outputs as the call left them.
type Run = (Result<(), String>, Option<fp4norm::Error>, Option<Outputs>);

fn run_on(b: &dyn Backend, case: &Case) -> Run {
    match b.prepare(case) {
        Err(e) => (Err(e.to_string()), None, None),
        Ok(mut p) => {
            let r = p.run_once();
            let out = p.outputs().ok();
            match r {
                Ok(()) => {
                    // Once more from the same inputs: a backend must be deterministic
                    // (a race in a kernel shows up here).
                    let again = p
                        .reset()
                        .map_err(|e| e.to_string())
                        .and_then(|()| p.run_once().map_err(|e| e.to_string()));
                    match (again, p.outputs().ok()) {
                        (Ok(()), Some(o2)) if Some(&o2) == out.as_ref() => (Ok(()), None, out),
                        (Err(e), _) => (
                            Err(format!("the second, identical call failed: {e}")),
                            None,
                            out,
                        ),
                        _ => (
                            Err("a second, identical call gave different bytes".into()),
                            None,
                            out,
                        ),
                    }
                }
                Err(e) => (Err(e.to_string()), Some(e), out),
            }
        }
    }
}

/// `b`'s verdict on `case`, against the reference's run of it (`expected`).
fn check_case(case: &Case, expected: &Run, expect_error: bool, b: &dyn Backend) -> Verdict {
    let (ref_res, _, ref_out) = expected;
    let (got_res, got_err, got_out) = run_on(b, case);
    let initial = match Outputs::initial(case) {
        Ok(o) => o,
        Err(e) => return Verdict::Fail(e.to_string()),
    };
    let untouched = |out: &Option<Outputs>, who: &str| match out {
        Some(o) => compare(case, &initial, o)
            .map(|m| format!("{who} rejected the call but wrote to it: {m}")),
        None => None,
    };
    match (ref_res, got_res) {
        (Ok(()), _) if expect_error => {
            Verdict::Fail("the reference accepted a call that must be rejected".into())
        }
        (Ok(()), Ok(())) => match (ref_out, got_out) {
            (Some(e), Some(g)) => match compare(case, e, &g) {
                None => Verdict::Pass,
                Some(m) => Verdict::Fail(m.to_string()),
            },
            _ => Verdict::Fail("could not read the outputs back".into()),
        },
        (Ok(()), Err(e)) => match got_err {
            Some(fp4norm::Error::Unsupported(_) | fp4norm::Error::Misaligned { .. }) => {
                Verdict::Skip(format!("{} refuses it: {e}", b.name()))
            }
            _ => Verdict::Fail(format!("{} rejected a valid call: {e}", b.name())),
        },
        (Err(e), Ok(())) => Verdict::Fail(format!(
            "{} accepted a call the reference rejects ({e})",
            b.name()
        )),
        (Err(_), Err(_)) => {
            match untouched(ref_out, "the reference").or_else(|| untouched(&got_out, b.name())) {
                None => Verdict::Pass,
                Some(why) => Verdict::Fail(why),
            }
        }
    }
}

// ---------------------------------------------------------------- case builders

fn opts(f: Fp4Format) -> Options {
    Options::default().with_format(f)
}

fn rand_case(
    rng: &mut StdRng,
    m: usize,
    h: usize,
    dtype: DType,
    layout: ScaleLayout,
    f: Fp4Format,
) -> Case {
    Case::random(m, h, dtype, layout, opts(f), rng.random())
}

/// Random inputs of one random case: x (and the residual) at magnitudes from somewhere
/// between subnormal and near the dtype's max, and in some cases a few special values
/// (±0, ±Inf, NaN, the max, subnormals) dropped into x.
fn fill_mixed(rng: &mut StdRng, dtype: DType, x: &mut [u16], residual: Option<&mut Vec<u16>>) {
    let (lo, hi) = if dtype == DType::F16 {
        (-20, 12)
    } else {
        (-60, 60)
    };
    let lo = rng.random_range(lo..=hi - 2);
    let hi = rng.random_range(lo..=hi);
    fill_random(x, dtype, rng.random(), lo, hi);
    if let Some(r) = residual {
        fill_random(r, dtype, rng.random(), lo, hi);
    }
    let s = sp(dtype);
    if rng.random_bool(0.3) && !x.is_empty() {
        for _ in 0..rng.random_range(1..8) {
            let i = rng.random_range(0..x.len());
            x[i] = pick(
                rng,
                &[0, 0x8000, s.inf, s.inf | 0x8000, s.nan, s.max, 1, s.max_sub],
            );
        }
    }
}

fn pick<T: Copy>(rng: &mut StdRng, v: &[T]) -> T {
    v[rng.random_range(0..v.len())]
}

/// Special bit patterns of a dtype.
struct Sp {
    inf: u16,
    nan: u16,
    max: u16,
    max_sub: u16,
}

fn sp(d: DType) -> Sp {
    match d {
        DType::BF16 => Sp {
            inf: 0x7F80,
            nan: 0x7FC0,
            max: 0x7F7F,
            max_sub: 0x007F,
        },
        DType::F16 => Sp {
            inf: 0x7C00,
            nan: 0x7E00,
            max: 0x7BFF,
            max_sub: 0x03FF,
        },
    }
}

/// Re-lays `c`'s rows `stride` elements apart; gap elements get random values (in the
/// residual they must survive the call untouched).
fn with_stride(mut c: Case, stride: usize, rng: &mut StdRng) -> Case {
    assert!(stride >= c.h);
    let (m, h, old, dtype) = (c.m, c.h, c.stride, c.dtype);
    let relay = |src: &[u16], rng: &mut StdRng| {
        let mut dst = vec![0u16; m * stride];
        fill_random(&mut dst, dtype, rng.random(), -2, 2);
        for row in 0..m {
            dst[row * stride..row * stride + h].copy_from_slice(&src[row * old..row * old + h]);
        }
        dst
    };
    c.x = relay(&c.x, rng);
    if let Some(r) = c.residual.take() {
        c.residual = Some(relay(&r, rng));
    }
    c.stride = stride;
    c
}

fn per_row_gs(rng: &mut StdRng, m: usize) -> Gs {
    Gs::PerRow(
        (0..m)
            .map(|_| 2f32.powf(rng.random_range(-8.0f32..8.0)))
            .collect(),
    )
}

fn formats_layouts(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let ms = [1, 7, 127, 129, 130, 257];
    let mut v = Vec::new();
    for f in Fp4Format::ALL {
        for layout in ScaleLayout::ALL {
            for dtype in DTYPES {
                for residual in [true, false] {
                    for y_out in [false, true] {
                        let m = ms[v.len() % ms.len()];
                        let h = f.block_size() * rng.random_range(1..=40);
                        let mut c = rand_case(rng, m, h, dtype, layout, f);
                        c.y_out = y_out;
                        if !residual {
                            c.residual = None;
                        }
                        c.gs = match v.len() % 3 {
                            0 => Gs::Uniform(1.0),
                            1 => Gs::Uniform(rng.random_range(0.01f32..100.0)),
                            _ => per_row_gs(rng, m),
                        };
                        v.push(c);
                    }
                }
            }
        }
    }
    v
}

fn odd_m(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let mut v = Vec::new();
    for m in [0, 1, 2, 7, 31, 32, 33, 127, 128, 129, 255, 256, 257, 300] {
        for layout in ScaleLayout::ALL {
            for f in [Fp4Format::NVFP4, Fp4Format::MXFP4] {
                // 1, 5 and 8 blocks per row: a partial and whole 4-block swizzle column.
                let nb = [1, 5, 8][v.len() % 3];
                let dtype = DTYPES[v.len() % 2];
                let mut c = rand_case(rng, m, nb * f.block_size(), dtype, layout, f);
                c.y_out = v.len() % 4 == 0;
                v.push(c);
            }
        }
    }
    v
}

fn special_values(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let (m, h) = (24, 256);
    let mut v = Vec::new();
    for f in Fp4Format::ALL {
        for layout in ScaleLayout::ALL {
            for dtype in DTYPES {
                for eps in [1e-6f32, 0.0] {
                    let residual = v.len() % 2 == 0;
                    let mut c = rand_case(rng, m, h, dtype, layout, f);
                    c.set_eps(eps);
                    c.y_out = v.len() % 3 == 0;
                    special_rows(&mut c, rng, f.block_size());
                    match v.len() % 3 {
                        1 => special_weights(&mut c, rng, f.block_size()),
                        2 => c.gs = per_row_gs(rng, m),
                        _ => {}
                    }
                    if !residual {
                        c.residual = None;
                    }
                    v.push(c);
                }
            }
        }
    }
    v
}

/// Special rows, by row % 14: zero rows, x + r = +0, NaN, ±Inf, Inf - Inf, a zero block
/// and a NaN block of `b` elements, -0 rows, constant rows, a single nonzero, NaN payloads,
/// Inf with NaN. The case must have its residual (drop it afterwards for the variant
/// without one).
fn special_rows(c: &mut Case, rng: &mut StdRng, b: usize) {
    let (m, h, dtype) = (c.m, c.h, c.dtype);
    let s = sp(dtype);
    let r = c.residual.as_mut().expect("random cases have a residual");
    for row in 0..m {
        let at = row * c.stride;
        let col = rng.random_range(0..h);
        let blk = rng.random_range(0..h / b) * b;
        match row % 14 {
            0 => {
                c.x[at..at + h].fill(0);
                r[at..at + h].fill(0);
            }
            1 => {
                for i in at..at + h {
                    r[i] = c.x[i] ^ 0x8000; // x + r = +0 exactly
                }
            }
            2 => c.x[at + col] = s.nan,
            3 => r[at + col] = s.inf,
            4 => c.x[at + col] = s.inf | 0x8000,
            5 => {
                c.x[at + col] = s.inf;
                r[at + col] = s.inf | 0x8000; // Inf - Inf = NaN
            }
            6 => {
                c.x[at + blk..at + blk + b].fill(0);
                r[at + blk..at + blk + b].fill(0);
            }
            7 => c.x[at + blk..at + blk + b].fill(s.nan | 0x8000),
            8 => {
                c.x[at..at + h].fill(0x8000); // -0
                r[at..at + h].fill(0x8000);
            }
            9 => {
                let k = c.x[at];
                c.x[at..at + h].fill(k);
                r[at..at + h].fill(0);
            }
            10 => {
                c.x[at..at + h].fill(0);
                r[at..at + h].fill(0);
                c.x[at + col] = to_bits(dtype, 3.0);
            }
            11 => c.x[at + col] = s.nan | 0x8001, // NaN with a payload
            12 => {
                c.x[at + col] = s.inf;
                c.x[at + (col + h / 2) % h] = s.nan;
            }
            _ => {}
        }
    }
}

/// Special weights: NaN, Inf, a zero block of `b`, negatives, -0.
fn special_weights(c: &mut Case, rng: &mut StdRng, b: usize) {
    let (h, s) = (c.h, sp(c.dtype));
    c.w[rng.random_range(0..h)] = s.nan;
    c.w[rng.random_range(0..h)] = s.inf;
    let blk = rng.random_range(0..h / b) * b;
    c.w[blk..blk + b].fill(0);
    for i in 0..8 {
        c.w[rng.random_range(0..h)] |= 0x8000;
        c.w[(i * 31) % h] = 0x8000;
    }
    c.note = "special weights".into();
}

fn subnormals(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let (m, h) = (33, 512);
    let mut v = Vec::new();
    for f in Fp4Format::ALL {
        for dtype in DTYPES {
            for eps in [0.0f32, 1e-40, 1e-30, 1e-6] {
                let layout = ScaleLayout::ALL[v.len() % 3];
                let mut c = rand_case(rng, m, h, dtype, layout, f);
                c.set_eps(eps);
                subnormal_rows(&mut c, rng);
                // Weights 2^k per block, k down to -40: y, and with it the block scales,
                // reach E4M3 subnormals, zero scales and f32 subnormals.
                pow2_weights(&mut c, rng, f.block_size(), -40);
                c.y_out = v.len() % 2 == 0;
                v.push(c);
            }
        }
    }
    v
}

/// Subnormal rows, by row % 3: every element subnormal (x and residual), subnormal with a
/// few normal values, untouched. The case must have its residual.
fn subnormal_rows(c: &mut Case, rng: &mut StdRng) {
    let (m, h) = (c.m, c.h);
    let s = sp(c.dtype);
    let r = c.residual.as_mut().expect("random cases have a residual");
    for row in 0..m {
        let at = row * c.stride;
        match row % 3 {
            0 => {
                for i in at..at + h {
                    c.x[i] = rng.random_range(1..=s.max_sub) | (rng.random::<u16>() & 0x8000);
                    r[i] = rng.random_range(0..=s.max_sub) | (rng.random::<u16>() & 0x8000);
                }
            }
            1 => {
                for i in at..at + h {
                    c.x[i] = if rng.random_bool(0.05) {
                        c.x[i]
                    } else {
                        rng.random_range(1..=s.max_sub)
                    };
                    r[i] = 0;
                }
            }
            _ => {}
        }
    }
}

/// Weights `[1, 2) · 2^k` with one random `k` in `lo..=3` per block of `b` (a trailing
/// partial block gets its own): blocks of very different magnitudes, down to values whose
/// scales are subnormal or zero.
fn pow2_weights(c: &mut Case, rng: &mut StdRng, b: usize, lo: i32) {
    let dtype = c.dtype;
    for blk in c.w.chunks_mut(b.max(1)) {
        let k = rng.random_range(lo..=3);
        for w in blk {
            *w = to_bits(dtype, rng.random_range(1.0f32..2.0) * 2f32.powi(k));
        }
    }
}

/// Ties. Rows are ±c with c a power of two and eps 0, so rstd = 1/c and y = ±w exactly;
/// the weights then put y on the rounding boundaries of the block scale and of E2M1.
/// Some rows instead hit RNdt ties in x + r.
fn ties(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let (m, h) = (16, 256);
    let e2m1_ties = [
        0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
    ];
    let mut v = Vec::new();
    for f in Fp4Format::ALL {
        for dtype in DTYPES {
            for gs_kind in 0..3 {
                let layout = ScaleLayout::ALL[v.len() % 3];
                let residual = v.len() % 4 != 1;
                let mut c = rand_case(rng, m, h, dtype, layout, f);
                tie_rows(&mut c, rng, residual);
                let b = f.block_size();
                for blk in 0..h / b {
                    let ws = &mut c.w[blk * b..(blk + 1) * b];
                    let sgn = |rng: &mut StdRng| if rng.random_bool(0.5) { 1.0f32 } else { -1.0 };
                    match rng.random_range(0..3) {
                        // amax = 6·2^k: scale 2^k exactly, every y/scale an E2M1 value or tie.
                        0 => {
                            let k = 2f32.powi(rng.random_range(-3..=3));
                            for w in ws.iter_mut() {
                                *w = to_bits(dtype, sgn(rng) * pick(rng, &e2m1_ties) * k);
                            }
                            let at = rng.random_range(0..b);
                            ws[at] = to_bits(dtype, sgn(rng) * 6.0 * k);
                        }
                        // amax / 6 exactly halfway between two E4M3 values.
                        1 => {
                            let code = rng.random_range(0u8..0x7E);
                            let mid = 0.5 * (e4m3_decode(code) + e4m3_decode(code + 1));
                            for w in ws.iter_mut() {
                                *w = to_bits(dtype, sgn(rng) * rng.random_range(0.0f32..5.0) * mid);
                            }
                            ws[rng.random_range(0..b)] = to_bits(dtype, 6.0 * mid);
                        }
                        // amax / 6 a power of two or just above: UE8M0's round-up boundary.
                        _ => {
                            let k = 2f32.powi(rng.random_range(-6..=6));
                            let up = if rng.random_bool(0.5) {
                                1.0
                            } else {
                                1.0 + 2f32.powi(-7)
                            };
                            for w in ws.iter_mut() {
                                *w = to_bits(dtype, sgn(rng) * pick(rng, &e2m1_ties) * k);
                            }
                            ws[rng.random_range(0..b)] = to_bits(dtype, 6.0 * k * up);
                        }
                    }
                }
                c.gs = match gs_kind {
                    0 => Gs::Uniform(1.0),
                    1 => Gs::Uniform(4.0),
                    _ => Gs::PerRow(
                        (0..m)
                            .map(|_| 2f32.powi(rng.random_range(-3..=3)))
                            .collect(),
                    ),
                };
                if !residual {
                    c.residual = None;
                }
                c.y_out = v.len() % 2 == 0;
                v.push(c);
            }
        }
    }
    v
}

/// Rows for ties, with eps set to 0: all but every fourth row are ±c (c a power of two,
/// split between x and the residual when `residual`), so rstd = 1/c and y = ±w exactly;
/// every fourth row has x + r exactly halfway between two dtype values (an RNdt tie).
/// The case must have its residual.
fn tie_rows(c: &mut Case, rng: &mut StdRng, residual: bool) {
    c.set_eps(0.0);
    let (m, h, dtype) = (c.m, c.h, c.dtype);
    let precision = if dtype == DType::BF16 { 8 } else { 11 };
    let r = c.residual.as_mut().expect("random cases have a residual");
    for row in 0..m {
        let at = row * c.stride;
        if row % 4 == 3 {
            for i in at..at + h {
                let xv = crate::case::to_f32(dtype, c.x[i]);
                let e = xv.abs().log2().floor() as i32;
                let half_ulp =
                    2f32.powi(e - precision) * if rng.random_bool(0.5) { 1.0 } else { -1.0 };
                r[i] = to_bits(dtype, half_ulp * pick(rng, &[1.0, 3.0, 5.0]));
            }
            continue;
        }
        let cv = 2f32.powi(rng.random_range(-4..=4));
        // h = x + r = ±c exactly (without a residual, x = ±c).
        let a = if residual {
            pick(rng, &[0.25f32, 0.5, 0.75, 1.0])
        } else {
            1.0
        };
        for i in at..at + h {
            let sign = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
            c.x[i] = to_bits(dtype, sign * cv * a);
            r[i] = to_bits(dtype, sign * cv * (1.0 - a));
        }
    }
}

fn huge(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let (m, h) = (20, 128);
    let mut v = Vec::new();
    for f in Fp4Format::ALL {
        for dtype in DTYPES {
            for gs in [1.0f32, 1e30, f32::MAX, 1e-30, 1e-45] {
                let layout = ScaleLayout::ALL[v.len() % 3];
                let mut c = rand_case(rng, m, h, dtype, layout, f);
                huge_rows(&mut c, rng);
                if v.len() % 2 == 0 {
                    huge_weights(&mut c, rng);
                }
                c.gs = Gs::Uniform(gs);
                c.y_out = true;
                v.push(c);
            }
        }
    }
    v
}

/// Rows near the dtype's max, by row % 5: x near max (ss ≈ H·max², rstd tiny: an f32
/// subnormal for bf16), x and residual near max (the sum may overflow to ±Inf), both at
/// max (an Inf row), one max element in a zero row, untouched. The case must have its
/// residual.
fn huge_rows(c: &mut Case, rng: &mut StdRng) {
    let (m, h) = (c.m, c.h);
    let s = sp(c.dtype);
    let r = c.residual.as_mut().expect("random cases have a residual");
    for row in 0..m {
        let at = row * c.stride;
        for i in at..at + h {
            let near_max = (s.max - rng.random_range(0..8)) | (rng.random::<u16>() & 0x8000);
            match row % 5 {
                0 => c.x[i] = near_max,
                1 => {
                    c.x[i] = near_max;
                    r[i] = near_max;
                }
                2 => {
                    c.x[i] = s.max;
                    r[i] = s.max;
                }
                3 if i == at => {
                    c.x[at..at + h].fill(0);
                    r[at..at + h].fill(0);
                    c.x[at] = s.max;
                }
                _ => {}
            }
        }
    }
}

/// Weights near the dtype's max: y and y_out overflow the dtype.
fn huge_weights(c: &mut Case, rng: &mut StdRng) {
    let max = sp(c.dtype).max;
    for w in c.w.iter_mut() {
        *w = max - rng.random_range(0..64);
    }
}

/// SPEC.md §8's weight bias: w' = RN32(w + bias), the weight itself for a bias of ±0.
fn weight_bias(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let (m, h) = (7, 256);
    let mut v = Vec::new();
    for f in [Fp4Format::NVFP4, Fp4Format::MXFP4] {
        for dtype in DTYPES {
            for bias in WEIGHT_BIASES {
                let mut c = rand_case(rng, m, h, dtype, ScaleLayout::ALL[v.len() % 3], f);
                c.set_weight_bias(bias);
                bias_weights(&mut c);
                c.y_out = true;
                v.push(c);
            }
        }
    }
    v
}

/// Weight biases: Gemma's 1, -1, ±0 (the weight as it is), tiny, ordinary, near overflow.
const WEIGHT_BIASES: [f32; 7] = [1.0, -1.0, 0.0, -0.0, 1e-40, 0.3, 3e38];

/// Weights that meet the bias, every 7th from the first: -1 (w' = 0 for Gemma), ±0,
/// infinities, NaN. Needs H ≥ 29.
fn bias_weights(c: &mut Case) {
    let s = sp(c.dtype);
    for (i, w) in [to_bits(c.dtype, -1.0), 0x8000, 0, s.inf, s.nan]
        .into_iter()
        .enumerate()
    {
        c.w[i * 7] = w;
    }
}

fn eps(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let (m, h) = (9, 160);
    let mut v = Vec::new();
    for f in [Fp4Format::NVFP4, Fp4Format::MXFP4] {
        for dtype in DTYPES {
            for e in EPSILONS {
                let mut c = rand_case(rng, m, h, dtype, ScaleLayout::ALL[v.len() % 3], f);
                c.set_eps(e);
                zero_and_tiny_rows(&mut c);
                c.y_out = true;
                v.push(c);
            }
        }
    }
    v
}

/// Epsilons: 0, the smallest f32 subnormal, the usual, 1, huge, f32::MAX.
const EPSILONS: [f32; 6] = [0.0, 1e-45, 1e-6, 1.0, 1e30, f32::MAX];

/// Row 0 zero and row 1 of the smallest subnormal (the residual zero): rows where eps
/// decides rstd. Needs M ≥ 2 and the residual.
fn zero_and_tiny_rows(c: &mut Case) {
    let (h, st) = (c.h, c.stride);
    let r = c.residual.as_mut().expect("random cases have a residual");
    c.x[0..h].fill(0);
    r[0..h].fill(0);
    c.x[st..st + h].fill(1);
    r[st..st + h].fill(0);
}

fn global_scale(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let m = 37;
    let specials = [
        1.0f32,
        0.0,
        -0.0,
        -1.0,
        0.5,
        1e-30,
        1e-45,
        1e30,
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        2688.0,
        3.0,
    ];
    let mut v = Vec::new();
    for f in Fp4Format::ALL {
        for dtype in DTYPES {
            for kind in 0..5 {
                let h = f.block_size() * 6;
                let mut c = rand_case(rng, m, h, dtype, ScaleLayout::ALL[v.len() % 3], f);
                c.gs = match kind {
                    0 => Gs::PerRow((0..m).map(|i| specials[i % specials.len()]).collect()),
                    1 => Gs::Uniform(0.0),
                    2 => Gs::Uniform(f32::NAN),
                    3 => Gs::Uniform(f32::INFINITY),
                    _ => Gs::Uniform(rng.random_range(1e-3f32..1e3)),
                };
                c.y_out = v.len() % 2 == 0;
                v.push(c);
            }
        }
    }
    v
}

fn strided_rows(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let mut v = Vec::new();
    for pad in [1usize, 2, 7, 16, 64, 0] {
        for m in [1usize, 2, 7, 129] {
            let f = [Fp4Format::NVFP4, Fp4Format::MXFP4][v.len() % 2];
            let dtype = DTYPES[(v.len() / 2) % 2];
            let h = f.block_size() * rng.random_range(1..=12);
            let c = rand_case(rng, m, h, dtype, ScaleLayout::ALL[v.len() % 3], f);
            let pad = if pad == 0 { h } else { pad }; // 0 stands for stride 2H
            let mut c = with_stride(c, h + pad, rng);
            c.y_out = v.len() % 3 != 2;
            if v.len() % 5 == 4 {
                c.residual = None;
            }
            v.push(c);
        }
    }
    v
}

fn narrow_wide(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let mut v = Vec::new();
    for h in [16usize, 32, 48, 96, 16384, 32768] {
        for f in Fp4Format::ALL {
            if h % f.block_size() != 0 {
                continue;
            }
            for m in [1usize, 3, 130] {
                if h * m > 1 << 20 {
                    continue;
                }
                let dtype = DTYPES[v.len() % 2];
                let mut c = rand_case(rng, m, h, dtype, ScaleLayout::ALL[v.len() % 3], f);
                c.y_out = v.len() % 2 == 1;
                v.push(c);
            }
        }
    }
    v
}

fn random_cases(rng: &mut StdRng, n: usize) -> Vec<Case> {
    (0..n)
        .map(|_| {
            let f = pick(rng, &Fp4Format::ALL);
            let dtype = pick(rng, &DTYPES);
            let layout = pick(rng, &ScaleLayout::ALL);
            let m = match rng.random_range(0..10) {
                0 => 0,
                1..=3 => rng.random_range(1..8),
                4..=7 => rng.random_range(1..200),
                _ => rng.random_range(120..300),
            };
            let h = if rng.random_bool(0.1) {
                f.block_size() * rng.random_range(64..=512)
            } else {
                f.block_size() * rng.random_range(1..=64)
            };
            let m = if m * h > 1 << 20 { 3 } else { m };
            let mut c = Case::random(m, h, dtype, layout, opts(f), rng.random());
            fill_mixed(rng, dtype, &mut c.x, c.residual.as_mut());
            let any_eps = rng.random_range(0.0f32..1.0);
            c.set_eps(pick(rng, &[1e-6f32, 1e-5, 0.0, any_eps]));
            c.gs = match rng.random_range(0..4) {
                0 | 1 => Gs::Uniform(1.0),
                2 => Gs::Uniform(2f32.powf(rng.random_range(-20.0f32..20.0))),
                _ => per_row_gs(rng, m),
            };
            c.y_out = rng.random_bool(0.3);
            if rng.random_bool(0.2) {
                c.residual = None;
            }
            if rng.random_bool(0.15) {
                let pad = rng.random_range(1..40);
                c = with_stride(c, h + pad, rng);
            }
            c
        })
        .collect()
}

fn bad_input(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let mut v = Vec::new();
    for dtype in DTYPES {
        for layout in ScaleLayout::ALL {
            let base =
                |rng: &mut StdRng, f: Fp4Format, h: usize| rand_case(rng, 5, h, dtype, layout, f);
            let mut c = base(rng, Fp4Format::NVFP4, 24);
            c.note = "H not a multiple of 16".into();
            v.push(c);
            let mut c = base(rng, Fp4Format::MXFP4, 48);
            c.note = "H not a multiple of 32".into();
            v.push(c);
            let mut c = base(rng, Fp4Format::NVFP4, 0);
            c.note = "H = 0".into();
            v.push(c);
            for e in [-1e-6f32, f32::NAN, f32::INFINITY] {
                let mut c = base(rng, Fp4Format::MXFP4, 64);
                c.set_eps(e);
                c.note = "invalid eps".into();
                v.push(c);
            }
            for b in [f32::NAN, f32::NEG_INFINITY] {
                let mut c = base(rng, Fp4Format::NVFP4, 64);
                c.set_weight_bias(b);
                c.note = "invalid weight bias".into();
                v.push(c);
            }
            for len in [4usize, 6] {
                let mut c = base(rng, Fp4Format::NVFP4, 64);
                c.gs = Gs::PerRow(vec![1.0; len]);
                c.note = format!("{len} per-row global scales for 5 rows");
                v.push(c);
            }
            for len in [63usize, 80] {
                let mut c = base(rng, Fp4Format::NVFP4, 64);
                c.w.resize(len, 0x3F80);
                c.note = format!("weight of {len} for H = 64");
                v.push(c);
            }
            let mut c = base(rng, Fp4Format::NVFP4, 64);
            c.x.pop();
            c.note = "input buffer one element short".into();
            v.push(c);
            let mut c = base(rng, Fp4Format::MXFP4, 64);
            if let Some(r) = c.residual.as_mut() {
                r.pop();
            }
            c.note = "residual buffer one element short".into();
            v.push(c);
            let mut c = base(rng, Fp4Format::NVFP4, 64);
            c.stride = 48;
            c.note = "row stride smaller than H".into();
            v.push(c);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Prepared;

    /// The calls `verify` readies on a GPU before a batch runs (over made-up addresses,
    /// `made_up_call`) pass the validator exactly where the reference accepts the case:
    /// the kernels compiled ahead are those of every valid case, and a refused case is
    /// refused there too.
    #[cfg(feature = "cuda")]
    #[test]
    fn made_up_calls_validate_where_the_reference_accepts() {
        use crate::cuda_backend::{made_up_call, DeviceCall};
        let (mut valid, mut refused) = (0, 0);
        for (gi, g) in GROUPS.iter().enumerate() {
            let mut rng = StdRng::seed_from_u64(gi as u64 + 5);
            for case in (g.make)(&mut rng, 40) {
                let reference = run_on(&HostBackend::reference(), &case).0.is_ok();
                let made_up = match made_up_call(&case) {
                    Ok(DeviceCall::Fp4(c)) => c.validate().is_ok(),
                    Ok(DeviceCall::Fp8(c)) => c.validate().is_ok(),
                    Err(_) => false,
                };
                assert_eq!(made_up, reference, "{}: {}", g.name, case.describe());
                if reference {
                    valid += 1;
                } else {
                    refused += 1;
                }
            }
        }
        assert!(
            valid > 1000 && refused > 50,
            "{valid} valid, {refused} refused"
        );
    }

    /// The random groups made in batches are the cases made all at once (same seed, same
    /// cases), and only they are sized by --cases.
    #[test]
    fn random_groups_in_batches_are_the_same_cases() {
        for g in GROUPS.iter().filter(|g| g.sized_by_cases) {
            let n = 2 * 40 + 7;
            let whole = (g.make)(&mut StdRng::seed_from_u64(9), n);
            let mut rng = StdRng::seed_from_u64(9);
            let mut parts = Vec::new();
            for size in [40, 40, 7] {
                parts.extend((g.make)(&mut rng, size));
            }
            assert_eq!(whole.len(), n);
            assert_eq!(parts.len(), n);
            for (a, b) in whole.iter().zip(&parts) {
                assert_eq!(a.describe(), b.describe(), "{}", g.name);
                assert_eq!((&a.x, &a.residual, &a.w), (&b.x, &b.residual, &b.w));
            }
        }
        let sized: Vec<&str> = GROUPS
            .iter()
            .filter(|g| g.sized_by_cases)
            .map(|g| g.name)
            .collect();
        assert_eq!(sized, ["random", "fp8-random"]);
    }

    /// The `ties` rows (all but every fourth) have rstd = 1/c exactly, so y = ±w: the
    /// block scales and E2M1 codes then sit on the rounding boundaries by construction.
    #[test]
    fn ties_rows_give_y_equal_to_the_weights() {
        let mut rng = StdRng::seed_from_u64(3);
        for mut c in ties(&mut rng, 0) {
            c.y_out = true;
            let reference = HostBackend::reference();
            let mut p: Box<dyn Prepared + '_> = reference.prepare(&c).unwrap();
            p.run_once().unwrap();
            let y = p.outputs().unwrap().y_out.unwrap();
            for row in (0..c.m).filter(|r| r % 4 != 3) {
                for i in 0..c.h {
                    assert_eq!(
                        y[row * c.stride + i] & 0x7FFF,
                        c.w[i] & 0x7FFF,
                        "{} row {row} col {i}",
                        c.describe()
                    );
                }
            }
        }
    }

    /// Each FP8 bad input is rejected for the reason its note gives, not another one.
    #[test]
    fn fp8_bad_inputs_are_rejected_for_their_own_reason() {
        let mut rng = StdRng::seed_from_u64(9);
        let reference = HostBackend::reference();
        for c in fp8::bad_input(&mut rng, 0) {
            let mut p = reference.prepare(&c).unwrap();
            let e = p.run_once().unwrap_err().to_string();
            let note = c.note.as_str();
            let says = [
                ("H = 0", "hidden size H is 0"),
                ("H not a multiple of", "is not a multiple of the group size"),
                ("swizzled", "swizzled 128x4 scale layout is MXFP8's"),
                ("invalid s_min", "s_min ="),
                ("invalid eps", "eps"),
                ("invalid weight bias", "weight_bias ="),
                ("weight of", "weight"),
                // The host API sees slices: a short one is a matrix too small for its shape.
                ("input buffer", "need 320 elements but the buffer has 319"),
                (
                    "residual buffer",
                    "need 320 elements but the buffer has 319",
                ),
                ("row stride", "stride"),
            ]
            .iter()
            .find(|(n, _)| note.starts_with(n))
            .unwrap_or_else(|| panic!("no reason listed for {note:?}"))
            .1;
            assert!(e.contains(says), "{}: {e}", c.describe());
        }
    }

    /// The FP8 `ties` rows put `y / scale` exactly on FP8 midpoints: every scale is a power
    /// of two, and each case has many ties of the element rounding.
    #[test]
    fn fp8_ties_rows_land_on_fp8_midpoints() {
        use fp4norm::fp8::{Fp8Problem, Fp8ScaleFormat, Fp8Scaling};
        let mut rng = StdRng::seed_from_u64(5);
        for mut c in fp8::ties(&mut rng, 0) {
            c.y_out = true;
            let opts = *c.fp8().unwrap();
            let p = Fp8Problem::new(c.m, c.h, c.dtype, &opts).unwrap();
            let reference = HostBackend::reference();
            let mut run = reference.prepare(&c).unwrap();
            run.run_once().unwrap();
            let out = run.outputs().unwrap();
            let (y, sf) = (out.y_out.unwrap(), out.fp8_scales.unwrap_or_default());
            let e = opts.element;
            let finite: Vec<f32> = (0u8..0x7F)
                .map(|k| e.decode(k))
                .filter(|v| v.is_finite())
                .collect();
            let (mut ties, mut all) = (0, 0);
            for row in (0..c.m).filter(|r| r % 4 != 3) {
                for i in 0..c.h {
                    let g = i / p.group().unwrap_or(c.h);
                    let at = p.scale_index(row, g);
                    let scale = match opts.scaling {
                        Fp8Scaling::PerTensor(s) => s,
                        Fp8Scaling::Dynamic {
                            format: Fp8ScaleFormat::UE8M0,
                            ..
                        } => 2f32.powi(sf[at] as i32 - 127),
                        _ => f32::from_le_bytes(sf[4 * at..4 * at + 4].try_into().unwrap()),
                    };
                    assert_eq!(scale, 2f32.powi(scale.log2() as i32), "{}", c.describe());
                    let t = crate::case::to_f32(c.dtype, y[row * c.stride + i]).abs() / scale;
                    all += 1;
                    ties += finite.windows(2).any(|w| t == 0.5 * (w[0] + w[1])) as usize;
                }
            }
            assert!(ties * 2 > all, "{}: {ties} ties of {all}", c.describe());
        }
    }

    #[test]
    fn every_group_builds_and_the_reference_accepts_exactly_the_valid_cases() {
        for (gi, g) in GROUPS.iter().enumerate() {
            let mut rng = StdRng::seed_from_u64(gi as u64);
            for c in (g.make)(&mut rng, 20) {
                let reference = HostBackend::reference();
                let mut p = reference.prepare(&c).unwrap();
                assert_eq!(
                    p.run_once().is_err(),
                    g.expect_error,
                    "{}: {}",
                    g.name,
                    c.describe()
                );
            }
        }
    }
}
