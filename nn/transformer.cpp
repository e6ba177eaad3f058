// TransformerBlock and its MLP: two residual additions around registered sublayers.
#include "nn/transformer.h"

#include "core/ops.h"

namespace mg::nn {

TransformerMLP::TransformerMLP(int64_t embd, double p)
    : n_embd(embd), dropout_p(p), c_fc(embd, 4 * embd), c_proj(4 * embd, embd), dropout(p) {
  register_module("c_fc", c_fc);
  register_module("gelu", gelu);
  register_module("c_proj", c_proj);
  register_module("dropout", dropout);
}

Tensor TransformerMLP::forward(const Tensor& x) { return dropout(c_proj(gelu(c_fc(x)))); }

std::shared_ptr<Module> TransformerMLP::clone_empty() const {
  return std::make_shared<TransformerMLP>(n_embd, dropout_p);
}

TransformerBlock::TransformerBlock(int64_t embd, int64_t heads, double p, AttentionImpl attention)
    : n_embd(embd),
      n_head(heads),
      dropout_p(p),
      ln_1(embd),
      attn(embd, heads, p, attention),
      ln_2(embd),
      mlp(embd, p) {
  register_module("ln_1", ln_1);
  register_module("attn", attn);
  register_module("ln_2", ln_2);
  register_module("mlp", mlp);
}

Tensor TransformerBlock::forward(const Tensor& x) {
  Tensor h = add(x, attn(ln_1(x)));
  return add(h, mlp(ln_2(h)));
}

std::shared_ptr<Module> TransformerBlock::clone_empty() const {
  return std::make_shared<TransformerBlock>(n_embd, n_head, dropout_p, attn.impl);
}

}  // namespace mg::nn
