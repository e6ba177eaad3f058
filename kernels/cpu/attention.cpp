// Fused attention on the CPU: FlashAttention-2's tiling and online softmax, forward and backward.
//
// Why: the composed path (matmul, mul, where, softmax, dropout, matmul) writes the [Tq, Tk] score
// matrix of every head several times and keeps one copy until backward: O(B H Tq Tk) bytes. Here
// a work item owns one tile of kBr query rows of one (batch, head); K and V stream through in
// tiles of kBc keys, and only O ([Tq, D]) and one log-sum-exp per row leave the item. Per thread
// the scores never exceed one kBr x kBc tile (16 KiB in f32).
//
// Online softmax (docs/attention.md derives it): a row keeps its running max m, the running sum
// l = sum_j exp(S_j - m) and the unnormalised output acc = sum_j exp(S_j - m) v_j. A new tile with
// max m_t gives m' = max(m, m_t); the old terms are rescaled by alpha = exp(m - m'):
//   l' = alpha l + sum_{j in tile} exp(S_j - m'),  acc' = alpha acc + sum_{j in tile} exp(S_j - m') v_j
// and at the end O = acc / l, LSE = m + log l. The result is exact softmax(S) v, tile by tile.
// With dropout the sum l takes the undropped exp (the softmax normaliser); only acc takes the
// dropped and rescaled weights, so O = (P * keep / (1 - p)) v as in the composed path.
//
// Backward (FlashAttention-2): delta_i = sum_d dO_id O_id first (= rowsum(P~ * dP~), dropout
// included); then P is rebuilt from S and the saved LSE, P = exp(S - LSE), and
//   dV = P~^T dO,  dP~ = dO V^T,  dS = P * (dP~ * z - delta)  (z = keep / (1 - p), or 1),
//   dQ = scale dS K,  dK = scale dS^T Q.
// Two passes keep every write private to one thread with no reduction: over (b, h, key tile) for
// dK and dV, then over (b, h, query tile) for dQ; each rebuilds its P and dP tiles (the price:
// the QK^T and dO V^T products are computed twice).
//
// Cost, one head, causal = false: forward 4 Tq Tk D flops (QK^T and PV) plus Tq Tk exps; backward
// 4 products of 2 Tq Tk D in the first pass and 3 in the second (14 Tq Tk D flops) plus 2 Tq Tk
// exps. Causal skips key tiles wholly above the diagonal: about half of everything. DRAM bytes:
// forward reads Q once and K, V once per query tile (ceil(Tq / kBr) times), writes O and LSE;
// nothing of size Tq x Tk is ever read or written.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/philox.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel_for.h"

