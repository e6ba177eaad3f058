// The callbacks of g++'s -fsanitize=thread instrumentation, defined by the emulator instead of the
// ThreadSanitizer runtime (which is never linked with them). libmultigrad_traced's kernels are
// compiled with that instrumentation (CMakeLists.txt: MG_TRACE_FLAGS), so every load and store
// they make calls __tsan_readN / __tsan_writeN(address) first, and every atomic is a call to
// __tsan_atomicN_<op>, which must then be performed here. Outside a traced block a callback costs
// a thread-local load and a branch (trace.h: t_block_trace).
//
// With MG_EMU_MEMCHECK=1 every load and store is also checked against the device allocations
// (memcheck_access, trace.cpp), profile or not.
//
// The call site is the callback's return address: one instruction of the kernel, resolved to
// file:line when the profile ends (trace.cpp). Function entry/exit callbacks are switched off at
// compile time (--param=tsan-instrument-func-entry-exit=0); the rest are here so that whatever the
// compiler emits links.
//
// The ThreadSanitizer test (tests/emu/tsan_host_read.cpp) links the real runtime and leaves this
// file out.
#include <cstdint>

#include "cuda_emu/trace.h"

namespace {

using mg_emu::profile::Op;

inline void record(void* address, unsigned bytes, Op op, void* site) {
  if (mg_emu::t_memcheck) mg_emu::memcheck_access(address, bytes, op, reinterpret_cast<uintptr_t>(site));
  if (mg_emu::t_block_trace != nullptr)
    mg_emu::trace_access(address, bytes, op, reinterpret_cast<uintptr_t>(site));
}

}  // namespace

// -fsanitize-coverage=trace-pc: a call at the start of every basic block of the kernels. With
// the instruction count on, the tracer counts them per warp (which lines ran: ptx_count.h).
extern "C" void __sanitizer_cov_trace_pc() {
  if (mg_emu::t_block_trace != nullptr)
    mg_emu::trace_block_entered(reinterpret_cast<uintptr_t>(__builtin_return_address(0)));
}

#define MG_SITE __builtin_return_address(0)
#define MG_PLAIN_ACCESS(N)                                                             \
  void __tsan_read##N(void* p) { record(p, N, Op::load, MG_SITE); }                    \
  void __tsan_write##N(void* p) { record(p, N, Op::store, MG_SITE); }                  \
  void __tsan_unaligned_read##N(void* p) { record(p, N, Op::load, MG_SITE); }          \
  void __tsan_unaligned_write##N(void* p) { record(p, N, Op::store, MG_SITE); }        \
  void __tsan_volatile_read##N(void* p) { record(p, N, Op::load, MG_SITE); }           \
  void __tsan_volatile_write##N(void* p) { record(p, N, Op::store, MG_SITE); }         \
  void __tsan_unaligned_volatile_read##N(void* p) { record(p, N, Op::load, MG_SITE); } \
  void __tsan_unaligned_volatile_write##N(void* p) { record(p, N, Op::store, MG_SITE); }

// Atomics: performed (sequentially consistent: at least as strong as any order asked for) and
// recorded as one atomic access. Plain atomic loads and stores are not recorded: in kernel code
// they are the emulator's own compare-and-swap loops (cuda_emulated.h's atomicAdd on floats), whose
// compare-and-swap is the one atomic the GPU would make.
#define MG_ATOMICS(N, T)                                                                               \
  T __tsan_atomic##N##_load(const volatile T* a, int) { return __atomic_load_n(a, __ATOMIC_SEQ_CST); } \
  void __tsan_atomic##N##_store(volatile T* a, T v, int) { __atomic_store_n(a, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##N##_exchange(volatile T* a, T v, int) {                                             \
    record((void*)a, N / 8, Op::atomic, MG_SITE);                                                      \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                                \
  }                                                                                                    \
  T __tsan_atomic##N##_fetch_add(volatile T* a, T v, int) {                                            \
    record((void*)a, N / 8, Op::atomic, MG_SITE);                                                      \
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                                 \
  }                                                                                                    \
  T __tsan_atomic##N##_fetch_sub(volatile T* a, T v, int) {                                            \
    record((void*)a, N / 8, Op::atomic, MG_SITE);                                                      \
    return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                                 \
  }                                                                                                    \
  T __tsan_atomic##N##_fetch_and(volatile T* a, T v, int) {                                            \
    record((void*)a, N / 8, Op::atomic, MG_SITE);                                                      \
    return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST);                                                 \
  }                                                                                                    \
  T __tsan_atomic##N##_fetch_or(volatile T* a, T v, int) {                                             \
    record((void*)a, N / 8, Op::atomic, MG_SITE);                                                      \
    return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);                                                  \
  }                                                                                                    \
  T __tsan_atomic##N##_fetch_xor(volatile T* a, T v, int) {                                            \
    record((void*)a, N / 8, Op::atomic, MG_SITE);                                                      \
    return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST);                                                 \
  }                                                                                                    \
  T __tsan_atomic##N##_fetch_nand(volatile T* a, T v, int) {                                           \
    record((void*)a, N / 8, Op::atomic, MG_SITE);                                                      \
    return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST);                                                \
  }                                                                                                    \
  bool __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* expected, T v, int, int) {         \
    record((void*)a, N / 8, Op::atomic, MG_SITE);                                                      \
    return __atomic_compare_exchange_n(a, expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);     \
  }                                                                                                    \
  bool __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* expected, T v, int, int) {           \
    record((void*)a, N / 8, Op::atomic, MG_SITE);                                                      \
    return __atomic_compare_exchange_n(a, expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);     \
  }                                                                                                    \
  T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T expected, T v, int, int) {                \
    record((void*)a, N / 8, Op::atomic, MG_SITE);                                                      \
    __atomic_compare_exchange_n(a, &expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);           \
    return expected;                                                                                   \
  }

extern "C" {

void __tsan_init() { mg_emu::trace_note_instrumented_code(); }
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
void __tsan_read_range(void* p, unsigned long bytes) {
  record(p, static_cast<unsigned>(bytes), Op::load, MG_SITE);
}
void __tsan_write_range(void* p, unsigned long bytes) {
  record(p, static_cast<unsigned>(bytes), Op::store, MG_SITE);
}
void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

MG_PLAIN_ACCESS(1)
MG_PLAIN_ACCESS(2)
MG_PLAIN_ACCESS(4)
MG_PLAIN_ACCESS(8)
MG_PLAIN_ACCESS(16)

MG_ATOMICS(8, uint8_t)
MG_ATOMICS(16, uint16_t)
MG_ATOMICS(32, uint32_t)
MG_ATOMICS(64, uint64_t)

}  // extern "C"
