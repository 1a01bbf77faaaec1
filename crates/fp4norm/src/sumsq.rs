//! SPEC.md §1 steps 2–3: a row's sum of squares and its `rstd`, the same for every
//! summation order.
//!
//! SPEC.md §1.2: `ss` is **the exact sum of the squares, rounded once to f64** (round to
//! nearest even). Each square is exact in f64, but an f64 sum of them is not in general
//! (bf16 squares span 2^-266 … 2^256), so two summation orders can give different sums
//! and, rarely, a different f32 `rstd`: on the row of `scripts/order-case.py` the CPU's
//! element order gives block scale 0x39, an H200's reduction tree and the exact sum 0x38.
//! The exact sum is the one value independent of the order (and of the launch shape, which
//! picks a GPU's reduction tree). Computing it exactly for
//! every row would cost far more than the op, so each backend sums in its own order
//! with a proven error bound and keeps that sum whenever it provably gives the same f32
//! `rstd` ([`rstd_if_decided`]); only the rare rows whose `rstd` lies within that bound
//! of an f32 rounding boundary take the exact sum ([`exact_sum_of_squares`]). The CUDA
//! kernel does the same (`cuda/kernel/cu/fused.cu`, `rstd_checked` and `exact_sum_redo`).

/// `rstd = RN32(1 / sqrt(ss / H + eps))` before the final rounding to f32: every step an
/// f64 IEEE operation (SPEC.md §1.3).
#[inline]
pub fn rstd_f64(ss: f64, h: usize, eps: f32) -> f64 {
    1.0 / (ss / h as f64 + eps as f64).sqrt()
}

/// SPEC.md §1.3 on the exact `ss`.
#[inline]
pub fn rstd_of_sum(ss: f64, h: usize, eps: f32) -> f32 {
    rstd_f64(ss, h, eps) as f32
}

/// The f32 `rstd` of the exact sum, from a sum `s` of the same nonnegative squares
/// computed in any order with at most `depth` rounded additions on the path from any
/// square to the result, or `None` when `s` cannot decide it.
///
/// For nonnegative terms `|s - exact| ≤ ((1 + u)^depth - 1) · exact` (u = 2^-53), and
/// the exact sum rounded to f64 is within `u · exact` of it. The rstd chain is monotone
/// and halves relative errors (a square root), and its own four roundings add at most
/// 4 u each time it is evaluated: so the chain's f64 result on the exact sum lies within
/// `0.52 · depth + 9` f64 ulps of its result `t` on `s`. If `t` is farther than that
/// (`depth + 16` here) from the nearest f32 rounding boundary — a midpoint between two
/// f32 values, i.e. the low 29 bits of `t`'s significand at 2^28 — both round to the
/// same f32. Zero, infinite and NaN sums are exact in every order; an f32-subnormal
/// `rstd` (where the f32 grid is coarser) is left to the exact sum.
#[inline]
pub fn rstd_if_decided(s: f64, depth: usize, h: usize, eps: f32) -> Option<f32> {
    if s == 0.0 || !s.is_finite() {
        return Some(rstd_of_sum(s, h, eps));
    }
    let t = rstd_f64(s, h, eps);
    let margin = depth as u64 + 16;
    let decided = t.is_finite()
        && t >= f64::from(f32::MIN_POSITIVE) * 2.0
        && ulps_to_f32_midpoint(t) > margin;
    decided.then_some(t as f32)
}

/// How many f64 ulps a normal f32-range `t` lies from the nearest f32 rounding boundary (a
/// midpoint between two f32 values): the low 29 bits of its significand against 2^28.
#[inline]
pub fn ulps_to_f32_midpoint(t: f64) -> u64 {
    (t.to_bits() & ((1u64 << 29) - 1)).abs_diff(1u64 << 28)
}

/// The largest relative error of the f32 `rsqrt` seed that [`rstd_by_seed`] allows: the GPU
/// codec self-check proves the hardware's `rsqrt.approx.ftz.f32` within it on every f32 of
/// `[2^-120, 2^120]`, or the device gets the literal path (the IEEE chain).
pub const RSTD_SEED_MAX_REL_ERROR: f64 = 1.0 / (1u64 << 22) as f64;

/// How far, in f64 ulps, [`rstd_by_seed`] may land from [`rstd_f64`] on the same sum: the GPU
/// kernels that decide a row by it widen [`rstd_if_decided`]'s margin by this much.
pub const RSTD_SEED_MARGIN_ULPS: u64 = 4;

