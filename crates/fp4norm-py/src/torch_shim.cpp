// The two things a boxed PyTorch kernel needs from C++ that Rust cannot do itself.
// No torch headers: only the C++ standard library, which the process shares with libtorch.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

extern "C" {

// libtorch boxes an optional argument in a StableIValue allocated with `new`; the kernel
// that receives it frees it (torch/csrc/stable/stableivalue_conversions.h).
void fp4norm_delete_boxed_ivalue(uint64_t* boxed) { delete boxed; }

// Fails the operator call: the dispatcher propagates the exception and PyTorch raises it
// in Python as RuntimeError with this message. The message is copied before throwing, so
// the caller's buffer may go away during unwinding.
[[noreturn]] void fp4norm_throw(const char* message, size_t len) {
  throw std::runtime_error(std::string(message, len));
}

}  // extern "C"
