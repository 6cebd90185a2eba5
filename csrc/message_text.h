// Text for TORCH_CHECK messages, built without std::ostream number formatting.
//
// Why: on the H200 test image (torch 2.11.0+cu130, extension built by nvcc 13), a TORCH_CHECK
// whose message streams an integer (or an IntArrayRef / Device, which stream integers) killed
// the process with SIGSEGV, while messages made only of strings raised normally (measured
// case by case: out-dtype, out-shape and out-noncontiguous raised, out-misaligned, whose
// message streamed an int64, crashed; the read-floor op likewise). Integer insertion is the
// one path that looks up the locale's num_put facet, which points at two copies of libstdc++
// disagreeing in one process; that cause is inferred, not proven. std::to_string formats with
// vsnprintf and avoids the facet, so every number in a message goes through these helpers.

#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace qpn_text {

inline std::string num(int64_t value) { return std::to_string(value); }

// "(1, 2560)"
inline std::string shape(at::IntArrayRef sizes) {
  std::string text = "(";
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(sizes[i]);
  }
  return text + ")";
}

inline std::string device(const at::Device& d) { return d.str(); }

}  // namespace qpn_text
