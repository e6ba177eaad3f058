// Fashion-MNIST: find the files, validate them, serve samples as f32 tensors.
#include "data/fashion_mnist.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "data/gzip.h"
#include "data/idx.h"

namespace mg::data {

std::string FashionMNIST::default_root() {
  const char* env = std::getenv("MG_FASHION_MNIST_DIR");
  return (env && *env) ? std::string(env) : std::string("/usr/share/datasets/fashion-mnist");
}

const std::array<const char*, 10>& FashionMNIST::class_names() {
  static const std::array<const char*, 10> names = {"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                                    "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                                    "Bag",         "Ankle boot"};
  return names;
}

namespace {
bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

// <root>/<stem>.gz if it exists (and zlib is available), else <root>/<stem>; the error lists both.
std::string find_file(const std::string& root, const std::string& stem) {
  const std::string base = root + "/" + stem;
  if (file_exists(base + ".gz") && has_gzip_support()) return base + ".gz";
  if (file_exists(base)) return base;
  if (file_exists(base + ".gz")) return base + ".gz";  // gunzip() explains that zlib is missing
  throw Error(str_cat("FashionMNIST: cannot find ", base, ".gz (nor the uncompressed ", base,
                      "); install Debian's dataset-fashion-mnist, or point MG_FASHION_MNIST_DIR (or the root "
                      "argument) at a folder with the four IDX files"));
}

std::string dims_str(const std::vector<int64_t>& dims) {
  std::ostringstream os;
  for (size_t d = 0; d < dims.size(); ++d) os << (d ? " x " : "") << dims[d];
  return os.str();
}
}  // namespace

FashionMNISTArrays load_fashion_mnist_files(const std::string& images_path, const std::string& labels_path) {
  IdxArray images = read_idx(images_path);
  MG_CHECK(images.magic() == 0x00000803, images_path,
           ": expected an IDX image file (magic 0x00000803: u8, 3 dims), ", "got ",
           idx_magic_hex(images.magic()));
  MG_CHECK(images.dims[1] == FashionMNIST::kRows && images.dims[2] == FashionMNIST::kCols, images_path,
           ": expected 28 x 28 images, got dims ", dims_str(images.dims));

  IdxArray labels = read_idx(labels_path);
  MG_CHECK(labels.magic() == 0x00000801, labels_path,
           ": expected an IDX label file (magic 0x00000801: u8, 1 dim), ", "got ",
           idx_magic_hex(labels.magic()));
  MG_CHECK(images.dims[0] == labels.dims[0], "FashionMNIST: ", images_path, " has ", images.dims[0],
           " images but ", labels_path, " has ", labels.dims[0], " labels");
  MG_CHECK(images.dims[0] > 0, "FashionMNIST: ", images_path, " has no images");
  for (size_t i = 0; i < labels.bytes.size(); ++i) {
    MG_CHECK(labels.bytes[i] < FashionMNIST::kClasses, labels_path, ": label ", int(labels.bytes[i]),
             " at index ", i, " is outside [0, 9]");
  }
  return FashionMNISTArrays{std::move(images.bytes), std::move(labels.bytes), images.dims[0]};
}

FashionMNIST::FashionMNIST(Split split, const std::string& root) : split_(split) {
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  images_path_ = find_file(root, prefix + "-images-idx3-ubyte");
  labels_path_ = find_file(root, prefix + "-labels-idx1-ubyte");
  FashionMNISTArrays arrays = load_fashion_mnist_files(images_path_, labels_path_);
  count_ = arrays.count;
  pixels_ = std::make_shared<const std::vector<uint8_t>>(std::move(arrays.pixels));
  labels_ = std::make_shared<const std::vector<uint8_t>>(std::move(arrays.labels));
}

namespace {
constexpr int64_t kPixels = FashionMNIST::kRows * FashionMNIST::kCols;

void to_unit_floats(const uint8_t* pixels, float* out) {
  for (int64_t p = 0; p < kPixels; ++p) out[p] = static_cast<float>(pixels[p]) * (1.0f / 255.0f);
}
}  // namespace

Example FashionMNIST::get(int64_t index) const {
  check_index("FashionMNIST::get", index, count_);
  Tensor data = empty({1, kRows, kCols});
  to_unit_floats(pixels_->data() + index * kPixels, data.data<float>());
  Tensor target = empty({}, TensorOptions{DType::i64});
  *target.data<int64_t>() = (*labels_)[static_cast<size_t>(index)];
  return Example{data, target};
}

Batch FashionMNIST::get_batch(const std::vector<int64_t>& indices) const {
  const int64_t batch = static_cast<int64_t>(indices.size());
  for (int64_t index : indices) check_index("FashionMNIST::get_batch", index, count_);
  Tensor data = empty({batch, 1, kRows, kCols});
  Tensor target = empty({batch}, TensorOptions{DType::i64});
  float* out = data.data<float>();
  int64_t* labels = target.data<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    to_unit_floats(pixels_->data() + indices[b] * kPixels, out + b * kPixels);
    labels[b] = (*labels_)[static_cast<size_t>(indices[b])];
  }
  return Batch{data, target};
}

}  // namespace mg::data
