//! Fuzzes the FP8 host API of fp4norm (`fp8::cpu::*`, `fp8::reference::*`,
//! `fp8::dequantize`, `Fp8Problem::new`) with hostile arguments. The decoding and the
//! invariants (no panic; errors write nothing; Ok outputs byte-identical across backends,
//! scale padding zero) live in the shared harness, also run by
//! `crates/fp4norm/tests/hostile.rs`.
//!
//! Run: `cargo fuzz run host_api_fp8 -s none -- -max_len=512` from `fuzz/`
//! (see RELIABILITY.md).
#![no_main]

#[path = "../../crates/fp4norm/tests/hostile_harness/mod.rs"]
mod hostile_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    hostile_harness::check_fp8(data);
});
