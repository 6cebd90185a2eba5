// CUDA launcher of qpnserve::awq_moe_m1_out: argument checks, device guard, current stream,
// the launches (two on sm_90, one cooperative launch for the V100 design), launch checks. No allocation and no host synchronisation, so it is capturable in
// a CUDA graph.

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "awq_moe_m1_checks.h"
#include "awq_moe_m1_kernels.cuh"
#include "pdl_launch.h"

namespace qpnserve {
namespace {

// The op's path argument: the device's default, or the V100 design on any GPU (so that it can be
// tested where no V100 is).
enum Path : int64_t { kDefault = 0, kV100 = 1 };
constexpr int kMaxDevices = 64;

// Whether a kernel's device code for this GPU contains griddepcontrol (built for sm_90+). A build
// that only carries older code must not be launched with the programmatic attribute, because
// its kernel B would read h without waiting. Cached per device; the query does not synchronise.
template <typename Kernel>
bool binary_has_pdl(Kernel kernel, int device) {
  static std::mutex mu;
  static std::array<int, kMaxDevices> cache{};  // 0 unknown, 1 no, 2 yes
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0 || device >= kMaxDevices) return false;
  if (cache[device] == 0) {
    cudaFuncAttributes attr{};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    cache[device] = attr.binaryVersion >= 90 ? 2 : 1;
  }
  return cache[device] == 2;
}

// ---------------------------------------------------------------------------------------------
// Slots of the polled hand-off (qpn::PolledH): its tag protocol needs the calls that share a slot
// to run one after another. Calls on one stream do; a CUDA graph captured on a stream keeps the
// slot it was captured with and may be replayed on another stream beside eager calls. So every
// eager stream gets a slot of its own for the process's life, and every stream of every capture
// one of its own, returned to the pool when the graph and its instantiations are destroyed (a
// CUDA user object). With none left the call gets the overflow slot, untagged: kernel B then
// takes h from intermediate after kernel A's completion, slower but trusting no shared state.
struct SlotPool {
  bool ready = false;
  qpn::PolledH* base = nullptr;
  std::vector<int> free;
  std::map<cudaStream_t, int> eager;
  std::map<std::pair<unsigned long long, cudaStream_t>, int> captured;
};
struct Slots {
  std::mutex mu;
  std::array<SlotPool, kMaxDevices> pools;
};
// Never destroyed: a graph released at interpreter exit runs its user object's destructor on a
// CUDA thread, possibly after this library's static objects are gone.
Slots& slots() {
  static Slots* const state = new Slots();
  return *state;
}

struct CapturedSlot {
  int device;
  std::pair<unsigned long long, cudaStream_t> key;
  int slot;
};

// The user object's destructor: runs on a CUDA-internal thread once the graph is gone and its
// launches have completed; it may not call CUDA.
void release_captured_slot(void* data) {
  const std::unique_ptr<CapturedSlot> held(static_cast<CapturedSlot*>(data));
  Slots& state = slots();
  const std::lock_guard<std::mutex> lock(state.mu);
  SlotPool& pool = state.pools[held->device];
  pool.captured.erase(held->key);
  pool.free.push_back(held->slot);
}

// The call's slot (tagged) or the overflow slot (untagged). Needs the device guard of the caller.
struct CallSlot {
  qpn::PolledH* slot;
  bool tagged;
};
CallSlot polled_slot(int device, cudaStream_t stream) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "awq_moe_m1_out: device index out of range");
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long capture_id = 0;
  cudaGraph_t graph = nullptr;
  C10_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &capture_id, &graph));
  const bool capturing = status == cudaStreamCaptureStatusActive;
  CapturedSlot* held = nullptr;
  CallSlot call{};
  CallSlot overflow{};
  {
    Slots& state = slots();
    const std::lock_guard<std::mutex> lock(state.mu);
    SlotPool& pool = state.pools[device];
    if (!pool.ready) {
      void* base = nullptr;
      C10_CUDA_CHECK(cudaGetSymbolAddress(&base, qpn::g_polled_h));
      pool.base = static_cast<qpn::PolledH*>(base);
      for (int i = qpn::kPolledSlots - 1; i >= 0; --i) pool.free.push_back(i);
      pool.ready = true;
    }
    overflow = {pool.base + qpn::kPolledSlots, false};
    // An invalidated capture fails at the launch anyway.
    if (status == cudaStreamCaptureStatusInvalidated) return overflow;
    if (!capturing) {
      const auto it = pool.eager.find(stream);
      if (it != pool.eager.end()) return {pool.base + it->second, true};
    } else {
      const auto it = pool.captured.find({capture_id, stream});
      if (it != pool.captured.end()) return {pool.base + it->second, true};
    }
    if (pool.free.empty()) return overflow;
    const int index = pool.free.back();
    pool.free.pop_back();
    call = {pool.base + index, true};
    if (!capturing) {
      pool.eager.emplace(stream, index);
      return call;
    }
    pool.captured.emplace(std::make_pair(capture_id, stream), index);
    held = new CapturedSlot{device, {capture_id, stream}, index};
  }
  // Outside the lock: the destructor takes it. Where the graph cannot hold the slot, the call
  // goes untagged rather than fail.
  cudaUserObject_t object = nullptr;
  if (cudaUserObjectCreate(&object, held, release_captured_slot, 1,
                           cudaUserObjectNoDestructorSync) != cudaSuccess) {
    (void)cudaGetLastError();
    release_captured_slot(held);
    return overflow;
  }
  if (cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove) != cudaSuccess) {
    (void)cudaGetLastError();
    (void)cudaUserObjectRelease(object, 1);  // runs the destructor: the slot goes back
    return overflow;
  }
  return call;
}

