// The device side of CUDA for the emulation build (-DMG_CUDA=EMULATE): the header forced in first.
//
// Every .cu file of multigrad is compiled by the host C++ compiler with this header forced in
// first (-include cuda_emu/cuda_emulated.h). It supplies what nvcc would: the qualifiers, the
// built-in variables, barriers, warp collectives, atomics and the intrinsics the kernels use; and,
// through cuda_emu/native_twins.h at the end, the emulated twins of kernels/cuda/native.cuh (the
// `<<<>>>` launch, the `__shared__` declarations, the inline PTX), whose include guard it defines
// so that file is skipped. The kernels are the same source nvcc compiles, without an #if for the
// emulator.
//
// How __syncthreads() becomes a fiber switch (cuda_emu/block_scheduler.cpp): each CUDA thread runs
// on a fiber (Boost.Context: a switch is a few register moves, no system call); the fibers of one
// block run on one OS thread, one at a time. __syncthreads() below is an ordinary function: it
// records where the thread waits (the caller's file and line, through the defaulted arguments) and
// switches back to the block's scheduler fiber, which resumes the next ready thread. When every
// live thread of the block waits at the same barrier, the scheduler marks them all ready and
// resumes them one by one. Warp collectives (__shfl_*_sync, __ballot_sync, ldmatrix, mma) switch
// the same way until the last lane of their mask arrives. Between those points a thread runs
// without interruption.
//
// threadIdx/blockIdx/blockDim/gridDim are per-OS-thread variables the scheduler sets before it
// resumes a fiber, so reading them costs a thread-local load and no fiber can see another's.
//
// `__shared__` declarations and `<<<>>>` launches never reach the compiler as written: the build's
// CUDA front end (cuda_emu/cu_rewrite/, run on the preprocessed text of every .cu file) turns them
// into calls of cuda_emu/cuda_syntax.h, included at the end of this header. A `__shared__` array is
// then one per block (per-OS-thread storage: an OS thread runs one block at a time, so the fibers
// of a block share it as the threads of a block share shared memory), poisoned at each block's
// start, counted against the block's shared-memory limit and traced as shared memory. Dynamic
// shared memory (the launch's third argument) is a per-block arena filled with 0xff bytes (a NaN
// in every float format) at block start.
#pragma once

#if !defined(MG_CUDA_EMULATE)
#error "cuda_emu/cuda_emulated.h is for the emulation build only (-DMG_CUDA=EMULATE)"
#endif

#include <cuda_runtime.h>  // host mode: dim3, uint3, cudaStream_t and the runtime API

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

// ---- qualifiers ---------------------------------------------------------------------------------
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __constant__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __constant__
// initial-exec: a thread-local read is one load off the thread pointer, not a __tls_get_addr call
// (libmg_cuda_emu and libmultigrad are loaded with the program, never dlopen'ed later).
#define MG_EMU_TLS __attribute__((tls_model("initial-exec")))
// __shared__ stays undefined: the front end rewrites every declaration that holds it.
#define __launch_bounds__(...)

// ---- built-in variables -------------------------------------------------------------------------
extern thread_local uint3 threadIdx MG_EMU_TLS;
extern thread_local uint3 blockIdx MG_EMU_TLS;
extern thread_local dim3 blockDim MG_EMU_TLS;
extern thread_local dim3 gridDim MG_EMU_TLS;
constexpr int warpSize = 32;

