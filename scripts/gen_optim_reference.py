#!/usr/bin/python3
"""Writes tests/fixtures/optim_reference.json: PyTorch reference values for multigrad's optim/.

Run ONCE (and again only when cases change) with Debian's python3-torch:

    /usr/bin/python3 scripts/gen_optim_reference.py

tests/optim/test_optimizers.cpp, test_lr_scheduler.cpp and test_clip_grad.cpp read the file;
tests never need PyTorch. Contents:

    problem      a tiny linear regression: X [8, 3], Y [8, 2], initial W [2, 3], b [2];
                 loss = mean((X @ W^T + b - Y)^2). Inputs rounded to 6 decimals.
    trajectories [{name, optimizer (SGD|Adam|AdamW), dtype (f64|f32), options (multigrad's
                 names: lr, momentum, dampening, weight_decay, nesterov, beta1, beta2, eps,
                 amsgrad), groups [{params: ["W", "b"], options: overrides}],
                 steps [{W, b}] after each of 10 steps}]
    schedulers   [{name, kind, options, base_lrs, lrs: get_last_lr() after construction and
                 after each step}]
    clip         [{name, dtype, max_norm, norm_type ("inf" for infinity), grads (input),
                 total_norm, clipped (grads after)}]

All data are flat row-major lists of Python floats (f32 values are exact as doubles).
"""

import json
import os

import torch

SEED = 20240612
STEPS = 10
torch.manual_seed(SEED)


def r6(t):
    return torch.round(t * 1e6) / 1e6


def flat(t):
    return [float(v) for v in t.detach().reshape(-1).tolist()]


# ---- the problem -------------------------------------------------------------------------------
X = r6(torch.randn(8, 3, dtype=torch.float64))
W_true = torch.tensor([[1.5, -2.0, 0.5], [-0.7, 0.3, 2.2]], dtype=torch.float64)
Y = r6(X @ W_true.T + torch.tensor([0.3, -0.1], dtype=torch.float64) + 0.1 * torch.randn(8, 2, dtype=torch.float64))
W0 = r6(0.5 * torch.randn(2, 3, dtype=torch.float64))
b0 = r6(0.5 * torch.randn(2, dtype=torch.float64))

problem = {"X": flat(X), "Y": flat(Y), "W": flat(W0), "b": flat(b0),
           "shapes": {"X": [8, 3], "Y": [8, 2], "W": [2, 3], "b": [2]}}


def torch_options(kind, o):
    o = dict(o)
    out = {}
    if "beta1" in o or "beta2" in o:
        out["betas"] = (o.pop("beta1", 0.9), o.pop("beta2", 0.999))
    for k in ("nesterov", "amsgrad"):
        if k in o:
            out[k] = bool(o.pop(k))
    out.update(o)
    return out


def run_trajectory(name, kind, dtype, options, groups):
    dt = {"f64": torch.float64, "f32": torch.float32}[dtype]
    W = W0.to(dt).clone().requires_grad_(True)
    b = b0.to(dt).clone().requires_grad_(True)
    x, y = X.to(dt), Y.to(dt)
    by_name = {"W": W, "b": b}
    torch_groups = [dict(params=[by_name[p] for p in g["params"]], **torch_options(kind, g["options"]))
                    for g in groups]
    cls = {"SGD": torch.optim.SGD, "Adam": torch.optim.Adam, "AdamW": torch.optim.AdamW}[kind]
    opt = cls(torch_groups, **torch_options(kind, options))
    steps = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = ((x @ W.T + b - y) ** 2).mean()
        loss.backward()
        opt.step()
        steps.append({"W": flat(W), "b": flat(b)})
    return {"name": name, "optimizer": kind, "dtype": dtype, "options": options, "groups": groups,
            "steps": steps}


