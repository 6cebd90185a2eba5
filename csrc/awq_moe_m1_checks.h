// Argument checks of qpnserve::awq_moe_m1_out, shared by the CPU and the CUDA implementation.
// Every message names the argument (contract section 4: caller errors raise, never a silent
// wrong answer).

#pragma once

#include <ATen/ATen.h>

#include "awq_moe_m1_geometry.h"
#include "message_text.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace qpnserve {
// Internal linkage: this header is compiled by the host compiler (awq_moe_m1.cpp) and through
// nvcc (awq_moe_m1_cuda.cu); each translation unit keeps its own copy instead of the linker
// merging two separately compiled inline definitions.
namespace {

constexpr int64_t kHidden = qpn::kHidden;
constexpr int64_t kInter = qpn::kInter;
constexpr int64_t kN13 = qpn::kN13;
constexpr int64_t kRoutes = qpn::kRoutes;
constexpr int64_t kGroup = qpn::kGroup;

enum class MetaFormat { kFourByte, kThreeByte };

struct NamedTensor {
  const char* name;
  const at::Tensor* t;
};

// The expected shape is an owning vector: an IntArrayRef over a braced list would dangle once
// the list's temporary array is gone, and the message below prints it.
inline void check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype,
                         const std::vector<int64_t>& shape, int64_t align_bytes,
                         const at::Device& device) {
  TORCH_CHECK(t.defined(), "awq_moe_m1_out: ", name, " is undefined");
  TORCH_CHECK(t.device() == device, "awq_moe_m1_out: ", name, " is on ", qpn_text::device(t.device()),
              " but out is on ", qpn_text::device(device), " (all arguments must be on one device)");
  TORCH_CHECK(t.scalar_type() == dtype, "awq_moe_m1_out: ", name, " must be ", dtype, ", got ",
              t.scalar_type());
  TORCH_CHECK(t.sizes() == at::IntArrayRef(shape), "awq_moe_m1_out: ", name, " must have shape ",
              qpn_text::shape(shape), ", got ", qpn_text::shape(t.sizes()));
  TORCH_CHECK(t.is_contiguous(), "awq_moe_m1_out: ", name, " must be contiguous");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % align_bytes == 0, "awq_moe_m1_out: ",
              name, " must be ", qpn_text::num(align_bytes), "-byte aligned");
}

inline bool ranges_overlap(const at::Tensor& a, const at::Tensor& b) {
  const auto a0 = reinterpret_cast<uintptr_t>(a.data_ptr());
  const auto b0 = reinterpret_cast<uintptr_t>(b.data_ptr());
  const auto a1 = a0 + a.numel() * a.element_size();
  const auto b1 = b0 + b.numel() * b.element_size();
  return a0 < b1 && b0 < a1;
}

// Checks all arguments; returns the metadata format. E (experts) is taken from w13 and may be
// any positive number (the contract's banks have E = 512); ids outside [0, E) are invalid routes.
inline MetaFormat check_args(const at::Tensor& out, const at::Tensor& intermediate,
                             const at::Tensor& x, const at::Tensor& w13, const at::Tensor& s13,
                             const at::Tensor& w2, const at::Tensor& s2, const at::Tensor& ids,
                             const at::Tensor& weights) {
  TORCH_CHECK(out.defined(), "awq_moe_m1_out: out is undefined");
  const at::Device device = out.device();
  TORCH_CHECK(w13.defined() && w13.dim() == 3, "awq_moe_m1_out: w13 must be (E, 2560, 40) int32");
  const int64_t experts = w13.size(0);
  TORCH_CHECK(experts >= 1 && experts <= (int64_t{1} << 20),
              "awq_moe_m1_out: w13 must hold between 1 and 2^20 experts, got ", qpn_text::num(experts));

  check_tensor(out, "out", at::kHalf, {1, kHidden}, 16, device);
  check_tensor(intermediate, "intermediate", at::kHalf, {kRoutes, kInter}, 16, device);
  check_tensor(x, "x", at::kHalf, {1, kHidden}, 16, device);
  check_tensor(w13, "w13", at::kInt, {experts, kHidden, kN13 / 8}, 16, device);
  check_tensor(w2, "w2", at::kInt, {experts, kInter, kHidden / 8}, 16, device);
  check_tensor(ids, "ids", at::kInt, {1, kRoutes}, 4, device);
  check_tensor(weights, "weights", at::kFloat, {1, kRoutes}, 4, device);

  TORCH_CHECK(s13.defined(), "awq_moe_m1_out: s13 is undefined");
  MetaFormat format;
  if (s13.scalar_type() == at::kByte) {
    format = MetaFormat::kThreeByte;
    check_tensor(s13, "s13", at::kByte, {experts, kHidden / kGroup, kN13, 3}, 16, device);
    check_tensor(s2, "s2", at::kByte, {experts, kInter / kGroup, kHidden, 3}, 16, device);
  } else {
    TORCH_CHECK(s13.scalar_type() == at::kInt,
                "awq_moe_m1_out: s13 must be int32 (4-byte records) or uint8 (3-byte records), "
                "got ",
                s13.scalar_type());
    format = MetaFormat::kFourByte;
    check_tensor(s13, "s13", at::kInt, {experts, kHidden / kGroup, kN13}, 16, device);
    check_tensor(s2, "s2", at::kInt, {experts, kInter / kGroup, kHidden}, 16, device);
  }

  // Outputs must not alias any input or each other: the kernels read inputs while writing.
  const std::vector<NamedTensor> inputs = {{"x", &x},   {"w13", &w13}, {"s13", &s13},
                                           {"w2", &w2}, {"s2", &s2},   {"ids", &ids},
                                           {"weights", &weights}};
  TORCH_CHECK(!ranges_overlap(out, intermediate),
              "awq_moe_m1_out: out and intermediate overlap in memory");
  for (const auto& in : inputs) {
    TORCH_CHECK(!ranges_overlap(out, *in.t), "awq_moe_m1_out: out overlaps ", in.name,
                " in memory");
    TORCH_CHECK(!ranges_overlap(intermediate, *in.t), "awq_moe_m1_out: intermediate overlaps ",
                in.name, " in memory");
  }
  return format;
}

}  // namespace
}  // namespace qpnserve
