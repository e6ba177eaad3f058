// SyncBatchNorm under `mpiexec -n K`: with unequal per-rank batches (rank r holds r + 2 samples),
// a converted BatchNorm's outputs, input gradients, parameter gradients (summed over the ranks)
// and running statistics equal one device normalising the whole batch; eval runs no collective;
// a DDP model converted with convert_sync_batchnorm trains like one device on the whole batch.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "multigrad.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "parallel/data_parallel/sync_batch_norm.h"
#include "tests/parallel/mpi_test_support.h"

using namespace mg;
using namespace mg::parallel;

namespace {

int64_t share_of(int rank) { return rank + 2; }  // unequal on purpose
int64_t offset_of(int rank) {
  int64_t offset = 0;
  for (int r = 0; r < rank; ++r) offset += share_of(r);
  return offset;
}

}  // namespace

TEST_CASE("SyncBatchNorm with unequal per-rank batches equals one device on the whole batch",
          "[mpi][syncbn]") {
  ProcessGroup pg = testing::mpi_test_group();
  const int world = pg.size(), rank = pg.rank();
  const int64_t total = offset_of(world);
  manual_seed(21);
  const Tensor x_all = add(mul(randn({total, 3, 4, 5}), 2.0), 0.5);  // mean 0.5, std 2
  const Tensor upstream = randn({total, 3, 4, 5});                   // dL/dy, fixed

  nn::BatchNorm2d reference(3);
  {
    NoGradGuard no_grad;
    reference.weight.copy_(tensor<float>({1.5f, 0.5f, -1.0f}));
    reference.bias.copy_(tensor<float>({0.1f, -0.2f, 0.3f}));
  }
  nn::BatchNorm2d synced(3);
  synced.load_state_dict(reference.state_dict());
  synced.to(pg.device());  // the reference stays on the CPU: one device, the whole batch
  REQUIRE(convert_sync_batchnorm(synced, pg) == 1);
  CHECK(synced.synchronizes_statistics());

  for (int step = 0; step < 2; ++step) {  // twice: the running statistics follow the global batch
    reference.zero_grad();
    synced.zero_grad();
    Tensor x_ref = x_all.clone().detach().set_requires_grad(true);
    Tensor y_ref = reference(x_ref);
    sum(mul(y_ref, upstream)).backward();

    Tensor x_mine = x_all.narrow(0, offset_of(rank), share_of(rank)).clone().detach().set_requires_grad(true);
    Tensor y_mine = synced(x_mine.to(pg.device()));
    sum(mul(y_mine, upstream.narrow(0, offset_of(rank), share_of(rank)).to(pg.device()))).backward();

    INFO("step " << step);
    testing::require_close(y_mine, y_ref.narrow(0, offset_of(rank), share_of(rank)), 1e-5);
    testing::require_close(x_mine.grad(), x_ref.grad().narrow(0, offset_of(rank), share_of(rank)), 1e-5);
    const std::pair<Tensor, Tensor> params[] = {{synced.weight, reference.weight},
                                                {synced.bias, reference.bias}};
    for (const auto& [mine, ref] : params) {  // each rank holds its share's part: sum them
      Tensor g = mine.grad().contiguous().clone();
      pg.allreduce(g)->wait();
      testing::require_close(g, ref.grad(), 1e-5);
    }
    testing::require_close(synced.running_mean, reference.running_mean, 1e-6);
    testing::require_close(synced.running_var, reference.running_var, 1e-6);
  }

  SECTION("eval is local: uneven evaluation shards run no collective and cannot hang") {
    synced.eval();
    reference.eval();
    // Rank 0 evaluates three batches, the others one: a collective in eval would deadlock.
    const int batches = rank == 0 ? 3 : 1;
    for (int b = 0; b < batches; ++b) {
      Tensor y = synced(x_all.narrow(0, 0, 2).to(pg.device()));
      testing::require_close(y, reference(x_all.narrow(0, 0, 2)), 1e-6);
    }
    pg.barrier()->wait();
  }
}

TEST_CASE("DDP with convert_sync_batchnorm trains like one device on the whole batch", "[mpi][syncbn]") {
  // Conv -> BatchNorm -> ReLU -> pool -> Linear; per-rank batches of rank + 2 images. Plain DDP
  // would normalise each share alone; converted, the statistics are the whole batch's, so SGD
  // steps equal one device's on the concatenated batch (losses summed, as DDP sums then averages:
  // each rank's loss is its share's sum divided by the global count, times the world size).
  ProcessGroup pg = testing::mpi_test_group();
  const int world = pg.size(), rank = pg.rank();
  const int64_t total = offset_of(world);
  auto make = [] {
    manual_seed(5);
    auto net = std::make_shared<nn::Sequential>();
    nn::Conv2dOptions same;
    same.padding = 1;
    net->emplace_back<nn::Conv2d>(1, 4, 3, same);
    net->emplace_back<nn::BatchNorm2d>(4);
    net->push_back([](const Tensor& t) { return relu(t); });
    net->emplace_back<nn::AdaptiveAvgPool2d>(1);
    net->emplace_back<nn::Flatten>();
    net->emplace_back<nn::Linear>(4, 3);
    return net;
  };
  auto reference = make(), model = make();
  model->to(pg.device());
  convert_sync_batchnorm(*model, pg);
  DistributedDataParallel ddp(*model, pg);
  auto opt_ref = testing::sgd_momentum(reference->parameters());
  auto opt = testing::sgd_momentum(ddp.parameters());
  for (int step = 0; step < 3; ++step) {
    manual_seed(100 + step);
    const Tensor x = randn({total, 1, 6, 6}), labels = randint(0, 3, {total});
    opt_ref->zero_grad();
    nn::cross_entropy((*reference)(x), labels).backward();
    opt_ref->step();

    opt->zero_grad();
    const Tensor mine = x.narrow(0, offset_of(rank), share_of(rank)).to(pg.device());
    CrossEntropyOptions sum_reduction;
    sum_reduction.reduction = Reduction::Sum;
    Tensor loss =
        mul(nn::cross_entropy(ddp(mine), labels.narrow(0, offset_of(rank), share_of(rank)).to(pg.device()),
                              sum_reduction),
            static_cast<double>(world) / static_cast<double>(total));
    loss.backward();
    opt->step();
  }
  const auto got = model->parameters(), want = reference->parameters();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("parameter " << i);
    testing::require_close(got[i], want[i], 1e-5, 1e-7);
  }
}