ALL = [{"params": ["W", "b"], "options": {}}]
trajectories = [
    run_trajectory("sgd_plain", "SGD", "f64", {"lr": 0.1}, ALL),
    run_trajectory("sgd_momentum", "SGD", "f64", {"lr": 0.05, "momentum": 0.9}, ALL),
    run_trajectory("sgd_nesterov_wd", "SGD", "f64",
                   {"lr": 0.05, "momentum": 0.9, "nesterov": 1, "weight_decay": 0.01}, ALL),
    run_trajectory("sgd_dampening_wd", "SGD", "f64",
                   {"lr": 0.05, "momentum": 0.8, "dampening": 0.3, "weight_decay": 0.05}, ALL),
    run_trajectory("adam", "Adam", "f64", {"lr": 0.05}, ALL),
    run_trajectory("adam_wd_amsgrad", "Adam", "f64",
                   {"lr": 0.05, "beta1": 0.8, "beta2": 0.95, "eps": 1e-6, "weight_decay": 0.1, "amsgrad": 1},
                   ALL),
    run_trajectory("adamw", "AdamW", "f64", {"lr": 0.05, "weight_decay": 0.1}, ALL),
    run_trajectory("adamw_amsgrad", "AdamW", "f64", {"lr": 0.05, "weight_decay": 0.02, "amsgrad": 1}, ALL),
    run_trajectory("adam_two_groups", "Adam", "f64", {"lr": 0.02},
                   [{"params": ["W"], "options": {"weight_decay": 0.05}},
                    {"params": ["b"], "options": {"lr": 0.1, "beta1": 0.5}}]),
    run_trajectory("sgd_momentum_f32", "SGD", "f32",
                   {"lr": 0.05, "momentum": 0.9, "nesterov": 1, "weight_decay": 0.01}, ALL),
    run_trajectory("adam_f32", "Adam", "f32", {"lr": 0.05, "weight_decay": 0.01}, ALL),
    run_trajectory("adamw_f32", "AdamW", "f32", {"lr": 0.05, "weight_decay": 0.1, "amsgrad": 1}, ALL),
]


# ---- schedulers --------------------------------------------------------------------------------
def run_scheduler(name, kind, options, steps):
    p1 = torch.zeros(1, requires_grad=True)
    p2 = torch.zeros(1, requires_grad=True)
    base_lrs = [0.1, 0.02]
    opt = torch.optim.SGD([{"params": [p1], "lr": base_lrs[0]}, {"params": [p2], "lr": base_lrs[1]}])
    if kind == "StepLR":
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=options["step_size"], gamma=options["gamma"])
    else:
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=options["t_max"], eta_min=options["eta_min"])
    lrs = [list(sched.get_last_lr())]
    for _ in range(steps):
        opt.step()
        sched.step()
        lrs.append(list(sched.get_last_lr()))
    return {"name": name, "kind": kind, "options": options, "base_lrs": base_lrs, "lrs": lrs}


schedulers = [
    run_scheduler("step_lr", "StepLR", {"step_size": 3, "gamma": 0.5}, 12),
    run_scheduler("cosine", "CosineAnnealingLR", {"t_max": 10, "eta_min": 0.001}, 25),
]


# ---- clip_grad_norm_ ---------------------------------------------------------------------------
GRAD_SHAPES = [[2, 3], [4], [3, 1]]
GRADS = [r6(torch.randn(*s, dtype=torch.float64)) for s in GRAD_SHAPES]


def run_clip(name, dtype, max_norm, norm_type):
    dt = {"f64": torch.float64, "f32": torch.float32}[dtype]
    params = []
    for g in GRADS:
        p = torch.zeros(g.shape, dtype=dt, requires_grad=True)
        p.grad = g.to(dt).clone()
        params.append(p)
    total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
    return {"name": name, "dtype": dtype, "max_norm": max_norm,
            "norm_type": "inf" if norm_type == float("inf") else norm_type,
            "shapes": GRAD_SHAPES, "grads": [flat(g) for g in GRADS], "total_norm": float(total),
            "clipped": [flat(p.grad) for p in params]}


clip = [
    run_clip("l2_clipped", "f64", 1.0, 2.0),
    run_clip("l2_not_clipped", "f64", 100.0, 2.0),
    run_clip("l1_clipped", "f64", 0.5, 1.0),
    run_clip("linf_clipped", "f64", 0.5, float("inf")),
    run_clip("l3_clipped", "f64", 2.0, 3.0),
    run_clip("l2_clipped_f32", "f32", 1.0, 2.0),
]

doc = {"generator": "scripts/gen_optim_reference.py", "torch_version": torch.__version__, "seed": SEED,
       "steps": STEPS, "problem": problem, "trajectories": trajectories, "schedulers": schedulers, "clip": clip}
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "optim_reference.json")
with open(out, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
print(f"wrote {os.path.normpath(out)} ({os.path.getsize(out)} bytes)")
