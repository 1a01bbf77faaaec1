/* The UE8M0 block code without a division (fp4norm.cu, ue8m0_code_of_amax) against the
 * literal SPEC.md steps, ue8m0_ceil_code(RN32(amax / 6)), on every f32 a block maximum can
 * be: +0 up to +Inf, and every NaN. C division is IEEE round-to-nearest (no -ffast-math).
 *   gcc -O2 ue8m0-code-exhaustive-check.c -o ue && ./ue      -> "mismatches: 0" (~10 s)
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
static float f(uint32_t b) { float x; memcpy(&x, &b, 4); return x; }
static uint32_t u(float x) { uint32_t b; memcpy(&b, &x, 4); return b; }
static uint32_t literal(float amax) {
    float v = amax / 6.0f;
    uint32_t bits = u(v);
    if (v != v) return 255;
    if (bits == 0 || (bits >> 31)) return 0;
    uint32_t e = bits >> 23, m = bits & 0x7fffff;
    if (e == 0) return m > 0x400000 ? 1 : 0;
    uint32_t c = e + (m != 0);
    return c < 254 ? c : 254;
}
static uint32_t fast(float amax) {  /* as ue8m0_code_of_amax */
    uint32_t b = u(amax) & 0x7fffffffu;
    if (b >= 0x7f800000u) return b == 0x7f800000u ? 254 : 255;
    uint32_t e = b >> 23;
    int c = (int)e - 2 + ((b & 0x7fffff) > 0x400000u + (e == 2));
    return c < 0 ? 0 : (uint32_t)c;
}
int main(void) {
    uint64_t bad = 0;
    for (uint64_t i = 0; i < (1ull << 32); i++) {
        float a = f((uint32_t)i);
        if ((i >> 31) && a == a) continue; /* negative numbers: not a maximum of |y| */
        if (literal(a) != fast(a)) bad++;
    }
    printf("mismatches: %llu\n", (unsigned long long)bad);
    return bad != 0;
}
