// CUDA launcher of qpnserve::awq_moe_m1_out: argument checks, device guard, current stream, one
// cooperative launch of the V100 design (awq_moe_m1_v100.cuh), launch check. No allocation and
// no host synchronisation, so it is capturable in a CUDA graph.

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include "awq_moe_m1_checks.h"
#include "awq_moe_m1_launch.cuh"

namespace qpnserve {
namespace {

void awq_moe_m1_out_cuda(at::Tensor& out, at::Tensor& intermediate, const at::Tensor& x,
                         const at::Tensor& w13, const at::Tensor& s13, const at::Tensor& w2,
                         const at::Tensor& s2, const at::Tensor& ids, const at::Tensor& weights) {
  TORCH_CHECK(out.is_cuda(), "awq_moe_m1_out: out must be a CUDA tensor");
  const MetaFormat format = check_args(out, intermediate, x, w13, s13, w2, s2, ids, weights);
  const c10::cuda::CUDAGuard guard(out.device());
  const int device = out.get_device();
  const bool meta3 = format == MetaFormat::kThreeByte;
  const qpn::MoeArgs args = v100_args(out, intermediate, x, w13, s13, w2, s2, ids, weights, device);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(device).stream();
  launch_v100(args, meta3, stream);
}

}  // namespace
}  // namespace qpnserve

TORCH_LIBRARY_IMPL(qpnserve, CUDA, m) { m.impl("awq_moe_m1_out", &qpnserve::awq_moe_m1_out_cuda); }
