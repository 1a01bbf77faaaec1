"""Test vectors for the exact sum of squares (crates/fp4norm/src/sumsq.rs), from an oracle
independent of the code under test: Python's math.fsum, which returns the correctly rounded
sum of its float arguments (every bf16 / f16 square is an exact float).

    python3 scripts/sumsq-vectors.py > crates/fp4norm/tests/data/sumsq_vectors.txt

Each line: dtype, the row as run-length encoded 16-bit patterns (BITS*COUNT), and the
expected f64 bits of the sum, all hex. Rows: the SPEC order case, ties, near-ties,
subnormals, wide and narrow random ranges. Seeded: the output is reproducible.
"""

import math
import random
import struct


def bf16_value(bits):
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def f16_value(bits):
    return struct.unpack("<e", struct.pack("<H", bits))[0]


def finite(dtype, bits):
    exp_mask = 0x7F80 if dtype == "bf16" else 0x7C00
    return (bits & exp_mask) != exp_mask


def bits_of(dtype, value):
    if dtype == "bf16":
        b = struct.unpack("<I", struct.pack("<f", value))[0]
        assert b & 0xFFFF == 0, value
        return b >> 16
    return struct.unpack("<H", struct.pack("<e", value))[0]


def line(dtype, row):
    val = bf16_value if dtype == "bf16" else f16_value
    s = math.fsum(val(b) ** 2 for b in row)
    runs = []
    for b in row:
        if runs and runs[-1][0] == b:
            runs[-1][1] += 1
        else:
            runs.append([b, 1])
    enc = " ".join(f"{b:04x}*{n}" for b, n in runs)
    return f"{dtype} {struct.unpack('<Q', struct.pack('<d', s))[0]:016x} {enc}"


def main():
    rnd = random.Random(20261130)
    out = []
    # The SPEC order case (scripts/order-case.py): 2^34, 96468992, 468992, then 4093 x 181.
    out.append(line("bf16", [bits_of("bf16", v) for v in (2.0**34, 96468992.0, 468992.0)] + [bits_of("bf16", 181.0)] * 4093))
    # Ties: 2^60 + 128 (to even, down), + 2^-120 (sticky, up), 2^60 + 256 + 128 (to even, up).
    two30, eight, sixteen = (bits_of("bf16", v) for v in (2.0**30, 8.0, 16.0))
    out.append(line("bf16", [two30, eight, eight]))
    out.append(line("bf16", [two30, eight, eight, bits_of("bf16", 2.0**-60)]))
    out.append(line("bf16", [two30, sixteen, eight, eight]))
    out.append(line("bf16", [0x0001] * 7 + [0x7F7F]))  # smallest subnormal and the largest finite
    out.append(line("f16", [0x0001] * 5 + [0x7BFF]))
    for dtype in ("bf16", "f16"):
        top = 0x7F7F if dtype == "bf16" else 0x7BFF
        for n in (1, 2, 3, 8, 17, 64, 255):
            for _ in range(4):
                # wide: any finite pattern; narrow: one binade band; spiky: a few large
                # values over many tiny ones (the case f64 order sums get wrong)
                wide = [rnd.randrange(0, top + 1) for _ in range(n)]
                base = rnd.randrange(0x0100, top - 0x0400)
                narrow = [base + rnd.randrange(0, 0x0200) for _ in range(n)]
                spiky = [rnd.randrange(0, 0x0400) for _ in range(n)]
                for k in range(min(3, n)):
                    spiky[rnd.randrange(n)] = rnd.randrange(top - 0x0800, top)
                for row in (wide, narrow, spiky):
                    row = [b if finite(dtype, b) else 0 for b in row]
                    out.append(line(dtype, [b | (0x8000 if rnd.random() < 0.5 else 0) for b in row]))
    print("\n".join(out))


if __name__ == "__main__":
    main()