namespace mg_emu {

// ---- what the scheduler offers the device functions below (block_scheduler.cpp) -------------
// A __syncthreads() of the current block, called at file:line.
void sync_block(const char* file, int line);

// The warp collectives. Each named lane deposits `in` words; when every lane of `mask` has
// arrived (at the same operation, with the same mask and the same WarpOpArgs), the last one runs
// `complete` once for the whole warp and every lane gets its `out` words. A lane that is not
// there, has exited, or waits at another operation is reported as an error naming the kernel,
// block and lanes.
//
// One lane's words. The sizes are those of the largest collective: mma.m16n8k16 deposits 10
// words (its a fragment's 4 registers, b's 2 and the 4 accumulators) and, like ldmatrix.x4,
// receives 4 registers; a shuffle deposits 3 (the 64-bit value and its lane argument) and
// receives 2, a vote deposits and receives 1.
constexpr int kWarpLaneInWords = 10;
constexpr int kWarpLaneOutWords = 4;
struct WarpLane {
  uint32_t in[kWarpLaneInWords];
  uint32_t out[kWarpLaneOutWords];
  // Set by a completion for a lane that read a lane outside the mask (undefined on a GPU): that
  // lane, which warp_collective then reports as the reading lane's fault. -1 otherwise.
  int read_outside_mask = -1;
};
// What else the lanes of one collective must agree on, and its completion reads: a shuffle's kind
// (ShuffleKind) and width; ldmatrix's .trans and mma's bf16 (rather than f16) inputs as `variant`.
struct WarpOpArgs {
  int variant = 0;
  int width = 32;
  bool operator==(const WarpOpArgs& o) const { return variant == o.variant && width == o.width; }
};
using WarpCompletion = void (*)(WarpLane (&lanes)[32], uint32_t mask, WarpOpArgs args);
void warp_collective(const char* op, uint32_t mask, WarpOpArgs args, const uint32_t* in, int in_words,
                     uint32_t* out, int out_words, WarpCompletion complete, const char* file, int line);

// Shared memory: the 32-bit address space of the current block's dynamic shared memory.
unsigned char* dynamic_shared_base();
uint32_t shared_address_of(const void* p, const char* file, int line);
unsigned char* shared_pointer_of(uint32_t address, int bytes, const char* file, int line);

// cp.async: the copy is recorded (its 16 source bytes read now), the destination poisoned, and
// the bytes land when a cp.async.wait_group covers its group.
void cp_async_16(void* shared_dst, const void* global_src, const char* file, int line);
void cp_async_commit();
void cp_async_wait(int pending_groups_allowed);

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 and mma.sync.aligned.m16n8k16.row.col
// (f32 accumulators, bf16 or f16 inputs) from the PTX ISA's fragment layouts (ptx.cpp).
void ldmatrix_x4(uint32_t (&r)[4], uint32_t shared_address, bool trans, const char* file, int line);
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool bf16,
                  const char* file, int line);

// A kernel-side error: stops the launch and reports kernel, block, thread and `what`.
[[noreturn]] void device_fault(const char* what, const char* file, int line);

template <class T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "warp shuffles move up to 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

enum class ShuffleKind : int { index = 0, up = 1, down = 2, bfly = 3 };
uint64_t shuffle(ShuffleKind kind, uint32_t mask, uint64_t value, int lane_arg, int width, const char* name,
                 const char* file, int line);
uint32_t vote_ballot(uint32_t mask, int predicate, const char* name, const char* file, int line);

}  // namespace mg_emu

// ---- barriers and warp collectives --------------------------------------------------------------
inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  mg_emu::sync_block(file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  mg_emu::vote_ballot(mask, 1, "__syncwarp", file, line);
}
inline unsigned __ballot_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  return mg_emu::vote_ballot(mask, predicate, "__ballot_sync", file, line);
}
inline int __any_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  return mg_emu::vote_ballot(mask, predicate, "__any_sync", file, line) != 0;
}
inline int __all_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  return mg_emu::vote_ballot(mask, predicate, "__all_sync", file, line) == mask;
}
template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
  return mg_emu::from_bits<T>(mg_emu::shuffle(mg_emu::ShuffleKind::index, mask, mg_emu::to_bits(var),
                                              src_lane, width, "__shfl_sync", file, line));
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
  return mg_emu::from_bits<T>(mg_emu::shuffle(mg_emu::ShuffleKind::up, mask, mg_emu::to_bits(var),
                                              static_cast<int>(delta), width, "__shfl_up_sync", file, line));
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
  return mg_emu::from_bits<T>(mg_emu::shuffle(mg_emu::ShuffleKind::down, mask, mg_emu::to_bits(var),
                                              static_cast<int>(delta), width, "__shfl_down_sync", file,
                                              line));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
  return mg_emu::from_bits<T>(mg_emu::shuffle(mg_emu::ShuffleKind::bfly, mask, mg_emu::to_bits(var),
                                              lane_mask, width, "__shfl_xor_sync", file, line));
}

