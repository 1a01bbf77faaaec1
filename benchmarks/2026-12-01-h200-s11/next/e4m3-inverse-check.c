// Host check of the fused kernel's inverse scale without a division routine
// (inverse_scale in crates/fp4norm/src/cuda/kernels/fp4norm.cu): for every positive
// finite E4M3 value d and every f32 mantissa of gs at eight exponents from 2^-100 to
// 2^99, y = RN32(1 / d), q = RN32(gs y), r = RN32(gs - d q) (one FMA), RN32(q + r y) (one
// FMA) against the f32 division gs / d. Within the normal range a power-of-two factor on gs
// scales every step exactly, so the exponents stand for the whole fast range; the kernel's
// table of y is checked against RN32(1 / d) here too.
//   cc -O2 -ffp-contract=off -o /tmp/e4m3-inverse-check scripts/e4m3-inverse-check.c -lm
//   /tmp/e4m3-inverse-check          (about 40 s on one core; prints the mismatch count)
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static float from_bits(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static uint32_t bits_of(float x) { uint32_t v; memcpy(&v, &x, 4); return v; }

// E4M3 codes 1..126 (positive, finite, nonzero), SPEC.md §2.
static float e4m3(int c) {
    const int e = (c >> 3) & 15, m = c & 7;
    return e == 0 ? ldexpf((float)m / 8.0f, -6) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
}

int main(void) {
    static const int exponents[] = {-100, -99, -60, -9, 0, 1, 59, 99};
    long cases = 0, bad = 0;
    for (int c = 1; c <= 126; ++c) {
        const float d = e4m3(c);
        // RN32(1 / d): 1 / d rounded to f64, then to f32 (53 >= 2 * 24 + 2 bits: innocuous).
        const float y = (float)(1.0 / (double)d);
        for (int xi = 0; xi < 8; ++xi) {
            for (uint32_t mant = 0; mant < (1u << 23); ++mant) {
                const float gs = from_bits(((uint32_t)(exponents[xi] + 127) << 23) | mant);
                const float q = gs * y;
                const float r = fmaf(-q, d, gs);
                const float got = fmaf(r, y, q);
                const float want = gs / d;
                ++cases;
                if (bits_of(got) != bits_of(want)) {
                    if (bad < 5) printf("code %d (d %a), gs %a: %a, want %a\n", c, d, gs, got, want);
                    ++bad;
                }
            }
        }
    }
    printf("%ld cases, %ld mismatches\n", cases, bad);
    return bad != 0;
}
