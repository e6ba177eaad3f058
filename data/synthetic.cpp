// SyntheticClassification: labels and pixels computed from Philox on demand.
#include "data/synthetic.h"

#include "base/error.h"
#include "data/seeding.h"

namespace mg::data {

namespace {
// Philox call offsets separating the three kinds of numbers drawn from one key.
constexpr uint64_t kLabelCall = 0, kCentroidCall = 1, kNoiseCall = 2;
}  // namespace

SyntheticClassification::SyntheticClassification(int64_t size, Shape sample_shape, int64_t classes,
                                                 uint64_t seed, double noise)
    : size_(size),
      sample_shape_(std::move(sample_shape)),
      numel_(shape_numel(sample_shape_)),
      classes_(classes),
      key_(stream_key(seed, Stream::Synthetic)),
      noise_(static_cast<float>(noise)) {
  MG_CHECK(size >= 0, "SyntheticClassification: size must be >= 0, got ", size);
  MG_CHECK(classes >= 1, "SyntheticClassification: classes must be >= 1, got ", classes);
  MG_CHECK(noise >= 0, "SyntheticClassification: noise must be >= 0, got ", noise);
  for (int64_t s : sample_shape_) {
    MG_CHECK(s > 0, "SyntheticClassification: sample_shape ", shape_str(sample_shape_),
             " has a non-positive size");
  }
  centroids_.resize(static_cast<size_t>(classes_ * numel_));
  for (size_t e = 0; e < centroids_.size(); ++e) centroids_[e] = philox_normal(key_, e, kCentroidCall);
}

int64_t SyntheticClassification::label(int64_t index) const {
  check_index("SyntheticClassification", index, size_);
  const Random128 r = philox128(key_, static_cast<uint64_t>(index), kLabelCall);
  return static_cast<int64_t>(below(r.lo, static_cast<uint64_t>(classes_)));
}

void SyntheticClassification::fill(int64_t index, float* out) const {
  const float* centroid = centroids_.data() + label(index) * numel_;
  const uint64_t first = static_cast<uint64_t>(index) * static_cast<uint64_t>(numel_);
  for (int64_t e = 0; e < numel_; ++e) {
    out[e] = centroid[e] + noise_ * philox_normal(key_, first + static_cast<uint64_t>(e), kNoiseCall);
  }
}

Example SyntheticClassification::get(int64_t index) const {
  Tensor data = empty(sample_shape_);
  fill(index, data.data<float>());
  return Example{data, scalar_tensor(static_cast<double>(label(index)), TensorOptions{DType::i64})};
}

Batch SyntheticClassification::get_batch(const std::vector<int64_t>& indices) const {
  Shape shape{static_cast<int64_t>(indices.size())};
  shape.insert(shape.end(), sample_shape_.begin(), sample_shape_.end());
  Tensor data = empty(shape);
  Tensor target = empty({static_cast<int64_t>(indices.size())}, TensorOptions{DType::i64});
  for (size_t b = 0; b < indices.size(); ++b) {
    fill(indices[b], data.data<float>() + static_cast<int64_t>(b) * numel_);
    target.data<int64_t>()[b] = label(indices[b]);
  }
  return Batch{data, target};
}

}  // namespace mg::data
