// The kernel lab: the memory-bound row kernels, softmax forward over the last axis
// (kernels/cuda/softmax_ladder.cu) and layer norm forward (kernels/cuda/layer_norm_ladder.cu), and
// the attention forward (kernels/cuda/attention_ladder.cu, at the end of this header), each as a
// ladder of versions, in the manner of llm.c's dev/cuda. Every rung computes exactly what the
// CPU kernel computes (kernels/cpu/softmax.h, kernels/cpu/layer_norm.h) for f32 rows; each is a
// step faster than the one before, and the two ladder files' opening comments say what each step
// buys (bytes, FLOPs, what limits it). benchmarks/bench_kernels/kernel_lab.cpp (family "lab")
// measures every rung, and with --profile prints its counters and its predicted H200 time.
//
//   naive      one thread per row, three passes over the row (4-byte loads; a warp's 32 lanes
//              read 32 different rows: 32 sectors per request)
//   warp       one warp per row: coalesced 4-byte sweeps, reductions by shuffles only (no shared
//              memory, no __syncthreads)
//   block      one block per row, three coalesced sweeps, block reductions through shared memory
//              (the production design before the lab)
//   online     16-byte loads (scalar head and tail), ONE sweep for the statistics (softmax: the
//              online max and rescaled sum; layer norm: Welford's mean and M2), then the write
//              sweep: the row is read twice, the second time from L2
//   registers  the row held in registers as 16-byte packs, read from DRAM once, the statistics
//              from the registers: THE PRODUCTION KERNELS' ALGORITHM (kernels/cuda/softmax.cu,
//              layer_norm.cu: a warp per row up to 32 x 8 packs, a block per row up to 1024 x 8,
//              every floating dtype); a row too long for the registers takes the online design.
//              Each ladder has its own f32 versions of the top two rungs (float4 loads; a warp per
//              row up to 1024 floats for registers), beside the production kernels they teach
//
// The lab's entry points take f32 only (the production ones take f32, f64, f16 and bf16).
// Host-only header (no CUDA includes). The functions are defined in CUDA builds only
// (kernels/cuda/*.cu are compiled only when MG_HAS_CUDA).
#pragma once

#include <cstdint>
#include <string>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/cuda/stream.h"
#include "kernels/kernel_args.h"

namespace mg::kernels::cuda {

enum class RowKernel { naive, warp, block, online, registers };

inline const char* row_kernel_name(RowKernel k) {
  switch (k) {
    case RowKernel::naive: return "naive";
    case RowKernel::warp: return "warp";
    case RowKernel::block: return "block";
    case RowKernel::online: return "online";
    case RowKernel::registers: return "registers";
  }
  return "unknown";
}

// Every rung, in ladder order (the production kernel last).
constexpr RowKernel kAllRowKernels[] = {RowKernel::naive, RowKernel::warp, RowKernel::block,
                                        RowKernel::online, RowKernel::registers};

// softmax (log_softmax with `log`) over each of `rows` contiguous rows of `dim` f32 values, with the
// chosen rung, queued on `stream` of the current device. x and y may not overlap.
void softmax_lab(cudaStream_t stream, RowKernel rung, int64_t rows, int64_t dim, const float* x, float* y,
                 bool log);

// layer norm over each of `rows` contiguous rows of `cols` f32 values (kernels/cpu/layer_norm.h:
// weight and bias may be null; mean and rstd per row), with the chosen rung.
void layer_norm_lab(cudaStream_t stream, RowKernel rung, int64_t rows, int64_t cols, const float* x,
                    const float* weight, const float* bias, double eps, float* y, float* mean, float* rstd);

// ---- the production side of the two top rungs (softmax.cu, layer_norm.cu) ------------------------
// The production forward of kernels.h with its design forced: `online` true takes the online
// (streaming) design even for a row that fits in registers; false is kernels.h's function (the
// registers design, or online for a row too long for them). Any floating dtype. The labs' rungs
// `online` and `registers` are the ladders' own teaching kernels; bench_kernels measures these
// beside them (softmax/production, layer_norm/production).
void softmax_rows_forward(cudaStream_t stream, DType dtype, int64_t rows, int64_t dim, const void* x, void* y,
                          bool log, bool online);
void layer_norm_rows_forward(cudaStream_t stream, DType dtype, const void* x, const void* weight,
                             const void* bias, int64_t rows, int64_t cols, double eps, void* y, void* mean,
                             void* rstd, bool online);

// ---- the attention ladder (kernels/cuda/attention_ladder.cu has each rung's design) ------------
//   naive               three kernels, the [Tq, Tk] scores written to DRAM and read back
//   row                 a block per query row, its scores in shared memory; K and V read per row
//   flash_cuda_cores    the production CUDA-core kernel: 16-row blocks, K/V tiles, online softmax
//   flash_tensor_cores  the production tensor-core kernel (bf16): mma.sync, ldmatrix, cp.async
enum class AttentionRung { naive, row, flash_cuda_cores, flash_tensor_cores };

inline const char* attention_rung_name(AttentionRung r) {
  switch (r) {
    case AttentionRung::naive: return "naive";
    case AttentionRung::row: return "row";
    case AttentionRung::flash_cuda_cores: return "flash_cuda_cores";
    case AttentionRung::flash_tensor_cores: return "flash_tensor_cores";
  }
  return "unknown";
}

constexpr AttentionRung kAllAttentionRungs[] = {AttentionRung::naive, AttentionRung::row,
                                                AttentionRung::flash_cuda_cores,
                                                AttentionRung::flash_tensor_cores};

// The attention forward of kernels/cpu/attention.h without dropout, with the chosen rung: q [B, H,
// Tq, D], k and v [B, H, Tk, D], o [B, H, Tq, D], all contiguous, f32 or bf16 (flash_tensor_cores:
// bf16 with D = 64 or 128); lse [B, H, Tq] f32. `scores`: B H Tq Tk floats of workspace for the naive
// rung (the others take nullptr).
void attention_lab(cudaStream_t stream, AttentionRung rung, DType dtype, const AttentionProblem& p,
                   const void* q, const void* k, const void* v, void* o, float* lse, float* scores);

}  // namespace mg::kernels::cuda
