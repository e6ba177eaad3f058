// The cuDNN entry points multigrad calls (kernels/cuda/conv_cudnn.cpp), emulated on the host
// (build mode -DMG_CUDA=EMULATE).
//
// What is emulated. Handles (cudnnCreate/Destroy, SetStream), error strings (cudnnGetErrorString
// gives the enumerator's name; cudnnGetLastErrorString this thread's explanation of its last
// failure, then forgets it), 4-d tensor, filter and 2-d convolution descriptors, the output-shape
// helper, the v7 heuristics, workspace sizes, and the three convolutions:
//   forward          y  = alpha conv(x, w) + beta y
//   backward data    dx = alpha conv_transpose(dy, w) + beta dx
//   backward filter  dw = alpha sum over the batch of corr(x, dy) + beta dw
// with padding, stride and dilation, CUDNN_CROSS_CORRELATION or CUDNN_CONVOLUTION (flipped
// filter), one group. Tensors: any 4-d strides (cudnnSetTensor4dDescriptor's NCHW or NHWC, or
// cudnnSetTensor4dDescriptorEx). Filters: NCHW (KCRS) or NHWC (KRSC). Configurations (data type /
// compute type of the convolution descriptor), as cuDNN's legacy API lists them:
//   FLOAT/FLOAT, DOUBLE/DOUBLE (double sums), HALF/FLOAT ("pseudo half"), HALF/HALF (true half:
//   here also summed in float), BFLOAT16/FLOAT; 16-bit results are rounded to nearest even once.
// Math type: float data with CUDNN_DEFAULT_MATH or a tensor-op math type sees its inputs rounded
// to TF32 (as cuDNN runs it on tensor cores since Ampere); CUDNN_FMA_MATH keeps full float.
// alpha and beta are host scalars, double for double data and float otherwise, read at the call;
// beta == 0 never reads the output (it may hold NaN).
//
// Algorithms. Forward offers IMPLICIT_PRECOMP_GEMM (then IMPLICIT_GEMM, GEMM), backward data
// and backward filter ALGO_1 (then ALGO_0). IMPLICIT_GEMM and the two ALGO_0 need no workspace;
// the others need one image's column buffer (C*R*S*OH*OW accumulators), which they really keep in
// the caller's workspace and which is overwritten with 0xff bytes when the call is done, so a
// workspace that is too small, shared, or read afterwards shows. All algorithms compute the same
// numbers. Other algorithms: CUDNN_STATUS_NOT_SUPPORTED (listed as such by the heuristics).
//
// What is checked, on the caller's thread, before anything is queued:
//   CUDNN_STATUS_BAD_PARAM        null or unknown handle, descriptor or pointer (also an unset
//                                 descriptor, null alpha/beta); bad descriptor values (a size
//                                 < 1, a negative stride or padding, a stride or dilation < 1, an
//                                 invalid enumerant); x and w channel counts differ; data types of
//                                 x, w, y differ; a dilated filter larger than the padded input; y's
//                                 N or C not x's N and w's K; an algorithm outside the enumeration;
//                                 a workspace smaller than the algorithm needs (or null); memory
//                                 that is not device memory over a tensor's extent (an emulation
//                                 check: cuDNN would fault); a stream that no longer exists;
//   CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH  the stream belongs to another device than the handle;
//   CUDNN_STATUS_NOT_SUPPORTED    a data/compute type configuration above does not list; y's H, W
//                                 not cudnnGetConvolution2dForwardOutputDim's (as cuDNN documents);
//                                 a tensor over 2^31 elements; NCHW_VECT_C; an algorithm not offered.
// Every failure leaves its explanation for cudnnGetLastErrorString.
//
// Execution runs in mg_emu::enqueue on the handle's stream, one image at a time: the image is
// converted to the accumulation type (float, double for DOUBLE), unfolded into columns (im2col)
// and multiplied by the filter matrix four rows at a time with a contiguous inner loop (backward
// data: the filter's transpose times dy, folded back with col2im; backward filter: dy times the
// transposed columns, one partial sum per image added to the total). Queued work holds copies of
// the descriptors, so they may be changed or destroyed once the call returns.
//
// The files: cudnn_internal.h lists them. This one is the API.
#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "cuda_emu/cudnn_internal.h"
#include "cuda_emu/runtime_internal.h"

