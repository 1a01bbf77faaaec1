#!/usr/bin/env bash
# The Python module on aarch64 (Grace hosts) under qemu-user, on an x86-64 Debian 12 host:
# an arm64 CPython 3.11 unpacked from Debian's packages, the wheel cross-built by maturin,
# NumPy / ml_dtypes / pytest from PyPI's aarch64 wheels, then the NumPy-path suites.
#
# Needs: apt (root), g++-aarch64-linux-gnu, qemu-user, `rustup target add
# aarch64-unknown-linux-gnu`, network to deb.debian.org and PyPI. Work folder: $A64 (default
# /var/tmp/fp4norm-a64). The torch cases skip (PyPI's aarch64 torch needs its CUDA wheels);
# the one test that starts a Python subprocess is left out (qemu-user cannot exec an aarch64
# child without a binfmt entry, which would change the host kernel's settings).
set -euo pipefail
cd "$(dirname "$0")/.."
a64=${A64:-/var/tmp/fp4norm-a64}
mkdir -p "$a64/debs" "$a64/root" "$a64/wheels" "$a64/site" "$a64/wheel"

# 1. CPython for arm64: Debian's packages unpacked into a root qemu reads libraries from.
dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
apt-get -o APT::Sandbox::User=root update -qq
(cd "$a64/debs" && apt-get -o APT::Sandbox::User=root download -q \
  libc6:arm64 python3.11-minimal:arm64 libpython3.11-minimal:arm64 libpython3.11-stdlib:arm64 \
  libexpat1:arm64 zlib1g:arm64 libffi8:arm64 libssl3:arm64 libbz2-1.0:arm64 liblzma5:arm64 \
  libsqlite3-0:arm64 libncursesw6:arm64 libtinfo6:arm64 libreadline8:arm64 libuuid1:arm64 \
  libgcc-s1:arm64 libstdc++6:arm64 libcrypt1:arm64 libdb5.3:arm64 libgdbm6:arm64 libnsl2:arm64 \
  libtirpc3:arm64 libgssapi-krb5-2:arm64 libkrb5-3:arm64 libk5crypto3:arm64 \
  libkrb5support0:arm64 libcom-err2:arm64 libkeyutils1:arm64)
for d in "$a64"/debs/*.deb; do dpkg -x "$d" "$a64/root"; done
py=("qemu-aarch64" -L "$a64/root" -E "PYTHONPATH=$a64/site" "$a64/root/usr/bin/python3.11")

# 2. The test dependencies (the versions CI pins) as aarch64 wheels, unpacked.
(cd "$a64/wheels" && python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 \
  numpy==2.4.6 ml_dtypes==0.6.0 pytest==9.2.0 iniconfig pluggy packaging pygments)

# 3. fp4norm's wheel, cross-built (abi3: no target interpreter needed).
python3 -m venv "$a64/maturin" && "$a64/maturin/bin/pip" install -q 'maturin>=1.9,<2'
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++ \
PYO3_CROSS_PYTHON_VERSION=3.11 \
  "$a64/maturin/bin/maturin" build -q --release --target aarch64-unknown-linux-gnu \
  -m crates/fp4norm-py/Cargo.toml -o "$a64/wheel"
rm -rf "$a64/site" && mkdir -p "$a64/site"
for w in "$a64"/wheels/*.whl "$a64"/wheel/*.whl; do (cd "$a64/site" && python3 -m zipfile -e "$w" .); done

# 4. The module on aarch64: import without torch, then the NumPy-path suites.
"${py[@]}" -c 'import platform, sys, fp4norm; print(platform.machine(), fp4norm.__version__, "torch" in sys.modules)'
cd crates/fp4norm-py
"${py[@]}" -m pytest -q -rs -p no:cacheprovider python/tests/test_cpu.py python/tests/test_hostile.py \
  python/tests/test_fp8.py python/tests/test_allreduce_reference.py \
  --deselect python/tests/test_hostile.py::test_raw_core_refuses_sizes_past_isize_max
