// Ring attention (ring_attention.h): the forward and backward rings over the group's send/recv.
//
// Bytes moved per call, per rank, with K and V of C = T_local x D elements per head:
//   forward   (N-1) steps x (K + V)                 = 2 (N-1) C per head
//   backward  (N-1) steps x (K + V) + N x (dK + dV) = 2 (N-1) C + 2 N C per head
// (the accumulators travel in f32 for f16/bf16 inputs). Each step's transfer is posted before
// that step's blocks are computed, so it overlaps them; a rank waits only when a transfer takes
// longer than a step's attention.
#include "parallel/context_parallel/ring_attention.h"

#include <chrono>
#include <ctime>
#include <vector>

#include "base/error.h"
#include "core/attention.h"
#include "core/autograd/node.h"
#include "core/grad_mode.h"
#include "core/ops.h"

namespace mg::parallel {
namespace {

// Tags of the ring's messages. A receive matches the send with its source and tag in the order
// they were posted, so every call (every layer, every step) can reuse the same four.
constexpr int kTagKeys = 7100, kTagValues = 7101, kTagKeyGrads = 7102, kTagValueGrads = 7103;

int mod(int a, int n) { return ((a % n) + n) % n; }

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Adds one step's blocks, compute time, wait and bytes to the caller's stats, if it asked.
class StepMeter {
 public:
  explicit StepMeter(RingAttentionStats* stats) : stats_(stats) {}
  void blocks_start() { cpu_ = thread_cpu_seconds(); }
  void blocks_end(int64_t blocks) {
    if (stats_ == nullptr) return;
    stats_->compute_seconds += thread_cpu_seconds() - cpu_;
    stats_->blocks += blocks;
  }
  void wait_start() { wall_ = wall_seconds(); }
  void wait_end() {
    if (stats_ != nullptr) stats_->wait_seconds += wall_seconds() - wall_;
  }
  void sent(const Tensor& t) {
    if (stats_ != nullptr) stats_->bytes_sent += t.numel() * int64_t(dtype_size(t.dtype()));
  }

 private:
  RingAttentionStats* stats_;
  double cpu_ = 0, wall_ = 0;
};

// The chunks of the whole sequence that `rank` holds, in sequence order.
std::vector<int> chunks_of(int rank, int world, ContextLayout layout) {
  if (layout == ContextLayout::contiguous) return {rank};
  return {rank, 2 * world - 1 - rank};
}

// How query chunk i attends to key chunk j (indices in the whole sequence).
enum class Mask { full, diagonal, none };
Mask mask_for(int query_chunk, int key_chunk, bool causal) {
  if (!causal || key_chunk < query_chunk) return Mask::full;
  return key_chunk == query_chunk ? Mask::diagonal : Mask::none;
}

// The dtype gradients are summed in across blocks: f32 for the half types.
DType accumulation_dtype(DType t) { return t == DType::f16 || t == DType::bf16 ? DType::f32 : t; }

// One step's transfers: receives from the left neighbour posted before the sends to the right,
// as the hand-written ring all-reduce does (comm/ring_allreduce.cpp).
class RingTransfer {
 public:
  RingTransfer(const ProcessGroup& group, int left, int right, StepMeter& meter)
      : group_(group), left_(left), right_(right), meter_(meter) {}
  // Sends `outgoing` to the right; returns the tensor the left neighbour's arrives in.
  Tensor pass(const Tensor& outgoing, int tag) {
    meter_.sent(outgoing);
    Tensor incoming = empty_like(outgoing);
    works_.push_back(group_.recv(incoming, left_, tag));
    works_.push_back(group_.send(outgoing, right_, tag));
    return incoming;
  }
  void wait() {
    meter_.wait_start();
    for (WorkPtr& w : works_) w->wait();
    works_.clear();
    meter_.wait_end();
  }

