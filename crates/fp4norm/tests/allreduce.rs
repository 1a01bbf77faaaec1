//! SPEC.md §9 (tensor parallel): the host reference of the all-reduce fused in front of the
//! op. Golden vectors worked out by hand show the order and the rounding the contract fixes;
//! the fused reference equals the op on the hand-computed sum; bad inputs write nothing.

use fp4norm::reference::{
    allreduce_add_rmsnorm_fp4quant, allreduce_rmsnorm_fp4quant, allreduce_sum,
};
use fp4norm::{
    bf16, f16, reference, Error, Fp4Out, GlobalScale, MatMut, MatRef, Options, Problem,
    ScaleLayout, ScaleOut,
};

fn b(v: f32) -> bf16 {
    bf16::from_f32(v)
}

fn mats(ranks: &[Vec<bf16>], m: usize, h: usize) -> Vec<MatRef<'_, bf16>> {
    ranks
        .iter()
        .map(|r| MatRef::new(r, m, h).unwrap())
        .collect()
}

#[test]
fn sum_is_in_rank_order_with_one_f32_rounding_per_addition() {
    let tiny = 2f32.powi(-24);
    // (1 + 2^-24) rounds to 1 in f32 (a tie, to even), then + (-1) = 0.
    let ranks = vec![vec![b(1.0)], vec![b(tiny)], vec![b(-1.0)]];
    assert_eq!(
        allreduce_sum(&mats(&ranks, 1, 1)).unwrap()[0].to_bits(),
        0x0000
    );
    // Another order: 2^-24 + (-1) = -(1 - 2^-24) is exact in f32, then + 1 = 2^-24 (bf16 0x3380).
    let ranks = vec![vec![b(tiny)], vec![b(-1.0)], vec![b(1.0)]];
    assert_eq!(
        allreduce_sum(&mats(&ranks, 1, 1)).unwrap()[0].to_bits(),
        0x3380
    );
}

#[test]
fn sum_is_rounded_to_the_dtype_once_at_the_end() {
    // 1 + 2^-8 + 2^-8 = 1.0078125 exactly in f32, which bf16 holds (0x3F81). Rounding to bf16
    // after each addition would give 1 (the tie 1 + 2^-8 goes to the even 1.0): 0x3F80.
    let e = 2f32.powi(-8);
    let ranks = vec![vec![b(1.0)], vec![b(e)], vec![b(e)]];
    assert_eq!(
        allreduce_sum(&mats(&ranks, 1, 1)).unwrap()[0].to_bits(),
        0x3F81
    );
    // f16: 2048 + 1 + 1 = 2050 exactly (f16 spacing at 2048 is 2; 2049 would tie to 2048).
    let ranks: Vec<Vec<f16>> = [2048.0f32, 1.0, 1.0]
        .iter()
        .map(|&v| vec![f16::from_f32(v)])
        .collect();
    let m: Vec<MatRef<'_, f16>> = ranks
        .iter()
        .map(|r| MatRef::new(r, 1, 1).unwrap())
        .collect();
    assert_eq!(allreduce_sum(&m).unwrap()[0].to_f32(), 2050.0);
}

fn random_rank(seed: u64, n: usize) -> Vec<bf16> {
    // A small LCG: values of both signs and several magnitudes.
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5;
            b(u * 8.0 * 2f32.powi(((s >> 20) % 7) as i32 - 3))
        })
        .collect()
}