// ---------------------------------------------------------------------------------------------
// The sm_90 default: both kernels as programmatic dependents. Kernel A waits for its predecessor
// (griddepcontrol.wait) before reading ids and x and publishes h with the call's tag; kernel B,
// scheduled at once, streams and dequantizes its W2 meanwhile and polls h. Kernel A at 64
// registers and kernel B at 80, so that every B CTA is resident beside A from the start.
template <bool kMeta3>
void launch_sm90(const qpn::MoeArgs& args, cudaStream_t stream, int device) {
  qpn::MoeArgs a = args;
  const CallSlot call = polled_slot(device, stream);
  a.polled = call.slot;
  a.tagged = call.tagged ? 1 : 0;
  qpn_launch::launch(qpn::w13_swiglu_kernel<kMeta3, false, 16, 2, qpn::kPublishTag>,
                     dim3(qpn::kTiles13, qpn::kRoutes), dim3(16 * 32), true, stream, a);
  qpn_launch::launch(qpn::w2_combine16_kernel<kMeta3>, dim3(qpn::kTiles2x16),
                     dim3(qpn::kWarpsB * 32), true, stream, a);
}

// ---------------------------------------------------------------------------------------------
// The V100 design (awq_moe_m1_sm70.cuh): whether all its CTAs fit on `device` at once and the
// device can launch cooperatively (cached per device; neither query synchronises), and its
// launch. A grid that cannot be co-resident is refused by the driver with an error, never run.
bool v100_design_fits(int device) {
  static std::mutex mu;
  static std::array<int, kMaxDevices> cache{};  // 0 unknown, 1 no, 2 yes
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0 || device >= kMaxDevices) return false;
  if (cache[device] == 0) {
    int cooperative = 0, sms = 0, per_sm_4 = 0, per_sm_3 = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm_4, qpn::v100_moe_kernel<false>, qpn::kV100Threads, 0));
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm_3, qpn::v100_moe_kernel<true>, qpn::kV100Threads, 0));
    const int per_sm = per_sm_4 < per_sm_3 ? per_sm_4 : per_sm_3;
    cache[device] = cooperative != 0 && per_sm * sms >= qpn::kV100Ctas ? 2 : 1;
  }
  return cache[device] == 2;
}