using namespace mg_emu::cudnn;

namespace {

// Strides of a packed 4-d array of dims (n, c, h, w) in NCHW or NHWC order.
cudnnStatus_t packed_strides(const char* fn, cudnnTensorFormat_t format, const int d[4], long long st[4]) {
  const long long c = d[1], h = d[2], w = d[3];
  if (format == CUDNN_TENSOR_NCHW) {
    st[0] = c * h * w, st[1] = h * w, st[2] = w, st[3] = 1;
  } else if (format == CUDNN_TENSOR_NHWC) {
    st[0] = h * w * c, st[1] = 1, st[2] = w * c, st[3] = c;
  } else if (format == CUDNN_TENSOR_NCHW_VECT_C) {
    return fail(fn, CUDNN_STATUS_NOT_SUPPORTED, "CUDNN_TENSOR_NCHW_VECT_C is not emulated");
  } else {
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "invalid tensor format " + std::to_string(int(format)));
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t check_dims(const char* fn, cudnnDataType_t type, const int d[4]) {
  if (!valid_data_type(type))
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "invalid data type " + std::to_string(int(type)));
  for (int i = 0; i < 4; ++i)
    if (d[i] < 1) return fail(fn, CUDNN_STATUS_BAD_PARAM, "a dimension is < 1: " + std::to_string(d[i]));
  if (double(d[0]) * d[1] * d[2] * d[3] > double(INT_MAX))
    return fail(fn, CUDNN_STATUS_NOT_SUPPORTED, "more than 2^31 - 1 elements");
  return CUDNN_STATUS_SUCCESS;
}

// Sets a tensor or filter descriptor: packed in `format`, or with explicit `strides`.
template <class Desc>
cudnnStatus_t set_4d(const char* fn, Desc* desc, cudnnDataType_t type, const int dims[4],
                     cudnnTensorFormat_t format, const long long* strides) {
  if (!is_live(desc)) return fail(fn, CUDNN_STATUS_BAD_PARAM, "the descriptor is null or unknown");
  long long st[4];
  cudnnStatus_t status = check_dims(fn, type, dims);
  if (status == CUDNN_STATUS_SUCCESS && strides == nullptr) status = packed_strides(fn, format, dims, st);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  for (int i = 0; strides != nullptr && i < 4; ++i) {
    if (strides[i] < 0) return fail(fn, CUDNN_STATUS_BAD_PARAM, "a stride is negative");
    st[i] = strides[i];
  }
  desc->type = type;
  std::copy(dims, dims + 4, desc->dims);
  std::copy(st, st + 4, desc->strides);
  desc->set = true;
  return CUDNN_STATUS_SUCCESS;
}

// cudnnStatus_t's names (as cudnnGetErrorString gives them), by category (code / 1000) and
// specific error (code % 1000), the way cudnn_graph.h numbers them.
const char* status_name(int code) {
  static const char* const kNames[6][16] = {
      {"CUDNN_STATUS_SUCCESS"},
      {nullptr, "CUDNN_STATUS_NOT_INITIALIZED", "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH",
       "CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH", "CUDNN_STATUS_DEPRECATED", "CUDNN_STATUS_LICENSE_ERROR",
       "CUDNN_STATUS_RUNTIME_IN_PROGRESS", "CUDNN_STATUS_RUNTIME_FP_OVERFLOW",
       "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED"},
      {"CUDNN_STATUS_BAD_PARAM", "CUDNN_STATUS_INVALID_VALUE", "CUDNN_STATUS_BAD_PARAM_NULL_POINTER",
       "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER", "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED",
       "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND", "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT",
       "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH", "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH",
       "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES", "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE",
       "CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH", "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE"},
      {"CUDNN_STATUS_NOT_SUPPORTED", "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN",
       "CUDNN_STATUS_NOT_SUPPORTED_SHAPE", "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE",
       "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT", "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER",
       "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART", "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH",
       "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING",
       "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE",
       "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT", "CUDNN_STATUS_NOT_SUPPORTED_PADDING",
       "CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM", "CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API",
       "CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE"},
      {"CUDNN_STATUS_INTERNAL_ERROR", "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED",
       "CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE", "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
       "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED", "CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM",
       "CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED"},
      {"CUDNN_STATUS_EXECUTION_FAILED", "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER",
       "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS", "CUDNN_STATUS_EXECUTION_FAILED_CUDART",
       "CUDNN_STATUS_EXECUTION_FAILED_CURAND"},
  };
  const int category = code / 1000, specific = code % 1000;
  const char* name = code >= 0 && category < 6 && specific < 16 ? kNames[category][specific] : nullptr;
  return name != nullptr ? name : "CUDNN_UNKNOWN_STATUS";
}

}  // namespace

