// The emulator as a GPU profiler: what the memory system would do for each kernel launch.
//
// In the emulation build the kernels are also compiled a second time with the compiler's memory-
// access instrumentation (g++ -fsanitize=thread, without the ThreadSanitizer runtime: the
// callbacks are cuda_emu/trace_hooks.cpp) into libmultigrad_traced, which bench_kernels and the
// profiling tests link. Every load, store and atomic a kernel makes then reaches the emulator with
// its address, width and call site; libmultigrad itself (and every other test) is untouched.
//
// Between begin() and end(), each launch is traced (cuda_emu/trace.cpp): the accesses the lanes of
// one warp make at the same dynamic instance of one instruction (same call site, same occurrence
// in each lane) form one request, as the hardware forms it. Per instruction and per launch:
//   global memory  requests and the 32-byte sectors they touch (Nsight Compute:
//                  l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum, ..._requests_...); sector
//                  efficiency = distinct bytes the lanes asked for / (sectors x 32);
//   shared memory  requests and wavefronts: 32 banks of 4 bytes, a request takes as many
//                  wavefronts as the most distinct words one bank must serve (a word many lanes
//                  read is a broadcast: free); `ideal_wavefronts` is what the bytes need at best;
//   caches         the global requests replayed through one L1 per SM and an L2 (cache_model.h:
//                  resident blocks interleaved as they run): sectors L1 served and sectors that
//                  reached L2; DRAM bytes as each sector's first touch (an infinite L2) and as the
//                  misses and dirty evictions of an L2 of the GPU's size in hashed 16-way sets
//                  (the H200's 50 MB unless Options says otherwise), cold at each launch;
//   tensor cores   mma.m16n8k16, ldmatrix.x4 and cp.async instructions (warp-level).
// Tracing every block of a big grid is slow: Options::max_traced_blocks traces the first blocks
// in launch order and scales the request counts by blocks / traced_blocks (LaunchProfile::scale);
// DRAM bytes are extrapolated from the steady state of the traced blocks (trace.cpp says how).
//
// These are counts of what the kernel asks for and of what the caches would serve: no timing.
// Turning them into a GPU's time is cuda_emu/gpu_model.h. docs/performance-model.md explains both.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_emu/gpu_spec.h"

