// The operator's geometry: one TP4 rank of Qwen3.8 (contract section 2), the one definition that
// the kernels, the argument checks, the CPU implementation and the read floor (bench_floor.cu)
// share. qpnserve/geometry.py states the same numbers
// for Python. No includes: NVRTC (the sm_70 gate), nvcc and the host compiler all read it.

#pragma once

namespace qpn {

constexpr int kHidden = 2560;                   // W13 K, W2 N
constexpr int kInter = 160;                     // W2 K (intermediate per rank)
constexpr int kN13 = 2 * kInter;                // W13 N: gate_i at column 2i, up_i at 2i+1
constexpr int kRoutes = 10;                     // top-k
constexpr int kGroup = 32;                      // AWQ group along K
constexpr int kTile = 32;                       // columns per weight tile of the bank layout
constexpr int kNumExperts = 512;                // E of the checkpoint (the op takes any E >= 1)
constexpr int kGroups13 = kHidden / kGroup;     // 80
constexpr int kGroups2 = kInter / kGroup;       // 5
constexpr int kTiles13 = kN13 / kTile;          // 10
constexpr int kTiles2 = kHidden / kTile;        // 80
constexpr int kWords13 = kHidden * kN13 / 8;    // int32 code words per expert, W13
constexpr int kWords2 = kInter * kHidden / 8;   // int32 code words per expert, W2
constexpr int kGroupTileWords = kGroup * kTile / 8;  // 128 words = 512 B: one group x one tile

}  // namespace qpn