#[test]
fn fused_reference_is_the_op_on_the_sum_for_two_to_eight_ranks() {
    let (m, h) = (5, 64);
    let opts = Options::nvfp4();
    let p = Problem::new(m, h, fp4norm::DType::BF16, ScaleLayout::Both, &opts).unwrap();
    for w in 1..=8 {
        let ranks: Vec<Vec<bf16>> = (0..w).map(|k| random_rank(100 + k as u64, m * h)).collect();
        // The sum by hand: f32 left fold in rank order, then RNdt (half rounds to nearest even).
        let sum: Vec<bf16> = (0..m * h)
            .map(|i| {
                let mut acc = ranks[0][i].to_f32();
                for r in &ranks[1..] {
                    acc += r[i].to_f32();
                }
                b(acc)
            })
            .collect();
        assert_eq!(allreduce_sum(&mats(&ranks, m, h)).unwrap(), sum, "W = {w}");
        let weight = random_rank(7, h);
        let r0 = random_rank(9, m * h);
        let run = |fused: bool| {
            let mut r = r0.clone();
            let mut q = vec![0u8; p.fp4_len()];
            let mut rm = vec![0u8; p.row_major_scales_len()];
            let mut sw = vec![0u8; p.swizzled_scales_len()];
            let out = Fp4Out {
                y_fp4: &mut q,
                scales: ScaleOut::Both {
                    row_major: &mut rm,
                    swizzled: &mut sw,
                },
                y_out: None,
            };
            let res = MatMut::new(&mut r, m, h).unwrap();
            if fused {
                allreduce_add_rmsnorm_fp4quant(
                    &mats(&ranks, m, h),
                    res,
                    &weight,
                    out,
                    GlobalScale::Uniform(1.5),
                    &opts,
                )
            } else {
                reference::add_rmsnorm_fp4quant(
                    MatRef::new(&sum, m, h).unwrap(),
                    res,
                    &weight,
                    out,
                    GlobalScale::Uniform(1.5),
                    &opts,
                )
            }
            .unwrap();
            (r, q, rm, sw)
        };
        assert_eq!(run(true), run(false), "W = {w}");
        // Without a residual too.
        let mut q = vec![0u8; p.fp4_len()];
        let mut rm = vec![0u8; p.row_major_scales_len()];
        allreduce_rmsnorm_fp4quant(
            &mats(&ranks, m, h),
            &weight,
            Fp4Out {
                y_fp4: &mut q,
                scales: ScaleOut::RowMajor(&mut rm),
                y_out: None,
            },
            GlobalScale::Uniform(1.5),
            &opts,
        )
        .unwrap();
        let mut q2 = vec![0u8; p.fp4_len()];
        let mut rm2 = vec![0u8; p.row_major_scales_len()];
        reference::rmsnorm_fp4quant(
            MatRef::new(&sum, m, h).unwrap(),
            &weight,
            Fp4Out {
                y_fp4: &mut q2,
                scales: ScaleOut::RowMajor(&mut rm2),
                y_out: None,
            },
            GlobalScale::Uniform(1.5),
            &opts,
        )
        .unwrap();
        assert_eq!((q, rm), (q2, rm2), "W = {w}, no residual");
    }
}

