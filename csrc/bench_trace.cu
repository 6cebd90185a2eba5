// The bench extension's traced copy of the operator and its grid-barrier probe (never in the
// library a server loads).
//
// awq_moe_m1_traced: the shipped V100 design compiled with QPN_TRACE, which only adds the
// per-CTA %globaltimer / %clock64 stores of TraceStamp (awq_moe_m1_v100.cuh) and the traced
// build's skip_barrier switch; tests/kernels/test_sm70_trace_macro.py shows the untraced SASS is
// the shipped one. Its namespace is renamed (qpn -> qpn_traced) so that its kernels can never be
// confused with the operator library's, loaded in the same process.
// barrier_probe: the design's grid barrier alone, to show on a GPU that a broken launch traps
// instead of hanging (tests/kernels/test_barrier_gpu.py runs it in a subprocess: a trap poisons
// the CUDA context).

#define QPN_TRACE 1
#define qpn qpn_traced

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <cooperative_groups.h>
#include <torch/library.h>

#include "awq_moe_m1_checks.h"
#include "awq_moe_m1_launch.cuh"

namespace qpnserve_bench {
namespace {

// modes: 0 cooperative, every CTA arrives (completes); 1 an ordinary launch (no workspace: traps
// at once); 2 cooperative, CTA 1 never arrives (the others trap after kProbePolls polls, a
// smaller bound than the operator's so that the probe ends in well under a second); 3
// cooperative, the design's barrier and cooperative_groups' grid sync alternately on the same
// workspace word, three times each: both complete only if they keep one protocol (the
// design's barrier is CUDA's own grid sync for this ABI, plus the trap and the bound).
constexpr unsigned kProbePolls = 1u << 20;
__global__ void barrier_probe_kernel(int skip_cta, int alternate) {
  if (static_cast<int>(blockIdx.x) == skip_cta) return;
  for (int i = 0; i < (alternate ? 3 : 1); ++i) {
    const qpn::BarrierTicket ticket = qpn::grid_barrier_arrive();
    qpn::grid_barrier_wait<kProbePolls>(ticket);
    if (alternate) cooperative_groups::this_grid().sync();
  }
}

void barrier_probe(int64_t mode) {
  TORCH_CHECK(mode >= 0 && mode <= 3, "barrier_probe: mode must be 0 to 3, got ",
              qpn_text::num(mode));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  const dim3 grid(8), block(32);
  int skip = mode == 2 ? 1 : -1;
  int alternate = mode == 3 ? 1 : 0;
  if (mode == 1) {
    barrier_probe_kernel<<<grid, block, 0, stream>>>(skip, alternate);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  void* params[] = {&skip, &alternate};
  C10_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(barrier_probe_kernel),
                                             grid, block, params, 0, stream));
}

// trace: (80, 6, 2) int64, filled with (%globaltimer ns, %clock64) per CTA and TraceStamp.
void awq_moe_m1_traced(at::Tensor& out, at::Tensor& intermediate, const at::Tensor& x,
                       const at::Tensor& w13, const at::Tensor& s13, const at::Tensor& w2,
                       const at::Tensor& s2, const at::Tensor& ids, const at::Tensor& weights,
                       at::Tensor& trace, bool skip_barrier) {
  using qpnserve::MetaFormat;
  TORCH_CHECK(out.is_cuda(), "awq_moe_m1_traced: out must be a CUDA tensor");
  const MetaFormat format =
      qpnserve::check_args(out, intermediate, x, w13, s13, w2, s2, ids, weights);
  TORCH_CHECK(trace.device() == out.device() && trace.scalar_type() == at::kLong &&
                  trace.is_contiguous() && trace.numel() == qpn::kV100Ctas * qpn::kTraceStamps * 2,
              "awq_moe_m1_traced: trace must be a contiguous int64 tensor of 80 x 6 x 2 on the "
              "op's device");
  const c10::cuda::CUDAGuard guard(out.device());
  const int device = out.get_device();
  qpn::MoeArgs args =
      qpnserve::v100_args(out, intermediate, x, w13, s13, w2, s2, ids, weights, device);
  args.trace = reinterpret_cast<unsigned long long*>(trace.data_ptr<int64_t>());
  args.trace_skip_barrier = skip_barrier ? 1 : 0;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(device).stream();
  qpnserve::launch_v100(args, format == MetaFormat::kThreeByte, stream);
}

}  // namespace
}  // namespace qpnserve_bench

TORCH_LIBRARY_FRAGMENT(qpnserve_bench, m) {
  m.def(
      "awq_moe_m1_traced(Tensor(a!) out, Tensor(b!) intermediate, Tensor x, Tensor w13, "
      "Tensor s13, Tensor w2, Tensor s2, Tensor ids, Tensor weights, Tensor(c!) trace, "
      "bool skip_barrier=False) -> ()");
  // No tensor argument to dispatch on: one kernel for every backend.
  m.def("barrier_probe(int mode) -> ()", &qpnserve_bench::barrier_probe);
}

TORCH_LIBRARY_IMPL(qpnserve_bench, CUDA, m) {
  m.impl("awq_moe_m1_traced", &qpnserve_bench::awq_moe_m1_traced);
}
