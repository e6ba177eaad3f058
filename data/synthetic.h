// SyntheticClassification: a made-up but learnable classification dataset, for benchmarks and
// tests that must not depend on files.
//
// Sample i has label y_i uniform in [0, classes) and data = centroid[y_i] + noise_i, where the
// centroids and the noise are standard normal numbers drawn with Philox from (seed, i, element):
// any sample can be computed on its own, on any thread, and the same seed gives the same dataset
// everywhere. Nothing is stored but the `classes` centroids, so N can be large.
#pragma once

#include <vector>

#include "data/dataset.h"

namespace mg::data {

class SyntheticClassification : public Dataset {
 public:
  // noise: standard deviation of the per-sample noise (centroids have unit variance).
  SyntheticClassification(int64_t size, Shape sample_shape, int64_t classes, uint64_t seed = 0,
                          double noise = 1.0);

  int64_t size() const override { return size_; }
  // data: f32 sample_shape; target: i64 scalar.
  Example get(int64_t index) const override;
  // data: f32 [B, sample_shape...]; target: i64 [B].
  Batch get_batch(const std::vector<int64_t>& indices) const override;

  const Shape& sample_shape() const { return sample_shape_; }
  int64_t classes() const { return classes_; }
  int64_t label(int64_t index) const;

 private:
  void fill(int64_t index, float* out) const;

  int64_t size_;
  Shape sample_shape_;
  int64_t numel_;
  int64_t classes_;
  uint64_t key_;
  float noise_;
  std::vector<float> centroids_;  // [classes, numel]
};

}  // namespace mg::data
