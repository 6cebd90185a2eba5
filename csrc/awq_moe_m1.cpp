// The schema of the qpnserve operator library: one op, qpnserve::awq_moe_m1_out (contract
// section 4). Its implementations register themselves beside it: the CPU one in
// awq_moe_m1_cpu.cpp, the CUDA one (the V100 design) in awq_moe_m1_cuda.cu; the fake (meta)
// kernel for torch.compile from Python (qpnserve.kernels.ops).

#include <torch/library.h>

TORCH_LIBRARY(qpnserve, m) {
  m.set_python_module("qpnserve.kernels.ops");
  m.def(
      "awq_moe_m1_out(Tensor(a!) out, Tensor(b!) intermediate, Tensor x, Tensor w13, "
      "Tensor s13, Tensor w2, Tensor s2, Tensor ids, Tensor weights) -> ()");
}
