// Fashion-MNIST (Xiao, Rasul, Vollgraf 2017): 70,000 28x28 grayscale images of clothing in 10
// classes, a drop-in replacement for MNIST that is harder to get right by accident.
//
// The files are IDX (see idx.h), gzipped, as Debian's dataset-fashion-mnist installs them:
//   <root>/train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz   (60,000 samples)
//   <root>/t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz    (10,000 samples)
// Uncompressed copies (same names without .gz) are used when the .gz is absent.
//
// The images stay in memory as the u8 bytes of the file (47 MB for the training split, a quarter
// of f32); get() and get_batch() convert to f32 in [0, 1] on the fly. Loading checks everything a
// damaged file can get wrong (idx.h, gzip.h) plus what Fashion-MNIST promises: 28x28 images, one
// label per image, labels in [0, 9].
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace mg::data {

enum class Split { Train, Test };

class FashionMNIST : public Dataset {
 public:
  static constexpr int64_t kRows = 28, kCols = 28, kClasses = 10;
  // Mean and standard deviation of the training pixels in [0, 1], for Normalize.
  static constexpr double kMean = 0.2860, kStd = 0.3530;

  // $MG_FASHION_MNIST_DIR if set, else /usr/share/datasets/fashion-mnist.
  static std::string default_root();
  // "T-shirt/top", "Trouser", ..., "Ankle boot".
  static const std::array<const char*, 10>& class_names();

  explicit FashionMNIST(Split split, const std::string& root = default_root());

  int64_t size() const override { return count_; }
  // data: f32 [1, 28, 28] in [0, 1]; target: i64 scalar (0-d) class label.
  Example get(int64_t index) const override;
  // data: f32 [B, 1, 28, 28]; target: i64 [B]. Straight from the bytes, no per-sample tensors.
  Batch get_batch(const std::vector<int64_t>& indices) const override;

  Split split() const { return split_; }
  const std::string& images_path() const { return images_path_; }
  const std::string& labels_path() const { return labels_path_; }
  // The raw file contents: count * 28 * 28 pixels (row-major), count labels.
  const std::vector<uint8_t>& pixels() const { return *pixels_; }
  const std::vector<uint8_t>& labels() const { return *labels_; }

 private:
  Split split_;
  int64_t count_ = 0;
  std::string images_path_, labels_path_;
  // Shared, immutable after construction: copies of the dataset share the memory, and worker
  // threads may read it concurrently without locks.
  std::shared_ptr<const std::vector<uint8_t>> pixels_, labels_;
};

// Loads an images/labels pair of IDX files with the checks described above (exposed so tests can
// feed it hand-made files). Returns {pixels, labels}.
struct FashionMNISTArrays {
  std::vector<uint8_t> pixels;
  std::vector<uint8_t> labels;
  int64_t count = 0;
};
FashionMNISTArrays load_fashion_mnist_files(const std::string& images_path, const std::string& labels_path);

}  // namespace mg::data
