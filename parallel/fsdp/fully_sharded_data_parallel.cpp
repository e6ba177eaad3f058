// FullyShardedDataParallel: the hooks that gather, reshard and reduce-scatter each unit around its
// forward and backward (see fully_sharded_data_parallel.h for the timeline).
#include "parallel/fsdp/fully_sharded_data_parallel.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <string>

#include "base/error.h"
#include "core/autograd/node.h"
#include "core/grad_mode.h"

namespace mg::parallel {

struct FullyShardedDataParallel::Engine : std::enable_shared_from_this<Engine> {
  static constexpr size_t kMaxReduceScattersInFlight = 2;

  ProcessGroup group;
  FSDPOptions options;
  std::vector<std::shared_ptr<FlatParamUnit>> units;
  FSDPStats stats;
  bool sync = true;
  bool pass_active = false;
  // The last forward's units in the order their forwards began (forward prefetch), and in the
  // order they ended: backward reaches their outputs in the reverse of the latter.
  std::vector<size_t> forward_order, forward_end_order;
  std::vector<size_t> current_order, current_end_order;  // this forward's, so far
  std::deque<size_t> reducing;  // units whose reduce-scatter is in flight, oldest first

  int64_t gathered_alive() const {
    int64_t bytes = 0;
    for (const auto& unit : units)
      if (unit->state() != FlatParamUnit::State::Sharded) bytes += unit->gathered_bytes();
    return bytes;
  }
  void note_gathered() { stats.peak_gathered_bytes = std::max(stats.peak_gathered_bytes, gathered_alive()); }

  void gather_now(size_t u) {
    if (units[u]->start_gather()) ++stats.all_gathers;
    units[u]->wait_gather();
    note_gathered();
  }
  void prefetch(size_t u) {
    if (units[u]->start_gather()) {
      ++stats.all_gathers;
      ++stats.prefetched_all_gathers;
    }
    note_gathered();
  }

  static size_t position(const std::vector<size_t>& order, size_t u) {
    return static_cast<size_t>(std::find(order.begin(), order.end(), u) - order.begin());
  }
  // The unit whose backward runs after u's: the one whose forward ended just before u's did
  // (skipping those already reduce-scattered in this pass).
  void prefetch_for_backward(size_t u) {
    const size_t at = position(forward_end_order, u);
    if (at == forward_end_order.size()) return;  // not seen in the last forward
    for (size_t k = at; k-- > 0;) {
      const size_t v = forward_end_order[k];
      if (units[v]->reduce_scatter_posted()) continue;
      prefetch(v);
      return;
    }
  }

  void begin_pass() {
    if (pass_active) return;
    pass_active = true;
    std::weak_ptr<Engine> weak = shared_from_this();
    autograd::queue_callback([weak] {
      if (auto engine = weak.lock()) engine->finalize();
    });
  }

  // ---- forward ----
  void pre_forward(size_t u) {
    const bool recompute = autograd::in_backward();  // activation checkpointing's second forward
    if (!recompute) current_order.push_back(u);
    gather_now(u);
    if (recompute) {
      begin_pass();
      if (options.backward_prefetch) prefetch_for_backward(u);
    } else if (options.forward_prefetch) {
      const size_t at = position(forward_order, u);
      if (at + 1 < forward_order.size()) prefetch(forward_order[at + 1]);
    }
  }

  Tensor post_forward(size_t u, const Tensor& output) {
    if (autograd::in_backward()) return output;  // a recompute: its backward follows at once
    current_end_order.push_back(u);
    if (GradMode::is_enabled() && output.defined() && output.requires_grad()) {
      std::weak_ptr<Engine> weak = shared_from_this();
      output.register_hook([weak, u](const Tensor&) {
        if (auto engine = weak.lock()) engine->pre_backward(u);
        return Tensor();  // the gradient passes unchanged
      });
    }
    const bool root = units[u]->name().empty();
    if (!root && options.reshard_after_forward) units[u]->reshard();
    return output;
  }

