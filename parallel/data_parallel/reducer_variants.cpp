// The Reducer's paths beyond the plain step (reducer.cpp): static_graph, parameters that get no
// gradient (find_unused_parameters, or the error that names them), the first pass's bucket
// rebuild, and Join's shadow passes. A reader follows the plain step in reducer.cpp first; each
// function here is called from one place there.
#include <algorithm>

#include "base/error.h"
#include "core/grad_mode.h"
#include "parallel/comm/object_collectives.h"
#include "parallel/comm/process_group_signature.h"
#include "parallel/data_parallel/reducer.h"

namespace mg::parallel {

// ---- static_graph ------------------------------------------------------------------------------

// static_graph: the first pass only counts each parameter's arrivals (its buckets are reduced
// at the end, in finalize); later passes mark a parameter ready at its last expected arrival. A
// surplus arrival updates its slot while the bucket waits, and is an error once it has launched.
void Reducer::on_static_graph_arrival(size_t index) {
  ++arrivals_[index];
  if (!static_recorded_) {
    last_arrival_[index] = arrival_seq_++;
    return;
  }
  const int expected = expected_arrivals_[index];
  if (arrivals_[index] < expected) return;  // more of its gradient is still to come
  if (arrivals_[index] == expected) {
    mark_ready(index, params_[index].grad());
    return;
  }
  const size_t b = slot_of_[index].first;
  if (b < next_to_launch_) {
    const std::string name = names_[index];
    const int arrivals = arrivals_[index];
    reset_pass();
    throw Error(
        str_cat("DistributedDataParallel (static_graph): parameter '", name, "' became ready ", arrivals,
                " times in this backward pass but ", expected,
                " in the first; its bucket was already all-reduced, so this part of its gradient would "
                "be lost. static_graph needs the same graph (and the same parameters used) in every "
                "iteration"));
  }
  NoGradGuard no_grad;  // the bucket waits for other members: the slot takes the accumulated .grad
  Bucket& bucket = buckets_[b];
  Tensor slot = bucket.flat.narrow(0, bucket.offsets[slot_of_[index].second], params_[index].numel());
  const Tensor& grad = params_[index].grad();
  if (grad.data_ptr() != slot.data_ptr()) slot.copy_(grad.reshape({-1}));
}

// The first static_graph pass: every gradient is complete at the end of backward; unused
// parameters give zeros.
void Reducer::ready_first_static_pass() {
  for (size_t i = 0; i < params_.size(); ++i) mark_ready(i, arrivals_[i] > 0 ? params_[i].grad() : Tensor());
}

// After the first static_graph pass the buckets follow the order parameters became ready for the
// last time; the unused ones (zeros from the start of each pass) first.
std::vector<size_t> Reducer::static_graph_order() const {
  std::vector<size_t> order;
  for (size_t i = 0; i < params_.size(); ++i)
    if (arrivals_[i] == 0) order.push_back(i);
  std::vector<size_t> used;
  for (size_t i = 0; i < params_.size(); ++i)
    if (arrivals_[i] > 0) used.push_back(i);
  std::sort(used.begin(), used.end(),
            [&](size_t a, size_t b) { return last_arrival_[a] < last_arrival_[b]; });
  order.insert(order.end(), used.begin(), used.end());
  return order;
}

// ---- parameters that received no gradient ----------------------------------------------------------

// Their buckets would stay unready for ever: they get zeros, and without find_unused_parameters
// the names of the missing parameters come back for the error (fail_pass).
std::string Reducer::ready_missing_parameters() {
  std::vector<size_t> missing;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!arrived_[i]) missing.push_back(i);
  std::string missing_names;  // without find_unused_parameters: an error naming them
  if (!missing.empty()) {
    if (options_.static_graph) {
      std::string names;
      for (size_t k = 0; k < missing.size() && k < 10; ++k)
        names += str_cat(k ? ", " : "", names_[missing[k]], " (", arrivals_[missing[k]], " of ",
                         expected_arrivals_[missing[k]], ")");
      reset_pass();
      throw Error(
          str_cat("DistributedDataParallel (static_graph): these parameters became ready fewer times "
                  "in this backward pass than in the first: ",
                  names, ". static_graph needs the same graph in every iteration"));
    }
    if (!options_.find_unused_parameters) {
      for (size_t k = 0; k < missing.size() && k < 10; ++k)
        missing_names += (k ? ", " : "") + names_[missing[k]];
      if (missing.size() > 10) missing_names += str_cat(", ... (", missing.size(), " in all)");
      // An error -- but the remaining buckets still go out (zeros), tagged: where other ranks have
      // every gradient, their all-reduces of these buckets fail at once instead of waiting for
      // ever, and below all ranks learn the names (the tag never reaches a rank that lacks the
      // same parameters: there the signatures match and each rank names its own).
      detail::SignatureTagScope tag(detail::kUnusedParametersTag);
      for (size_t index : missing) mark_ready(index, Tensor());
    } else {
      for (size_t index : missing) mark_ready(index, Tensor());
    }
  }

  return missing_names;
}

