//! The `fp4norm` binary end to end on the CPU: `bench` and `verify` over FP4 and FP8
//! formats (rows, checks, bytes moved, JSON, exit statuses) and the messages of bad
//! command lines. GPU runs are the same code with `--device cuda`.

use std::process::{Command, Output};

use fp4norm::fp8::{Fp8Element, Fp8Group, Fp8Options, Fp8Problem, Fp8ScaleFormat, Fp8ScaleLayout};
use fp4norm::{DType, Options, Problem, ScaleLayout};
use serde_json::Value;

fn fp4norm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fp4norm"))
        .args(args)
        .output()
        .expect("running fp4norm")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A short CPU bench of these formats and shapes, JSON on stdout; the parsed report.
fn bench_json(extra: &[&str]) -> (Value, String) {
    let mut args = vec![
        "bench",
        "--device",
        "cpu",
        "--reps",
        "2",
        "--warmup",
        "0",
        "--copy-mib",
        "4",
        "--json",
        "-",
    ];
    args.extend_from_slice(extra);
    let out = fp4norm(&args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    (report, err)
}

#[test]
fn bench_measures_fp4_and_fp8_rows_against_one_copy_and_checks_every_row() {
    let formats = "nvfp4,fp8-token,mxfp8,fp8-group128-e5m2,fp8-tensor,fp8-g64-ue8m0-row-major";
    let (report, table) = bench_json(&["--m", "1,130", "--h", "256", "--format", formats]);
    assert_eq!(report["device"], "cpu");
    assert_eq!(report["all_ok"], true);
    let copy = report["copy"]["gb_per_s"].as_f64().unwrap();
    let rows = report["rows"].as_array().unwrap();
    let names: Vec<&str> = formats.split(',').collect();
    assert_eq!(rows.len(), 2 * names.len());
    // (layout, op, element, group, scale format) per format, as the JSON names them.
    let expect = [
        ("swizzled", "fp4", "e2m1", Some(16), "e4m3"),
        ("row-major", "fp8", "e4m3", Some(256), "f32"),
        ("swizzled", "fp8", "e4m3", Some(32), "ue8m0"),
        ("column-major", "fp8", "e5m2", Some(128), "f32"),
        ("none", "fp8", "e4m3", None, "static"),
        ("row-major", "fp8", "e4m3", Some(64), "ue8m0"),
    ];
    let d = |g, f, l| Fp8Options::dynamic(Fp8Element::E4M3, g, f, l);
    let fp8 = [
        None,
        Some(Fp8Options::per_token(Fp8Element::E4M3)),
        Some(Fp8Options::mxfp8()),
        Some(Fp8Options::dynamic(
            Fp8Element::E5M2,
            Fp8Group::G128,
            Fp8ScaleFormat::F32_NO_FLOOR,
            Fp8ScaleLayout::ColumnMajor,
        )),
        Some(Fp8Options::per_tensor(Fp8Element::E4M3, 1.0)),
        Some(d(
            Fp8Group::G64,
            Fp8ScaleFormat::UE8M0,
            Fp8ScaleLayout::RowMajor,
        )),
    ];
    for (i, r) in rows.iter().enumerate() {
        let k = i % names.len();
        let m = if i < names.len() { 1 } else { 130 };
        let (layout, op, element, group, sf) = expect[k];
        assert_eq!(r["m"], m);
        assert_eq!(r["h"], 256);
        assert_eq!(r["format"], names[k]);
        assert_eq!(r["layout"], layout, "{r}");
        assert_eq!(r["op"], op);
        assert_eq!(r["element"], element);
        assert_eq!(r["group"].as_u64(), group);
        assert_eq!(r["scale_format"], sf);
        assert_eq!(r["check"], "ok", "{r}");
        assert_eq!(r["rows_checked"], m);
        // SPEC.md §6 bytes: FP8 elements one byte each, f32 scales four, with padding.
        let bytes = match fp8[k] {
            None => Problem::new(
                m,
                256,
                DType::BF16,
                ScaleLayout::Swizzled,
                &Options::nvfp4(),
            )
            .unwrap()
            .bytes_moved(),
            Some(o) => Fp8Problem::new(m, 256, DType::BF16, &o)
                .unwrap()
                .bytes_moved(),
        };
        assert_eq!(r["bytes_moved"].as_u64(), Some(bytes), "{r}");
        let (gb, vs) = (
            r["gb_per_s"].as_f64().unwrap(),
            r["vs_copy"].as_f64().unwrap(),
        );
        assert!((vs - gb / copy).abs() <= 1e-9 * vs.abs().max(1.0), "{r}");
    }
    // Column-major scales of 130 rows pad to 132: 2 groups x 132 x 4 bytes.
    let cm = &rows[names.len() + 3];
    let mh = 130 * 256;
    assert_eq!(
        cm["bytes_moved"].as_u64(),
        Some((mh * 3 * 2 + 256 * 2 + mh + 2 * 132 * 4) as u64)
    );
    // With --json -, the table goes to stderr: one table for every format.
    for name in names {
        assert!(
            table.contains(&format!(" {name} ")),
            "{name} missing:\n{table}"
        );
    }
    assert!(table.contains("12 rows in"), "{table}");
    assert!(table.contains("all match the reference"), "{table}");
    assert!(table.contains("FP4 / FP8 quantisation"), "{table}");
}

#[test]
fn bench_fp8_without_residual_with_y_out_and_several_dtypes() {
    let out = fp4norm(&[
        "bench",
        "--device",
        "cpu",
        "--m",
        "5",
        "--h",
        "96",
        "--format",
        "fp8-tensor-e5m2,fp8-group32",
        "--dtype",
        "bf16,f16",
        "--no-residual",
        "--y-out",
        "--weight-bias",
        "1",
        "--fp8-scale",
        "0.25",
        "--fp8-scale-floor",
        "4.3597e-6",
        "--reps",
        "2",
        "--copy-mib",
        "4",
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("no residual + RMSNorm + FP8 quantisation"),
        "{stdout}"
    );
    assert!(stdout.contains("FP8 per-tensor scale 0.25"), "{stdout}");
    assert!(stdout.contains("FP8 f32 scale floor 4.3597e-6"), "{stdout}");
    assert!(!stdout.contains("FP4 global scale"), "{stdout}");
    for (format, dtype, layout) in [
        ("fp8-tensor-e5m2", "bf16", "none"),
        ("fp8-group32", "bf16", "column-major"),
        ("fp8-tensor-e5m2", "f16", "none"),
        ("fp8-group32", "f16", "column-major"),
    ] {
        let line = stdout
            .lines()
            .find(|l| l.contains(format) && l.contains(dtype))
            .unwrap_or_else(|| panic!("no {format} {dtype} row:\n{stdout}"));
        assert!(line.contains(layout) && line.ends_with("ok"), "{line}");
    }
    assert!(stdout.contains("4 rows in"), "{stdout}");
    assert!(stderr.contains("fp8-tensor-e5m2/bf16"), "{stderr}");
}

#[test]
fn bench_without_check_says_so() {
    let out = fp4norm(&[
        "bench",
        "--device",
        "cpu",
        "--m",
        "3",
        "--h",
        "64",
        "--format",
        "mxfp8",
        "--no-check",
        "--reps",
        "1",
        "--copy-mib",
        "1",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("not checked (--no-check)"), "{stdout}");
}

/// Bad FP8 command lines: exit status 2, a message that says what is wrong and what to do,
/// and no table.
#[test]
fn bad_fp8_arguments_are_usage_errors_with_clear_messages() {
    for (args, says) in [
        (
            &["--format", "mxfp8", "--h", "48"][..],
            "--h 48 does not fit format mxfp8: hidden size H = 48 is not a multiple of the group size 32",
        ),
        (
            &["--format", "nvfp4,fp8-group128", "--h", "4096,4160"],
            "--h 4160 does not fit format fp8-group128",
        ),
        (
            &["--format", "fp8-g32-f32-swizzled"],
            "the swizzled 128x4 scale layout is MXFP8's and needs ue8m0 scales in groups of 32",
        ),
        (
            &["--format", "fp8-g64-ue8m0-swizzled"],
            "needs ue8m0 scales in groups of 32",
        ),
        (
            &["--format", "fp8-token-ue8m0-swizzled", "--h", "64"],
            "needs UE8M0 scales in groups of 32 (got ue8m0 scales in groups of 64)",
        ),
        (&["--format", "fp8-token-e6m1"], "unknown FP8 format \"fp8-token-e6m1\""),
        (&["--format", "fp8-g48-f32-row-major"], "unknown group \"g48\""),
        (&["--format", "fp9"], "fp8-tensor, fp8-token"),
        (
            &["--format", "fp8-token", "--fp8-scale-floor", "-1"],
            "--fp8-scale-floor -1: the floor must be finite and >= 0",
        ),
        (
            &["--format", "fp8-tensor", "--fp8-scale", "inf"],
            "--fp8-scale inf: the per-tensor scale must be finite",
        ),
    ] {
        let mut all = vec!["bench", "--device", "cpu"];
        all.extend_from_slice(args);
        let out = fp4norm(&all);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// The FP8 verify groups pass on the CPU (the full set runs in `verify`'s own tests through
/// the reference; these are the cheapest groups through the binary, and the random one).
#[test]
fn verify_runs_the_fp8_groups_on_the_cpu() {
    for (group, cases) in [
        ("fp8-ties", "32"),
        ("fp8-static-scale", "64"),
        ("fp8-bad-input", "42"),
        ("fp8-random", "12"),
    ] {
        let out = fp4norm(&["verify", "--group", group, "--cases", "12", "--seed", "7"]);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{stdout}");
        let line = stdout
            .lines()
            .find(|l| l.starts_with(group))
            .unwrap_or_else(|| panic!("no {group} line:\n{stdout}"));
        let cols: Vec<&str> = line.split_whitespace().collect();
        // group, cases, passed, failed, skipped: on the CPU every case runs.
        assert_eq!(&cols[1..5], &[cases, cases, "0", "0"], "{line}");
        assert!(
            stdout
                .trim_end()
                .ends_with(&format!("{cases} passed, 0 failed")),
            "{stdout}"
        );
    }
}

/// A --group that matches no group is a bad command line (exit status 2) that lists the
/// groups, before any work.
#[test]
fn verify_with_an_unknown_group_is_a_usage_error() {
    for group in ["fp8-nothing", "nosuchgroup"] {
        let out = fp4norm(&["verify", "--group", group]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!("invalid value '{group}' for '--group <TEXT>'"))
                && stderr.contains("formats-layouts, odd-m,")
                && stderr.contains("fp8-scalings"),
            "{stderr}"
        );
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn info_lists_the_fp8_formats() {
    let out = fp4norm(&["info"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    for name in ["fp8-tensor", "fp8-token", "fp8-group128", "mxfp8", "-e5m2"] {
        assert!(stdout.contains(name), "{name}:\n{stdout}");
    }
}

/// Sizes past what any machine holds: a usage error (exit status 2, before any work) where
/// a byte count overflows, an error (exit status 1) where the memory cannot be had; never a
/// panic or an abort.
#[test]
fn oversized_shapes_and_copy_buffers_are_errors_not_crashes() {
    for (args, code, says) in [
        (
            &["--m", "1", "--h", "64", "--copy-mib", "17592186044416"][..],
            2,
            "--copy-mib 17592186044416: more bytes than this machine can address",
        ),
        (
            &[
                "--m",
                "1",
                "--h",
                "64",
                "--copy-mib",
                "18446744073709551615",
            ],
            2,
            "--copy-mib 18446744073709551615",
        ),
        (
            &["--m", "4294967296", "--h", "4294967296"],
            2,
            "--m 4294967296 x --h 4294967296 (format nvfp4): tensor sizes overflow",
        ),
        // The default M list (up to 16384 rows) times H = 2^60.
        (&["--h", "1152921504606846976"], 2, "tensor sizes overflow"),
        (
            &["--m", "1", "--h", "64", "--copy-mib", "1099511627776"],
            1,
            "cannot allocate 1152921504606846976 bytes for the copy baseline",
        ),
        (
            &["--m", "1099511627776", "--h", "1048576", "--copy-mib", "1"],
            1,
            "cannot allocate",
        ),
        (
            &["--m", "1", "--h", "1152921504606846976", "--copy-mib", "1"],
            1,
            "cannot allocate",
        ),
    ] {
        let mut all = vec!["bench", "--device", "cpu", "--format", "nvfp4"];
        all.extend_from_slice(args);
        let out = fp4norm(&all);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        if code == 2 {
            assert!(!stderr.contains("copy baseline ("), "{args:?}: {stderr}");
        }
    }
}

/// `fp4norm` with `env` set (and FP4NORM_REQUIRE_GPU unset unless `env` sets it).
fn fp4norm_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fp4norm"));
    c.args(args).env_remove("FP4NORM_REQUIRE_GPU");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("running fp4norm")
}

/// Where CUDA cannot be opened (here: an ordinal no machine has), `--device auto` says why
/// on stderr and runs on the CPU, FP4NORM_REQUIRE_GPU=1 makes that a failure, and
/// `verify --device cuda` fails with the reason; `--device cpu` never opens CUDA.
#[test]
fn without_cuda_auto_says_why_and_a_required_gpu_fails() {
    let no_gpu = ("FP4NORM_DEVICE", "4095");
    let verify = ["verify", "--group", "fp8-ties", "--cases", "1"];
    let bench = [
        "bench",
        "--m",
        "1",
        "--h",
        "64",
        "--format",
        "nvfp4",
        "--reps",
        "1",
        "--copy-mib",
        "1",
    ];
    for args in [&verify[..], &bench[..]] {
        let out = fp4norm_env(args, &[no_gpu]);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stdout}{stderr}");
        let why = stderr
            .lines()
            .find(|l| l.starts_with("cuda: not used: "))
            .unwrap_or_else(|| panic!("{args:?}: no reason on stderr:\n{stderr}"));
        assert!(why.len() > "cuda: not used: ".len(), "{why}");
        assert!(!stdout.contains("cuda"), "{args:?}: {stdout}");
        for require in ["1", "yes"] {
            let out = fp4norm_env(args, &[no_gpu, ("FP4NORM_REQUIRE_GPU", require)]);
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
            assert!(
                stderr.contains("error: FP4NORM_REQUIRE_GPU is set but CUDA cannot be used: "),
                "{args:?}: {stderr}"
            );
            assert!(out.stdout.is_empty(), "{args:?}");
        }
        let out = fp4norm_env(args, &[no_gpu, ("FP4NORM_REQUIRE_GPU", "0")]);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
    }
    // verify --device cuda: the reason, exit status 1, nothing checked.
    let out = fp4norm_env(&["verify", "--device", "cuda"], &[no_gpu]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: ") && stderr.len() > 10,
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
    // verify --device cpu: the CPU alone, no word about CUDA, whatever is required.
    let out = fp4norm_env(
        &["verify", "--device", "cpu", "--group", "fp8-ties"],
        &[no_gpu, ("FP4NORM_REQUIRE_GPU", "1")],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("| backends: cpu ("), "{stdout}");
    assert!(!stderr.contains("cuda"), "{stderr}");
}

/// Negative and non-finite numbers reach the options' own checks (a value starting with
/// '-' is not taken for an option): every one a usage error that says what is wanted.
#[test]
fn negative_and_non_finite_numbers_get_the_options_own_messages() {
    for (args, says) in [
        (
            &["bench", "--global-scale", "nan"][..],
            "--global-scale NaN: the global scale must be finite",
        ),
        (
            &["bench", "--global-scale", "-inf"],
            "--global-scale -inf: the global scale must be finite",
        ),
        (
            &["bench", "--format", "fp8-tensor", "--fp8-scale", "-inf"],
            "--fp8-scale -inf: the per-tensor scale must be finite",
        ),
        (
            &["bench", "--eps", "-1e-3"],
            "--eps -0.001: eps must be finite and >= 0",
        ),
        (
            &[
                "bench",
                "--format",
                "fp8-token",
                "--fp8-scale-floor",
                "-4.3597e-6",
            ],
            "--fp8-scale-floor -0.0000043597: the floor must be finite and >= 0",
        ),
        (
            &["bench", "--m", "-1"],
            "invalid value '-1' for '--m <M,..>...': M must be a positive integer",
        ),
        (
            &["bench", "--m", "1,-16"],
            "invalid value '-16' for '--m <M,..>...': M must be a positive integer",
        ),
        (
            &["bench", "--h", "-64"],
            "invalid value '-64' for '--h <H,..>...': H must be a positive integer",
        ),
        (
            &["bench", "--reps", "-1"],
            "invalid value '-1' for '--reps <N>': must be a positive integer",
        ),
        (
            &["bench", "--copy-mib", "-1"],
            "invalid value '-1' for '--copy-mib <MIB>': must be a positive integer",
        ),
        (
            &["bench", "--warmup", "-1"],
            "invalid value '-1' for '--warmup <N>': must be an integer >= 0",
        ),
        (
            &["bench", "--seed", "-1"],
            "invalid value '-1' for '--seed <SEED>': must be an integer >= 0",
        ),
        (
            &["verify", "--cases", "-1"],
            "invalid value '-1' for '--cases <N>': must be an integer >= 0",
        ),
        (
            &["verify", "--seed", "-7"],
            "invalid value '-7' for '--seed <SEED>': must be an integer >= 0",
        ),
        (
            &["tune", "--h", "-4096"],
            "invalid value '-4096' for '--h <H,..>...': H must be a positive integer",
        ),
        (
            &["tune", "--device", "-1"],
            "invalid value '-1' for '--device <N>': must be an integer >= 0",
        ),
        (
            &["bench", "--m", "99999999999999999999999"],
            "M must be a positive integer of at most 18446744073709551615",
        ),
    ] {
        let out = fp4norm(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // Negative finite global scales and weight biases are values the contract defines.
    let out = fp4norm(&[
        "bench",
        "--device",
        "cpu",
        "--m",
        "3",
        "--h",
        "64",
        "--format",
        "nvfp4",
        "--global-scale",
        "-2.5e-1",
        "--weight-bias",
        "-1",
        "--reps",
        "1",
        "--copy-mib",
        "1",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("FP4 global scale -0.25"), "{stdout}");
    assert!(stdout.contains("all match the reference"), "{stdout}");
}

/// Usage errors found after parsing name the binary in their usage line, as clap's own do.
#[test]
fn usage_errors_of_the_checks_name_the_binary() {
    for (args, usage) in [
        (&["bench", "--m", "0"][..], "Usage: fp4norm bench [OPTIONS]"),
        (
            &["bench", "--global-scale", "nan"],
            "Usage: fp4norm bench [OPTIONS]",
        ),
        (&["tune", "--h", "100"], "Usage: fp4norm tune [OPTIONS]"),
    ] {
        let out = fp4norm(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.lines().any(|l| l == usage), "{args:?}: {stderr}");
    }
}

/// Programmatic dependent launch is a CUDA launch feature: `--pdl` on the CPU is a bad
/// command line, and where `auto` runs on the CPU the run says it was not measured, once.
#[test]
fn pdl_is_for_cuda_only() {
    let out = fp4norm(&["bench", "--device", "cpu", "--pdl"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--pdl: programmatic dependent launch is a CUDA launch feature"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
    let out = fp4norm_env(
        &[
            "bench",
            "--pdl",
            "--m",
            "1,16",
            "--h",
            "64,128",
            "--format",
            "nvfp4",
            "--reps",
            "1",
            "--copy-mib",
            "1",
        ],
        &[("FP4NORM_DEVICE", "4095")],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert_eq!(
        stdout
            .matches("programmatic dependent launch: not measured")
            .count(),
        1,
        "{stdout}"
    );
    assert!(!stdout.contains("no PDL"), "{stdout}");
}

/// FP4NORM_DEVICE that is not a device ordinal is an error naming the variable and its
/// value wherever CUDA would be opened, not device 0; the CPU alone does not read it.
#[test]
fn a_bad_fp4norm_device_is_an_error() {
    for args in [
        &["verify", "--group", "fp8-ties"][..],
        &["verify", "--device", "cuda"],
        &[
            "bench",
            "--m",
            "1",
            "--h",
            "64",
            "--reps",
            "1",
            "--copy-mib",
            "1",
        ],
        &["tune", "--quick", "--dry-run"],
    ] {
        if args[0] == "tune" && !cfg!(feature = "cuda") {
            continue; // tune is CUDA's alone
        }
        for value in ["abc", "-1", "1.5"] {
            let out = fp4norm_env(args, &[("FP4NORM_DEVICE", value)]);
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?} {value}: {stderr}");
            assert!(
                stderr.contains(&format!(
                    "error: FP4NORM_DEVICE={value:?} is not a CUDA device ordinal"
                )),
                "{args:?} {value}: {stderr}"
            );
        }
    }
    let out = fp4norm_env(
        &["verify", "--device", "cpu", "--group", "fp8-ties"],
        &[("FP4NORM_DEVICE", "abc")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // `tune --device N` overrides the variable.
    let out = fp4norm_env(
        &["tune", "--quick", "--dry-run", "--device", "4095"],
        &[("FP4NORM_DEVICE", "abc")],
    );
    assert!(
        !text(&out.stderr).contains("FP4NORM_DEVICE"),
        "{}",
        text(&out.stderr)
    );
}

/// A huge --cases is a long run, not a crash: the random groups are made a batch at a
/// time (their memory bounded by the batch), not all up front.
#[test]
fn verify_with_a_huge_case_count_runs_instead_of_crashing() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fp4norm"))
        .args([
            "verify",
            "--device",
            "cpu",
            "--group",
            "fp8-random",
            "--cases",
            "18446744073709551615",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running fp4norm");
    std::thread::sleep(std::time::Duration::from_secs(3));
    let status = child.try_wait().expect("waiting for fp4norm");
    if status.is_none() {
        child.kill().expect("stopping fp4norm");
    }
    let out = child.wait_with_output().expect("fp4norm's output");
    assert!(
        status.is_none(),
        "exited with {status:?}: {}",
        text(&out.stderr)
    );
}

#[test]
fn the_cpu_backend_names_its_row_kernels() {
    for isa in ["portable", "avx2"] {
        let out = fp4norm_env(
            &[
                "verify", "--device", "cpu", "--group", "random", "--cases", "2",
            ],
            &[("FP4NORM_CPU_ISA", isa)],
        );
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
        let header = stdout.lines().next().unwrap_or_default();
        // AVX2 where the CPU has it; a capped process never reports a wider path.
        let ran = if isa == "avx2" && !header.contains("avx2 row kernels") {
            "portable"
        } else {
            isa
        };
        assert!(header.contains(&format!("{ran} row kernels")), "{header}");
    }
}
