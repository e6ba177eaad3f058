// Embedding: mg::embedding gathers rows forward and scatter-adds them backward.
#include "nn/embedding.h"

#include "core/grad_mode.h"
#include "core/ops.h"
#include "nn/init.h"

namespace mg::nn {

Embedding::Embedding(int64_t num, int64_t dim, int64_t pad)
    : num_embeddings(num), embedding_dim(dim), padding_idx(pad) {
  MG_CHECK(num > 0 && dim > 0, "Embedding: num_embeddings and embedding_dim must be positive, got ", num,
           " and ", dim);
  MG_CHECK(pad >= -1 && pad < num, "Embedding: padding_idx ", pad, " must be -1 (none) or in [0, ", num, ")");
  weight = empty({num, dim});
  register_parameter("weight", weight);
  init::normal_(weight);
  if (pad >= 0) {
    NoGradGuard no_grad;
    weight.select(0, pad).zero_();
  }
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(weight, indices, padding_idx); }

std::shared_ptr<Module> Embedding::clone_empty() const {
  return std::make_shared<Embedding>(num_embeddings, embedding_dim, padding_idx);
}

std::string Embedding::extra_repr() const {
  return str_cat(num_embeddings, ", ", embedding_dim,
                 padding_idx >= 0 ? str_cat(", padding_idx=", padding_idx) : "");
}

}  // namespace mg::nn