namespace mg::kernels::cpu {

namespace {

constexpr int64_t kBr = 64;  // query rows per work item
constexpr int64_t kBc = 64;  // keys per streamed tile (also the row pitch of every score tile)
// Below this many multiply-adds (B H Tq Tk D), one thread is faster than waking the others.
constexpr int64_t kAttentionMinParallelWork = int64_t{1} << 20;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <class T>
struct Operand {
  const T* base;
  AttentionStrides s;
  const T* row(int64_t b, int64_t h, int64_t t) const { return base + b * s.batch + h * s.head + t * s.row; }
};

// dst[r * D + c] = x[b, h, t0 + r, c] for r < n: a tile in the accumulation type, row-major.
template <class T, class Acc>
void load_rows(const Operand<T>& x, int64_t b, int64_t h, int64_t t0, int64_t n, int64_t D, Acc* dst) {
  for (int64_t r = 0; r < n; ++r) {
    const T* src = x.row(b, h, t0 + r);
    Acc* d = dst + r * D;
    for (int64_t c = 0; c < D; ++c) d[c] = static_cast<Acc>(src[c]);
  }
}

// dst[c * kBc + r] = x[b, h, t0 + r, c]: the tile transposed, so products over D run along rows.
template <class T, class Acc>
void load_rows_transposed(const Operand<T>& x, int64_t b, int64_t h, int64_t t0, int64_t n, int64_t D,
                          Acc* dst) {
  for (int64_t r = 0; r < n; ++r) {
    const T* src = x.row(b, h, t0 + r);
    for (int64_t c = 0; c < D; ++c) dst[c * kBc + r] = static_cast<Acc>(src[c]);
  }
}

// c[i * ldc + j] (+)= sum_k a[i * a_row + k * a_col] * b[k * ldb + j] for i < M, j < N: every
// product of the kernel, each operand a tile in this thread's cache (a_row or a_col is 1; the
// other reads a transposed tile, P^T or dS^T, without copying it). With OpenBLAS, one sgemm/dgemm
// per tile; without, a register-blocked loop: a 4 x 8 block of c stays in registers over the
// whole k loop, so each b load feeds four multiply-adds and each a load eight, and the j loops
// have unit stride and no reduction, so they vectorise without reassociating sums.
template <class Acc>
void tile_gemm(const Acc* a, int64_t a_row, int64_t a_col, const Acc* b, int64_t ldb, int64_t M, int64_t N,
               int64_t K, Acc* c, int64_t ldc, bool accumulate) {
#if defined(MG_HAS_OPENBLAS)
  // OpenBLAS's micro-kernels use the widest vectors the CPU has (this file is built for the
  // baseline ISA). Inside the kernel's parallel region it runs on the calling thread alone.
  const bool trans_a = a_col != 1;
  gemm(gemm_args(dtype_of<Acc>(), trans_a, false, M, N, K, a, trans_a ? a_col : a_row, b, ldb, c, ldc,
                 accumulate ? 1.0 : 0.0));
#else
  constexpr int64_t MR = 4, NR = 8;
  for (int64_t i0 = 0; i0 < M; i0 += MR) {
    const int64_t mr = std::min(MR, M - i0);
    for (int64_t j0 = 0; j0 < N; j0 += NR) {
      const int64_t nr = std::min(NR, N - j0);
      Acc acc[MR][NR] = {};
      if (mr == MR && nr == NR) {
        for (int64_t k = 0; k < K; ++k) {
          const Acc* bk = b + k * ldb + j0;
          for (int64_t r = 0; r < MR; ++r) {
            const Acc x = a[(i0 + r) * a_row + k * a_col];
            for (int64_t j = 0; j < NR; ++j) acc[r][j] += x * bk[j];
          }
        }
      } else {
        for (int64_t k = 0; k < K; ++k) {
          const Acc* bk = b + k * ldb + j0;
          for (int64_t r = 0; r < mr; ++r) {
            const Acc x = a[(i0 + r) * a_row + k * a_col];
            for (int64_t j = 0; j < nr; ++j) acc[r][j] += x * bk[j];
          }
        }
      }
      for (int64_t r = 0; r < mr; ++r) {
        Acc* ci = c + (i0 + r) * ldc + j0;
        for (int64_t j = 0; j < nr; ++j) ci[j] = accumulate ? ci[j] + acc[r][j] : acc[r][j];
      }
    }
  }
#endif
}

// s[i * kBc + j] = sum_d a[i * D + d] * bt[d * kBc + j] for i < nr, j < nc (a score-shaped tile).
template <class Acc>
void tile_product(const Acc* a, const Acc* bt, int64_t nr, int64_t nc, int64_t D, Acc* s) {
  tile_gemm(a, D, int64_t{1}, bt, kBc, nr, nc, D, s, kBc, /*accumulate=*/false);
}

// Scales the score tile, and sets -inf where key j0 + j lies after query i0 + i (causal).
template <class Acc>
void scale_and_mask(Acc* s, int64_t nr, int64_t nc, int64_t i0, int64_t j0, Acc scale, bool causal) {
  const Acc minus_inf = -std::numeric_limits<Acc>::infinity();
  for (int64_t i = 0; i < nr; ++i) {
    Acc* si = s + i * kBc;
    // Keys j0 + j <= i0 + i are visible: j < visible.
    const int64_t visible = causal ? std::clamp<int64_t>(i0 + i - j0 + 1, 0, nc) : nc;
    for (int64_t j = 0; j < visible; ++j) si[j] *= scale;
    for (int64_t j = visible; j < nc; ++j) si[j] = minus_inf;
  }
}

// keep[j] for the n consecutive elements from e0: mg::dropout's draw (word e % 4 of Philox block
// e / 4), one block per four elements.
void dropout_keep_row(uint64_t seed, uint64_t offset, uint64_t e0, int64_t n, float threshold,
                      uint8_t* keep) {
  uint64_t e = e0;
  PhiloxBlock block = philox4x32_10(seed, e / 4, offset);
  for (int64_t j = 0; j < n; ++j, ++e) {
    if (j > 0 && e % 4 == 0) block = philox4x32_10(seed, e / 4, offset);
    keep[j] = philox_word_uniform(block.word[e % 4]) >= threshold ? 1 : 0;
  }
}

// One thread's tiles (reused across its work items).
template <class Acc>
struct Workspace {
  explicit Workspace(int64_t D)
      : q(kBr * D),
        dout(kBr * D),
        k(kBc * D),
        kt(D * kBc),
        vt(D * kBc),
        v(kBc * D),
        s(kBr * kBc),
        dp(kBr * kBc),
        acc(std::max(kBr, kBc) * D),
        acc2(kBc * D),
        m(kBr),
        l(kBr),
        keep(kBc) {}
  std::vector<Acc> q, dout, k, kt, vt, v, s, dp, acc, acc2, m, l;
  std::vector<uint8_t> keep;
};

template <class T>
struct Problem {
  using Acc = acc_t<T>;
  const AttentionProblem& p;
  Operand<T> q, k, v;
  Acc scale;
  bool dropout;
  float threshold;  // keep when the uniform draw >= float(p), as mg::dropout
  Acc keep_scale;   // 1 / (1 - p), 0 when p == 1

