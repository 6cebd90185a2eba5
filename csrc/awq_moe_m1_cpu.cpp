// The CPU implementation of qpnserve::awq_moe_m1_out (the schema is in awq_moe_m1.cpp).
//
// It is the readable statement of the contract (section 4): it follows the same staged roundings
// as the CUDA kernels, summing every dot product in ascending k. It is what runs on machines
// without CUDA (CI, and everything that calls the op there).

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "awq_moe_m1_checks.h"

namespace qpnserve {
namespace {

// FP16 bits of the double v rounded to nearest even, in one step (a double -> float -> half path
// would round twice). Used for q * s + b, which is exact in double, so the result is the single
// FP16 rounding of the fused multiply-add that the contract asks for.
uint16_t half_bits_from_double(double v) {
  if (std::isnan(v)) return 0x7e00;
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(v);
  if (a >= 65520.0) return sign | 0x7c00;  // 65520 is the tie between 65504 and 2^16: to inf
  if (a < 6.103515625e-05) {               // below 2^-14: subnormal, units of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0));
  }
  int exp2 = 0;
  std::frexp(a, &exp2);  // a = f * 2^exp2, f in [0.5, 1)
  const int e = exp2 - 1;
  const auto mant = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, 10 - e)));  // 1024..2048
  // A mantissa of 2048 carries into the exponent, which is the right rounding.
  return sign | static_cast<uint16_t>((static_cast<uint32_t>(e + 15) << 10) + mant - 1024);
}

float half_to_float(uint16_t bits) {
  c10::Half h;
  h.x = bits;
  return static_cast<float>(h);
}

uint16_t float_to_half_bits(float v) { return c10::Half(v).x; }  // round to nearest even

// Dequantized FP32 values of the 16 possible codes of one (group, column): fp16(q * s + b).
void code_table(uint16_t scale_bits, uint16_t bias_bits, float (&table)[16]) {
  const double s = half_to_float(scale_bits);
  const double b = half_to_float(bias_bits);
  for (int q = 0; q < 16; ++q) table[q] = half_to_float(half_bits_from_double(q * s + b));
}

