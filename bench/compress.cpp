// gradsync-bench compress: host (and, built with CUDA and run with a GPU,
// device) throughput of the gradient codecs over a range of tensor sizes.
//
//   gradsync-bench compress -z int8 -z topk:density=0.01 -d f32 -b 1M -e 64M -f 4
//
// Per size and codec: encode and decode bandwidth in input bytes per second
// (best of the timed iterations, like the memcpy reference), compression ratio
// (input bytes / payload bytes), relative L2 error of the decoded tensor
// (||decode(encode(x)) - x|| / ||x||) and single-thread memcpy bandwidth of the
// same size measured in the same run (the ceiling of one pass over the data).
// Input: Gaussian N(0, 1) values from a fixed seed (gradients are roughly
// Gaussian; the sparsifiers' thresholds depend on the distribution).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <numbers>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common.hpp"
#include "compress.hpp"
#include "subcommands.hpp"

namespace gradsync::bench {
namespace compress_bench {

#if !defined(GRADSYNC_BENCH_CUDA)
bool gpu_built() { return false; }
void gpu_require() {
  throw std::runtime_error("--device gpu: this gradsync-bench was built without CUDA (nvcc)");
}
point gpu_measure(const codec_spec&, dtype, const void*, std::size_t, iteration_plan) {
  gpu_require();
  return {};
}
#endif

namespace {

/// Gaussian N(0, 1) values (Box-Muller over a SplitMix64 stream).
template <class T> std::vector<T> gaussian(std::size_t n, std::uint64_t seed) {
  std::vector<T> v(n);
  std::uint64_t s = seed;
  const auto next = [&s] {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1p-53;
  };
  for (std::size_t i = 0; i < n; i += 2) {
    const double u1 = 1.0 - next(), u2 = next();
    const double r = std::sqrt(-2.0 * std::log(u1));
    v[i] = T(static_cast<float>(r * std::cos(2 * std::numbers::pi * u2)));
    if (i + 1 < n) v[i + 1] = T(static_cast<float>(r * std::sin(2 * std::numbers::pi * u2)));
  }
  return v;
}

/// The clock of the measurements: wall time (what a caller waits), or this
/// thread's CPU time (--clock cpu: on an oversubscribed machine, where other
/// processes take the core mid-measurement, wall time measures the queue).
bool use_cpu_clock = false;

double now_s() {
  if (use_cpu_clock) {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Single-thread memcpy of `bytes` on the same clock: best of five copies.
memcpy_limit memcpy_reference(std::size_t bytes) {
  if (!use_cpu_clock) return measure_memcpy(bytes, 5);
  buffer src(bytes), dst(bytes);
  std::memset(src.data(), 0x5a, bytes);
  std::memset(dst.data(), 0, bytes);
  memcpy_limit lim{bytes, 0};
  for (int i = 0; i <= 5; ++i) { // the first copy only warms up
    const double t0 = now_s();
    std::memcpy(dst.data(), src.data(), bytes);
    asm volatile("" : : "r"(dst.data()) : "memory");
    const double s = now_s() - t0;
    if (i > 0 && (lim.seconds == 0 || s < lim.seconds)) lim.seconds = s;
  }
  return lim;
}

/// Times encode and decode of `c` on x (host path).
template <class C>
point measure_host(const C& c, typename C::state st, std::span<const typename C::value_type> x,
                   iteration_plan plan) {
  using T = typename C::value_type;
  std::vector<std::byte> ws(c.workspace_bytes(x.size())), out(c.max_encoded_bytes(x.size()));
  std::vector<T> back(x.size());
  point p;
  for (int i = -plan.warmup; i < plan.iters; ++i) {
    const double t0 = now_s();
    p.payload = c.encode(x, st, ws, out);
    asm volatile("" : : "r"(out.data()) : "memory");
    const double s = now_s() - t0;
    if (i >= 0 && (p.encode_s == 0 || s < p.encode_s)) p.encode_s = s;
  }
  const std::span<const std::byte> payload(out.data(), p.payload);
  for (int i = -plan.warmup; i < plan.iters; ++i) {
    const double t0 = now_s();
    c.decode(payload, std::span<T>(back));
    asm volatile("" : : "r"(back.data()) : "memory");
    const double s = now_s() - t0;
    if (i >= 0 && (p.decode_s == 0 || s < p.decode_s)) p.decode_s = s;
  }
  p.rel_l2 = rel_l2<T>(x, back);
  return p;
}

struct config {
  std::vector<codec_spec> codecs;
  dtype dt = dtype::f32;
  std::vector<std::size_t> sizes;
  int iters = 0, warmup = -1;
  std::string json, device = "cpu";
};

std::string fixed(double v, int prec) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

template <class T> int run(const config& cfg) {
  std::FILE* json = nullptr;
  if (!cfg.json.empty()) {
    json = std::fopen(cfg.json.c_str(), "w");
    if (json == nullptr) throw std::runtime_error("--json: cannot open " + cfg.json);
  }
  const bool gpu = cfg.device == "gpu";
  std::printf("# gradsync-bench compress: %s, input %s N(0,1); GB/s = input bytes / best %s "
              "time; memcpy: single thread, same size\n",
              gpu ? "device (CUDA)" : "host, one thread", std::string(dtype_name(cfg.dt)).c_str(),
              use_cpu_clock ? "thread CPU" : "wall");
  std::printf("%12s %-22s %5s %10s %9s %10s %9s %8s %10s %9s %7s\n", "bytes", "codec", "type",
              "enc_us", "enc_GB/s", "dec_us", "dec_GB/s", "ratio", "rel_l2", "memcpy", "enc/cp");
  for (const std::size_t bytes : cfg.sizes) {
    const std::size_t n = bytes / sizeof(T);
    if (n == 0) continue;
    const std::vector<T> x = gaussian<T>(n, 0x9a55 + n);
    const memcpy_limit lim = memcpy_reference(n * sizeof(T));
    const iteration_plan plan = plan_iterations(n * sizeof(T), cfg.iters, cfg.warmup);
    for (const codec_spec& spec : cfg.codecs) {
      point p;
      std::size_t used = n; // powersgd encodes rows * cols <= n
      with_codec<T>(spec, n, [&](const auto& c, auto st) {
        if constexpr (requires { c.rows; }) used = c.rows * c.cols;
        const std::span<const T> in(x.data(), used);
        if (gpu)
          p = gpu_measure(spec, cfg.dt, in.data(), in.size(), plan);
        else
          p = measure_host(c, st, in, plan);
      });
      const double in_bytes = static_cast<double>(used * sizeof(T));
      const double enc = in_bytes / p.encode_s / 1e9, dec = in_bytes / p.decode_s / 1e9;
      const double ratio = in_bytes / static_cast<double>(p.payload);
      std::printf("%12zu %-22s %5s %10s %9s %10s %9s %8s %10.3e %9s %6.0f%%\n", used * sizeof(T),
                  spec.text.c_str(), std::string(dtype_name(cfg.dt)).c_str(),
                  fixed(p.encode_s * 1e6, 1).c_str(), fixed(enc, 2).c_str(),
                  fixed(p.decode_s * 1e6, 1).c_str(), fixed(dec, 2).c_str(),
                  fixed(ratio, 2).c_str(), p.rel_l2, fixed(lim.gbs(), 2).c_str(),
                  100 * enc / lim.gbs());
      if (json != nullptr) {
        const nlohmann::json j = {{"codec", spec.text},
                                  {"dtype", std::string(dtype_name(cfg.dt))},
                                  {"bytes", used * sizeof(T)},
                                  {"encode_gbs", enc},
                                  {"decode_gbs", dec},
                                  {"ratio", ratio},
                                  {"rel_l2_error", p.rel_l2},
                                  {"memcpy_gbs", lim.gbs()},
                                  {"device", cfg.device}};
        std::fprintf(json, "%s\n", j.dump().c_str());
      }
    }
  }
  if (json != nullptr) std::fclose(json);
  return 0;
}

} // namespace
} // namespace compress_bench

int compress_main(std::string_view, int argc, char** argv) {
  using namespace compress_bench;
  CLI::App app{"Times gradsync's gradient codecs: encode/decode GB/s, compression ratio and "
               "relative L2 error against single-thread memcpy.",
               "gradsync-bench compress"};
  std::vector<std::string> specs;
  std::string dt = "f32";
  config cfg;
  app.add_option("-z,--codec", specs, codec_help)->required();
  app.add_option("-d,--datatype", dt, "element type of the tensor")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "f64", "f16", "bf16"}));
  app.add_option("--device", cfg.device,
                 "cpu: host codecs; gpu: the CUDA paths (builds with nvcc, needs a GPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "gpu"}));
  std::string clock = "wall";
  app.add_option("--clock", clock,
                 "host timing: wall, or cpu (thread CPU time, for a shared, oversubscribed machine)")
      ->capture_default_str()
      ->check(CLI::IsMember({"wall", "cpu"}));
  sweep_options sw;
  sw.min = "1M";
  sw.max = "64M";
  sw.factor = 4;
  sw.add_to(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (const auto& s : specs) {
    cfg.codecs.push_back(parse_spec(s));
    // Unknown codecs and parameters fail before any measurement starts.
    with_codec<float>(cfg.codecs.back(), 1024, [](const auto&, const auto&) {});
  }
  cfg.sizes = sw.sizes();
  cfg.iters = sw.iters;
  cfg.warmup = sw.warmup;
  cfg.json = sw.json;
  if (cfg.device == "gpu") gpu_require();
  use_cpu_clock = clock == "cpu";
  if (use_cpu_clock && cfg.device == "gpu")
    throw std::invalid_argument("--clock cpu times host code; the device path uses CUDA events");
  for (auto d : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16})
    if (dtype_name(d) == dt) cfg.dt = d;
  switch (cfg.dt) {
  case dtype::f64: return run<double>(cfg);
  case dtype::f16: return run<half>(cfg);
  case dtype::bf16: return run<bfloat16>(cfg);
  default: return run<float>(cfg);
  }
}

} // namespace gradsync::bench
