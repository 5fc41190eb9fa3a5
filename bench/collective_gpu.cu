// gradsync-bench allreduce | reduce_scatter | allgather | broadcast | reduce
// --device gpu: the same sweep on device buffers. Every rank (inproc threads,
// shm processes or MPI processes, all on the current GPU) stages its
// messages through pinned host blocks (transport/staged.hpp, cuda_copier on
// its own stream) and does its element work with exec::cuda on that stream.
// Rows as the host sweep's (nccl-tests columns, closed-form check of every
// element); the run's device copy bandwidth (device to device, device to
// pinned host, pinned host to device: rank 0, the others waiting) is printed
// and attached to every JSON row, beside the host memcpy limit. f32 and sum
// only: each more instantiation costs ~15 s of nvcc in every CI build, and the
// bytes moved are the same for every dtype and operator.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <gradsync/collectives.hpp>
#include <gradsync/exec/cuda.cuh>
#include <gradsync/transport/cuda_staging.cuh>

#include "collective.hpp"
#include "common.hpp"
#include "transports.hpp"

namespace gradsync::bench::coll_bench {
namespace {

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("--device gpu: ") + what + ": " + cudaGetErrorString(e));
}

struct dmem {
  std::byte* p = nullptr;
  explicit dmem(std::size_t bytes) { ok(cudaMalloc(&p, bytes == 0 ? 256 : bytes), "cudaMalloc"); }
  ~dmem() { (void)cudaFree(p); }
  dmem(const dmem&) = delete;
  dmem& operator=(const dmem&) = delete;
  template <class T> T* as() const noexcept { return reinterpret_cast<T*>(p); }
};

