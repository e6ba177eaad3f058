// Cross-entropy (fused with log-softmax) on the GPU. Semantics: kernels/cpu/cross_entropy.h.
//
// Decomposition: one block per row of logits, ONE sweep (row_online_lse, online_softmax.cuh). Each
// thread keeps the online log-sum-exp of the logits it reads -- a running max
// m and sum(exp(x - m)), the sum multiplied by exp(m_old - m_new) whenever m
// grows (and, with label smoothing, sum(x - m), shifted by count * (m_old -
// m_new)) -- and the block merges the threads' states with the same rule
// (warp shuffles, then one state per warp in shared memory): m = max(m_a,
// m_b), s = s_a exp(m_a - m) + s_b exp(m_b - m). The row is read as 16-byte
// packs (row_packs.cuh's cut, as the online softmax: a loose head up to the
// first 16-byte boundary -- a row of 50257 f32 starts wherever row * 50257
// puts it --, packs of 4 f32 / 2 f64 / 8 f16,bf16 strided over the threads,
// four in flight a thread, then a loose tail; the backward also writes packs,
// when its gradients are misaligned like the logits, else both go element by
// element). So each thread sums its logits in another order than the CPU
// (and than the element-strided sweep before), within the tests' tolerances;
// ignore_index, smoothing and the special values are unchanged (the online
// rule is exact for them in any order). The forward writes ONE loss
// per row (no [rows, classes] log-probabilities in memory) and saves the row's
// (m, log s) in a [rows, 2] f32 (f64 for f64) tensor, as layer norm saves mean
// and rstd: two numbers, not m + log s, because every use subtracts a logit
// first and (x - m) - log s keeps digits that x - (m + log s) loses when |m|
// is large (the CPU's rule). The backward then reads each logit once and
// writes each gradient once: g * (exp((x - m) - log s) - eps/C - (1 - eps)[j == t]).
// Its entry point still takes no stats (the stats are then recomputed first in
// the same kernel: one more read).
//
// Cost. Over [rows, C] (C = 50257, GPT-2's vocabulary, 201 KB per f32
// row): forward reads the logits once from DRAM (4 C bytes per f32 row, plus 8
// to 16 bytes of loss and stats written), one exp and ~4 FLOPs per logit (6 with
// smoothing), and a second exp only when a thread's running max grows (about
// ln(C / 256) ~ 5 times per thread on random logits, every element on a
// row sorted ascending). Backward: one read and one write, 8 C bytes per f32
// row, one exp and ~5 FLOPs per logit. Before the online sweep the forward
// read each row twice (max, then sum) and the backward three times (max, sum,
// write pass): 8 C -> 4 C bytes forward, 16 C -> 8 C backward. With 4-byte
// lanes over unaligned rows the H200 model (bench_kernels --profile, f32
// [1335, 50257]) had both bound by bytes in flight, 4.87 sectors a request
// (82% sector efficiency). With the packs: 16.5 sectors a request (97%),
// DRAM-bound; docs/kernels.md has the predicted times. Not measured on a GPU yet: at HBM speed (H200: ~4.8
// TB/s, ~1.2 T f32 logits/s) the expf per logit (one MUFU.EX2 and a few FMAs) stays under the
// special-function units' ~4 T/s (132 SMs x 16 per clock).
//
// Arithmetic in float for f32/f16/bf16 and double for f64, like the CPU.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/online_softmax.cuh"
#include "kernels/cuda/row_packs.cuh"
#include "kernels/cuda/workspace.h"

