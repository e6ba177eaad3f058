#!/usr/bin/env python3
"""multigrad's fused CPU attention beside PyTorch's, forward and backward, A/B alternated.

    /usr/bin/python3 benchmarks/attention_vs_torch.py [--bench build/benchmarks/bench_attention]
                                                      [--rounds 5] [--t 256 1024 2048]

Causal attention, f32, B = 1, H = 12, D = 64 (GPT-2 small's heads), one forward and backward of
sum(out * w), as bench_attention measures it. PyTorch's side is its fused
torch.nn.functional.scaled_dot_product_attention where it exists (PyTorch >= 2.0), else its
composed attention (matmul, masked_fill, softmax, matmul): Debian 12's python3-torch is 1.13, which
has no fused attention, so there it is the composed one. multigrad's side is
`bench_attention --repeats 1` (its fused and composed paths, one warm-up and one timed call each),
run as a subprocess. Each round runs both, the order alternating; each figure is the median over
the rounds. Both use two threads unless --threads says otherwise. For comparisons only: no test
needs PyTorch.

glibc: PyTorch allocates CPU tensors with malloc, and glibc maps every block over 32 MiB afresh and
unmaps it on free, so each call page-faults its [12, T, T] buffers in again (with the defaults,
torch's T = 1024 call took 1.0 s here instead of 0.13 s). multigrad's caching allocator keeps its
memory, as scripts/test runs the tests. So the script re-runs itself with GLIBC_TUNABLES set to
keep freed memory (no mmap, no trim) unless the variable is already set: PyTorch at its best.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time


def torch_seconds(torch, T, H, D):
    q, k, v, w = (torch.randn(1, H, T, D) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    fused = hasattr(torch.nn.functional, "scaled_dot_product_attention")

    def step():
        for t in (q, k, v):
            t.grad = None
        if fused:
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (D ** -0.5)
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = att @ v
        (y * w).sum().backward()

    step()  # warm-up
    start = time.perf_counter()
    step()
    return time.perf_counter() - start, fused


def mg_seconds(bench, T, H, D, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    out = subprocess.run([bench, "--repeats", "1", "--heads", str(H), "--dim", str(D), "--t", str(T)],
                         capture_output=True, text=True, env=env, check=True).stdout
    for line in out.splitlines():
        cells = line.split("|")
        if len(cells) > 2 and cells[0].strip() == str(T):
            fused, composed = cells[1].split()[:2]
            return float(fused), float(composed)
    raise RuntimeError("bench_attention printed no row for T = %d:\n%s" % (T, out))


KEEP_MEMORY = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184"


def main():
    if "GLIBC_TUNABLES" not in os.environ:
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, GLIBC_TUNABLES=KEEP_MEMORY))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default="build/benchmarks/bench_attention")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--t", type=int, nargs="+", default=[256, 1024, 2048])
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("attention_vs_torch: no PyTorch here (apt-get install python3-torch)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    H, D = 12, 64
    print("attention_vs_torch: causal, f32, B = 1, H = %d, D = %d, forward + backward; torch %s, %d threads, "
          "%d rounds alternated, medians; GLIBC_TUNABLES=%s" % (H, D, torch.__version__, args.threads, args.rounds,
                                                               os.environ["GLIBC_TUNABLES"]))
    print("%6s | %12s %12s | %12s %10s | %s" % ("T", "mg fused s", "mg composed", "torch s", "torch/mg", "torch path"))
    for T in args.t:
        mg_f, mg_c, th = [], [], []
        fused = False
        for r in range(args.rounds):
            legs = ["torch", "mg"] if r % 2 == 0 else ["mg", "torch"]
            for leg in legs:
                if leg == "torch":
                    s, fused = torch_seconds(torch, T, H, D)
                    th.append(s)
                else:
                    f, c = mg_seconds(args.bench, T, H, D, args.threads)
                    mg_f.append(f)
                    mg_c.append(c)
        f, c, t = statistics.median(mg_f), statistics.median(mg_c), statistics.median(th)
        print("%6d | %12.4f %12.4f | %12.4f %9.2fx | %s" % (T, f, c, t, t / f, "fused SDPA" if fused else "composed"))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