extern "C" {

const char* CUDNNWINAPI cudnnGetErrorString(cudnnStatus_t status) { return status_name(int(status)); }

void CUDNNWINAPI cudnnGetLastErrorString(char* message, size_t max_size) {
  if (message == nullptr || max_size == 0) return;
  const size_t n = std::min(max_size - 1, t_last_error.size());
  std::memcpy(message, t_last_error.data(), n);
  message[n] = '\0';
  t_last_error.clear();
}

cudnnStatus_t CUDNNWINAPI cudnnCreate(cudnnHandle_t* handle) {
  if (handle == nullptr) return fail("cudnnCreate", CUDNN_STATUS_BAD_PARAM, "handle is a null pointer");
  const cudnnStatus_t status = create(handle);
  if (status == CUDNN_STATUS_SUCCESS) (*handle)->device = mg_emu::current_device();
  return status;
}

cudnnStatus_t CUDNNWINAPI cudnnDestroy(cudnnHandle_t handle) {
  if (handle == nullptr || destroy(handle) != CUDNN_STATUS_SUCCESS)
    return fail("cudnnDestroy", CUDNN_STATUS_BAD_PARAM, "the handle is null or not one cudnnCreate made");
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
  const char* fn = "cudnnSetStream";
  if (!is_live(handle))
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "the handle is null or not one cudnnCreate made");
  const int device = mg_emu::stream_device(streamId);
  if (device < 0) return fail(fn, CUDNN_STATUS_BAD_PARAM, "the stream does not exist");
  if (device != handle->device)
    return fail(fn, CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH,
                "the handle belongs to device " + std::to_string(handle->device) +
                    " but the stream to device " + std::to_string(device));
  handle->stream = streamId;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* tensorDesc) {
  return create(tensorDesc);
}
cudnnStatus_t CUDNNWINAPI cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc) {
  return destroy(tensorDesc);
}
cudnnStatus_t CUDNNWINAPI cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* filterDesc) {
  return create(filterDesc);
}
cudnnStatus_t CUDNNWINAPI cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc) {
  return destroy(filterDesc);
}
cudnnStatus_t CUDNNWINAPI cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* convDesc) {
  return create(convDesc);
}
cudnnStatus_t CUDNNWINAPI cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc) {
  return destroy(convDesc);
}

cudnnStatus_t CUDNNWINAPI cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t tensorDesc,
                                                     cudnnTensorFormat_t format, cudnnDataType_t dataType,
                                                     int n, int c, int h, int w) {
  const int dims[4] = {n, c, h, w};
  return set_4d("cudnnSetTensor4dDescriptor", tensorDesc, dataType, dims, format, nullptr);
}

cudnnStatus_t CUDNNWINAPI cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t tensorDesc,
                                                       cudnnDataType_t dataType, int n, int c, int h, int w,
                                                       int nStride, int cStride, int hStride, int wStride) {
  const int dims[4] = {n, c, h, w};
  const long long strides[4] = {nStride, cStride, hStride, wStride};
  return set_4d("cudnnSetTensor4dDescriptorEx", tensorDesc, dataType, dims, CUDNN_TENSOR_NCHW, strides);
}

// NHWC filters are KRSC.
cudnnStatus_t CUDNNWINAPI cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t filterDesc,
                                                     cudnnDataType_t dataType, cudnnTensorFormat_t format,
                                                     int k, int c, int h, int w) {
  const int dims[4] = {k, c, h, w};
  return set_4d("cudnnSetFilter4dDescriptor", filterDesc, dataType, dims, format, nullptr);
}