namespace mg::kernels::cuda {
namespace {

// status[0]: rows counted (not ignored); status[1]: the first row with a bad
// target (rows when none); status[2]: that row's target (cross_entropy_finish_kernel).
// stats (may be null): per counted row, its max and log(sum(exp(x - max))), for the backward.
template <class T>
__global__ void cross_entropy_forward_kernel(int64_t rows, int64_t classes, const T* logits,
                                             const int64_t* targets, int64_t ignore_index, double smoothing,
                                             T* losses, acc_t<T>* stats, unsigned long long* status,
                                             bool vector) {
  using A = acc_t<T>;
  const A eps = A(smoothing);
  const bool smooth = eps > A(0);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t t = targets[row];
    const bool ignored = t == ignore_index;
    if (!ignored && (t < 0 || t >= classes)) {
      if (threadIdx.x == 0) atomicMin(status + 1, static_cast<unsigned long long>(row));
      continue;  // uniform across the block: every thread read the same t
    }
    if (ignored) {
      if (threadIdx.x == 0) store(losses + row, A(0));
      continue;
    }
    const T* x = logits + row * classes;
    const OnlineLse<A> r = row_online_lse(x, classes, smooth, vector);
    if (threadIdx.x == 0) {
      // As the CPU: logsumexp kept as m + log_s and every logit shifted by m first
      // ((m - x) + log_s, not (m + log_s) - x, which loses digits when |m| is large), and the
      // smoothing term only when eps > 0 -- with -inf (masked) logits it is +inf, and 0 * inf
      // would turn a finite loss into NaN.
      const A m = r.max, log_s = log_(r.sum);
      A loss = log_s - (A(load(x + t)) - m);
      if (smooth) loss = (A(1) - eps) * loss + eps * (log_s - r.shifted / A(classes));
      store(losses + row, loss);
      if (stats != nullptr) {
        stats[2 * row] = m;
        stats[2 * row + 1] = log_s;
      }
      atomicAdd(status, 1ull);
    }
  }
}

// status = {0 rows counted, no bad row yet (rows), no value}.
__global__ void cross_entropy_status_init_kernel(unsigned long long* status, int64_t rows) {
  status[0] = 0;
  status[1] = static_cast<unsigned long long>(rows);
  status[2] = 0;
}

// After the forward: the count as a float for the mean's divisor (exact up to 2^24 rows), and the
// bad row's target value for the deferred error message (the targets may be gone by then).
__global__ void cross_entropy_finish_kernel(unsigned long long* status, const int64_t* targets, int64_t rows,
                                            float* counted) {
  counted[0] = static_cast<float>(status[0]);
  if (status[1] < static_cast<unsigned long long>(rows))
    status[2] = static_cast<unsigned long long>(targets[status[1]]);
}

// The gradients from the row's stats: what the backward's pack and loose stores take.
template <class T>
struct CrossEntropyGrad {
  using A = acc_t<T>;
  static constexpr int V = pack_width<T>();
  A m, log_s, uniform, hit, g;  // hit: 1 - eps, taken off at the target
  int64_t t;
  __device__ __forceinline__ A one(A x, int64_t col) const {
    A d = exp_((x - m) - log_s) - uniform;
    if (col == t) d -= hit;
    return g * d;
  }
  __device__ __forceinline__ Pack<T, V> pack(const Pack<T, V>& x, int64_t col) const {
    Pack<T, V> y;
    MG_ROW_UNROLL
    for (int j = 0; j < V; ++j) store(&y.v[j], one(A(load(&x.v[j])), col + j));
    return y;
  }
};

// grad[j] = g * (exp((x_j - m) - log_s) - eps / classes - (1 - eps) [j == t]): one read of the
// row and one write with the forward's stats; without them (null), the row's stats first, from
// the same single online sweep (two reads). Reads and writes go as 16-byte packs (the row's cut,
// as row_online_lse's: `vector` when logits and gradients are misaligned alike), four packs a
// thread in flight.
template <class T>
__global__ void cross_entropy_backward_kernel(int64_t rows, int64_t classes, const T* logits,
                                              const int64_t* targets, int64_t ignore_index, double smoothing,
                                              const acc_t<T>* stats, const T* grad_losses, T* grad_logits,
                                              bool vector) {
  using A = acc_t<T>;
  constexpr int V = pack_width<T>(), U = kRowStreamUnroll;
  const int threads = static_cast<int>(blockDim.x), rank = static_cast<int>(threadIdx.x);
  const A eps = A(smoothing);
  const A uniform = eps / A(classes);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t t = targets[row];
    const T* x = logits + row * classes;
    T* gx = grad_logits + row * classes;
    const RowCut cut = row_cut(x, classes, vector);  // gx's too: misaligned alike when vector
    const int64_t loose = loose_column<T>(cut, rank);
    // Ignored rows (and, defensively, out-of-range targets, which the forward
    // already refused) get a zero gradient.
    if (t == ignore_index || t < 0 || t >= classes) {
      Pack<T, V> zero;
      MG_ROW_UNROLL
      for (int j = 0; j < V; ++j) store(&zero.v[j], A(0));
      for (int64_t q = rank; q < cut.packs; q += threads) store_row_pack(gx + cut.head + q * V, zero, vector);
      if (loose >= 0) store(gx + loose, A(0));
      continue;
    }
    A m, log_s;
    if (stats != nullptr) {
      m = stats[2 * row];
      log_s = stats[2 * row + 1];
    } else {
      const OnlineLse<A> r = row_online_lse(x, classes, false, vector);
      m = r.max;
      log_s = log_(r.sum);
    }
    const CrossEntropyGrad<T> f{m, log_s, uniform, A(1) - eps, A(load(grad_losses + row)), t};
    map_row_packs<U, A>(gx, x, cut, loose, rank, threads, vector, f);
  }
}

}  // namespace

