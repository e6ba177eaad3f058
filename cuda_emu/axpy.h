// The inner loops of the emulated cuBLAS GEMM (cublas.cpp) and cuDNN convolution
// (cudnn_compute.cpp): c += a * x over a column, with four accumulator columns fed by one read
// of x. Host code, for the emulator's speed only; the result is the plain sum either way.
#pragma once

namespace mg_emu {

// c0..c3[i] += a0..a3 * x[i] for i < n.
template <class Acc>
void axpy4(long long n, const Acc* __restrict x, Acc a0, Acc a1, Acc a2, Acc a3, Acc* __restrict c0,
           Acc* __restrict c1, Acc* __restrict c2, Acc* __restrict c3) {
  for (long long i = 0; i < n; ++i) {
    const Acc v = x[i];
    c0[i] += a0 * v;
    c1[i] += a1 * v;
    c2[i] += a2 * v;
    c3[i] += a3 * v;
  }
}

// c[i] += a * x[i] for i < n.
template <class Acc>
void axpy1(long long n, const Acc* __restrict x, Acc a, Acc* __restrict c) {
  for (long long i = 0; i < n; ++i) c[i] += a * x[i];
}

}  // namespace mg_emu