namespace mg_emu::profile {

struct Options {
  uint64_t max_traced_blocks = 0;     // per launch: trace the first N blocks; 0 = every block
  uint64_t min_traced_rows = 0;       // but at least this many whole rows (grid.x blocks each) of a
                                      // 2-D grid: blocks of different rows share inputs (a GEMM's B)
  bool skip_untraced_blocks = false;  // run only the traced blocks (the outputs are then wrong:
                                      // for counting shapes too big to emulate whole)
  const GpuSpec* gpu = nullptr;       // whose L2 the cache model takes (l2_capacity_bytes, l2_ways):
                                      // nullptr = default_gpu_spec() (MG_EMU_GPU, else the H200)
  uint64_t l2_bytes = 0;              // > 0: a fully associative LRU L2 of this many bytes instead
                                      // of the GPU's hashed sets (tests)
  // Count every launch's warp instructions by kind from nvcc's PTX of the kernel's source file
  // (ptx_count.h): needs nvcc (MG_EMU_NVCC, else the one found at configure time), costs a few
  // seconds per source file the first time (the PTX is cached, see ptx_compile.cpp). Also on with
  // MG_EMU_INSTRUCTIONS=1.
  bool count_instructions = false;
};

enum class Space : uint8_t { global, shared, none };
enum class Op : uint8_t { load, store, atomic, ldmatrix, mma, cp_async };
const char* name_of(Op op);

// One kind of access: summed over requests (warp-level) of the traced blocks.
struct AccessCounts {
  double requests = 0;
  double lanes = 0;             // lane-level accesses
  double bytes = 0;             // distinct bytes the lanes of each request asked for, summed
  double sectors = 0;           // global: 32-byte sectors the requests touched
  double wavefronts = 0;        // shared: bank wavefronts; global: passes through the L1 data
                                // array: per request, the most sectors in one of
                                // the 4 places of a 128-byte line (at least 1)
  double ideal_wavefronts = 0;  // shared: ceil(distinct words / 32) per request
  double lane_bytes = 0;        // bytes each lane asked for, summed over lanes (overlaps counted)
  void add(const AccessCounts& o);
};

// One instruction (call site) of one launch, over the traced blocks (not scaled).
struct SiteCounts {
  std::string where;  // "softmax.cu:120", resolved from the call site when the profile ends
  Space space = Space::none;
  Op op = Op::load;
  AccessCounts counts;
};

// The warp instructions of a launch by the unit that executes them (ptx_count.h says how counted).
enum class InstructionKind : uint8_t {
  fp32,           // FFMA, FADD, FMUL, FMNMX, FSETP: the FP32 pipe
  fp16,           // half and bfloat16 arithmetic (packed pairs)
  fp64,           // double arithmetic
  integer,        // IADD3, IMAD, LOP3, SHF, ISETP, SEL, PRMT, vote: the integer pipe
  conversion,     // F2I, I2F, F2F: the conversion pipe (quarter rate)
  special,        // MUFU: exp2, log2, rcp, rsqrt, sin, cos, tanh (quarter rate)
  global_memory,  // LDG, STG, ATOMG, RED, LDGSTS (cp.async)
  shared_memory,  // LDS, STS, ATOMS, LDSM (ldmatrix)
  local_memory,   // LDL, STL: spills and stack arrays (not traced)
  tensor,         // HMMA (mma.sync)
  warp,           // SHFL, MATCH, REDUX
  barrier,        // BAR, MEMBAR, DEPBAR (cp.async waits)
  branch,         // BRA, EXIT, CALL, RET
  other,
};
constexpr size_t kInstructionKinds = 14;
const char* name_of(InstructionKind kind);

struct InstructionMix {
  bool counted = false;  // false: `why` says why not
  std::string why;       // "nvcc not found", "no PTX entry named ... in softmax.cu", ...
  std::string source;    // "softmax.cu (PTX for sm_90)"
  double warp_instructions[kInstructionKinds] = {};  // over the whole grid (scaled like the counts)
  double inherited = 0;  // of the total: counted in blocks without an anchor (ptx_count.h)
  // A warp's own clocks, summed over every warp: each block run the longer of its issue and its
  // chain of dependent instructions (ptx_count.h: block_cycles), as if the warp ran alone.
  double warp_cycles = 0;
  // Global-load round trips, summed over every warp: the levels of dependent ld.global, carried
  // through the blocks between loop edges (ptx_count.h: load_round_trips). Several copies of a load
  // (an unrolled loop, its guarded copies in blocks of their own) are one level; < 0 = not counted.
  double load_round_trips = -1;
  int registers_per_thread = 0;  // ptxas -v for sm_90; 0 = unknown
  int stack_bytes = 0;           // ptxas -v: bytes of stack frame per thread, in local memory
  double total() const;
  double of(InstructionKind kind) const { return warp_instructions[static_cast<size_t>(kind)]; }
};

struct LaunchProfile {
  std::string kernel;  // "mg::kernels::cuda::{anonymous}::softmax_rows_kernel<float>"
  dim3 grid, block;
  uint64_t blocks = 0, traced_blocks = 0;
  uint64_t shared_bytes_per_block = 0;  // dynamic + static __shared__ arrays
  double scale = 1;                     // blocks / traced_blocks: the counts below are scaled
  AccessCounts global_load, global_store, global_atomic, shared_load, shared_store, shared_atomic;
  double mma = 0, ldmatrix = 0, cp_async = 0;  // warp-level instructions
  // Memory round trips, summed over warps (each warp: its slowest lane). A warp's global loads
  // are one round trip until an instruction repeats or a barrier passes: loads of different
  // instructions between two such points (an unrolled loop, a tile's A and B) can be in flight
  // together, while a loop's next iteration is taken to wait for the last one's data (in-order
  // issue stalls at its first use). cp.async loads are not round trips; a cp.async.wait_group that
  // lands g of the n groups in flight is g / n of one (a pipeline n deep hides n - 1 of n).
  double load_round_trips = 0;
  double async_round_trips = 0;  // of load_round_trips, the cp.async waits' (the PTX count replaces
                                 // the rest: InstructionMix::load_round_trips)
  double barriers = 0;           // __syncthreads() passed, summed over the blocks
  double tensor_flops = 0;       // 2 * 16 * 8 * 16 per mma.m16n8k16
  double dram_read_first_touch = 0, dram_write_first_touch = 0;  // bytes, infinite L2
  double dram_read_lru = 0, dram_write_lru = 0;  // bytes, through the GPU's L2 (or Options::l2_bytes')
  // The caches (cache_model.h): load sectors an SM's L1 served, and the sectors that reached L2
  // (what the model's L2 limit prices): L1 misses, cp.async, stores and atomics.
  double l1_hit_sectors = 0, l2_sectors = 0;
  // Of the L1 hits, those on a sector another warp's same instruction had just missed: on their
  // way from L2, waited for as long as a miss (the latency limit), though L2 serves them once.
  double l1_pending_sectors = 0;
  std::vector<SiteCounts> sites;  // most sectors/wavefronts first
  // A cuBLAS or cuDNN call rather than a kernel (the emulator runs reference loops for those, not
  // traced): `kernel` is its name, nothing above is counted but the DRAM bytes, which are the
  // call's ideal bytes, and the FLOPs below. The GPU model prices it at its roofline.
  bool library = false;
  double fp32_flops = 0;
  InstructionMix instructions;  // with Options::count_instructions
  std::string kernel_symbol;    // the kernel's demangled C++ name with parameters, when resolved

  double dram_bytes_first_touch() const { return dram_read_first_touch + dram_write_first_touch; }
  double dram_bytes_lru() const { return dram_read_lru + dram_write_lru; }
};

// True when this program's kernels were compiled with access tracing (it links libmultigrad_traced).
bool available();
// Starts tracing every launch made from now on, on every emulated device.
void begin(const Options& options = Options{});
// Waits for every emulated device, stops tracing and returns one profile per launch, in launch order.
std::vector<LaunchProfile> end();

}  // namespace mg_emu::profile