 private:
  ProcessGroup group_;
  int left_, right_;
  StepMeter& meter_;
  std::vector<WorkPtr> works_;
};

struct Ring {
  ProcessGroup group;
  int rank, world;
  int left() const { return mod(rank - 1, world); }
  int right() const { return mod(rank + 1, world); }
};

// The chunk pairs one step computes: this rank's query chunks against the key chunks of `source`.
struct BlockPair {
  int query, key;  // local chunk indices (0 or 1)
  bool diagonal;
};
std::vector<BlockPair> pairs_for(const Ring& ring, int source, const RingAttentionOptions& options) {
  const std::vector<int> mine = chunks_of(ring.rank, ring.world, options.layout);
  const std::vector<int> theirs = chunks_of(source, ring.world, options.layout);
  std::vector<BlockPair> pairs;
  for (size_t i = 0; i < mine.size(); ++i)
    for (size_t j = 0; j < theirs.size(); ++j) {
      const Mask mask = mask_for(mine[i], theirs[j], options.causal);
      if (mask != Mask::none) pairs.push_back({int(i), int(j), mask == Mask::diagonal});
    }
  return pairs;
}

struct Saved {
  Tensor q, k, v;
  std::vector<AttentionBlock> merged;  // per local query chunk: its out and lse over every key
};

Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v, const Ring& ring,
               const RingAttentionOptions& options, Saved& saved) {
  const int64_t per_rank = int64_t(chunks_of(0, ring.world, options.layout).size());
  const int64_t chunk = q.size(2) / per_rank;
  auto piece = [&](const Tensor& t, int64_t i) { return t.narrow(2, i * chunk, chunk); };

  std::vector<std::optional<AttentionBlock>> partial(static_cast<size_t>(per_rank));
  Tensor keys = k.contiguous(), values = v.contiguous();  // the chunks in hand: rank - step's
  StepMeter meter(options.stats);
  for (int step = 0; step < ring.world; ++step) {
    RingTransfer transfer(ring.group, ring.left(), ring.right(), meter);
    Tensor next_keys, next_values;
    if (step + 1 < ring.world) {  // the next step's K and V travel while this step computes
      next_keys = transfer.pass(keys, kTagKeys);
      next_values = transfer.pass(values, kTagValues);
    }
    const std::vector<BlockPair> pairs = pairs_for(ring, mod(ring.rank - step, ring.world), options);
    meter.blocks_start();
    for (const BlockPair& p : pairs) {
      AttentionBlock block = attention_block_forward(piece(q, p.query), piece(keys, p.key),
                                                     piece(values, p.key), p.diagonal, options.scale);
      std::optional<AttentionBlock>& into = partial[static_cast<size_t>(p.query)];
      into = into ? merge_attention_blocks(*into, block) : std::move(block);
    }
    meter.blocks_end(int64_t(pairs.size()));
    transfer.wait();
    keys = next_keys;
    values = next_values;
  }
  std::vector<Tensor> outs;
  for (std::optional<AttentionBlock>& m : partial) {  // every query chunk sees its diagonal block
    outs.push_back(m->out);
    saved.merged.push_back(std::move(*m));
  }
  return outs.size() == 1 ? outs[0] : cat(outs, 2);
}

std::vector<Tensor> backward(const Saved& saved, const Tensor& grad_out, const Ring& ring,
                             const RingAttentionOptions& options) {
  const Tensor &q = saved.q, &k = saved.k, &v = saved.v;
  const int64_t per_rank = int64_t(saved.merged.size());
  const int64_t chunk = q.size(2) / per_rank;
  auto piece = [&](const Tensor& t, int64_t i) { return t.narrow(2, i * chunk, chunk); };
  const DType acc = accumulation_dtype(q.dtype());
  const Tensor dout = grad_out.defined() ? grad_out.contiguous() : zeros_like(q);

  Tensor dq = zeros_like(q).to(acc);
  Tensor keys = k.contiguous(), values = v.contiguous();
  Tensor dkeys = zeros_like(keys).to(acc), dvalues = zeros_like(values).to(acc);  // travel with them
  StepMeter meter(options.stats);
  for (int step = 0; step < ring.world; ++step) {
    RingTransfer kv(ring.group, ring.left(), ring.right(), meter);
    Tensor next_keys, next_values;
    if (step + 1 < ring.world) {
      next_keys = kv.pass(keys, kTagKeys);
      next_values = kv.pass(values, kTagValues);
    }
    const std::vector<BlockPair> pairs = pairs_for(ring, mod(ring.rank - step, ring.world), options);
    meter.blocks_start();
    for (const BlockPair& p : pairs) {
      const AttentionBlockGrads g = attention_block_backward(
          piece(q, p.query), piece(keys, p.key), piece(values, p.key),
          saved.merged[static_cast<size_t>(p.query)], piece(dout, p.query), p.diagonal, options.scale);
      piece(dq, p.query).add_(g.dq.to(acc));
      piece(dkeys, p.key).add_(g.dk.to(acc));
      piece(dvalues, p.key).add_(g.dv.to(acc));
    }
    meter.blocks_end(int64_t(pairs.size()));
    // The accumulators go on to the next rank, which holds their chunk next; after the last step
    // this hop brings each rank's own chunk's gradients home (a group of one is home already).
    RingTransfer grads(ring.group, ring.left(), ring.right(), meter);
    Tensor next_dkeys = dkeys, next_dvalues = dvalues;
    if (ring.world > 1) {
      next_dkeys = grads.pass(dkeys, kTagKeyGrads);
      next_dvalues = grads.pass(dvalues, kTagValueGrads);
    }
    kv.wait();
    grads.wait();
    keys = next_keys;
    values = next_values;
    dkeys = next_dkeys;
    dvalues = next_dvalues;
  }
  return {dq.to(q.dtype()), dkeys.to(k.dtype()), dvalues.to(v.dtype())};
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const ProcessGroup& group,
                  const RingAttentionOptions& options) {
  MG_CHECK(group.defined(), "ring_attention: the process group is undefined");
  MG_CHECK(q.defined() && k.defined() && v.defined(), "ring_attention: q, k and v must be defined");
  MG_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
           "ring_attention: q, k, v must be [B, H, T_local, D]; got ", shape_str(q.shape()), ", ",
           shape_str(k.shape()), ", ", shape_str(v.shape()));
  MG_CHECK(k.shape() == q.shape() && v.shape() == q.shape(),
           "ring_attention: q, k and v must have the same shape (self-attention over one sequence); got ",
           shape_str(q.shape()), ", ", shape_str(k.shape()), ", ", shape_str(v.shape()));
  MG_CHECK(options.layout != ContextLayout::zigzag || q.size(2) % 2 == 0,
           "ring_attention: the zigzag layout holds two equal chunks per rank, but T_local = ", q.size(2),
           " is odd (pad the sequence to a multiple of 2 x the group size)");
}

}  // namespace

Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const ProcessGroup& group,
                      const RingAttentionOptions& options) {
  check_inputs(q, k, v, group, options);
  const Ring ring{group, group.rank(), group.size()};
  auto saved = std::make_shared<Saved>();
  Tensor out;
  {
    NoGradGuard no_grad;
    saved->q = q.detach();
    saved->k = k.detach();
    saved->v = v.detach();
    out = forward(saved->q, saved->k, saved->v, ring, options, *saved);
  }
  if (autograd::any_requires_grad({q, k, v})) {
    autograd::record("RingAttentionBackward", {q, k, v}, {out},
                     [saved, ring, options](const std::vector<Tensor>& grads) {
                       NoGradGuard no_grad;
                       return backward(*saved, grads[0], ring, options);
                     });
  }
  return out;
}

Tensor context_shard(const Tensor& full, int64_t dim, int rank, int world, ContextLayout layout) {
  MG_CHECK(world >= 1 && rank >= 0 && rank < world, "context_shard: rank ", rank, " is not in a group of ",
           world);
  const std::vector<int> chunks = chunks_of(rank, world, layout);
  const int64_t total_chunks = int64_t(chunks.size()) * world;
  MG_CHECK(dim >= 0 && dim < full.dim(), "context_shard: dim ", dim, " is out of range for shape ",
           shape_str(full.shape()));
  MG_CHECK(full.size(dim) % total_chunks == 0, "context_shard: length ", full.size(dim), " along dim ", dim,
           " does not divide into ", total_chunks, " equal chunks (", world, " ranks",
           layout == ContextLayout::zigzag ? ", zigzag: 2 per rank" : "", "); pad the sequence");
  const int64_t chunk = full.size(dim) / total_chunks;
  std::vector<Tensor> parts;
  for (int c : chunks) parts.push_back(full.narrow(dim, c * chunk, chunk));
  return cat(parts, dim);
}

}  // namespace mg::parallel
