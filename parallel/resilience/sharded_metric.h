// ShardedMetric: an evaluation metric over a DistributedSampler's shards, each sample counted once.
//
// A DistributedSampler pads the dataset so every rank gets as many samples (DDP needs every rank
// to run the same number of steps): with 10000 test images and 3 ranks, each rank scores 3334
// and 10002 are counted -- two images twice -- unless the padding is dropped. PyTorch leaves
// that to the user (torchvision's reference scripts warn about it). Here each rank adds its
// per-sample values batch by batch; the values past the rank's real samples (the padding comes
// last, DistributedSampler::real_size) are dropped, and all_reduce sums over the ranks:
//
//   parallel::ShardedMetric correct(test_sampler);
//   for (auto& [x, y] : test_loader) correct.add(eq(argmax(model(x), 1), y));
//   double accuracy = correct.all_reduce(pg).mean();   // over exactly the 10000 images
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "data/distributed_sampler.h"
#include "parallel/comm/process_group.h"

namespace mg::parallel {

class ShardedMetric {
 public:
  // The sampler's current epoch fixes which of this rank's samples are real.
  explicit ShardedMetric(const data::DistributedSampler& sampler) : real_(sampler.real_size()) {}

  // The next batch's per-sample values (1-D, any dtype and device), in the sampler's order.
  void add(const Tensor& per_sample);

  struct Total {
    double sum = 0;
    int64_t count = 0;
    double mean() const { return count > 0 ? sum / static_cast<double>(count) : 0.0; }
  };
  Total local() const { return {sum_, counted_}; }    // this rank's real samples so far
  Total all_reduce(const ProcessGroup& group) const;  // a collective: every rank's, summed

 private:
  int64_t real_;
  int64_t offered_ = 0;  // values given to add(), padding included
  int64_t counted_ = 0;
  double sum_ = 0;
};

}  // namespace mg::parallel