// Row offset j (0..7) inside a code word lives in nibble kNibbleOfRow[j] (contract section 3).
constexpr int kNibbleOfRow[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// (scale bits, bias bits) of metadata record (group g, column n) of one expert.
struct MetaReader {
  MetaFormat format;
  const uint8_t* base;  // the expert's first record
  int64_t columns;      // N
  void read(int64_t g, int64_t n, uint16_t& scale, uint16_t& bias) const {
    if (format == MetaFormat::kFourByte) {
      uint32_t rec;
      std::memcpy(&rec, base + (g * columns + n) * 4, 4);
      scale = static_cast<uint16_t>(rec & 0xffffu);
      bias = static_cast<uint16_t>(rec >> 16);
    } else {
      const uint8_t* rec = base + (g * columns + n) * 3;
      scale = static_cast<uint16_t>(rec[0] | (rec[1] << 8));
      const double z = rec[2];
      // fp16(-z * s): the product is exact in double, one rounding.
      bias = half_bits_from_double(-z * static_cast<double>(half_to_float(scale)));
    }
  }
};

// y[n] = FP32 sum over k (ascending) of act[k] * w[k][n] for one expert's tiled bank.
//   words: the expert's (K/8 * N) int32 words, tile-major (contract section 3)
//   act:   K FP32 values, each an FP16 value (so every product is exact in FP32)
void expert_dot(const int32_t* words, const MetaReader& meta, const float* act, int64_t k_dim,
                int64_t n_dim, float* y) {
  const int64_t k8_count = k_dim / 8;
  std::vector<float> table(static_cast<size_t>(n_dim) * 16);
  for (int64_t n = 0; n < n_dim; ++n) y[n] = 0.0f;
  for (int64_t g = 0; g < k_dim / kGroup; ++g) {
    for (int64_t n = 0; n < n_dim; ++n) {
      uint16_t s, b;
      meta.read(g, n, s, b);
      code_table(s, b, reinterpret_cast<float(&)[16]>(table[n * 16]));
    }
    for (int64_t k8 = g * (kGroup / 8); k8 < (g + 1) * (kGroup / 8); ++k8) {
      for (int64_t n = 0; n < n_dim; ++n) {
        const int64_t t = n / 32, c = n % 32;
        const auto word = static_cast<uint32_t>(words[(t * k8_count + k8) * 32 + c]);
        const float* tab = &table[n * 16];
        float acc = y[n];
        for (int j = 0; j < 8; ++j) {
          const uint32_t q = (word >> (4 * kNibbleOfRow[j])) & 0xfu;
          acc += act[k8 * 8 + j] * tab[q];
        }
        y[n] = acc;
      }
    }
  }
}

void awq_moe_m1_out_cpu(at::Tensor& out, at::Tensor& intermediate, const at::Tensor& x,
                        const at::Tensor& w13, const at::Tensor& s13, const at::Tensor& w2,
                        const at::Tensor& s2, const at::Tensor& ids, const at::Tensor& weights) {
  const MetaFormat format = check_args(out, intermediate, x, w13, s13, w2, s2, ids, weights);
  const int64_t experts = w13.size(0);
  const int64_t record = format == MetaFormat::kFourByte ? 4 : 3;
  const auto* x_bits = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* ids_p = ids.data_ptr<int32_t>();
  const auto* weights_p = weights.data_ptr<float>();
  auto* inter_bits = reinterpret_cast<uint16_t*>(intermediate.data_ptr());
  auto* out_bits = reinterpret_cast<uint16_t*>(out.data_ptr());
  const auto* w13_p = w13.data_ptr<int32_t>();
  const auto* w2_p = w2.data_ptr<int32_t>();
  const auto* s13_p = static_cast<const uint8_t*>(s13.data_ptr());
  const auto* s2_p = static_cast<const uint8_t*>(s2.data_ptr());

  std::vector<float> xf(kHidden), gate_up(kN13), h(kInter);
  for (int64_t k = 0; k < kHidden; ++k) xf[k] = half_to_float(x_bits[k]);
  std::vector<float> y(static_cast<size_t>(kRoutes * kHidden), 0.0f);
  std::vector<bool> valid(kRoutes);

  for (int64_t r = 0; r < kRoutes; ++r) {
    const int64_t e = ids_p[r];
    valid[r] = e >= 0 && e < experts;
    if (!valid[r]) {
      for (int64_t i = 0; i < kInter; ++i) inter_bits[r * kInter + i] = 0;
      continue;
    }
    const MetaReader m13{format, s13_p + e * (kHidden / kGroup) * kN13 * record, kN13};
    expert_dot(w13_p + e * (kHidden * kN13 / 8), m13, xf.data(), kHidden, kN13, gate_up.data());
    for (int64_t i = 0; i < kInter; ++i) {
      const uint16_t gate16 = float_to_half_bits(gate_up[2 * i]);
      const uint16_t up16 = float_to_half_bits(gate_up[2 * i + 1]);
      const float g = half_to_float(gate16);
      const uint16_t silu16 = float_to_half_bits(g / (1.0f + std::exp(-g)));
      // FP16 x FP16 is exact in FP32, so rounding the FP32 product once is the FP16 multiply.
      const uint16_t h16 = float_to_half_bits(half_to_float(silu16) * half_to_float(up16));
      inter_bits[r * kInter + i] = h16;
      h[i] = half_to_float(h16);
    }
    const MetaReader m2{format, s2_p + e * (kInter / kGroup) * kHidden * record, kHidden};
    float* y_r = &y[r * kHidden];
    expert_dot(w2_p + e * (kInter * kHidden / 8), m2, h.data(), kInter, kHidden, y_r);
    for (int64_t n = 0; n < kHidden; ++n) y_r[n] = half_to_float(float_to_half_bits(y_r[n]));
  }
  for (int64_t n = 0; n < kHidden; ++n) {
    float acc = 0.0f;
    for (int64_t r = 0; r < kRoutes; ++r) {
      if (valid[r]) acc = std::fma(weights_p[r], y[r * kHidden + n], acc);
    }
    out_bits[n] = float_to_half_bits(acc);
  }
}

}  // namespace
}  // namespace qpnserve

TORCH_LIBRARY_IMPL(qpnserve, CPU, m) { m.impl("awq_moe_m1_out", &qpnserve::awq_moe_m1_out_cpu); }
