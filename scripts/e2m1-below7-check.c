// Host check of the kernel's E2M1 encoder arithmetic (e2m1_pack8_fast, in
// crates/fp4norm/src/cuda/kernel/cu/common.cuh): for a = |v|, the low nibble of
// t + (t >> 22), where t = bits(RN32(a + C)) and
// C = binade(max(a, 1)) * 2^22 + 6 ulps, equals the E2M1 magnitude code of SPEC.md §2
// (written as e2m1_encode_sw) for every non-negative f32 a < 7 as it is (the unclamped
// form, BELOW_7) and for every non-NaN a clamped to 6 first (the clamped form). The GPU's
// codec self-check runs the kernel's own code on every f32; this checks the arithmetic
// alone, in seconds:
//   gcc -O2 -ffp-contract=off -o /tmp/e2m1-check scripts/e2m1-below7-check.c && /tmp/e2m1-check
// (With 4 ulps instead of 6 every value fails; exit status 1 on any mismatch.)
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static float from_bits(uint32_t b) { float x; memcpy(&x, &b, 4); return x; }
static uint32_t to_bits(float x) { uint32_t b; memcpy(&b, &x, 4); return b; }

static uint32_t e2m1_magnitude_literal(float a) {
    return (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
}

static uint32_t code_of(float a) {
    const uint32_t e = to_bits(a > 1.0f ? a : 1.0f) & 0x7F800000u;
    volatile float c = from_bits(e + ((22u << 23) + 6u));
    volatile float t = a + c;  // RN32, ties to even
    const uint32_t tb = to_bits(t);
    return (tb + (tb >> 22)) & 0xFu;
}

int main(void) {
    uint64_t below7 = 0, clamped = 0, bad = 0;
    for (uint64_t b = 0; b <= 0x7F800000ull; ++b) {  // +0 up to +Inf: every non-NaN |v|
        const float a = from_bits((uint32_t)b);
        const uint32_t want = e2m1_magnitude_literal(a);
        const uint32_t got_clamped = code_of(a < 6.0f ? a : 6.0f);
        ++clamped;
        uint32_t got_below7 = want;
        if (a < 7.0f) {
            ++below7;
            got_below7 = code_of(a);
        }
        if (got_clamped != want || got_below7 != want) {
            if (bad < 5)
                printf("mismatch: bits %08x (%g): clamped %u, unclamped %u, want %u\n", (unsigned)b, a,
                       got_clamped, got_below7, want);
            ++bad;
        }
    }
    printf("%llu values below 7 (unclamped) and %llu non-NaN values (clamped) checked, %llu mismatches\n",
           (unsigned long long)below7, (unsigned long long)clamped, (unsigned long long)bad);
    return bad != 0;
}