  Problem(const AttentionProblem& problem, Operand<T> q_, Operand<T> k_, Operand<T> v_)
      : p(problem),
        q(q_),
        k(k_),
        v(v_),
        scale(static_cast<Acc>(problem.scale)),
        dropout(problem.dropout_p > 0),
        threshold(static_cast<float>(problem.dropout_p)),
        keep_scale(static_cast<Acc>(problem.dropout_p < 1 ? 1.0 / (1.0 - problem.dropout_p) : 0.0)) {}

  // Keys a query tile [i0, i0 + nr) can see: [0, key_end).
  int64_t key_end(int64_t i0, int64_t nr) const { return p.causal ? std::min(p.Tk, i0 + nr) : p.Tk; }
  // Element index of score (bh, i, j0) for the dropout draw.
  uint64_t element(int64_t bh, int64_t i, int64_t j0) const {
    return static_cast<uint64_t>((bh * p.Tq + i) * p.Tk + j0);
  }
  bool parallel() const { return p.B * p.H * p.Tq * p.Tk * p.D >= kAttentionMinParallelWork; }
};

// ---- forward -----------------------------------------------------------------------------------

template <class T>
void forward_item(const Problem<T>& pr, int64_t item, T* o, acc_t<T>* lse, Workspace<acc_t<T>>& w) {
  using Acc = acc_t<T>;
  const AttentionProblem& p = pr.p;
  const int64_t D = p.D, n_qt = ceil_div(p.Tq, kBr);
  const int64_t bh = item / n_qt, b = bh / p.H, h = bh % p.H;
  const int64_t i0 = (item % n_qt) * kBr, nr = std::min(kBr, p.Tq - i0);
  const Acc minus_inf = -std::numeric_limits<Acc>::infinity();

  load_rows(pr.q, b, h, i0, nr, D, w.q.data());
  std::fill(w.acc.begin(), w.acc.begin() + nr * D, Acc(0));
  std::fill(w.m.begin(), w.m.end(), minus_inf);
  std::fill(w.l.begin(), w.l.end(), Acc(0));

  const int64_t key_end = pr.key_end(i0, nr);  // causal: tiles wholly above the diagonal never load
  for (int64_t j0 = 0; j0 < key_end; j0 += kBc) {
    const int64_t nc = std::min(kBc, key_end - j0);
    load_rows_transposed(pr.k, b, h, j0, nc, D, w.kt.data());
    load_rows(pr.v, b, h, j0, nc, D, w.v.data());
    tile_product(w.q.data(), w.kt.data(), nr, nc, D, w.s.data());
    scale_and_mask(w.s.data(), nr, nc, i0, j0, pr.scale, p.causal);
    for (int64_t i = 0; i < nr; ++i) {
      Acc* si = w.s.data() + i * kBc;
      Acc tile_max = minus_inf;
      for (int64_t j = 0; j < nc; ++j) tile_max = std::max(tile_max, si[j]);
      const Acc m_new = std::max(w.m[i], tile_max);
      if (m_new == minus_inf) {  // nothing visible yet: exp(-inf - -inf) would be NaN
        std::fill(si, si + nc, Acc(0));
        continue;
      }
      const Acc alpha = std::exp(w.m[i] - m_new);
      Acc row_sum = 0;
      for (int64_t j = 0; j < nc; ++j) {
        si[j] = std::exp(si[j] - m_new);
        row_sum += si[j];
      }
      w.l[i] = w.l[i] * alpha + row_sum;
      w.m[i] = m_new;
      if (pr.dropout) {
        dropout_keep_row(p.seed, p.offset, pr.element(bh, i0 + i, j0), nc, pr.threshold, w.keep.data());
        for (int64_t j = 0; j < nc; ++j) si[j] = w.keep[j] ? si[j] * pr.keep_scale : Acc(0);
      }
      if (alpha != Acc(1)) {
        Acc* oi = w.acc.data() + i * D;
        for (int64_t d = 0; d < D; ++d) oi[d] *= alpha;
      }
    }
    // acc += P~ V for the whole tile.
    tile_gemm(w.s.data(), kBc, int64_t{1}, w.v.data(), D, nr, D, nc, w.acc.data(), D, /*accumulate=*/true);
  }
  for (int64_t i = 0; i < nr; ++i) {
    T* out = o + (bh * p.Tq + i0 + i) * D;
    const Acc* oi = w.acc.data() + i * D;
    if (w.l[i] > Acc(0)) {
      const Acc inv = Acc(1) / w.l[i];
      for (int64_t d = 0; d < D; ++d) out[d] = static_cast<T>(oi[d] * inv);
      lse[bh * p.Tq + i0 + i] = w.m[i] + std::log(w.l[i]);
    } else {  // the row saw no key: output 0, and a -inf LSE that the backward reads as P = 0
      for (int64_t d = 0; d < D; ++d) out[d] = static_cast<T>(Acc(0));
      lse[bh * p.Tq + i0 + i] = minus_inf;
    }
  }
}

// ---- backward ----------------------------------------------------------------------------------

// The probability tile P = exp(S - LSE) of query rows [i0, i0 + nr) against keys [j0, j0 + nc)
// into w.s, and dP~ = dO V^T into w.dp. Needs w.q, w.dout (rows) and w.kt, w.vt (transposed keys).
template <class T>
void rebuild_tiles(const Problem<T>& pr, const acc_t<T>* lse_rows, int64_t i0, int64_t nr, int64_t j0,
                   int64_t nc, Workspace<acc_t<T>>& w) {
  using Acc = acc_t<T>;
  const int64_t D = pr.p.D;
  tile_product(w.q.data(), w.kt.data(), nr, nc, D, w.s.data());
  scale_and_mask(w.s.data(), nr, nc, i0, j0, pr.scale, pr.p.causal);
  for (int64_t i = 0; i < nr; ++i) {
    Acc* si = w.s.data() + i * kBc;
    const Acc L = lse_rows[i];
    if (L == -std::numeric_limits<Acc>::infinity()) {
      std::fill(si, si + nc, Acc(0));
    } else {
      for (int64_t j = 0; j < nc; ++j) si[j] = std::exp(si[j] - L);
    }
  }
  tile_product(w.dout.data(), w.vt.data(), nr, nc, D, w.dp.data());
}

// dS for row i of the tile (in place of dP~ in w.dp), already times scale; and P~ in place of P
// in w.s when `dropped` (the first pass needs P~ for dV).
template <class T>
void score_grad_row(const Problem<T>& pr, int64_t bh, int64_t i_abs, int64_t i, int64_t j0, int64_t nc,
                    acc_t<T> delta_i, bool dropped, Workspace<acc_t<T>>& w) {
  using Acc = acc_t<T>;
  Acc* si = w.s.data() + i * kBc;
  Acc* dpi = w.dp.data() + i * kBc;
  if (pr.dropout) {
    dropout_keep_row(pr.p.seed, pr.p.offset, pr.element(bh, i_abs, j0), nc, pr.threshold, w.keep.data());
    for (int64_t j = 0; j < nc; ++j) {
      const Acc z = w.keep[j] ? pr.keep_scale : Acc(0);
      dpi[j] = si[j] * (dpi[j] * z - delta_i) * pr.scale;
      if (dropped) si[j] *= z;
    }
  } else {
    for (int64_t j = 0; j < nc; ++j) dpi[j] = si[j] * (dpi[j] - delta_i) * pr.scale;
  }
}

// dK and dV of one key tile: every query tile that can see it.
template <class T>
void backward_kv_item(const Problem<T>& pr, int64_t item, const acc_t<T>* lse, const acc_t<T>* delta,
                      const Operand<T>& dout, T* dk, T* dv, Workspace<acc_t<T>>& w) {
  using Acc = acc_t<T>;
  const AttentionProblem& p = pr.p;
  const int64_t D = p.D, n_kt = ceil_div(p.Tk, kBc), n_qt = ceil_div(p.Tq, kBr);
  const int64_t bh = item / n_kt, b = bh / p.H, h = bh % p.H;
  const int64_t j0 = (item % n_kt) * kBc, nc = std::min(kBc, p.Tk - j0);
  load_rows_transposed(pr.k, b, h, j0, nc, D, w.kt.data());
  load_rows_transposed(pr.v, b, h, j0, nc, D, w.vt.data());
  Acc* dk_acc = w.acc.data();
  Acc* dv_acc = w.acc2.data();
  std::fill(dk_acc, dk_acc + nc * D, Acc(0));
  std::fill(dv_acc, dv_acc + nc * D, Acc(0));

  // Causal: query i sees key j only when i >= j, so the rows before j0 contribute nothing.
  for (int64_t qt = p.causal ? j0 / kBr : 0; qt < n_qt; ++qt) {
    const int64_t i0 = qt * kBr, nr = std::min(kBr, p.Tq - i0);
    if (p.causal && i0 + nr <= j0) continue;
    load_rows(pr.q, b, h, i0, nr, D, w.q.data());
    load_rows(dout, b, h, i0, nr, D, w.dout.data());
    rebuild_tiles(pr, lse + bh * p.Tq + i0, i0, nr, j0, nc, w);
    for (int64_t i = 0; i < nr; ++i)
      score_grad_row(pr, bh, i0 + i, i, j0, nc, delta[bh * p.Tq + i0 + i], /*dropped=*/true, w);
    // dV += P~^T dO and dK += dS^T Q (scale is in dS): the tiles read transposed.
    tile_gemm(w.s.data(), int64_t{1}, kBc, w.dout.data(), D, nc, D, nr, dv_acc, D, /*accumulate=*/true);
    tile_gemm(w.dp.data(), int64_t{1}, kBc, w.q.data(), D, nc, D, nr, dk_acc, D, /*accumulate=*/true);
  }
  for (int64_t j = 0; j < nc; ++j) {
    T* dk_row = dk + (bh * p.Tk + j0 + j) * D;
    T* dv_row = dv + (bh * p.Tk + j0 + j) * D;
    for (int64_t d = 0; d < D; ++d) {
      dk_row[d] = static_cast<T>(dk_acc[j * D + d]);
      dv_row[d] = static_cast<T>(dv_acc[j * D + d]);
    }
  }
}

// dQ of one query tile: every key tile it sees.
template <class T>
void backward_q_item(const Problem<T>& pr, int64_t item, const acc_t<T>* lse, const acc_t<T>* delta,
                     const Operand<T>& dout, T* dq, Workspace<acc_t<T>>& w) {
  using Acc = acc_t<T>;
  const AttentionProblem& p = pr.p;
  const int64_t D = p.D, n_qt = ceil_div(p.Tq, kBr);
  const int64_t bh = item / n_qt, b = bh / p.H, h = bh % p.H;
  const int64_t i0 = (item % n_qt) * kBr, nr = std::min(kBr, p.Tq - i0);
  load_rows(pr.q, b, h, i0, nr, D, w.q.data());
  load_rows(dout, b, h, i0, nr, D, w.dout.data());
  Acc* dq_acc = w.acc.data();
  std::fill(dq_acc, dq_acc + nr * D, Acc(0));

  const int64_t key_end = pr.key_end(i0, nr);
  for (int64_t j0 = 0; j0 < key_end; j0 += kBc) {
    const int64_t nc = std::min(kBc, key_end - j0);
    load_rows(pr.k, b, h, j0, nc, D, w.k.data());
    load_rows_transposed(pr.k, b, h, j0, nc, D, w.kt.data());
    load_rows_transposed(pr.v, b, h, j0, nc, D, w.vt.data());
    rebuild_tiles(pr, lse + bh * p.Tq + i0, i0, nr, j0, nc, w);
    for (int64_t i = 0; i < nr; ++i)
      score_grad_row(pr, bh, i0 + i, i, j0, nc, delta[bh * p.Tq + i0 + i], /*dropped=*/false, w);
    // dQ += dS K (scale is in dS).
    tile_gemm(w.dp.data(), kBc, int64_t{1}, w.k.data(), D, nr, D, nc, dq_acc, D, /*accumulate=*/true);
  }
  for (int64_t i = 0; i < nr; ++i) {
    T* dq_row = dq + (bh * p.Tq + i0 + i) * D;
    for (int64_t d = 0; d < D; ++d) dq_row[d] = static_cast<T>(dq_acc[i * D + d]);
  }
}

void check_problem(const char* what, const AttentionProblem& p) {
  MG_CHECK(p.B >= 0 && p.H >= 0 && p.Tq >= 0 && p.Tk >= 0 && p.D > 0, what, ": bad sizes B=", p.B, " H=", p.H,
           " Tq=", p.Tq, " Tk=", p.Tk, " D=", p.D);
  MG_CHECK(p.dropout_p >= 0.0 && p.dropout_p <= 1.0, what, ": dropout_p must be in [0, 1], got ",
           p.dropout_p);
}

}  // namespace

void attention_forward(DType dtype, const AttentionProblem& p, const void* q, AttentionStrides q_strides,
                       const void* k, AttentionStrides k_strides, const void* v, AttentionStrides v_strides,
                       void* o, void* lse) {
  check_problem("attention_forward", p);
  visit_floating(dtype, "attention_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_t<T>;
    const Problem<T> pr(p, Operand<T>{static_cast<const T*>(q), q_strides},
                        Operand<T>{static_cast<const T*>(k), k_strides},
                        Operand<T>{static_cast<const T*>(v), v_strides});
    const int64_t items = p.B * p.H * ceil_div(p.Tq, kBr);
    parallel_for(items, pr.parallel(), [&](int64_t begin, int64_t end) {
      Workspace<Acc> w(p.D);
      for (int64_t item = begin; item < end; ++item)
        forward_item(pr, item, static_cast<T*>(o), static_cast<Acc*>(lse), w);
    });
  });
}