void cross_entropy_forward_counted(cudaStream_t stream, DType dtype, const void* logits,
                                   const int64_t* targets, int64_t rows, int64_t classes,
                                   int64_t ignore_index, double label_smoothing, void* losses,
                                   void* row_stats, float* counted, void* check_words) {
  MG_CHECK(label_smoothing >= 0.0 && label_smoothing < 1.0,
           "cross_entropy (CUDA): label_smoothing must be in [0, 1), got ", label_smoothing);
  MG_CHECK(classes > 0 || rows == 0, "cross_entropy (CUDA): no classes");
  static_assert(kCrossEntropyCheckWords == 3, "rows counted, the first row with a bad target, its value");
  unsigned long long* status = static_cast<unsigned long long*>(check_words);
  launch_kernel<cross_entropy_status_init_kernel>(1, 1, 0, stream, status, rows);
  if (rows > 0) {
    visit_float(dtype, "cross_entropy", [&](auto t) {
      using T = typename decltype(t)::type;
      launch_kernel<cross_entropy_forward_kernel<T>>(
          row_grid(rows), row_block(classes), 0, stream, rows, classes, static_cast<const T*>(logits),
          targets, ignore_index, label_smoothing, static_cast<T*>(losses), static_cast<acc_t<T>*>(row_stats),
          status, rows_vector_ok(logits, logits, sizeof(T)));
    });
  }
  launch_kernel<cross_entropy_finish_kernel>(1, 1, 0, stream, status, targets, rows, counted);
}

std::string cross_entropy_target_error(const void* host_check_words, int64_t rows, int64_t classes,
                                       int64_t ignore_index) {
  const auto* w = static_cast<const unsigned long long*>(host_check_words);
  if (w[1] >= static_cast<unsigned long long>(rows)) return "";
  return str_cat("cross_entropy: target ", static_cast<int64_t>(w[2]), " of row ", w[1],
                 " is out of range [0, ", classes, ") (and is not ignore_index ", ignore_index,
                 "); found by the CUDA kernel, reported at the next synchronisation (as PyTorch's "
                 "device-side asserts are)");
}

int64_t cross_entropy_forward(cudaStream_t stream, ScratchAllocator& scratch, DType dtype, const void* logits,
                              const int64_t* targets, int64_t rows, int64_t classes, int64_t ignore_index,
                              double label_smoothing, void* losses, void* row_stats) {
  if (rows == 0) return 0;
  // The check words, then the count (a float, after the 8-byte words): one buffer, one copy back.
  constexpr size_t kWordBytes = kCrossEntropyCheckWords * sizeof(unsigned long long);
  Workspace buffer(scratch, kWordBytes + sizeof(float));
  unsigned char* device = static_cast<unsigned char*>(buffer.get());
  cross_entropy_forward_counted(stream, dtype, logits, targets, rows, classes, ignore_index, label_smoothing,
                                losses, row_stats, reinterpret_cast<float*>(device + kWordBytes), device);
  unsigned long long host[kCrossEntropyCheckWords + 1] = {};
  MG_CUDA_CHECK(cudaMemcpyAsync(host, device, kWordBytes + sizeof(float), cudaMemcpyDeviceToHost, stream));
  MG_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::string error = cross_entropy_target_error(host, rows, classes, ignore_index);
  if (!error.empty()) throw Error(error);  // a bad target throws here, at the call
  float counted = 0;
  std::memcpy(&counted, host + kCrossEntropyCheckWords, sizeof(float));
  return static_cast<int64_t>(counted);
}

void cross_entropy_backward(cudaStream_t stream, DType dtype, const void* logits, const int64_t* targets,
                            int64_t rows, int64_t classes, int64_t ignore_index, double label_smoothing,
                            const void* grad_losses, void* grad_logits, const void* row_stats) {
  if (rows == 0 || classes == 0) return;
  visit_float(dtype, "cross_entropy backward", [&](auto t) {
    using T = typename decltype(t)::type;
    launch_kernel<cross_entropy_backward_kernel<T>>(
        row_grid(rows), row_block(classes), 0, stream, rows, classes, static_cast<const T*>(logits), targets,
        ignore_index, label_smoothing, static_cast<const acc_t<T>*>(row_stats),
        static_cast<const T*>(grad_losses), static_cast<T*>(grad_logits),
        rows_vector_ok(logits, grad_logits, sizeof(T)));
  });
}

}  // namespace mg::kernels::cuda