// A bucket all-reduce that failed on a signature mismatch failed on every rank alike, and the
// group is still in step: all ranks then exchange the names of the parameters each lacked (a
// rank that sent tagged zeros), so every rank's error names them. Otherwise (a timeout, a lost
// peer) the exchange fails too and the all-reduce's error is reported.
void Reducer::fail_pass(const std::string& missing_names, const std::string& error) {
  std::string named;
  if (error.empty()) {
    named = str_cat(missing_names, " (on rank ", group_.rank(), ")");
  } else {
    try {
      std::vector<std::string> all = all_gather_object(group_, missing_names);
      for (size_t r = 0; r < all.size(); ++r)
        if (!all[r].empty()) named += str_cat(named.empty() ? "" : "; ", all[r], " (on rank ", r, ")");
    } catch (const std::exception&) {  // the group itself failed
    }
  }
  reset_pass();
  if (named.empty()) throw Error(str_cat("DistributedDataParallel: gradient all-reduce failed: ", error));
  throw Error(
      str_cat("DistributedDataParallel: these parameters received no gradient in this backward pass: ", named,
              ". Their buckets cannot be all-reduced as they are: make every parameter take part in "
              "forward's output on every rank, or construct DDP with find_unused_parameters = true"));
}

// After the first pass, one broadcast of rank 0's [arrival order, arrival counts]: the buckets are
// rebuilt in the order gradients really arrived (identical on every rank), and static_graph
// records how many times each parameter becomes ready (0: unused), checked equal on all ranks.
void Reducer::after_first_pass(const std::vector<size_t>& order, const std::vector<int>& arrivals,
                               bool counts_known) {
  const bool rebuild = options_.rebuild_buckets && !options_.gradient_as_bucket_view;
  if (!rebuild && !options_.static_graph) return;
  const auto count = static_cast<int64_t>(params_.size());
  Tensor shared = zeros({2 * count}, TensorOptions{DType::i64});
  int64_t* data = shared.data<int64_t>();
  for (size_t k = 0; k < order.size(); ++k) data[k] = static_cast<int64_t>(order[k]);
  for (size_t i = 0; i < arrivals.size(); ++i) data[count + static_cast<int64_t>(i)] = arrivals[i];
  group_.broadcast(shared, 0)->wait();
  if (options_.static_graph) {
    std::string difference;
    for (size_t i = 0; counts_known && i < params_.size() && difference.empty(); ++i)
      if (data[count + static_cast<int64_t>(i)] != arrivals[i])
        difference = str_cat("parameter '", names_[i], "' became ready ", arrivals[i], " times on rank ",
                             group_.rank(), " but ", data[count + static_cast<int64_t>(i)], " on rank 0");
    const bool everyone_agrees = all_ranks(group_, difference.empty());
    MG_CHECK(everyone_agrees, "DistributedDataParallel (static_graph): the ranks' first iterations differ: ",
             difference.empty() ? std::string("another rank's error names the parameter") : difference,
             " (static_graph needs the same graph on every rank)");
    expected_arrivals_.assign(params_.size(), 0);
    for (size_t i = 0; i < params_.size(); ++i)
      expected_arrivals_[i] = static_cast<int>(data[count + static_cast<int64_t>(i)]);
    static_recorded_ = true;
  }
  if (!rebuild) return;
  std::vector<size_t> new_order;
  for (int64_t k = 0; k < count; ++k) new_order.push_back(static_cast<size_t>(data[k]));
  std::vector<size_t> current;
  for (const Bucket& bucket : buckets_)
    current.insert(current.end(), bucket.members.begin(), bucket.members.end());
  if (new_order != current) build_buckets(new_order);
  rebuilt_ = true;
}

// ---- Join --------------------------------------------------------------------------------------

void Reducer::set_gradient_divisor(int ranks) {
  MG_CHECK(ranks >= 1 && ranks <= group_.size(),
           "DistributedDataParallel: the gradient divisor must be "
           "between 1 and the world size ",
           group_.size(), ", got ", ranks);
  gradient_divisor_ = ranks;
}

void Reducer::run_joined_pass() {
  MG_CHECK(!pass_active_,
           "DistributedDataParallel (Join): a joined rank cannot shadow a backward pass while "
           "its own is running");
  std::vector<size_t> order;
  {
    NoGradGuard no_grad;
    for (Bucket& bucket : buckets_) {
      bucket.flat.zero_();
      bucket.pending = 0;
      order.insert(order.end(), bucket.members.begin(), bucket.members.end());
    }
  }
  next_to_launch_ = 0;
  launch_ready_buckets();  // the same path as a real pass: same order, same comm hook
  const std::string error = wait_for_all_buckets();
  const bool first_pass = !first_pass_done_;
  first_pass_done_ = true;
  reset_pass();
  if (!error.empty())
    throw Error(
        str_cat("DistributedDataParallel (Join): this rank has joined; shadowing the others' gradient "
                "all-reduce failed: ",
                error));
  // Its own order is used only where this rank is rank 0; static_graph's counts come from rank 0.
  if (first_pass) after_first_pass(order, std::vector<int>(params_.size(), 0), /*counts_known=*/false);
}

}  // namespace mg::parallel
