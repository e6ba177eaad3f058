#!/usr/bin/python3
"""Writes tests/fixtures/torch_reference.json: PyTorch reference values for multigrad's ops.

Run ONCE (and again only when cases change) with Debian's python3-torch:

    /usr/bin/python3 scripts/gen_torch_reference.py

The C++ test tests/core/test_torch_reference.cpp reads the JSON file; tests never need
PyTorch. Every case stores:

    name     unique case name (the Catch2 section name)
    op       the multigrad op the test dispatches to
    attrs    op attributes (dims, keepdim, exponent, reduction, stride, ...)
    inputs   [{name, shape, dtype, data, requires_grad}] in the op's argument order;
             integer inputs (targets, indices) are i64, conditions are bool (0/1)
    outputs  [{shape, dtype, data}] (a list: split returns several tensors)
    weights  [{shape, dtype, data}] one per output, for differentiable ops: the loss is
             sum_k (outputs[k] * weights[k]).sum()
    grads    {input name: {shape, dtype, data}} d loss / d input for each input with
             requires_grad

Data are flat row-major lists. Inputs and weights are rounded to 6 decimals before use
(short in the file, and exactly the values the op ran on); f64 outputs and gradients are
written with full precision (Python's repr); f32 values as the shortest decimal that
round-trips the float. Inputs come from torch.manual_seed and are kept away from kinks
(abs/relu at 0, ties in max/maximum/max_pool, clamp bounds) so gradients are well defined.
The file must stay under 200 KB.
"""

import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

SEED = 20240611
torch.manual_seed(SEED)

DTYPES = {torch.float64: "f64", torch.float32: "f32", torch.int64: "i64", torch.bool: "bool"}

cases = []
names = set()


def short_f32(v):
    """The double nearest to the shortest decimal that round-trips float32 value v: JSON then
    holds <= 9 significant digits, and casting the parsed double to float gives v back."""
    d = float(str(np.float32(v)))
    assert np.float32(d) == np.float32(v), v
    return d


def flat(t):
    t = t.detach().contiguous().reshape(-1)
    if t.dtype == torch.float64:
        return [float(v) for v in t.tolist()]  # repr: full precision
    if t.dtype == torch.float32:
        return [short_f32(v) for v in t.tolist()]
    return [int(v) for v in t.tolist()]


def quantize(t):
    """Rounds float data to 6 decimals (so inputs and weights are short in the JSON); the op
    then runs on exactly the values the file holds."""
    if not t.is_floating_point():
        return t
    return (torch.round(t.double() * 1e6) / 1e6).to(t.dtype)


def enc(t):
    return {"shape": list(t.shape), "dtype": DTYPES[t.dtype], "data": flat(t)}


def randn(*shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=torch.float64).to(dtype)