cudnnStatus_t CUDNNWINAPI cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t convDesc, int pad_h,
                                                          int pad_w, int u, int v, int dilation_h,
                                                          int dilation_w, cudnnConvolutionMode_t mode,
                                                          cudnnDataType_t computeType) {
  const char* fn = "cudnnSetConvolution2dDescriptor";
  if (!is_live(convDesc)) return fail(fn, CUDNN_STATUS_BAD_PARAM, "the descriptor is null or unknown");
  if (pad_h < 0 || pad_w < 0 || u < 1 || v < 1 || dilation_h < 1 || dilation_w < 1)
    return fail(fn, CUDNN_STATUS_BAD_PARAM,
                "padding must be >= 0, strides and dilations >= 1 (pad " + std::to_string(pad_h) + "," +
                    std::to_string(pad_w) + ", stride " + std::to_string(u) + "," + std::to_string(v) +
                    ", dilation " + std::to_string(dilation_h) + "," + std::to_string(dilation_w) + ")");
  if (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION)
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "invalid convolution mode " + std::to_string(int(mode)));
  if (!valid_data_type(computeType))
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "invalid compute type " + std::to_string(int(computeType)));
  convDesc->pad[0] = pad_h, convDesc->pad[1] = pad_w;
  convDesc->stride[0] = u, convDesc->stride[1] = v;
  convDesc->dilation[0] = dilation_h, convDesc->dilation[1] = dilation_w;
  convDesc->mode = mode;
  convDesc->compute = computeType;
  convDesc->set = true;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc,
                                                      cudnnMathType_t mathType) {
  const char* fn = "cudnnSetConvolutionMathType";
  if (!is_live(convDesc)) return fail(fn, CUDNN_STATUS_BAD_PARAM, "the descriptor is null or unknown");
  if (int(mathType) < CUDNN_DEFAULT_MATH || int(mathType) > CUDNN_FMA_MATH)
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "invalid math type " + std::to_string(int(mathType)));
  convDesc->math = mathType;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t convDesc,
                                                                const cudnnTensorDescriptor_t inputTensorDesc,
                                                                const cudnnFilterDescriptor_t filterDesc,
                                                                int* n, int* c, int* h, int* w) {
  const char* fn = "cudnnGetConvolution2dForwardOutputDim";
  if (n == nullptr || c == nullptr || h == nullptr || w == nullptr)
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "an output pointer is null");
  int out[4];
  const cudnnStatus_t status = output_dims(fn, convDesc, inputTensorDesc, filterDesc, out);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  *n = out[0], *c = out[1], *h = out[2], *w = out[3];
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc, const cudnnFilterDescriptor_t filterDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t destDesc,
    const int requestedAlgoCount, int* returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t* perfResults) {
  const char* fn = "cudnnGetConvolutionForwardAlgorithm_v7";
  Problem p;
  const cudnnStatus_t status = resolve(fn, handle, srcDesc, filterDesc, convDesc, destDesc, &p);
  return heuristics<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
      fn, Dir::forward, status, p, requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t filterDesc, const cudnnTensorDescriptor_t diffDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t gradDesc,
    const int requestedAlgoCount, int* returnedAlgoCount, cudnnConvolutionBwdDataAlgoPerf_t* perfResults) {
  const char* fn = "cudnnGetConvolutionBackwardDataAlgorithm_v7";
  Problem p;
  const cudnnStatus_t status = resolve(fn, handle, gradDesc, filterDesc, convDesc, diffDesc, &p);
  return heuristics<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
      fn, Dir::backward_data, status, p, requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc, const cudnnTensorDescriptor_t diffDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    const int requestedAlgoCount, int* returnedAlgoCount, cudnnConvolutionBwdFilterAlgoPerf_t* perfResults) {
  const char* fn = "cudnnGetConvolutionBackwardFilterAlgorithm_v7";
  Problem p;
  const cudnnStatus_t status = resolve(fn, handle, srcDesc, gradDesc, convDesc, diffDesc, &p);
  return heuristics<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
      fn, Dir::backward_filter, status, p, requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionForwardWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc,
    cudnnConvolutionFwdAlgo_t algo, size_t* sizeInBytes) {
  const char* fn = "cudnnGetConvolutionForwardWorkspaceSize";
  if (sizeInBytes == nullptr) return fail(fn, CUDNN_STATUS_BAD_PARAM, "sizeInBytes is a null pointer");
  Problem p;
  const cudnnStatus_t status = resolve(fn, handle, xDesc, wDesc, convDesc, yDesc, &p);
  return status != CUDNN_STATUS_SUCCESS ? status : workspace_for(fn, Dir::forward, p, algo, sizeInBytes);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    cudnnConvolutionBwdDataAlgo_t algo, size_t* sizeInBytes) {
  const char* fn = "cudnnGetConvolutionBackwardDataWorkspaceSize";
  if (sizeInBytes == nullptr) return fail(fn, CUDNN_STATUS_BAD_PARAM, "sizeInBytes is a null pointer");
  Problem p;
  const cudnnStatus_t status = resolve(fn, handle, dxDesc, wDesc, convDesc, dyDesc, &p);
  return status != CUDNN_STATUS_SUCCESS ? status
                                        : workspace_for(fn, Dir::backward_data, p, algo, sizeInBytes);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t* sizeInBytes) {
  const char* fn = "cudnnGetConvolutionBackwardFilterWorkspaceSize";
  if (sizeInBytes == nullptr) return fail(fn, CUDNN_STATUS_BAD_PARAM, "sizeInBytes is a null pointer");
  Problem p;
  const cudnnStatus_t status = resolve(fn, handle, xDesc, gradDesc, convDesc, dyDesc, &p);
  return status != CUDNN_STATUS_SUCCESS ? status
                                        : workspace_for(fn, Dir::backward_filter, p, algo, sizeInBytes);
}