// ---- atomics: really atomic across the worker threads that run blocks ---------------------------
// Fibers of one block never switch inside an atomic, so the builtins' atomicity across OS threads
// is all a kernel can observe.
template <class T>
inline T mg_emu_atomic_add(T* p, T v) {
  if constexpr (std::is_integral<T>::value) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
  } else {
    T old;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    T desired;
    do {
      desired = old + v;
    } while (!__atomic_compare_exchange(p, &old, &desired, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
  }
}
inline int atomicAdd(int* p, int v) { return mg_emu_atomic_add(p, v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return mg_emu_atomic_add(p, v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return mg_emu_atomic_add(p, v);
}
inline float atomicAdd(float* p, float v) { return mg_emu_atomic_add(p, v); }
inline double atomicAdd(double* p, double v) { return mg_emu_atomic_add(p, v); }
inline int atomicSub(int* p, int v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicSub(unsigned* p, unsigned v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }
template <class T>
inline T mg_emu_atomic_cas(T* p, T compare, T value) {
  __atomic_compare_exchange_n(p, &compare, value, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return compare;  // the old value either way
}
inline int atomicCAS(int* p, int c, int v) { return mg_emu_atomic_cas(p, c, v); }
inline unsigned atomicCAS(unsigned* p, unsigned c, unsigned v) { return mg_emu_atomic_cas(p, c, v); }
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long c, unsigned long long v) {
  return mg_emu_atomic_cas(p, c, v);
}
inline unsigned short atomicCAS(unsigned short* p, unsigned short c, unsigned short v) {
  return mg_emu_atomic_cas(p, c, v);
}
template <class T>
inline T mg_emu_atomic_exch(T* p, T v) {
  return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);
}
inline int atomicExch(int* p, int v) { return mg_emu_atomic_exch(p, v); }
inline unsigned atomicExch(unsigned* p, unsigned v) { return mg_emu_atomic_exch(p, v); }
inline unsigned long long atomicExch(unsigned long long* p, unsigned long long v) {
  return mg_emu_atomic_exch(p, v);
}
template <class T, class Better>
inline T mg_emu_atomic_extreme(T* p, T v, Better better) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (better(v, old) &&
         !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
template <class T>
inline T mg_emu_atomic_min(T* p, T v) {
  return mg_emu_atomic_extreme(p, v, [](T a, T b) { return a < b; });
}
template <class T>
inline T mg_emu_atomic_max(T* p, T v) {
  return mg_emu_atomic_extreme(p, v, [](T a, T b) { return a > b; });
}
inline int atomicMin(int* p, int v) { return mg_emu_atomic_min(p, v); }
inline unsigned atomicMin(unsigned* p, unsigned v) { return mg_emu_atomic_min(p, v); }
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
  return mg_emu_atomic_min(p, v);
}
inline long long atomicMin(long long* p, long long v) { return mg_emu_atomic_min(p, v); }
inline int atomicMax(int* p, int v) { return mg_emu_atomic_max(p, v); }
inline unsigned atomicMax(unsigned* p, unsigned v) { return mg_emu_atomic_max(p, v); }
inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) {
  return mg_emu_atomic_max(p, v);
}
inline long long atomicMax(long long* p, long long v) { return mg_emu_atomic_max(p, v); }
inline unsigned atomicOr(unsigned* p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicAnd(unsigned* p, unsigned v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- loads, reinterpretation, rounding-exact arithmetic ----------------------------------------
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
inline float __uint_as_float(unsigned u) { return mg_emu::from_bits<float>(u); }
inline unsigned __float_as_uint(float f) { return static_cast<unsigned>(mg_emu::to_bits(f)); }
inline float __int_as_float(int i) { return mg_emu::from_bits<float>(static_cast<uint32_t>(i)); }
inline int __float_as_int(float f) { return static_cast<int>(static_cast<uint32_t>(mg_emu::to_bits(f))); }
inline double __longlong_as_double(long long i) {
  return mg_emu::from_bits<double>(static_cast<uint64_t>(i));
}
inline long long __double_as_longlong(double d) { return static_cast<long long>(mg_emu::to_bits(d)); }
// The _rn intrinsics are IEEE operations rounded to nearest even, never contracted into an FMA:
// exactly what the host's SSE arithmetic does (the build compiles without -ffast-math or -mfma).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
// rsqrtf is accurate to 2 ulp on the GPU; here it is the correctly rounded 1/sqrt (via double).
inline float rsqrtf(float a) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(a))); }
inline double rsqrt(double a) { return 1.0 / std::sqrt(a); }
// The fast-math intrinsics (a few ulp on the GPU) as the accurate functions.
inline float __expf(float a) { return std::exp(a); }
inline float __logf(float a) { return std::log(a); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float a) { return a != a ? 0.f : (a < 0.f ? 0.f : (a > 1.f ? 1.f : a)); }
// CUDA's min/max overloads for device code: fminf/fmaxf for floats (a NaN loses), plain
// comparison for integers, both operands converted to their common type first.
template <class A, class B>
inline std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  if constexpr (std::is_floating_point<C>::value)
    return std::fmin(C(a), C(b));
  else
    return C(b) < C(a) ? C(b) : C(a);
}
template <class A, class B>
inline std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  if constexpr (std::is_floating_point<C>::value)
    return std::fmax(C(a), C(b));
  else
    return C(a) < C(b) ? C(b) : C(a);
}
[[noreturn]] inline void __trap(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  mg_emu::device_fault("__trap() executed", file, line);
}
inline size_t __cvta_generic_to_shared(const void* p, const char* file = __builtin_FILE(),
                                       int line = __builtin_LINE()) {
  return mg_emu::shared_address_of(p, file, line);
}

// ---- what the front end's rewrites call: <<<>>> launches, __shared__ declarations ---------------
#include "cuda_emu/cuda_syntax.h"

// ---- the twins of kernels/cuda/native.cuh (launch helper, inline PTX) --------------------------
#include "cuda_emu/native_twins.h"