def positive(*shape, dtype=torch.float64, lo=0.3, hi=2.5):
    return (torch.rand(*shape, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


def away_from_zero(*shape, dtype=torch.float64, margin=0.1):
    x = torch.randn(*shape, dtype=torch.float64)
    x = torch.where(x.abs() < margin, torch.sign(x + 1e-12) * margin + x, x)
    return x.to(dtype)


def add_case(name, op, fn, inputs, attrs=None, differentiable=True):
    """inputs: list of (name, tensor); fn(*tensors) -> tensor or list of tensors."""
    assert name not in names, name
    names.add(name)
    leaves = []
    for _, t in inputs:
        t = quantize(t.detach().clone())
        if op in ("max", "min", "maximum", "minimum", "max_pool2d", "maximum_scalar", "argmax"):
            assert t.unique().numel() == t.numel(), "ties in %s" % name  # gradients need unique maxima
        if differentiable and t.is_floating_point():
            t.requires_grad_(True)
        leaves.append(t)
    out = fn(*leaves)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    case = {
        "name": name,
        "op": op,
        "attrs": attrs or {},
        "inputs": [
            dict(enc(t), name=n, requires_grad=bool(t.requires_grad)) for (n, _), t in zip(inputs, leaves)
        ],
        "outputs": [enc(o) for o in outs],
    }
    if differentiable:
        weights = [quantize(torch.randn(o.shape, dtype=torch.float64).to(o.dtype)) for o in outs]
        loss = sum((o * w).sum() for o, w in zip(outs, weights))
        loss.backward()
        case["weights"] = [enc(w) for w in weights]
        case["grads"] = {n: enc(t.grad) for (n, _), t in zip(inputs, leaves) if t.requires_grad}
        for n, g in case["grads"].items():
            assert g["data"] is not None, (name, n)
    cases.append(case)


# ---------------------------------------------------------------- unary
add_case("neg", "neg", torch.neg, [("x", randn(3, 4))])
add_case("exp", "exp", torch.exp, [("x", randn(3, 4))])
add_case("exp_f32", "exp", torch.exp, [("x", randn(2, 5, dtype=torch.float32))])
add_case("log", "log", torch.log, [("x", positive(3, 4))])
add_case("sqrt", "sqrt", torch.sqrt, [("x", positive(3, 4))])
add_case("rsqrt", "rsqrt", torch.rsqrt, [("x", positive(3, 4))])
add_case("abs", "abs", torch.abs, [("x", away_from_zero(3, 4))])
add_case("tanh", "tanh", torch.tanh, [("x", randn(3, 4))])
add_case("sigmoid", "sigmoid", torch.sigmoid, [("x", randn(3, 4))])
add_case("sigmoid_f32", "sigmoid", torch.sigmoid, [("x", randn(4, 3, dtype=torch.float32))])
add_case("relu", "relu", torch.relu, [("x", away_from_zero(3, 4))])
add_case("gelu_tanh", "gelu", lambda x: F.gelu(x, approximate="tanh"), [("x", randn(3, 4) * 2)])
add_case("gelu_tanh_f32", "gelu", lambda x: F.gelu(x, approximate="tanh"),
         [("x", randn(2, 6, dtype=torch.float32) * 2)])
add_case("square", "square", torch.square, [("x", randn(3, 4))])
add_case("reciprocal", "reciprocal", torch.reciprocal, [("x", away_from_zero(3, 4, margin=0.3))])
for e in (2.0, 3.0, 0.5, -1.5):
    add_case("pow_%g" % e, "pow", lambda x, e=e: torch.pow(x, e), [("x", positive(3, 4))], {"exponent": e})
add_case("pow_3_negative_base", "pow", lambda x: torch.pow(x, 3.0), [("x", randn(2, 3))], {"exponent": 3.0})

# ---------------------------------------------------------------- binary, broadcasting
for op, fn in (("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("div", torch.div),
               ("maximum", torch.maximum), ("minimum", torch.minimum)):
    b = away_from_zero(2, 4, margin=0.3) if op == "div" else randn(2, 4)
    add_case(op + "_broadcast", op, fn, [("a", randn(3, 1, 4)), ("b", b)])
add_case("add_alpha", "add", lambda a, b: torch.add(a, b, alpha=-2.5), [("a", randn(2, 3)), ("b", randn(3))],
         {"alpha": -2.5})
add_case("mul_same_shape_f32", "mul", torch.mul,
         [("a", randn(3, 4, dtype=torch.float32)), ("b", randn(3, 4, dtype=torch.float32))])
add_case("div_broadcast_rows", "div", torch.div, [("a", randn(4, 1)), ("b", away_from_zero(1, 3, margin=0.3))])
add_case("maximum_scalar", "maximum_scalar", lambda x: torch.clamp(x, min=0.25), [("x", away_from_zero(3, 4))],
         {"scalar": 0.25})
add_case("add_scalar", "add_scalar", lambda x: x + 1.75, [("x", randn(2, 3))], {"scalar": 1.75})
add_case("rsub_scalar", "rsub_scalar", lambda x: 2.0 - x, [("x", randn(2, 3))], {"scalar": 2.0})
add_case("rdiv_scalar", "rdiv_scalar", lambda x: 3.0 / x, [("x", away_from_zero(2, 3, margin=0.3))],
         {"scalar": 3.0})

# ---------------------------------------------------------------- where, clamp
cond = torch.rand(3, 4) > 0.5
add_case("where_broadcast", "where", torch.where, [("condition", cond), ("a", randn(3, 4)), ("b", randn(4))])
add_case("where_broadcast_cond", "where", torch.where,
         [("condition", torch.rand(3, 1) > 0.5), ("a", randn(1, 4)), ("b", randn(3, 4))])


def clamp_input():
    x = randn(4, 5) * 2
    # keep values away from the bounds used below
    for bound in (-0.5, 0.75):
        x = torch.where((x - bound).abs() < 0.05, x + 0.1, x)
    return x


add_case("clamp_both", "clamp", lambda x: torch.clamp(x, -0.5, 0.75), [("x", clamp_input())],
         {"min": -0.5, "max": 0.75})
add_case("clamp_min", "clamp", lambda x: torch.clamp(x, min=-0.5), [("x", clamp_input())], {"min": -0.5})
add_case("clamp_max", "clamp", lambda x: torch.clamp(x, max=0.75), [("x", clamp_input())], {"max": 0.75})

# ---------------------------------------------------------------- reductions
x234 = lambda: randn(2, 3, 4)
for dims, keepdim in (([1], False), ([1], True), ([0, 2], False), ([-1], True), ([], False)):
    tag = "all" if not dims else "d" + "_".join(str(d).replace("-", "m") for d in dims)
    tag += "_keep" if keepdim else ""
    attrs = {"dims": dims, "keepdim": keepdim}
    if dims:
        add_case("sum_" + tag, "sum", lambda x, d=dims, k=keepdim: torch.sum(x, d, keepdim=k), [("x", x234())], attrs)
        add_case("mean_" + tag, "mean", lambda x, d=dims, k=keepdim: torch.mean(x, d, keepdim=k), [("x", x234())],
                 attrs)
        add_case("max_" + tag, "max", lambda x, d=dims, k=keepdim: torch.amax(x, d, keepdim=k), [("x", x234())],
                 attrs)
        add_case("min_" + tag, "min", lambda x, d=dims, k=keepdim: torch.amin(x, d, keepdim=k), [("x", x234())],
                 attrs)
    else:
        add_case("sum_all", "sum", lambda x: torch.sum(x), [("x", x234())], attrs)
        add_case("mean_all", "mean", lambda x: torch.mean(x), [("x", x234())], attrs)
        add_case("max_all", "max", lambda x: torch.max(x), [("x", x234())], attrs)
        add_case("min_all", "min", lambda x: torch.min(x), [("x", x234())], attrs)
add_case("sum_d1_f32", "sum", lambda x: torch.sum(x, [1]), [("x", randn(3, 5, dtype=torch.float32))],
         {"dims": [1], "keepdim": False})

for unbiased in (True, False):
    corr = 1 if unbiased else 0
    for dims, keepdim in (([1], False), ([0, 2], True), ([], False)):
        tag = ("all" if not dims else "d" + "_".join(map(str, dims))) + ("_keep" if keepdim else "")
        attrs = {"dims": dims, "keepdim": keepdim, "correction": corr}
        if dims:
            fn = lambda x, d=dims, k=keepdim, u=unbiased: torch.var(x, d, unbiased=u, keepdim=k)
        else:
            fn = lambda x, u=unbiased: torch.var(x, unbiased=u)
        add_case("var_c%d_%s" % (corr, tag), "var", fn, [("x", x234())], attrs)

add_case("argmax_d1", "argmax", lambda x: torch.argmax(x, 1), [("x", x234())], {"dim": 1, "keepdim": False},
         differentiable=False)
add_case("argmax_dm1_keep", "argmax", lambda x: torch.argmax(x, -1, keepdim=True), [("x", x234())],
         {"dim": -1, "keepdim": True}, differentiable=False)
add_case("argmax_all", "argmax", lambda x: torch.argmax(x), [("x", x234())], {}, differentiable=False)

# ---------------------------------------------------------------- linear algebra
add_case("matmul_2d", "matmul", torch.matmul, [("a", randn(3, 4)), ("b", randn(4, 5))])
add_case("matmul_2d_f32", "matmul", torch.matmul,
         [("a", randn(4, 6, dtype=torch.float32)), ("b", randn(6, 3, dtype=torch.float32))])
add_case("matmul_batched_broadcast", "matmul", torch.matmul, [("a", randn(2, 1, 3, 4)), ("b", randn(5, 4, 2))])
add_case("matmul_1d_2d", "matmul", torch.matmul, [("a", randn(4)), ("b", randn(4, 3))])
add_case("matmul_2d_1d", "matmul", torch.matmul, [("a", randn(3, 4)), ("b", randn(4))])
add_case("matmul_1d_1d", "matmul", torch.matmul, [("a", randn(5)), ("b", randn(5))])
add_case("matmul_3d_2d", "matmul", torch.matmul, [("a", randn(2, 3, 4)), ("b", randn(4, 2))])
add_case("linear_bias", "linear", F.linear, [("x", randn(4, 3)), ("weight", randn(5, 3)), ("bias", randn(5))])
add_case("linear_nobias_3d", "linear", F.linear, [("x", randn(2, 3, 4)), ("weight", randn(2, 4))])

# ---------------------------------------------------------------- softmax family
for dim in (0, -1):
    tag = "d0" if dim == 0 else "dm1"
    add_case("softmax_" + tag, "softmax", lambda x, d=dim: torch.softmax(x, d), [("x", randn(3, 5) * 2)],
             {"dim": dim})
    add_case("log_softmax_" + tag, "log_softmax", lambda x, d=dim: torch.log_softmax(x, d),
             [("x", randn(3, 5) * 2)], {"dim": dim})
add_case("softmax_3d_d1", "softmax", lambda x: torch.softmax(x, 1), [("x", randn(2, 3, 4))], {"dim": 1})
add_case("softmax_f32", "softmax", lambda x: torch.softmax(x, -1), [("x", randn(4, 6, dtype=torch.float32))],
         {"dim": -1})
add_case("log_softmax_f32", "log_softmax", lambda x: torch.log_softmax(x, -1),
         [("x", randn(4, 6, dtype=torch.float32))], {"dim": -1})

# ---------------------------------------------------------------- cross entropy


def ce_case(name, logits, targets, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    add_case(name, "cross_entropy",
             lambda x, t: F.cross_entropy(x, t, reduction=reduction, ignore_index=ignore_index,
                                          label_smoothing=label_smoothing),
             [("logits", logits), ("targets", targets)],
             {"reduction": reduction, "ignore_index": ignore_index, "label_smoothing": label_smoothing})


ce_case("cross_entropy_mean", randn(5, 4), torch.tensor([0, 3, 1, 1, 2]))
ce_case("cross_entropy_sum", randn(5, 4), torch.tensor([2, 0, 3, 1, 2]), reduction="sum")
ce_case("cross_entropy_none", randn(5, 4), torch.tensor([2, 0, 3, 1, 2]), reduction="none")
ce_case("cross_entropy_ignore_default", randn(5, 4), torch.tensor([1, -100, 3, -100, 0]))
ce_case("cross_entropy_ignore_index_2", randn(6, 4), torch.tensor([2, 0, 2, 1, 3, 2]), ignore_index=2)
ce_case("cross_entropy_ignore_sum", randn(6, 4), torch.tensor([2, 0, 2, 1, 3, 2]), reduction="sum",
        ignore_index=2)
ce_case("cross_entropy_label_smoothing", randn(5, 4), torch.tensor([0, 3, 1, 1, 2]), label_smoothing=0.1)
ce_case("cross_entropy_label_smoothing_sum", randn(5, 4), torch.tensor([0, 3, 1, 1, 2]), reduction="sum",
        label_smoothing=0.25)
ce_case("cross_entropy_label_smoothing_ignore", randn(5, 4), torch.tensor([0, -100, 1, 3, -100]),
        label_smoothing=0.2)
ce_case("cross_entropy_ncd", randn(2, 4, 3), torch.tensor([[0, 3, 1], [2, 2, 0]]))
ce_case("cross_entropy_ncd_ignore_smoothing", randn(2, 3, 4), torch.tensor([[0, -100, 1, 2], [2, 1, -100, 0]]),
        label_smoothing=0.1)
ce_case("cross_entropy_f32", randn(4, 5, dtype=torch.float32), torch.tensor([4, 0, 2, 1]))

# ---------------------------------------------------------------- layer norm
add_case("layer_norm_affine", "layer_norm", lambda x, w, b: F.layer_norm(x, [5], w, b, 1e-5),
         [("x", randn(3, 5) * 2 + 1), ("weight", randn(5)), ("bias", randn(5))],
         {"normalized_shape": [5], "eps": 1e-5})
add_case("layer_norm_plain", "layer_norm", lambda x: F.layer_norm(x, [5], eps=1e-5), [("x", randn(2, 3, 5))],
         {"normalized_shape": [5], "eps": 1e-5})
add_case("layer_norm_2d_shape_eps", "layer_norm", lambda x, w, b: F.layer_norm(x, [3, 4], w, b, 1e-3),
         [("x", randn(2, 3, 4)), ("weight", randn(3, 4)), ("bias", randn(3, 4))],
         {"normalized_shape": [3, 4], "eps": 1e-3})
add_case("layer_norm_f32", "layer_norm", lambda x, w, b: F.layer_norm(x, [6], w, b, 1e-5),
         [("x", randn(4, 6, dtype=torch.float32)), ("weight", randn(6, dtype=torch.float32)),
          ("bias", randn(6, dtype=torch.float32))],
         {"normalized_shape": [6], "eps": 1e-5})

# ---------------------------------------------------------------- embedding
add_case("embedding_repeated", "embedding", lambda w, i: F.embedding(i, w),
         [("weight", randn(6, 3)), ("indices", torch.tensor([[1, 4, 1], [0, 4, 1]]))], {"padding_idx": -1})
add_case("embedding_padding_idx", "embedding", lambda w, i: F.embedding(i, w, padding_idx=0),
         [("weight", randn(5, 4)), ("indices", torch.tensor([0, 2, 0, 3, 2]))], {"padding_idx": 0})

# ---------------------------------------------------------------- conv2d


def conv_case(name, x, w, b, stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
    inputs = [("x", x), ("weight", w)] + ([("bias", b)] if b is not None else [])
    add_case(name, "conv2d",
             lambda *t: F.conv2d(t[0], t[1], t[2] if len(t) > 2 else None, stride, padding, dilation),
             inputs, {"stride": list(stride), "padding": list(padding), "dilation": list(dilation)})


conv_case("conv2d_basic_bias", randn(2, 3, 5, 5), randn(4, 3, 3, 3), randn(4))
conv_case("conv2d_stride2_pad1", randn(1, 2, 6, 7), randn(3, 2, 3, 3), randn(3), stride=(2, 2), padding=(1, 1))
conv_case("conv2d_dilation2_nobias", randn(2, 2, 7, 6), randn(2, 2, 3, 2), None, dilation=(2, 2))
conv_case("conv2d_mixed", randn(1, 3, 8, 7), randn(2, 3, 3, 2), randn(2), stride=(2, 1), padding=(1, 2),
          dilation=(1, 2))
conv_case("conv2d_1x1", randn(2, 4, 3, 3), randn(5, 4, 1, 1), randn(5))
conv_case("conv2d_f32", randn(1, 2, 5, 5, dtype=torch.float32), randn(3, 2, 3, 3, dtype=torch.float32),
          randn(3, dtype=torch.float32), padding=(1, 1))

# ---------------------------------------------------------------- pooling


def pool_case(name, op, x, kernel, stride=None, padding=(0, 0), count_include_pad=True):
    stride = stride or kernel
    if op == "max_pool2d":
        fn = lambda t: F.max_pool2d(t, kernel, stride, padding)
    else:
        fn = lambda t: F.avg_pool2d(t, kernel, stride, padding, count_include_pad=count_include_pad)
    add_case(name, op, fn, [("x", x)],
             {"kernel": list(kernel), "stride": list(stride), "padding": list(padding),
              "count_include_pad": count_include_pad})


pool_case("max_pool2d_k2", "max_pool2d", randn(2, 2, 4, 6), (2, 2))
pool_case("max_pool2d_k3_s2_p1", "max_pool2d", randn(1, 2, 7, 6), (3, 3), (2, 2), (1, 1))
pool_case("max_pool2d_k2x3_s1", "max_pool2d", randn(1, 1, 4, 5), (2, 3), (1, 1))
pool_case("avg_pool2d_k2", "avg_pool2d", randn(2, 2, 4, 6), (2, 2))
pool_case("avg_pool2d_k3_s2_p1_incl", "avg_pool2d", randn(1, 2, 7, 6), (3, 3), (2, 2), (1, 1), True)
pool_case("avg_pool2d_k3_s2_p1_excl", "avg_pool2d", randn(1, 2, 7, 6), (3, 3), (2, 2), (1, 1), False)
pool_case("avg_pool2d_k2x3_s1_p1_excl", "avg_pool2d", randn(1, 1, 4, 5), (2, 3), (1, 2), (1, 1), False)

# ---------------------------------------------------------------- joining, splitting, indexing
add_case("cat_d0", "cat", lambda a, b, c: torch.cat([a, b, c], 0),
         [("a", randn(2, 3)), ("b", randn(1, 3)), ("c", randn(3, 3))], {"dim": 0})
add_case("cat_dm1", "cat", lambda a, b: torch.cat([a, b], -1), [("a", randn(2, 2, 3)), ("b", randn(2, 2, 1))],
         {"dim": -1})
add_case("stack_d0", "stack", lambda a, b: torch.stack([a, b], 0), [("a", randn(2, 3)), ("b", randn(2, 3))],
         {"dim": 0})
add_case("stack_d2", "stack", lambda a, b, c: torch.stack([a, b, c], 2),
         [("a", randn(2, 3)), ("b", randn(2, 3)), ("c", randn(2, 3))], {"dim": 2})
add_case("index_select_d0_repeat", "index_select", lambda x, i: torch.index_select(x, 0, i),
         [("x", randn(4, 3)), ("index", torch.tensor([3, 0, 3, 1]))], {"dim": 0})
add_case("index_select_d1", "index_select", lambda x, i: torch.index_select(x, 1, i),
         [("x", randn(2, 5, 2)), ("index", torch.tensor([4, 1, 1]))], {"dim": 1})
add_case("split_sizes_d1", "split", lambda x: torch.split(x, [1, 3, 2], 1), [("x", randn(2, 6))],
         {"sizes": [1, 3, 2], "dim": 1})
add_case("split_size_d0", "split", lambda x: torch.split(x, 2, 0), [("x", randn(5, 3))],
         {"split_size": 2, "dim": 0})
add_case("chunk_d1", "chunk", lambda x: torch.chunk(x, 3, 1), [("x", randn(2, 7))], {"chunks": 3, "dim": 1})

# ---------------------------------------------------------------- write
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
path = os.path.join(root, "tests", "data", "torch_reference.json")
os.makedirs(os.path.dirname(path), exist_ok=True)
doc = {
    "generator": "scripts/gen_torch_reference.py",
    "torch_version": torch.__version__,
    "seed": SEED,
    "loss": "sum_k (outputs[k] * weights[k]).sum()",
    "cases": cases,
}
with open(path, "w") as f:
    # json writes floats with repr(): the shortest string that round-trips exactly.
    json.dump(doc, f, separators=(",", ":"), allow_nan=False)
    f.write("\n")
size = os.path.getsize(path)
ops = sorted({c["op"] for c in cases})
print("wrote %d cases (%d ops) to %s (%d bytes)" % (len(cases), len(ops), os.path.relpath(path, root), size))
if size >= 200 * 1024:
    sys.exit("torch_reference.json is too large: %d bytes" % size)
