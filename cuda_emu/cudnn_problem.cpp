// The emulated cuDNN's problem: a convolution resolved from its descriptors and checked (data and
// compute types, shapes, y's size as cudnnGetConvolution2dForwardOutputDim gives it), by value so
// that queued work keeps a copy; and the calling thread's last error.
#include <algorithm>
#include <cstdio>
#include <string>

#include "cuda_emu/cudnn_internal.h"
#include "cuda_emu/runtime_internal.h"

namespace mg_emu::cudnn {

thread_local std::string t_last_error;

cudnnStatus_t fail(const char* fn, cudnnStatus_t status, const std::string& why) {
  t_last_error = std::string(fn) + ": " + why;
  return status;
}

// One spatial output size, or -1 when the dilated filter does not fit the padded input.
int output_size(int in, int pad, int filter, int dilation, int stride) {
  const long long span = static_cast<long long>(filter - 1) * dilation + 1;
  const long long room = static_cast<long long>(in) + 2LL * pad - span;
  return room < 0 ? -1 : static_cast<int>(room / stride + 1);
}

cudnnStatus_t output_dims(const char* fn, const cudnnConvolutionStruct* cd, const cudnnTensorStruct* xd,
                          const cudnnFilterStruct* wd, int out[4]) {
  if (!is_live(cd) || !cd->set)
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "the convolution descriptor is null or unset");
  if (!is_live(xd) || !xd->set)
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "the input tensor descriptor is null or unset");
  if (!is_live(wd) || !wd->set)
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "the filter descriptor is null or unset");
  if (xd->dims[1] != wd->dims[1])
    return fail(fn, CUDNN_STATUS_BAD_PARAM,
                "the input has " + std::to_string(xd->dims[1]) + " channels but the filter takes " +
                    std::to_string(wd->dims[1]) + " (one group)");
  out[0] = xd->dims[0], out[1] = wd->dims[0];
  for (int i = 0; i < 2; ++i) {
    out[2 + i] = output_size(xd->dims[2 + i], cd->pad[i], wd->dims[2 + i], cd->dilation[i], cd->stride[i]);
    if (out[2 + i] < 1)
      return fail(fn, CUDNN_STATUS_BAD_PARAM,
                  std::string("the dilated filter is larger than the padded input in ") +
                      (i == 0 ? "height" : "width"));
  }
  return CUDNN_STATUS_SUCCESS;
}

// Checks the descriptors of one convolution (x: the input or dx, y: the output or dy).
cudnnStatus_t resolve(const char* fn, cudnnHandle_t handle, const cudnnTensorStruct* xd,
                      const cudnnFilterStruct* wd, const cudnnConvolutionStruct* cd,
                      const cudnnTensorStruct* yd, Problem* p) {
  if (!is_live(handle))
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "the handle is null or not one cudnnCreate made");
  if (!is_live(yd) || !yd->set)
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "the output tensor descriptor is null or unset");
  int out[4];
  const cudnnStatus_t dims = output_dims(fn, cd, xd, wd, out);
  if (dims != CUDNN_STATUS_SUCCESS) return dims;
  if (xd->type != wd->type || xd->type != yd->type)
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "the tensors' and the filter's data types differ");
  const cudnnDataType_t data = xd->type, compute = cd->compute;
  if (data == CUDNN_DATA_FLOAT && compute == CUDNN_DATA_FLOAT)
    p->elem = Elem::f32;
  else if (data == CUDNN_DATA_DOUBLE && compute == CUDNN_DATA_DOUBLE)
    p->elem = Elem::f64;
  else if (data == CUDNN_DATA_HALF && (compute == CUDNN_DATA_FLOAT || compute == CUDNN_DATA_HALF))
    p->elem = Elem::f16;
  else if (data == CUDNN_DATA_BFLOAT16 && compute == CUDNN_DATA_FLOAT)
    p->elem = Elem::bf16;
  else
    return fail(fn, CUDNN_STATUS_NOT_SUPPORTED,
                "data type " + std::to_string(int(data)) + " with compute type " +
                    std::to_string(int(compute)) +
                    " is not a supported configuration (FLOAT/FLOAT, DOUBLE/DOUBLE, HALF/FLOAT, HALF/HALF, "
                    "BFLOAT16/FLOAT)");
  if (yd->dims[0] != out[0] || yd->dims[1] != out[1])
    return fail(
        fn, CUDNN_STATUS_BAD_PARAM,
        "the output tensor has N=" + std::to_string(yd->dims[0]) + ", C=" + std::to_string(yd->dims[1]) +
            " where the input and filter give N=" + std::to_string(out[0]) + ", C=" + std::to_string(out[1]));
  if (yd->dims[2] != out[2] || yd->dims[3] != out[3])
    return fail(fn, CUDNN_STATUS_NOT_SUPPORTED,
                "the output tensor is " + std::to_string(yd->dims[2]) + "x" + std::to_string(yd->dims[3]) +
                    " where cudnnGetConvolution2dForwardOutputDim gives " + std::to_string(out[2]) + "x" +
                    std::to_string(out[3]));
  p->f64 = p->elem == Elem::f64;
  p->tf32 = p->elem == Elem::f32 && cd->math != CUDNN_FMA_MATH;
  p->flip = cd->mode == CUDNN_CONVOLUTION;
  p->math = cd->math;
  p->n = xd->dims[0], p->c = xd->dims[1], p->h = xd->dims[2], p->w = xd->dims[3];
  p->k = wd->dims[0], p->r = wd->dims[2], p->s = wd->dims[3];
  p->oh = out[2], p->ow = out[3];
  p->pad_h = cd->pad[0], p->pad_w = cd->pad[1];
  p->stride_h = cd->stride[0], p->stride_w = cd->stride[1];
  p->dil_h = cd->dilation[0], p->dil_w = cd->dilation[1];
  for (int i = 0; i < 4; ++i) p->xs[i] = xd->strides[i], p->ys[i] = yd->strides[i], p->ws[i] = wd->strides[i];
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace mg_emu::cudnn