void attention_backward(DType dtype, const AttentionProblem& p, const void* q, AttentionStrides q_strides,
                        const void* k, AttentionStrides k_strides, const void* v, AttentionStrides v_strides,
                        const void* o, const void* lse, const void* dout, AttentionStrides dout_strides,
                        void* delta, void* dq, void* dk, void* dv) {
  check_problem("attention_backward", p);
  visit_floating(dtype, "attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_t<T>;
    const Problem<T> pr(p, Operand<T>{static_cast<const T*>(q), q_strides},
                        Operand<T>{static_cast<const T*>(k), k_strides},
                        Operand<T>{static_cast<const T*>(v), v_strides});
    const Operand<T> g{static_cast<const T*>(dout), dout_strides};
    const T* out = static_cast<const T*>(o);
    const Acc* lse_rows = static_cast<const Acc*>(lse);
    Acc* delta_rows = static_cast<Acc*>(delta);

    // delta_i = sum_d dO_id O_id, one row per iteration.
    const int64_t rows = p.B * p.H * p.Tq;
    parallel_for(rows, rows * p.D >= (int64_t{1} << 16), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t bh = r / p.Tq, b = bh / p.H, h = bh % p.H, i = r % p.Tq;
        const T* gi = g.row(b, h, i);
        const T* oi = out + r * p.D;
        Acc sum = 0;
        for (int64_t d = 0; d < p.D; ++d) sum += static_cast<Acc>(gi[d]) * static_cast<Acc>(oi[d]);
        delta_rows[r] = sum;
      }
    });
    // dK, dV: one key tile per item.
    parallel_for(p.B * p.H * ceil_div(p.Tk, kBc), pr.parallel(), [&](int64_t begin, int64_t end) {
      Workspace<Acc> w(p.D);
      for (int64_t item = begin; item < end; ++item)
        backward_kv_item(pr, item, lse_rows, delta_rows, g, static_cast<T*>(dk), static_cast<T*>(dv), w);
    });
    // dQ: one query tile per item.
    parallel_for(p.B * p.H * ceil_div(p.Tq, kBr), pr.parallel(), [&](int64_t begin, int64_t end) {
      Workspace<Acc> w(p.D);
      for (int64_t item = begin; item < end; ++item)
        backward_q_item(pr, item, lse_rows, delta_rows, g, static_cast<T*>(dq), w);
    });
  });
}

}  // namespace mg::kernels::cpu