/// The f64 rstd by which the GPU kernels decide a row where the fast paths run (`fused.cu`,
/// `rstd_checked`): a shorter chain on the row's latency path than [`rstd_f64`]'s correctly
/// rounded square root and division. `mean = RN64(s · RN64(1/H) + eps)` (one fma),
/// `r0 = seed(RN32(mean))`, `e = RN64(1 − mean · r0²)` (`r0²` is exact, `r0` having 24 bits),
/// then `1/sqrt(mean) = r0 (1 − e)^(-1/2)` to second order:
/// `t = RN64(RN64(r0 e) · RN64(e · 3/8 + 1/2) + r0)` (fmas). `None` where the kernels take
/// the IEEE chain instead: `s` not positive and finite, or `mean` outside `[2^-120, 2^120]`.
///
/// Within [`RSTD_SEED_MARGIN_ULPS`] of `rstd_f64(s)` for a seed within
/// [`RSTD_SEED_MAX_REL_ERROR`]: with the f32 rounding of `mean`, `|e| < 2^-20.8`, so the
/// series' remainder, about `5/16 |e|³`, is under `2^-64` relative (a hundredth of an ulp),
/// and `e`'s and the product's roundings add far less. What remains is the two means: where
/// H is not a power of two, `rstd_f64`'s `RN(RN(s/H) + eps)` and this one fma can differ by
/// up to ~μ mean ulps before rounding (μ the mean's significand in [1, 2)), so 2 ulps after,
/// which costs `2 μ^-1.5` ulps of rstd; with `rstd_f64`'s square root (up to 1/μ ulp) and
/// division (1/2), the two unrounded values lie under 2.98 ulps apart, and each result
/// within half an ulp of its own: at most 3 ulps, which the tests reach. (One Newton step
/// instead, `1.5 e²`, would be 973 ulps, and would send 20 times as many rows to the exact
/// sum.)
pub fn rstd_by_seed(s: f64, h: usize, eps: f32, seed: impl Fn(f32) -> f32) -> Option<f64> {
    let mean = s.mul_add(1.0 / h as f64, f64::from(eps));
    if !(s > 0.0 && s.is_finite() && (2f64.powi(-120)..=2f64.powi(120)).contains(&mean)) {
        return None;
    }
    let r0 = f64::from(seed(mean as f32));
    let e = (-mean).mul_add(r0 * r0, 1.0);
    Some((r0 * e).mul_add(e.mul_add(0.375, 0.5), r0))
}

/// The exact sum of `h_i²` over the row (the values widened to f32, exactly), rounded once to f64 (round to nearest, ties
/// to even): NaN if any `h_i` is NaN, else +Inf if any is infinite.
///
/// Every finite f32 is `m · 2^(e - 150)` with `m < 2^24` an integer and `e` the biased
/// exponent (1 for subnormals), so its square is `m² · 2^(2e - 300)`: the sum is an
/// integer (at most ~2^600) times 2^-300, accumulated exactly in 64-bit limbs.
pub fn exact_sum_of_squares(row: impl IntoIterator<Item = f32>) -> f64 {
    let mut acc = BigSum::default();
    let (mut nan, mut inf) = (false, false);
    for f in row {
        if f.is_nan() {
            nan = true;
        } else if f.is_infinite() {
            inf = true;
        } else {
            acc.add_square(f);
        }
    }
    if nan {
        f64::NAN
    } else if inf {
        f64::INFINITY
    } else {
        acc.to_f64()
    }
}

/// `Σ m_i² 2^(2 e_i)` as an unsigned integer of `LIMBS` 64-bit limbs (least significant
/// first); its value in f64 is that times 2^-300.
const LIMBS: usize = 11; // 2e ≤ 508, m² < 2^48, and 2^80 squares of headroom
const SCALE_EXP: i32 = -300;

#[derive(Default)]
struct BigSum {
    limbs: [u64; LIMBS],
}

impl BigSum {
    fn add_square(&mut self, f: f32) {
        let bits = f.to_bits() & 0x7FFF_FFFF;
        let e = bits >> 23;
        let m = u64::from(bits & 0x7F_FFFF) | if e > 0 { 1 << 23 } else { 0 };
        if m == 0 {
            return;
        }
        let shift = 2 * e.max(1) as usize;
        let (limb, off) = (shift / 64, shift % 64);
        let v = u128::from(m * m) << off; // < 2^111
        let mut carry = self.add_at(limb, v as u64, 0);
        carry = self.add_at(limb + 1, (v >> 64) as u64, carry);
        let mut i = limb + 2;
        while carry != 0 {
            carry = self.add_at(i, 0, carry);
            i += 1;
        }
    }