struct stream {
  cudaStream_t s{};
  stream() { ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~stream() { (void)cudaStreamDestroy(s); }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
};

// Best GB/s of `reps` copies of `bytes` of the given kind (pinned host memory
// for the host side), timed with events on `s`.
double copy_gbs(cudaMemcpyKind kind, std::size_t bytes, cudaStream_t s, int reps = 5) {
  dmem a(bytes), b(bytes);
  void* host = nullptr;
  ok(cudaMallocHost(&host, bytes), "cudaMallocHost");
  void* dst = kind == cudaMemcpyDeviceToHost ? host : b.p;
  const void* src = kind == cudaMemcpyHostToDevice ? host : a.p;
  cudaEvent_t e0{}, e1{};
  ok(cudaEventCreate(&e0), "cudaEventCreate");
  ok(cudaEventCreate(&e1), "cudaEventCreate");
  float best = 0;
  for (int i = 0; i <= reps; ++i) { // the first copy warms up
    ok(cudaEventRecord(e0, s), "cudaEventRecord");
    ok(cudaMemcpyAsync(dst, src, bytes, kind, s), "cudaMemcpyAsync");
    ok(cudaEventRecord(e1, s), "cudaEventRecord");
    ok(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float ms = 0;
    ok(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    if (i > 0 && (best == 0 || ms < best)) best = ms;
  }
  (void)cudaEventDestroy(e0);
  (void)cudaEventDestroy(e1);
  (void)cudaFreeHost(host);
  // A device-to-device copy reads and writes every byte: count both, as a
  // memory bandwidth, so it compares with what p ranks' reads and writes need.
  const double moved = static_cast<double>(bytes) * (kind == cudaMemcpyDeviceToDevice ? 2 : 1);
  return best > 0 ? moved / (best / 1e3) / 1e9 : 0;
}

template <class T, class Op, transport C> std::int64_t sweep_device(C& host, const config& cfg, report& rep, Op op) {
  const int p = host.size(), r = host.rank();
  stream st;
  staged dev(host, cuda_copier(st.s));
  exec::cuda ex(st.s);
  options base;
  base.segment_bytes = cfg.segment_bytes;
  base.group_size = cfg.group_size;
  base.verify = cfg.verify;
  std::int64_t wrong_all = 0;
  std::size_t last_bytes = 0;
  for (const std::size_t size : cfg.sizes) {
    const shape s = shape_of(cfg.kind, size, sizeof(T), p);
    if (s.count == 0 || s.bytes == last_bytes) continue;
    last_bytes = s.bytes;
    std::vector<T> hin(s.in_n), hout(std::max(s.out_n, s.in_n));
    T pat[period];
    for (std::size_t i = 0; i < period; ++i) pat[i] = from_int<T>(input_value(r, i, Op::kind));
    for (std::size_t i = 0; i < s.in_n; ++i) hin[i] = pat[i % period];
    dmem din(s.in_n * sizeof(T)), dout(std::max<std::size_t>(s.out_n, 1) * sizeof(T));
    const auto upload = [&] {
      ok(cudaMemcpyAsync(din.p, hin.data(), s.in_n * sizeof(T), cudaMemcpyHostToDevice, st.s), "upload");
      ok(cudaStreamSynchronize(st.s), "cudaStreamSynchronize");
    };
    upload();
    for (const algo_choice& ac : cfg.algos) {
      if (ac.native)
        throw std::invalid_argument("--device gpu: -a native (the MPI library's own collective) takes host buffers only");
      options o = base;
      o.algo = ac.a;
      const std::span<const T> in(din.as<T>(), s.in_n);
      const std::span<T> out(dout.as<T>(), s.out_n);
      const auto call = [&] {
        switch (cfg.kind) {
        case coll::allreduce: allreduce(dev, ex, in, out, op, o); break;
        case coll::reduce_scatter: reduce_scatter(dev, ex, in, out, op, o); break;
        case coll::allgather: allgather(dev, ex, in, out, o); break;
        case coll::broadcast: broadcast(dev, ex, std::span<T>(din.as<T>(), s.in_n), root, o); break;
        case coll::reduce: reduce(dev, ex, in, out, root, op, o); break;
        }
      };
      const iteration_plan plan = plan_iterations(s.bytes, cfg.iters, cfg.warmup);
      for (int i = 0; i < plan.warmup; ++i) call();
      ok(cudaStreamSynchronize(st.s), "cudaStreamSynchronize");
      barrier(host);
      const double t0 = now();
      for (int i = 0; i < plan.iters; ++i) call();
      ok(cudaStreamSynchronize(st.s), "cudaStreamSynchronize");
      double sec = (now() - t0) / std::max(1, plan.iters);
      allreduce(host, std::span(&sec, 1), op::max{});
      std::int64_t wrong = -1;
      if (cfg.check) { // one more call on fresh inputs, every element against its closed form
        upload();
        call();
        ok(cudaStreamSynchronize(st.s), "cudaStreamSynchronize");
        const bool bcast = cfg.kind == coll::broadcast;
        const std::size_t n = bcast ? s.in_n : s.out_n;
        const bool has_result = cfg.kind != coll::reduce || r == root;
        wrong = 0;
        if (has_result && n > 0) {
          ok(cudaMemcpy(hout.data(), bcast ? din.p : dout.p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
          for (std::size_t i = 0; i < n; ++i) {
            T want{};
            switch (cfg.kind) {
            case coll::allreduce:
            case coll::reduce: want = reduced_value<T>(p, i, Op::kind); break;
            case coll::reduce_scatter: want = reduced_value<T>(p, static_cast<std::size_t>(r) * s.out_n + i, Op::kind); break;
            case coll::allgather: want = from_int<T>(input_value(static_cast<int>(i / s.in_n), (i % s.in_n) % period, Op::kind)); break;
            case coll::broadcast: want = from_int<T>(input_value(root, i % period, Op::kind)); break;
            }
            if (std::memcmp(&hout[i], &want, sizeof(T)) != 0) ++wrong;
          }
        }
        allreduce(host, std::span(&wrong, 1), op::sum{});
        wrong_all += wrong;
        if (cfg.kind == coll::broadcast) upload();
      }
      const double algbw = static_cast<double>(s.bytes) / sec / 1e9;
      row w;
      w.collective = cfg.name;
      w.transport = cfg.transport + "+gpu";
      w.ranks = p;
      w.algo = ac.name;
      w.dtype = std::string(dtype_name(cfg.dt));
      w.op = reduces(cfg.kind) ? std::string(Op::name) : "none";
      w.bytes = s.bytes;
      w.count = s.count;
      w.time_us = sec * 1e6;
      w.algbw_gbs = algbw;
      w.busbw_gbs = algbw * bus_factor(cfg.kind, p);
      w.wrong = wrong;
      rep.add(w);
    }
  }
  return wrong_all;
}

template <transport C> std::int64_t run_device_rank(C& host, const config& cfg) {
  ok(cudaSetDevice(0), "cudaSetDevice");
  report rep(host.rank() == 0, cfg.json);
  cudaDeviceProp prop{};
  ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  // Limits, measured by rank 0 while the others wait.
  memcpy_limit lim;
  double d2d = 0, d2h = 0, h2d = 0;
  const std::size_t probe = std::min<std::size_t>(cfg.sizes.back() == 0 ? 1 : cfg.sizes.back(), std::size_t{256} << 20);
  barrier(host);
  if (host.rank() == 0) {
    lim = measure_memcpy();
    stream st;
    d2d = copy_gbs(cudaMemcpyDeviceToDevice, probe, st.s);
    d2h = copy_gbs(cudaMemcpyDeviceToHost, probe, st.s);
    h2d = copy_gbs(cudaMemcpyHostToDevice, probe, st.s);
  }
  barrier(host);
  rep.note("gradsync-bench " + cfg.name + " --device gpu  transport " + cfg.transport + " (staged through pinned host memory)  ranks " +
           std::to_string(host.size()) + "  dtype " + std::string(dtype_name(cfg.dt)) + "  op " +
           (reduces(cfg.kind) ? std::string(op_name(cfg.op)) : std::string("none")) + "  algos " + cfg.algo_list +
           "  check " + (cfg.check ? "on" : "off") + "  verify " +
           (cfg.verify == verification::always ? "always" : cfg.verify == verification::never ? "never" : "auto"));
  rep.attribute("device", "device", prop.name);
  char buf[160];
  std::snprintf(buf, sizeof buf, "%.1f", d2d);
  rep.attribute("device copy GB/s (read + write, " + human_bytes(probe) + ")", "device_copy_gbs", buf);
  std::snprintf(buf, sizeof buf, "%.1f", d2h);
  rep.attribute("device to pinned host GB/s", "d2h_gbs", buf);
  std::snprintf(buf, sizeof buf, "%.1f", h2d);
  rep.attribute("pinned host to device GB/s", "h2d_gbs", buf);
  rep.header();
  const std::int64_t wrong = sweep_device<float>(host, cfg, rep, op::sum{});
  finish_checked(rep, lim, cfg.name, cfg.transport + "+gpu", host.size(), cfg.check, wrong);
  return wrong;
}

} // namespace

std::int64_t gpu_collective(const config& cfg) {
  if (cfg.dt != dtype::f32) throw std::invalid_argument("--device gpu: -d f32 only");
  if (reduces(cfg.kind) && cfg.op != op_kind::sum) throw std::invalid_argument("--device gpu: -o sum only");
  // Not before shm forks its ranks: a child must not inherit an initialised
  // CUDA runtime. Each rank finds out at its cudaSetDevice.
  if (cfg.transport != "shm") {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
      throw std::runtime_error("--device gpu: no CUDA device");
  }
  std::atomic<std::int64_t> wrong{0};
  with_transport(cfg.transport, cfg.ranks, [&](auto& c) { wrong.store(run_device_rank(c, cfg)); });
  return wrong.load();
}

} // namespace gradsync::bench::coll_bench