// One cooperative launch on `stream` (capturable in a CUDA graph); its grid barrier lives in the
// workspace the driver gives each cooperative launch, so calls in flight share no state.
void launch_v100(const qpn::MoeArgs& args, bool meta3, cudaStream_t stream) {
  qpn::MoeArgs a = args;
  void* params[] = {&a};
  const void* kernel = meta3 ? reinterpret_cast<const void*>(qpn::v100_moe_kernel<true>)
                             : reinterpret_cast<const void*>(qpn::v100_moe_kernel<false>);
  C10_CUDA_CHECK(cudaLaunchCooperativeKernel(kernel, dim3(qpn::kV100Ctas),
                                             dim3(qpn::kV100Threads), params, 0, stream));
}

void awq_moe_m1_out_path_cuda(at::Tensor& out, at::Tensor& intermediate, const at::Tensor& x,
                              const at::Tensor& w13, const at::Tensor& s13, const at::Tensor& w2,
                              const at::Tensor& s2, const at::Tensor& ids,
                              const at::Tensor& weights, int64_t path) {
  TORCH_CHECK(out.is_cuda(), "awq_moe_m1_out: out must be a CUDA tensor");
  TORCH_CHECK(path == kDefault || path == kV100,
              "awq_moe_m1_out_path: path must be 0 (the device's default) or 1 (the V100 "
              "design), got ",
              qpn_text::num(path));
  const MetaFormat format = check_args(out, intermediate, x, w13, s13, w2, s2, ids, weights);
  const c10::cuda::CUDAGuard guard(out.device());
  const int device = out.get_device();
  const int cc_major = at::cuda::getDeviceProperties(device)->major;  // cached by torch
  TORCH_CHECK(cc_major >= 7, "awq_moe_m1_out: needs compute capability 7.0 or newer, device ",
              qpn_text::num(device), " has ", qpn_text::num(cc_major), ".x");
  const bool meta3 = format == MetaFormat::kThreeByte;
  // The sm_90 default needs programmatic dependent launch in the binary; every other GPU, and a
  // build without sm_90 code, takes the V100 design, which needs its whole grid co-resident.
  const bool v100 =
      path == kV100 || cc_major < 9 ||
      !(meta3 ? binary_has_pdl(qpn::w2_combine16_kernel<true>, device)
              : binary_has_pdl(qpn::w2_combine16_kernel<false>, device));
  TORCH_CHECK(!v100 || v100_design_fits(device), "awq_moe_m1_out: the V100 design needs its ",
              qpn_text::num(qpn::kV100Ctas),
              " CTAs co-resident and cooperative launch; device ", qpn_text::num(device),
              " cannot run it");

  qpn::MoeArgs args{};
  args.out = reinterpret_cast<__half*>(out.data_ptr());
  args.intermediate = reinterpret_cast<__half*>(intermediate.data_ptr());
  args.x = reinterpret_cast<const __half*>(x.data_ptr());
  args.w13 = reinterpret_cast<const unsigned*>(w13.data_ptr());
  args.s13 = s13.data_ptr();
  args.w2 = reinterpret_cast<const unsigned*>(w2.data_ptr());
  args.s2 = s2.data_ptr();
  args.ids = ids.data_ptr<int32_t>();
  args.weights = weights.data_ptr<float>();
  args.polled = nullptr;
  args.tagged = 0;
  args.num_experts = static_cast<int>(w13.size(0));

  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(device).stream();
  if (v100) {
    launch_v100(args, meta3, stream);
  } else if (meta3) {
    launch_sm90<true>(args, stream, device);
  } else {
    launch_sm90<false>(args, stream, device);
  }
}

void awq_moe_m1_out_cuda(at::Tensor& out, at::Tensor& intermediate, const at::Tensor& x,
                         const at::Tensor& w13, const at::Tensor& s13, const at::Tensor& w2,
                         const at::Tensor& s2, const at::Tensor& ids, const at::Tensor& weights) {
  awq_moe_m1_out_path_cuda(out, intermediate, x, w13, s13, w2, s2, ids, weights, kDefault);
}

}  // namespace
}  // namespace qpnserve

TORCH_LIBRARY_IMPL(qpnserve, CUDA, m) {
  m.impl("awq_moe_m1_out", &qpnserve::awq_moe_m1_out_cuda);
  m.impl("awq_moe_m1_out_path", &qpnserve::awq_moe_m1_out_path_cuda);
}