cudnnStatus_t CUDNNWINAPI cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha,
                                                  const cudnnTensorDescriptor_t xDesc, const void* x,
                                                  const cudnnFilterDescriptor_t wDesc, const void* w,
                                                  const cudnnConvolutionDescriptor_t convDesc,
                                                  cudnnConvolutionFwdAlgo_t algo, void* workSpace,
                                                  size_t workSpaceSizeInBytes, const void* beta,
                                                  const cudnnTensorDescriptor_t yDesc, void* y) {
  return convolve("cudnnConvolutionForward", Dir::forward, handle, alpha, xDesc, x, wDesc, w, convDesc, algo,
                  workSpace, workSpaceSizeInBytes, beta, yDesc, nullptr, y);
}

cudnnStatus_t CUDNNWINAPI cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha,
                                                       const cudnnFilterDescriptor_t wDesc, const void* w,
                                                       const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                                       const cudnnConvolutionDescriptor_t convDesc,
                                                       cudnnConvolutionBwdDataAlgo_t algo, void* workSpace,
                                                       size_t workSpaceSizeInBytes, const void* beta,
                                                       const cudnnTensorDescriptor_t dxDesc, void* dx) {
  return convolve("cudnnConvolutionBackwardData", Dir::backward_data, handle, alpha, dxDesc, nullptr, wDesc,
                  w, convDesc, algo, workSpace, workSpaceSizeInBytes, beta, dyDesc, dy, dx);
}

cudnnStatus_t CUDNNWINAPI cudnnConvolutionBackwardFilter(
    cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xDesc, const void* x,
    const cudnnTensorDescriptor_t dyDesc, const void* dy, const cudnnConvolutionDescriptor_t convDesc,
    cudnnConvolutionBwdFilterAlgo_t algo, void* workSpace, size_t workSpaceSizeInBytes, const void* beta,
    const cudnnFilterDescriptor_t dwDesc, void* dw) {
  return convolve("cudnnConvolutionBackwardFilter", Dir::backward_filter, handle, alpha, xDesc, x, dwDesc,
                  nullptr, convDesc, algo, workSpace, workSpaceSizeInBytes, beta, dyDesc, dy, dw);
}

}  // extern "C"