    fn add_at(&mut self, i: usize, v: u64, carry: u64) -> u64 {
        let (s1, c1) = self.limbs[i].overflowing_add(v);
        let (s2, c2) = s1.overflowing_add(carry);
        self.limbs[i] = s2;
        u64::from(c1) + u64::from(c2)
    }

    fn bit(&self, pos: i64) -> u64 {
        if pos < 0 {
            0
        } else {
            (self.limbs[pos as usize / 64] >> (pos % 64)) & 1
        }
    }

    /// Whether any bit below `pos` is set.
    fn any_below(&self, pos: i64) -> bool {
        if pos <= 0 {
            return false;
        }
        let (limb, off) = (pos as usize / 64, pos % 64);
        self.limbs[..limb].iter().any(|&l| l != 0) || (self.limbs[limb] & ((1u64 << off) - 1)) != 0
    }

    /// Round to nearest even f64.
    fn to_f64(&self) -> f64 {
        let Some(top) = (0..LIMBS).rev().find(|&i| self.limbs[i] != 0) else {
            return 0.0;
        };
        let p = (64 * top + 63 - self.limbs[top].leading_zeros() as usize) as i64; // top bit
        if p < 53 {
            // Fewer than 54 bits: exact, and scaling by a power of two is exact.
            return self.limbs[0] as f64 * pow2(SCALE_EXP);
        }
        let mut mant = 0u64;
        for b in (p - 52..=p).rev() {
            mant = (mant << 1) | self.bit(b);
        }
        let round = self.bit(p - 53) == 1;
        let sticky = self.any_below(p - 53);
        let mut exp = p - 52 + SCALE_EXP as i64;
        if round && (sticky || mant & 1 == 1) {
            mant += 1;
            if mant == 1 << 53 {
                mant >>= 1;
                exp += 1;
            }
        }
        mant as f64 * pow2(exp as i32)
    }
}

