#!/usr/bin/python3
"""Writes tests/fixtures/nn_reference.json: PyTorch reference values for multigrad's nn layers.

Run ONCE (and again only when cases change) with Debian's python3-torch:

    /usr/bin/python3 scripts/gen_nn_reference.py

tests/nn/test_nn_reference.cpp reads the file; tests never need PyTorch. Every case holds

    name       unique case name (the Catch2 section name)
    layer      the multigrad layer to build, with its constructor arguments in "config"
    training   whether the layer runs in train() (true) or eval() (false) mode
    state      the layer's state dict in multigrad's names (parameters and buffers before
               the forward); the test loads it with load_state_dict
    input      the input, f64
    output     PyTorch's output, f64
    out_weight the loss is (output * out_weight).sum()
    grads      d loss / d input ("input") and d loss / d each parameter, in multigrad's names
    state_after  buffers after the forward (BatchNorm's running statistics)

PyTorch's parameter names differ for attention: nn.MultiheadAttention holds q, k, v as one
in_proj_weight [3C, C] (rows q, then k, then v) and in_proj_bias [3C], which are exactly
multigrad's c_attn.weight / c_attn.bias; out_proj is c_proj. The mapping is spelled out in
attention_state() below.

Inputs and parameters are rounded to 6 decimals (short in the file, and exactly the values
the layer ran on); outputs and gradients are written with full f64 precision. The file must
stay under 150 KB.
"""

import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

SEED = 20240612
torch.manual_seed(SEED)
torch.set_default_dtype(torch.float64)

cases = []


def quantize(t):
    return torch.round(t.detach().double() * 1e6) / 1e6


def enc(t):
    t = t.detach().contiguous()
    if t.dtype == torch.int64:
        return {"shape": list(t.shape), "dtype": "i64", "data": [int(v) for v in t.reshape(-1).tolist()]}
    return {"shape": list(t.shape), "dtype": "f64", "data": [float(v) for v in t.double().reshape(-1).tolist()]}