  // ---- backward ----
  void pre_backward(size_t u) {
    begin_pass();
    gather_now(u);
    if (options.backward_prefetch) prefetch_for_backward(u);
  }

  void on_gradient(size_t u, size_t member) {
    begin_pass();
    FlatParamUnit& unit = *units[u];
    if (!unit.accumulate_grad(member)) return;
    // Every gradient of the unit is in: reduce it now (overlapping the rest of backward) and
    // free the full parameters.
    if (sync) post_reduce_scatter(u);
    unit.reshard();
  }

  void post_reduce_scatter(size_t u) {
    while (reducing.size() >= kMaxReduceScattersInFlight) retire_oldest();
    units[u]->start_reduce_scatter();
    reducing.push_back(u);
    ++stats.reduce_scatters;
  }
  void retire_oldest() {
    const size_t u = reducing.front();
    reducing.pop_front();
    units[u]->finish_reduce_scatter();
  }

  void finalize() {
    std::string error;
    try {
      if (sync) {
        // Units whose gradients did not all arrive (a parameter unused this step): every rank still
        // issues every unit's reduce-scatter, in unit order, the missing gradients as zeros.
        for (size_t u = 0; u < units.size(); ++u)
          if (units[u]->grads_expected() > 0 && !units[u]->reduce_scatter_posted()) post_reduce_scatter(u);
        while (!reducing.empty()) retire_oldest();
        ++stats.backward_passes;
      }
      for (auto& unit : units) unit->reshard();
    } catch (const std::exception& e) {
      error = e.what();
    }
    for (auto& unit : units) unit->end_pass();
    reducing.clear();
    pass_active = false;
    if (!error.empty()) throw Error(str_cat("FSDP: the end of backward failed: ", error));
  }
};

namespace {

// The innermost unit containing parameter `name` (unit names are module paths; "" is the root).
size_t owner_of(const std::string& name, const std::vector<std::string>& unit_names) {
  size_t best = 0, best_length = 0;
  for (size_t u = 0; u < unit_names.size(); ++u) {
    const std::string& prefix = unit_names[u];
    if (prefix.empty() || prefix.size() < best_length) continue;
    if (name.compare(0, prefix.size() + 1, prefix + ".") == 0) {
      best = u;
      best_length = prefix.size();
    }
  }
  return best;
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(nn::Module& module, ProcessGroup group,
                                                   FSDPOptions options)
    : module_(&module), engine_(std::make_shared<Engine>()) {
  MG_CHECK(group.defined(), "FSDP: the process group is undefined");
  engine_->group = group;
  engine_->options = options;
  const std::vector<std::string> unit_names = select_units(module, options.auto_wrap);
  std::map<std::string, nn::Module*> modules;
  for (const auto& [name, m] : module.named_modules()) modules.emplace(name, m);

  // Each parameter to its innermost unit; a tensor reachable twice (tied weights) is refused.
  std::vector<std::vector<std::pair<std::string, Tensor*>>> slots_of(unit_names.size());
  std::set<const void*> seen;
  for (const auto& [name, slot] : module.named_parameter_slots()) {
    MG_CHECK(seen.insert(slot).second && seen.insert(slot->storage().get()).second, "FSDP: parameter '", name,
             "' shares its tensor with another parameter (tied weights are not supported)");
    slots_of[owner_of(name, unit_names)].push_back({name, slot});
  }
  MG_CHECK(!seen.empty(), "FSDP: ", module.type_name(), " has no parameters to shard");
  std::vector<nn::Module*> unit_modules;
  for (size_t k = 0; k < unit_names.size(); ++k) {
    if (slots_of[k].empty()) continue;
    const DType master = slots_of[k].front().second->dtype();
    const DType param_dtype = options.mixed_precision ? options.mixed_precision->param_dtype : master;
    const DType reduce_dtype = options.mixed_precision ? options.mixed_precision->reduce_dtype : master;
    nn::Module* unit_module = modules.at(unit_names[k]);
    engine_->units.push_back(std::make_shared<FlatParamUnit>(unit_names[k], *unit_module, slots_of[k], group,
                                                             param_dtype, reduce_dtype));
    unit_modules.push_back(unit_module);
  }
  // Buffers (BatchNorm's statistics) are replicated: every rank starts from rank 0's.
  if (group.size() > 1) {
    for (const auto& [name, slot] : module.named_buffer_slots()) {
      MG_CHECK(slot->is_contiguous(), "FSDP: buffer '", name, "' is not contiguous");
      group.broadcast(*slot, 0)->wait();
    }
  }

  // The hooks hold the engine weakly: it dies with this object.
  std::weak_ptr<Engine> weak = engine_;
  hook_handles_.emplace_back(module_, module.register_forward_pre_hook([weak](nn::Module&, const Tensor&) {
    auto engine = weak.lock();
    if (engine && !autograd::in_backward()) {
      engine->current_order.clear();
      engine->current_end_order.clear();
    }
  }));
  for (size_t u = 0; u < engine_->units.size(); ++u) {
    nn::Module* m = unit_modules[u];
    hook_handles_.emplace_back(m, m->register_forward_pre_hook([weak, u](nn::Module&, const Tensor&) {
      if (auto engine = weak.lock()) engine->pre_forward(u);
    }));
    hook_handles_.emplace_back(
        m, m->register_forward_hook([weak, u](nn::Module&, const Tensor&, const Tensor& out) {
          auto engine = weak.lock();
          return engine ? engine->post_forward(u, out) : out;
        }));
    FlatParamUnit& unit = *engine_->units[u];
    for (size_t member = 0; member < unit.members().size(); ++member) {
      if (!unit.leaf(member).requires_grad()) continue;
      unit.leaf(member).register_post_accumulate_grad_hook([weak, u, member](const Tensor&) {
        if (auto engine = weak.lock()) engine->on_gradient(u, member);
      });
    }
  }
  hook_handles_.emplace_back(
      module_, module.register_forward_hook([weak](nn::Module&, const Tensor&, const Tensor& out) {
        auto engine = weak.lock();
        if (!engine || autograd::in_backward()) return out;
        engine->forward_order = engine->current_order;
        engine->forward_end_order = engine->current_end_order;
        // Without a backward to come (evaluation), every unit is freed now; the root otherwise
        // stays gathered for the backward that starts with it.
        if (!GradMode::is_enabled() || !out.requires_grad())
          for (auto& unit : engine->units) unit->reshard();
        return out;
      }));
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (auto& [module, handle] : hook_handles_) module->remove_forward_hook(handle);
}

Tensor FullyShardedDataParallel::forward(const Tensor& x) {
  const auto& policy = engine_->options.mixed_precision;
  if (policy && x.defined() && is_floating(x.dtype()) && x.dtype() != policy->param_dtype)
    return (*module_)(x.to(policy->param_dtype));
  return (*module_)(x);
}

std::vector<Tensor> FullyShardedDataParallel::parameters() const {
  std::vector<Tensor> out;
  for (const auto& unit : engine_->units) out.push_back(unit->shard());
  return out;
}

const ProcessGroup& FullyShardedDataParallel::group() const { return engine_->group; }
const FSDPOptions& FullyShardedDataParallel::options() const { return engine_->options; }
const std::vector<std::shared_ptr<FlatParamUnit>>& FullyShardedDataParallel::units() const {
  return engine_->units;
}
const FSDPStats& FullyShardedDataParallel::stats() const { return engine_->stats; }
int64_t FullyShardedDataParallel::gathered_bytes_alive() const { return engine_->gathered_alive(); }
void FullyShardedDataParallel::set_sync(bool sync) { engine_->sync = sync; }
bool FullyShardedDataParallel::sync() const { return engine_->sync; }

void FullyShardedDataParallel::zero_grad() {
  for (auto& unit : engine_->units) unit->shard().set_grad(Tensor());
}

}  // namespace mg::parallel
