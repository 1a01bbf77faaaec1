use fp4norm::*;
use rand::{Rng, SeedableRng};

#[test]
fn cpu_matches_reference_random() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for &(m, h) in &[(1usize, 16usize), (7, 96), (130, 256), (257, 2048)] {
        for fmt in [Fp4Format::NVFP4, Fp4Format::MXFP4] {
            for layout in [
                ScaleLayout::RowMajor,
                ScaleLayout::Swizzled,
                ScaleLayout::Both,
            ] {
                if h % fmt.block_size() != 0 {
                    continue;
                }
                let x: Vec<bf16> = (0..m * h)
                    .map(|_| bf16::from_f32(rng.random_range(-4.0..4.0)))
                    .collect();
                let r0: Vec<bf16> = (0..m * h)
                    .map(|_| bf16::from_f32(rng.random_range(-4.0..4.0)))
                    .collect();
                let w: Vec<bf16> = (0..h)
                    .map(|_| bf16::from_f32(rng.random_range(0.5..1.5)))
                    .collect();
                let opts = Options::default().with_format(fmt);
                let p = Problem::new(m, h, DType::BF16, layout, &opts).unwrap();
                let mut outs = vec![];
                for fast in [false, true] {
                    let mut r = r0.clone();
                    let mut q = vec![0xAAu8; p.fp4_len()];
                    let mut rm = vec![0xAAu8; p.row_major_scales_len()];
                    let mut sw = vec![0xAAu8; p.swizzled_scales_len()];
                    let scales = match layout {
                        ScaleLayout::RowMajor => ScaleOut::RowMajor(&mut rm[..]),
                        ScaleLayout::Swizzled => ScaleOut::Swizzled(&mut sw[..]),
                        ScaleLayout::Both => ScaleOut::Both {
                            row_major: &mut rm[..],
                            swizzled: &mut sw[..],
                        },
                    };
                    let out = Fp4Out {
                        y_fp4: &mut q,
                        scales,
                        y_out: None,
                    };
                    let gs = GlobalScale::Uniform(2.5);
                    if fast {
                        cpu::add_rmsnorm_fp4quant(
                            MatRef::new(&x, m, h).unwrap(),
                            MatMut::new(&mut r, m, h).unwrap(),
                            &w,
                            out,
                            gs,
                            &opts,
                        )
                        .unwrap();
                    } else {
                        reference::add_rmsnorm_fp4quant(
                            MatRef::new(&x, m, h).unwrap(),
                            MatMut::new(&mut r, m, h).unwrap(),
                            &w,
                            out,
                            gs,
                            &opts,
                        )
                        .unwrap();
                    }
                    outs.push((r, q, rm, sw));
                }
                assert!(outs[0] == outs[1], "m={m} h={h} {fmt} {layout}");
            }
        }
    }
}

/// A global scale so small that gs / d underflows to 0 while y overflows to ±Inf (huge
/// weights): the product Inf · 0 is NaN, whose code is 0x7 whatever the NaN's sign
/// (SPEC.md §2). The fast path must not take its branch-free encoder for such blocks
/// (found by `fp4norm verify`'s "huge" group).
#[test]
fn tiny_global_scale_with_infinite_values() {
    let (m, h) = (2usize, 64usize);
    let x: Vec<bf16> = (0..m * h)
        .map(|i| bf16::from_f32((i % 7) as f32 - 3.0))
        .collect();
    let r0 = vec![bf16::from_f32(0.5); m * h];
    // Weights at the dtype's maximum: |h · rstd| > 1 overflows y to ±Inf.
    let w: Vec<bf16> = (0..h)
        .map(|i| if i % 3 == 0 { bf16::MAX } else { bf16::ONE })
        .collect();
    for fmt in [
        Fp4Format::NVFP4,
        Fp4Format::new(BlockSize::B32, ScaleFormat::E4M3),
    ] {
        let opts = Options::default().with_format(fmt);
        let p = Problem::new(m, h, DType::BF16, ScaleLayout::RowMajor, &opts).unwrap();
        let mut outs = vec![];
        for fast in [false, true] {
            let mut r = r0.clone();
            let mut q = vec![0xAAu8; p.fp4_len()];
            let mut sf = vec![0xAAu8; p.row_major_scales_len()];
            let out = Fp4Out {
                y_fp4: &mut q,
                scales: ScaleOut::RowMajor(&mut sf),
                y_out: None,
            };
            let (xv, rv) = (
                MatRef::new(&x, m, h).unwrap(),
                MatMut::new(&mut r, m, h).unwrap(),
            );
            let gs = GlobalScale::Uniform(1e-45);
            if fast {
                cpu::add_rmsnorm_fp4quant(xv, rv, &w, out, gs, &opts).unwrap();
            } else {
                reference::add_rmsnorm_fp4quant(xv, rv, &w, out, gs, &opts).unwrap();
            }
            outs.push((q, sf));
        }
        // Saturated scales (448) whose inverse rounds to 0: the case this test is about.
        assert!(
            outs[0].1.iter().all(|&c| c == 0x7E),
            "{fmt}: scales {:x?}",
            outs[0].1
        );
        assert_eq!(outs[0], outs[1], "{fmt}");
    }
}
