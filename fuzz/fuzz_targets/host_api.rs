//! Fuzzes the public host API of fp4norm (`cpu::*`, `reference::*`, `dequantize`,
//! `Problem::new`) with hostile arguments. The decoding and the invariants (no panic;
//! errors write nothing; Ok outputs byte-identical across backends) live in the shared
//! harness, also run by `crates/fp4norm/tests/hostile.rs`.
//!
//! Run: `cargo fuzz run host_api -s none -- -max_len=512` from the repository root
//! (see RELIABILITY.md).
#![no_main]

#[path = "../../crates/fp4norm/tests/hostile_harness/mod.rs"]
mod hostile_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    hostile_harness::check(data);
});
