// What the launch path, the block scheduler and the emulated PTX tell the tracer (trace.cpp);
// the public side is cuda_emu/profiler.h. Internal to cuda_emu/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda_emu/emulator.h"
#include "cuda_emu/profiler.h"

namespace mg_emu {

struct LaunchTrace;  // one launch being traced (trace.cpp)
class BlockTrace;    // one block of it, on the OS thread that runs the block

// ---- the launch path (streams.cpp) -----------------------------------------------------------
// A trace for a launch made now, or nullptr when no profile is running.
std::shared_ptr<LaunchTrace> trace_new_launch(const Launch& launch);
bool trace_block_is_traced(const LaunchTrace& trace, uint64_t linear_block);
bool trace_skips_untraced_blocks(const LaunchTrace& trace);
// Every block has run: the DRAM models see the traced blocks in launch order.
void trace_launch_done(LaunchTrace& trace);

// ---- the block scheduler (block_scheduler.cpp) -------------------------------------------------
// Traces one block on the calling OS thread from construction to finish().
class BlockTraceScope {
 public:
  BlockTraceScope(LaunchTrace* trace, uint64_t linear_block, int threads, const void* dynamic_shared,
                  size_t dynamic_shared_bytes);
  ~BlockTraceScope();
  BlockTraceScope(const BlockTraceScope&) = delete;
  BlockTraceScope& operator=(const BlockTraceScope&) = delete;
  void finish(size_t static_shared_bytes);  // the block ran to its end without a fault

 private:
  std::unique_ptr<BlockTrace> block_;
  BlockTrace* outer_ = nullptr;
};

// The block being traced on this OS thread, or nullptr (the hot check of every callback).
extern thread_local BlockTrace* t_block_trace __attribute__((tls_model("initial-exec")));

void trace_switch_thread(int linear_thread);                  // the scheduler resumed this thread
void trace_barrier_opened();                                  // every request before it is complete
void trace_static_shared(const void* storage, size_t bytes);  // a __shared__ array of this block
void trace_async_wait(double round_trips);                    // a cp.async.wait_group that waits
void trace_block_entered(uintptr_t pc);  // a CPU basic block of a kernel began (trace_hooks.cpp)

// ---- call sites (site_names.cpp) ------------------------------------------------------------------
// Each instrumented call site as "file.cu:line" ("common.cuh:66 < softmax.cu:120" when inlined
// from a header); sites addr2line cannot name are left out.
std::map<uintptr_t, std::string> site_names(const std::vector<uintptr_t>& pcs);
// The innermost "file.cu:line" of each (empty where unknown), cached for the process.
std::vector<std::string> site_lines(const std::vector<uintptr_t>& pcs);

// ---- instruction counts (ptx_compile.cpp) --------------------------------------------------------
// The widest vector shared-memory load and store nvcc emitted on each source line of the kernel
// at `kernel`, in bytes per lane (ld.shared.v4.f32: 16), by innermost "file.cu:line" (lines
// without one are absent); empty when its PTX cannot be had (no nvcc, no source). Compiles the
// kernel's file on first use (cached).
struct SharedWidths {
  unsigned load = 0;
  unsigned store = 0;
};
std::map<std::string, SharedWidths> shared_access_widths(const void* kernel);

// Fills r.instructions from the PTX of the kernel at `kernel` and the sites the tracer resolved.
// `lines_run`: the kernel's source lines (innermost "file.cu:line") that began a CPU basic block,
// with the warp executions of the most-run such block.
void count_launch_instructions(profile::LaunchProfile& r, const void* kernel,
                               const std::map<std::string, double>& lines_run);

// ---- the memcheck (MG_EMU_MEMCHECK=1, instrumented kernels only) --------------------------------
// Set by the block scheduler while it runs a block and the memcheck is on: every instrumented
// load and store is then checked against the device allocations' guard bytes.
extern thread_local bool t_memcheck __attribute__((tls_model("initial-exec")));
bool memcheck_enabled();  // MG_EMU_MEMCHECK, read once
// A load or store of `bytes` at `address` from the instruction at `site`: a fault naming the
// instruction's file:line when it reaches past the end of a device allocation.
void memcheck_access(const void* address, unsigned bytes, profile::Op op, uintptr_t site);

// ---- accesses ------------------------------------------------------------------------------------
// From the compiler's instrumentation (trace_hooks.cpp): `site` is the call's return address.
void trace_access(const void* address, unsigned bytes, profile::Op op, uintptr_t site);
// From the emulated PTX (cp.async, ldmatrix, mma; ptx.cpp, block_scheduler.cpp), named by file:line.
// `part` tells apart the two accesses one instruction makes (cp.async: global read 0, shared write 1).
void trace_emulated(const void* address, unsigned bytes, profile::Op op, const char* file, int line,
                    int part = 0);

// A library call (cuBLAS, cuDNN: reference loops here, not traced kernels) made now, while a
// profile runs: recorded as a launch with the FLOPs and the bytes it must move (read each input,
// write each output once), which the H200 model prices at its roofline.
void trace_library_call(const char* name, double flops, bool tensor_cores, double ideal_bytes);

// The instrumented translation units announce themselves (their constructors call __tsan_init).
void trace_note_instrumented_code();

}  // namespace mg_emu