def quantize_module(module):
    """Rounds every parameter and floating buffer in place."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(quantize(p))
        for b in module.buffers():
            if b.is_floating_point():
                b.copy_(quantize(b))


def run_case(name, layer, config, module, x, state_fn, training=True, grad_names=None, buffer_names=()):
    """Runs module(x) in the given mode, back-propagates (out * w).sum() and stores the case.

    state_fn(module) -> {multigrad name: tensor} (parameters and buffers before the forward)
    grad_names: {multigrad name: torch parameter} whose gradients to store
    buffer_names: {multigrad name: torch buffer} to store after the forward
    """
    quantize_module(module)
    module.train(training)
    x = quantize(x).requires_grad_(True)
    state = {k: enc(v) for k, v in state_fn(module).items()}  # before the forward changes buffers
    out = module(x)
    w = quantize(torch.randn(out.shape))
    (out * w).sum().backward()
    grads = {"input": enc(x.grad)}
    for k, p in (grad_names or {}).items():
        grads[k] = enc(p.grad)
    cases.append({
        "name": name,
        "layer": layer,
        "config": config,
        "training": training,
        "state": state,
        "input": enc(x),
        "output": enc(out),
        "out_weight": enc(w),
        "grads": grads,
        "state_after": {k: enc(b) for k, b in dict(buffer_names).items()},
    })


def params_of(module, mapping):
    """{multigrad name: torch tensor} from {multigrad name: torch attribute path}."""
    out = {}
    for ours, theirs in mapping.items():
        obj = module
        for part in theirs.split("."):
            obj = getattr(obj, part)
        out[ours] = obj
    return out


# ---------------------------------------------------------------- Linear
lin = nn.Linear(5, 4)
run_case("linear", "Linear", {"in": 5, "out": 4, "bias": True}, lin, torch.randn(3, 5),
         lambda m: {"weight": m.weight, "bias": m.bias}, grad_names={"weight": lin.weight, "bias": lin.bias})

lin3 = nn.Linear(3, 2, bias=False)
run_case("linear_3d_no_bias", "Linear", {"in": 3, "out": 2, "bias": False}, lin3, torch.randn(2, 3, 3),
         lambda m: {"weight": m.weight}, grad_names={"weight": lin3.weight})

# ---------------------------------------------------------------- Conv2d
conv = nn.Conv2d(2, 3, 3, stride=2, padding=1)
run_case("conv2d_stride2_pad1", "Conv2d",
         {"in": 2, "out": 3, "kernel": 3, "stride": 2, "padding": 1, "dilation": 1, "bias": True}, conv,
         torch.randn(2, 2, 7, 7), lambda m: {"weight": m.weight, "bias": m.bias},
         grad_names={"weight": conv.weight, "bias": conv.bias})

conv_d = nn.Conv2d(2, 2, 2, stride=1, padding=0, dilation=2, bias=False)
run_case("conv2d_dilation2_no_bias", "Conv2d",
         {"in": 2, "out": 2, "kernel": 2, "stride": 1, "padding": 0, "dilation": 2, "bias": False}, conv_d,
         torch.randn(1, 2, 6, 5), lambda m: {"weight": m.weight}, grad_names={"weight": conv_d.weight})


# ---------------------------------------------------------------- BatchNorm
def bn_state(m):
    return {"weight": m.weight, "bias": m.bias, "running_mean": m.running_mean, "running_var": m.running_var,
            "num_batches_tracked": m.num_batches_tracked}


def make_bn(cls, c):
    bn = cls(c)
    with torch.no_grad():  # non-trivial affine parameters and running statistics
        bn.weight.copy_(torch.rand(c) + 0.5)
        bn.bias.copy_(torch.randn(c) * 0.5)
        bn.running_mean.copy_(torch.randn(c) * 0.3)
        bn.running_var.copy_(torch.rand(c) + 0.5)
        bn.num_batches_tracked.fill_(3)
    return bn


for training in (True, False):
    bn = make_bn(nn.BatchNorm2d, 3)
    mode = "train" if training else "eval"
    run_case("batchnorm2d_" + mode, "BatchNorm2d", {"num_features": 3}, bn, torch.randn(4, 3, 4, 4) * 2 + 1,
             bn_state, training=training, grad_names={"weight": bn.weight, "bias": bn.bias},
             buffer_names={"running_mean": bn.running_mean, "running_var": bn.running_var,
                           "num_batches_tracked": bn.num_batches_tracked})

bn1 = make_bn(nn.BatchNorm1d, 4)
run_case("batchnorm1d_train", "BatchNorm1d", {"num_features": 4}, bn1, torch.randn(6, 4), bn_state,
         training=True, grad_names={"weight": bn1.weight, "bias": bn1.bias},
         buffer_names={"running_mean": bn1.running_mean, "running_var": bn1.running_var,
                       "num_batches_tracked": bn1.num_batches_tracked})

# ---------------------------------------------------------------- LayerNorm
ln = nn.LayerNorm(6)
with torch.no_grad():
    ln.weight.copy_(torch.rand(6) + 0.5)
    ln.bias.copy_(torch.randn(6) * 0.5)
run_case("layernorm", "LayerNorm", {"normalized_size": 6}, ln, torch.randn(2, 3, 6) * 1.5 + 0.5,
         lambda m: {"weight": m.weight, "bias": m.bias}, grad_names={"weight": ln.weight, "bias": ln.bias})


# ---------------------------------------------------------------- attention
def causal_mask(t):
    # PyTorch's float attn_mask is *added* to the scores: -inf above the diagonal hides the future.
    return torch.triu(torch.full((t, t), float("-inf")), diagonal=1)


class TorchCausalSelfAttention(nn.Module):
    """nn.MultiheadAttention with a causal mask, on [B, T, C]."""

    def __init__(self, c, h):
        super().__init__()
        self.mha = nn.MultiheadAttention(c, h, batch_first=True)

    def forward(self, x):
        y, _ = self.mha(x, x, x, attn_mask=causal_mask(x.shape[1]), need_weights=False)
        return y


# multigrad name -> PyTorch attribute (q, k, v rows of in_proj_* are c_attn's rows in the same order)
ATTENTION_NAMES = {
    "c_attn.weight": "mha.in_proj_weight",
    "c_attn.bias": "mha.in_proj_bias",
    "c_proj.weight": "mha.out_proj.weight",
    "c_proj.bias": "mha.out_proj.bias",
}

attn = TorchCausalSelfAttention(8, 2)
with torch.no_grad():  # MHA zero-initialises its biases; make them matter
    attn.mha.in_proj_bias.copy_(torch.randn(24) * 0.1)
    attn.mha.out_proj.bias.copy_(torch.randn(8) * 0.1)
run_case("causal_self_attention", "CausalSelfAttention", {"n_embd": 8, "n_head": 2}, attn, torch.randn(2, 5, 8),
         lambda m: params_of(m, ATTENTION_NAMES), grad_names=params_of(attn, ATTENTION_NAMES))


class TorchBlock(nn.Module):
    """GPT-2's pre-LN block from PyTorch parts."""

    def __init__(self, c, h):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c)
        self.attn = TorchCausalSelfAttention(c, h)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.c_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


BLOCK_NAMES = {"ln_1.weight": "ln_1.weight", "ln_1.bias": "ln_1.bias", "ln_2.weight": "ln_2.weight",
               "ln_2.bias": "ln_2.bias", "mlp.c_fc.weight": "c_fc.weight", "mlp.c_fc.bias": "c_fc.bias",
               "mlp.c_proj.weight": "c_proj.weight", "mlp.c_proj.bias": "c_proj.bias"}
BLOCK_NAMES.update({"attn." + k: "attn." + v for k, v in ATTENTION_NAMES.items()})

block = TorchBlock(8, 2)
with torch.no_grad():
    for lnm in (block.ln_1, block.ln_2):
        lnm.weight.copy_(torch.rand(8) + 0.5)
        lnm.bias.copy_(torch.randn(8) * 0.2)
    block.attn.mha.in_proj_bias.copy_(torch.randn(24) * 0.1)
    block.attn.mha.out_proj.bias.copy_(torch.randn(8) * 0.1)
run_case("transformer_block", "TransformerBlock", {"n_embd": 8, "n_head": 2}, block, torch.randn(2, 4, 8),
         lambda m: params_of(m, BLOCK_NAMES), grad_names=params_of(block, BLOCK_NAMES))

# ---------------------------------------------------------------- write
doc = {
    "generator": "scripts/gen_nn_reference.py",
    "torch_version": torch.__version__,
    "seed": SEED,
    "cases": cases,
}
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "nn_reference.json")
text = json.dumps(doc, separators=(",", ":"))
assert len(text) < 150_000, "nn_reference.json would be %d bytes" % len(text)
with open(path, "w") as f:
    f.write(text)
    f.write("\n")
print("wrote %s: %d cases, %d bytes" % (os.path.normpath(path), len(cases), len(text)))
