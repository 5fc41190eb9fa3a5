// gradsync-bench compress --device gpu: the codecs' CUDA paths, timed with
// CUDA events (best of the timed iterations, input bytes per second). Built
// into gradsync-bench only when nvcc is available (bench/meson.build).
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <gradsync/compress/cuda/approx_topk.cuh>
#include <gradsync/compress/cuda/blockwise.cuh>
#include <gradsync/compress/cuda/cast.cuh>
#include <gradsync/compress/cuda/powersgd.cuh>
#include <gradsync/compress/cuda/randk.cuh>
#include <gradsync/compress/cuda/threshold.cuh>
#include <gradsync/compress/cuda/topk.cuh>

#include "compress.hpp"

namespace gradsync::bench::compress_bench {
namespace {

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("--device gpu: ") + what + ": " + cudaGetErrorString(e));
}

struct dmem {
  std::byte* p = nullptr;
  explicit dmem(std::size_t bytes) { ok(cudaMalloc(&p, bytes == 0 ? 16 : bytes), "cudaMalloc"); }
  ~dmem() { cudaFree(p); }
  dmem(const dmem&) = delete;
  dmem& operator=(const dmem&) = delete;
};

struct events {
  cudaEvent_t a{}, b{};
  events() {
    ok(cudaEventCreate(&a), "cudaEventCreate");
    ok(cudaEventCreate(&b), "cudaEventCreate");
  }
  ~events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  /// Best seconds of plan.iters runs of f after plan.warmup.
  template <class F> double best(iteration_plan plan, F f) {
    double best_s = 0;
    for (int i = -plan.warmup; i < plan.iters; ++i) {
      ok(cudaEventRecord(a), "cudaEventRecord");
      f();
      ok(cudaEventRecord(b), "cudaEventRecord");
      ok(cudaEventSynchronize(b), "cudaEventSynchronize");
      float ms = 0;
      ok(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
      if (i >= 0 && (best_s == 0 || ms / 1e3 < best_s)) best_s = ms / 1e3;
    }
    return best_s;
  }
};

/// The state a device encode takes: the codec's own, except PowerSGD's,
/// whose warm start lives in device memory (owned here).
template <class C> struct device_state {
  typename C::state st;
  device_state(const C&, typename C::state s) : st(s) {}
};
template <class T> struct device_state<gc::powersgd<T>> {
  dmem q;
  gc::gpu::powersgd_state st;
  device_state(const gc::powersgd<T>& c, const gc::powersgd_state& s)
      : q(sizeof(float) * gc::gpu::powersgd_state_floats(c)),
        st(gc::gpu::to_device(s, {reinterpret_cast<float*>(q.p), gc::gpu::powersgd_state_floats(c)},
                              nullptr)) {}
};

template <class C>
point measure(const C& c, typename C::state host_st, const typename C::value_type* x,
              std::size_t n, iteration_plan plan) {
  using T = typename C::value_type;
  namespace g = gc::gpu;
  device_state<C> ds(c, host_st);
  auto& st = ds.st;
  if constexpr (!requires(std::span<const T> in, std::span<std::byte> b) {
                  g::encode(c, in, st, b, b, cudaStream_t{});
                }) {
    throw std::runtime_error(std::string("--device gpu: codec ") + std::string(C::name) +
                             " has no CUDA path");
  } else {
    dmem din(n * sizeof(T)), dout(c.max_encoded_bytes(n)), dws(g::encode_workspace_bytes(c, n));
    ok(cudaMemcpy(din.p, x, n * sizeof(T), cudaMemcpyHostToDevice), "upload");
    const std::span<const T> in(reinterpret_cast<const T*>(din.p), n);
    const std::span<std::byte> out(dout.p, c.max_encoded_bytes(n));
    const std::span<std::byte> ws(dws.p, g::encode_workspace_bytes(c, n));
    events ev;
    point p;
    p.encode_s = ev.best(plan, [&] { g::encode(c, in, st, ws, out, nullptr); });
    ok(cudaDeviceSynchronize(), "encode");
    std::byte head[gc::wire::header_bytes];
    ok(cudaMemcpy(head, dout.p, sizeof head, cudaMemcpyDeviceToHost), "download");
    p.payload = gc::wire::header_bytes + static_cast<std::uint8_t>(head[7]) +
                gc::wire::load<std::uint64_t>(head + 16);
    dmem dback(n * sizeof(T)), dstatus(4), dws2(g::decode_workspace_bytes(c, p.payload));
    const std::span<const std::byte> payload(dout.p, p.payload);
    const std::span<T> back(reinterpret_cast<T*>(dback.p), n);
    auto* status = reinterpret_cast<std::uint32_t*>(dstatus.p);
    const std::span<std::byte> ws2(dws2.p, g::decode_workspace_bytes(c, p.payload));
    p.decode_s = ev.best(plan, [&] { g::decode(c, payload, back, status, ws2, nullptr); });
    ok(cudaDeviceSynchronize(), "decode");
    std::uint32_t code = 0;
    ok(cudaMemcpy(&code, status, 4, cudaMemcpyDeviceToHost), "download");
    g::throw_if_failed(code, "bench.decode");
    std::vector<T> host_back(n);
    ok(cudaMemcpy(host_back.data(), dback.p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    p.rel_l2 = rel_l2<T>(std::span<const T>(x, n), host_back);
    return p;
  }
}

template <class T>
point run(const codec_spec& spec, const void* x, std::size_t n, iteration_plan plan) {
  point p;
  with_codec<T>(spec, n, [&](const auto& c, auto st) {
    p = measure(c, st, static_cast<const T*>(x), n, plan);
  });
  return p;
}

} // namespace

bool gpu_built() { return true; }

void gpu_require() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    throw std::runtime_error("--device gpu: no CUDA device is visible");
}

point gpu_measure(const codec_spec& spec, dtype t, const void* x, std::size_t n,
                  iteration_plan plan) {
  switch (t) {
  case dtype::f32: return run<float>(spec, x, n, plan);
  case dtype::f16: return run<half>(spec, x, n, plan);
  case dtype::bf16: return run<bfloat16>(spec, x, n, plan);
  default: throw std::runtime_error("--device gpu: element types f32, f16 and bf16 only");
  }
}

} // namespace gradsync::bench::compress_bench
