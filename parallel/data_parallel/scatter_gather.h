// scatter and gather: how DataParallel splits a batch across devices and joins the
// replicas' outputs again.
//
//   scatter(x [10, ...], {d0, d1, d2, d3})       chunk = ceil(10 / 4) = 3 rows
//
//     rows 0-2 ─▶ d0     rows 3-5 ─▶ d1     rows 6-8 ─▶ d2     row 9 ─▶ d3   (uneven last chunk)
//
//   scatter(x [5, ...], 4 devices): chunk = 2 → 2, 2, 1 rows on d0, d1, d2; d3 gets nothing
//   and DataParallel runs only 3 replicas (torch.chunk's rule, which PyTorch's scatter uses).
//
//   gather({y0 on d0, y1 on d1, y2 on d2}, d0) = cat(y0, y1.to(d0), y2.to(d0))
//
// Both are built from differentiable ops (narrow + to, to + cat), so autograd routes
// gradients back: the gradient of a gathered output is split again by rows and sent to
// the device that produced each part; the gradient of a scattered input is reassembled
// on the input's device.
#pragma once

#include <vector>

#include "base/device.h"
#include "core/tensor.h"
#include "nn/value.h"

namespace mg::parallel {

// Splits `input` along `dim` with chunk(input, devices.size(), dim): pieces of
// ceil(rows / devices) rows, the last one possibly smaller, so (10 rows, 4 devices)
// gives 3, 3, 3, 1 and (5, 4) gives 2, 2, 1. Moves piece i to devices[i] and returns
// one tensor per piece, which may be fewer than the devices; a piece that is already
// on its device is a view (no copy).
std::vector<Tensor> scatter(const Tensor& input, const std::vector<Device>& devices, int64_t dim = 0);

// Moves every output to `destination` and concatenates them along `dim`. Outputs with
// zero dims (a scalar per replica, e.g. a loss) are stacked into a vector instead, as
// PyTorch's gather does.
Tensor gather(const std::vector<Tensor>& outputs, Device destination, int64_t dim = 0);

// The same for a module of any signature (nn/value.h), as PyTorch's scatter and gather walk
// tuples and lists:
//
//   scatter((x [10, 3], [m [10], 0.5]), 4 devices)  →  (x[0:3], [m[0:3], 0.5]) on d0, ... ,
//                                                      (x[9:10], [m[9:10], 0.5]) on d3
//
// Every tensor leaf is split on its own as above (so tensors with different row counts are
// fine) and must give the same number of pieces -- PyTorch would silently drop the rows of the
// longer ones, this is an error naming both leaves. A tensor with zero dims cannot be split (an
// error, as in PyTorch: pass a number leaf, which is copied). Every other leaf (None, int,
// double, string) is copied to every replica. Inputs with no tensor at all go to every device;
// no inputs at all make one replica.
std::vector<nn::Values> scatter(const nn::Values& inputs, const std::vector<Device>& devices,
                                int64_t dim = 0);

// Joins the replicas' outputs leaf by leaf: every replica must return the same structure;
// each tensor leaf is gathered as above (zero-dim leaves stacked into a vector), None stays
// None; any other leaf is an error (PyTorch cannot gather those either).
nn::Values gather(const std::vector<nn::Values>& outputs, Device destination, int64_t dim = 0);

}  // namespace mg::parallel