#[test]
fn bad_inputs_are_refused_before_anything_is_written() {
    let (m, h) = (2, 32);
    let opts = Options::nvfp4();
    let weight = vec![b(1.0); h];
    let r0 = vec![b(0.5); m * h];
    let mut r = r0.clone();
    let mut q = vec![0xAAu8; m * h / 2];
    let mut sf = vec![0xAAu8; m * h / 16];
    let mut call = |inputs: &[MatRef<'_, bf16>], w: &[bf16]| {
        allreduce_add_rmsnorm_fp4quant(
            inputs,
            MatMut::new(&mut r, m, h).unwrap(),
            w,
            Fp4Out {
                y_fp4: &mut q,
                scales: ScaleOut::RowMajor(&mut sf),
                y_out: None,
            },
            GlobalScale::Uniform(1.0),
            &opts,
        )
    };
    assert!(matches!(call(&[], &weight), Err(Error::NoRankInputs)));
    let a = vec![b(1.0); m * h];
    let c = vec![b(1.0); (m + 1) * h];
    let ranks = [
        MatRef::new(&a, m, h).unwrap(),
        MatRef::new(&c, m + 1, h).unwrap(),
    ];
    let e = call(&ranks, &weight).unwrap_err();
    assert!(
        matches!(
            e,
            Error::RankShapeMismatch {
                rank: 1,
                got_rows: 3,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("rank 1"), "{e}");
    let ranks = [
        MatRef::new(&a, m, h).unwrap(),
        MatRef::new(&a, m, h).unwrap(),
    ];
    assert!(matches!(
        call(&ranks, &weight[..16]),
        Err(Error::WeightLength { .. })
    ));
    assert_eq!(r, r0);
    assert!(q.iter().chain(&sf).all(|&v| v == 0xAA));
}

/// The FP8 op behind the all-reduce (SPEC.md §9 then §8): the op on the hand-computed
/// sum, for every kind of FP8 scaling and 1 to 8 ranks; a rank count the reference refuses
/// (none) writes nothing.
#[test]
fn fused_fp8_reference_is_the_op_on_the_sum() {
    use fp4norm::fp8::{
        self, Fp8Element, Fp8Group, Fp8Options, Fp8Out, Fp8Problem, Fp8ScaleFormat, Fp8ScaleLayout,
        Fp8Scales,
    };
    // The scale outputs of problem `p` in the buffer of its scale format.
    fn scales_of<'a>(p: &Fp8Problem, s32: &'a mut [f32], s8: &'a mut [u8]) -> Fp8Scales<'a> {
        match p.scale_format() {
            None => Fp8Scales::None,
            Some(Fp8ScaleFormat::F32 { .. }) => Fp8Scales::F32(s32),
            Some(Fp8ScaleFormat::UE8M0) => Fp8Scales::UE8M0(s8),
        }
    }
    let (m, h) = (5, 128);
    let variants = [
        Fp8Options::per_tensor(Fp8Element::E4M3, 0.05),
        Fp8Options::per_token(Fp8Element::E5M2),
        Fp8Options::dynamic(
            Fp8Element::E4M3,
            Fp8Group::G128,
            Fp8ScaleFormat::F32_NO_FLOOR,
            Fp8ScaleLayout::ColumnMajor,
        ),
        Fp8Options::mxfp8().with_weight_bias(1.0),
    ];
    for opts in variants {
        let p = Fp8Problem::new(m, h, fp4norm::DType::BF16, &opts).unwrap();
        for w in 1..=8 {
            let ranks: Vec<Vec<bf16>> =
                (0..w).map(|k| random_rank(200 + k as u64, m * h)).collect();
            let sum: Vec<bf16> = (0..m * h)
                .map(|i| {
                    b(ranks[1..]
                        .iter()
                        .fold(ranks[0][i].to_f32(), |a, r| a + r[i].to_f32()))
                })
                .collect();
            let weight = random_rank(17, h);
            let run = |fused: bool| {
                let mut r = random_rank(19, m * h);
                let mut q = vec![0u8; p.q_len()];
                let mut s32 = vec![0f32; p.scales_len()];
                let mut s8 = vec![0u8; p.scales_len()];
                let scales = scales_of(&p, &mut s32, &mut s8);
                let out = Fp8Out {
                    q: &mut q,
                    scales,
                    y_out: None,
                };
                let res = MatMut::new(&mut r, m, h).unwrap();
                if fused {
                    fp8::reference::allreduce_add_rmsnorm_fp8quant(
                        &mats(&ranks, m, h),
                        res,
                        &weight,
                        out,
                        &opts,
                    )
                } else {
                    fp8::reference::add_rmsnorm_fp8quant(
                        MatRef::new(&sum, m, h).unwrap(),
                        res,
                        &weight,
                        out,
                        &opts,
                    )
                }
                .unwrap();
                let s32: Vec<u32> = s32.iter().map(|v| v.to_bits()).collect();
                (r, q, s32, s8)
            };
            assert_eq!(run(true), run(false), "{opts:?}, W = {w}");
        }
        let mut r = random_rank(19, m * h);
        let before = r.clone();
        let mut q = vec![0xABu8; p.q_len()];
        let mut s32 = vec![0f32; p.scales_len()];
        let mut s8 = vec![0u8; p.scales_len()];
        let scales = scales_of(&p, &mut s32, &mut s8);
        let err = fp8::reference::allreduce_add_rmsnorm_fp8quant::<bf16>(
            &[],
            MatMut::new(&mut r, m, h).unwrap(),
            &random_rank(17, h),
            Fp8Out {
                q: &mut q,
                scales,
                y_out: None,
            },
            &opts,
        );
        assert!(matches!(err, Err(Error::NoRankInputs)), "{err:?}");
        assert!(r == before && q.iter().all(|&v| v == 0xAB));
    }
}

/// The peer schedule's rule: one-shot for 1 or 2 ranks whatever the size (two-shot reads
/// no less there), two-shot exactly from the saved bytes' threshold, in terms any rank
/// computes alike.
#[cfg(feature = "cuda")]
#[test]
fn peer_strategy_switches_at_the_saved_bytes_threshold() {
    use fp4norm::cuda::{PeerStrategy, TWO_SHOT_MIN_SAVED_BYTES};
    use fp4norm::DType;
    for ranks in [1, 2] {
        assert_eq!(
            PeerStrategy::for_call(1 << 20, 8192, DType::BF16, ranks),
            PeerStrategy::OneShot
        );
    }
    // 8 ranks: saved = bytes · 7 · 6 / 8 = bytes · 5.25.
    let h = 8192;
    let rows_at = |ranks: usize| {
        (1..=4096)
            .find(|&m| PeerStrategy::for_call(m, h, DType::BF16, ranks) == PeerStrategy::TwoShot)
            .unwrap()
    };
    for ranks in 3..=8usize {
        let m = rows_at(ranks);
        let saved = |m: usize| m * h * 2 * (ranks - 1) * (ranks - 2) / ranks;
        assert!(
            saved(m) >= TWO_SHOT_MIN_SAVED_BYTES,
            "{ranks} ranks, {m} rows"
        );
        assert!(
            saved(m - 1) < TWO_SHOT_MIN_SAVED_BYTES,
            "{ranks} ranks, {m} rows"
        );
    }
    assert!(rows_at(8) < rows_at(4));
    // Huge shapes do not overflow.
    assert_eq!(
        PeerStrategy::for_call(usize::MAX, usize::MAX, DType::F16, 8),
        PeerStrategy::TwoShot
    );
}