/// 2^k for k in the normal f64 range.
fn pow2(k: i32) -> f64 {
    debug_assert!((-1022..=1023).contains(&k));
    f64::from_bits(((k + 1023) as u64) << 52)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Element;
    use half::{bf16, f16};

    /// An f32 seed of `1/sqrt(x)` with relative error `k · 2^-22` (|k| ≤ 1), kept within
    /// the bound after its rounding to f32.
    fn seed_at(x: f32, k: f64) -> f32 {
        let exact = 1.0 / f64::from(x).sqrt();
        let rel = |v: f32| (f64::from(v) / exact - 1.0).abs();
        let mut v = (exact * (1.0 + k * RSTD_SEED_MAX_REL_ERROR)) as f32;
        while rel(v) > RSTD_SEED_MAX_REL_ERROR {
            v = if f64::from(v) > exact {
                f32::from_bits(v.to_bits() - 1)
            } else {
                f32::from_bits(v.to_bits() + 1)
            };
        }
        v
    }

    fn ulps_apart(a: f64, b: f64) -> u64 {
        (a.to_bits() as i64).abs_diff(b.to_bits() as i64)
    }

    /// The seed's second-order step lands within the margin of the IEEE chain for seeds
    /// anywhere in the allowed error, at its ends too, over the range of sums, powers of two
    /// and other H, and the eps values in use.
    #[test]
    fn rstd_by_seed_stays_within_its_margin() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed_0007);
        let mut worst = 0u64;
        for &h in &[1usize, 16, 2048, 3584, 4096, 5120, 7168, 8192, 32768] {
            for &eps in &[0.0f32, 1e-6, 1e-5] {
                for _ in 0..4000 {
                    let s = 2f64.powf(rng.random_range(-90.0..100.0)) * h as f64;
                    let t = rstd_f64(s, h, eps);
                    for k in [
                        -1.0,
                        -0.9999,
                        -0.5,
                        0.0,
                        0.5,
                        0.9999,
                        1.0,
                        rng.random_range(-1.0..1.0),
                    ] {
                        let Some(got) = rstd_by_seed(s, h, eps, |x| seed_at(x, k)) else {
                            continue;
                        };
                        let d = ulps_apart(got, t);
                        assert!(
                            d <= RSTD_SEED_MARGIN_ULPS,
                            "s {s:e}, H {h}, eps {eps:e}, seed error {k} x 2^-22: {d} ulps"
                        );
                        worst = worst.max(d);
                    }
                }
            }
        }
        eprintln!("the seed's second-order step: at most {worst} ulps from the IEEE chain");
        assert!(worst >= 1, "never an ulp apart: the comparison is off");
        // The worst case is 3 ulps: H not a power of two and eps too small to change the
        // mean, where rstd_f64's two roundings of the mean and the seed path's one fma land
        // 2 mean ulps apart (found by an f64 model; random sums almost never reach it).
        for (s, h, eps) in [
            (
                f64::from_bits(0x40e0_e377_bf62_ebbc),
                31488,
                f32::from_bits(0x3084_07d5),
            ),
            (
                f64::from_bits(0x41c0_6d19_5ec2_2460),
                32517,
                f32::from_bits(0x372c_30a2),
            ),
        ] {
            let t = rstd_f64(s, h, eps);
            let got = rstd_by_seed(s, h, eps, |x| seed_at(x, 0.0)).unwrap();
            assert_eq!(ulps_apart(got, t), 3, "s {s:e}, H {h}, eps {eps:e}");
        }
        const { assert!(3 < RSTD_SEED_MARGIN_ULPS) };
        // Outside the seed's range the kernels take the IEEE chain.
        assert!(rstd_by_seed(0.0, 4096, 1e-6, |x| seed_at(x, 0.0)).is_none());
        assert!(rstd_by_seed(f64::NAN, 4096, 1e-6, |x| seed_at(x, 0.0)).is_none());
        assert!(rstd_by_seed(1e300, 4096, 1e-6, |x| seed_at(x, 0.0)).is_none());
    }

    fn exact<T: Element>(row: &[T]) -> f64 {
        exact_sum_of_squares(row.iter().map(|v| v.to_f32()))
    }

    fn b(v: f32) -> bf16 {
        bf16::from_f32(v)
    }

    #[test]
    fn exact_where_f64_is_exact() {
        let row: Vec<bf16> = [1.0, 2.0, 3.0, -0.5, 0.0].iter().map(|&v| b(v)).collect();
        assert_eq!(exact(&row), 1.0 + 4.0 + 9.0 + 0.25);
        assert_eq!(exact::<bf16>(&[]), 0.0);
        assert_eq!(exact(&[b(0.0), b(-0.0)]), 0.0);
    }

    #[test]
    fn ties_round_to_even_and_sticky_bits_count() {
        // 2^60 + 2·8²: 128 is half an ulp of 2^60 (ulp 256): a tie, to even (2^60).
        let tie = [b(2f32.powi(30)), b(8.0), b(8.0)];
        assert_eq!(exact(&tie), 2f64.powi(60));
        // Any square below breaks the tie upwards, however small.
        let above = [b(2f32.powi(30)), b(8.0), b(8.0), b(2f32.powi(-60))];
        assert_eq!(exact(&above), 2f64.powi(60) + 256.0);
        // Element order in f64 drops each 64 on its own: the reason for this module.
        let naive: f64 = above.iter().map(|v| (v.to_f32() as f64).powi(2)).sum();
        assert_eq!(naive, 2f64.powi(60));
        // A tie whose lower neighbour is odd rounds up: 2^60 + 256 + 128.
        let odd = [b(2f32.powi(30)), b(16.0), b(8.0), b(8.0)];
        assert_eq!(exact(&odd), 2f64.powi(60) + 512.0);
    }

    #[test]
    fn extremes_and_specials() {
        // The smallest bf16 subnormal (2^-133) squared is 2^-266, a normal f64.
        let tiny = bf16::from_bits(1);
        assert_eq!(exact(&[tiny]), 2f64.powi(-266));
        let big = bf16::MAX; // (2 - 2^-7) 2^127
        let want = (big.to_f32() as f64).powi(2);
        assert_eq!(exact(&[big]), want);
        assert_eq!(exact(&[big, tiny]), want); // far below an ulp, no tie
        assert!(exact(&[b(1.0), bf16::NAN, bf16::INFINITY]).is_nan());
        assert_eq!(exact(&[b(1.0), bf16::NEG_INFINITY]), f64::INFINITY);
        let h = f16::from_bits(1); // 2^-24
        assert_eq!(exact(&[h, h]), 2.0 * 2f64.powi(-48));
    }

    #[test]
    fn undecided_at_f32_midpoints() {
        let h = 4096;
        assert_eq!(
            rstd_if_decided(0.0, 64, h, 1e-6),
            Some(rstd_of_sum(0.0, h, 1e-6))
        );
        assert!(rstd_if_decided(f64::NAN, 64, h, 1e-6).unwrap().is_nan());
        // s whose rstd chain lands within a few ulps of 1 + 2^-24, an f32 midpoint.
        let mid = f64::from_bits(1.0f64.to_bits() | (1 << 28));
        let s = h as f64 / (mid * mid);
        assert_eq!(rstd_if_decided(s, 64, h, 0.0), None);
    }

    /// f64 sums of `row`'s squares in three orders, each with its depth bound.
    fn order_sums(row: &[bf16]) -> Vec<(f64, usize)> {
        let sq: Vec<f64> = row.iter().map(|v| (v.to_f32() as f64).powi(2)).collect();
        let forward = sq.iter().sum::<f64>();
        let backward = sq.iter().rev().sum::<f64>();
        let mut sorted = sq.clone();
        sorted.sort_by(f64::total_cmp);
        let ascending = sorted.iter().sum::<f64>();
        vec![
            (forward, sq.len()),
            (backward, sq.len()),
            (ascending, sq.len()),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        /// The bound itself: near an f32 midpoint of rstd, every sum `s` that decides must
        /// give the same f32 as every sum that `depth` roundings of nonnegative terms can
        /// put within reach of it, the rounded exact sum included: |s - exact| ≤
        /// ((1 + u)^depth - 1) exact, and the rounded exact sum is within u exact: so
        /// everything within (1.01 depth + 1) u s of s (rounded up to whole ulps of s) is
        /// reachable. The rstd chain is monotone: the two ends decide for the whole range.
        #[test]
        fn decided_sums_agree_with_every_sum_within_the_bound(
            r0 in 0x3500_0000u32..0x4B00_0000,
            depth in 1usize..200,
            h in proptest::sample::select(vec![16usize, 4096, 5120, 32768]),
            eps in proptest::sample::select(vec![0.0f32, 1e-6, 1e-3]),
        ) {
            let mid = f64::from_bits(f64::from(f32::from_bits(r0)).to_bits() | 1 << 28); // an f32 midpoint
            let s0 = h as f64 * (1.0 / (mid * mid) - eps as f64).max(1e-300);
            for j in -(3 * depth as i64)..=3 * depth as i64 {
                let s = f64::from_bits((s0.to_bits() as i64 + j) as u64);
                let ulp = f64::from_bits(s.to_bits() + 1) - s;
                let reach = ((1.01 * depth as f64 + 1.0) * 2f64.powi(-53) * s / ulp).ceil() as u64 + 1;
                if let Some(r) = rstd_if_decided(s, depth, h, eps) {
                    for end in [s.to_bits() - reach, s.to_bits() + reach] {
                        let got = rstd_of_sum(f64::from_bits(end), h, eps);
                        proptest::prop_assert_eq!(got.to_bits(), r.to_bits());
                    }
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// Whatever the order, a decided rstd is the exact sum's; and on rows built to
        /// sit near a boundary (one huge square, small ones filling the ulps below it) the
        /// orders disagree often, so the exact path is exercised too.
        #[test]
        fn any_order_decides_the_exact_rstd(
            big in 0x1A00u16..0x7F7F,
            below in proptest::collection::vec(0u16..0x1A00, 1..300),
            eps_bits in 0u32..0x3A83_126F,
        ) {
            // Squares within 2^-52 … 1 of the largest: every one of them moves the low
            // bits of the f64 sum, so the orders disagree in those bits.
            let mut row: Vec<bf16> = below.iter().map(|&d| bf16::from_bits(big - d)).collect();
            row.push(bf16::from_bits(big));
            let eps = f32::from_bits(eps_bits);
            let h = row.len();
            let exact = rstd_of_sum(exact(&row), h, eps);
            for (s, depth) in order_sums(&row) {
                if let Some(r) = rstd_if_decided(s, depth, h, eps) {
                    proptest::prop_assert_eq!(r.to_bits(), exact.to_bits());
                }
            }
        }
    }
}
