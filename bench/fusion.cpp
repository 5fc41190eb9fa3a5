// gradsync-bench fusion: what tensor fusion buys. One "step" allreduces a
// list of gradient tensors (f32, op avg) three ways, on every rank:
//   per-tensor  one gradsync::allreduce (or compressed_allreduce) per tensor;
//   grouped     fusion::grouped_allreduce (or grouped_compressed_allreduce):
//               the planner's buckets, one collective each, no thread;
//   engine      fusion::engine: submit every tensor, then flush() (the
//               progress thread negotiates and runs the buckets).
// Workloads: `uniform` (-N tensors of -s bytes, default 1024 x 4 KiB) and
// `resnet50` (the 161 parameter tensors of torchvision's ResNet-50, 25.6 M
// elements, submitted in backward order as DDP sees them).
//
//   gradsync-bench fusion --ranks 2                      (inproc)
//   mpiexec -n 2 gradsync-bench fusion -t mpi
//   gradsync-bench fusion -t shm --ranks 2 -z int8       (compressed buckets)
//
// time = the slowest rank's mean time per step; algbw = bytes per step /
// time; speedup = per-tensor time / this row's time; buckets = collectives
// per step. Every mode is checked once after timing: small-integer inputs,
// whose averages every schedule computes exactly (uncompressed only).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <gradsync/calibrate.hpp>
#include <gradsync/collectives.hpp>
#include <gradsync/compressed.hpp>
#include <gradsync/fusion/engine.hpp>

#include "common.hpp"
#include "subcommands.hpp"
#include "transports.hpp"

namespace gradsync::bench {
namespace fusion_bench {
namespace {

// torchvision.models.resnet50(): element counts of model.parameters() in
// order (conv1, bn1; per Bottleneck conv1, bn1, conv2, bn2, conv3, bn3 and
// the first block's downsample conv + bn; fc weight, bias).
constexpr std::size_t resnet50[] = {
    9408,    64,      64,      4096,    64,      64,      36864,   64,      64,      16384,   256,     256,
    16384,   256,     256,     16384,   64,      64,      36864,   64,      64,      16384,   256,     256,
    16384,   64,      64,      36864,   64,      64,      16384,   256,     256,     32768,   128,     128,
    147456,  128,     128,     65536,   512,     512,     131072,  512,     512,     65536,   128,     128,
    147456,  128,     128,     65536,   512,     512,     65536,   128,     128,     147456,  128,     128,
    65536,   512,     512,     65536,   128,     128,     147456,  128,     128,     65536,   512,     512,
    131072,  256,     256,     589824,  256,     256,     262144,  1024,    1024,    524288,  1024,    1024,
    262144,  256,     256,     589824,  256,     256,     262144,  1024,    1024,    262144,  256,     256,
    589824,  256,     256,     262144,  1024,    1024,    262144,  256,     256,     589824,  256,     256,
    262144,  1024,    1024,    262144,  256,     256,     589824,  256,     256,     262144,  1024,    1024,
    262144,  256,     256,     589824,  256,     256,     262144,  1024,    1024,    524288,  512,     512,
    2359296, 512,     512,     1048576, 2048,    2048,    2097152, 2048,    2048,    1048576, 512,     512,
    2359296, 512,     512,     1048576, 2048,    2048,    1048576, 512,     512,     2359296, 512,     512,
    1048576, 2048,    2048,    2048000, 1000};
static_assert(std::size(resnet50) == 161, "ResNet-50 has 161 parameter tensors");
static_assert(std::accumulate(std::begin(resnet50), std::end(resnet50), std::size_t{0}) == 25'557'032,
              "ResNet-50 has 25,557,032 parameters");

struct config {
  std::string transport;
  int ranks = 2;
  std::size_t tensors = 1024, tensor_bytes = 4096;
  std::vector<std::string> workloads{"uniform", "resnet50"};
  std::optional<compression> z;
  fusion::engine_options eo;
  algorithm algo = algorithm::automatic;
  int iters = 0, warmup = -1;
  std::string json;
};

struct workload {
  std::string name;
  std::vector<std::size_t> counts; // in submission order
  std::size_t bytes() const { return std::accumulate(counts.begin(), counts.end(), std::size_t{0}) * sizeof(float); }
};

workload make_workload(const std::string& name, const config& cfg) {
  if (name == "uniform") return {name, std::vector<std::size_t>(cfg.tensors, cfg.tensor_bytes / sizeof(float))};
  if (name == "resnet50") return {name, std::vector<std::size_t>(std::rbegin(resnet50), std::rend(resnet50))}; // backward order
  throw std::invalid_argument("--workload: unknown workload '" + name + "' (uniform, resnet50)");
}

// Rank r's element i of tensor j: a small integer, so averages are exact.
float input(int r, std::size_t j, std::size_t i) {
  return static_cast<float>(static_cast<int>((j * 7 + i * 3 + static_cast<std::size_t>(r) * 5) % 13) - 6);
}

struct tensors {
  std::vector<std::vector<float>> data;
  std::vector<std::span<float>> spans;

  explicit tensors(const workload& w) : data(w.counts.size()) {
    for (std::size_t j = 0; j < w.counts.size(); ++j) data[j].resize(w.counts[j]);
    for (auto& d : data) spans.emplace_back(d);
  }
  void fill(int r) {
    for (std::size_t j = 0; j < data.size(); ++j)
      for (std::size_t i = 0; i < data[j].size(); ++i) data[j][i] = input(r, j, i);
  }
  // Elements that differ from the average over p ranks of the inputs.
  long long wrong(int p) const {
    long long bad = 0;
    for (std::size_t j = 0; j < data.size(); ++j)
      for (std::size_t i = 0; i < data[j].size(); ++i) {
        float s = 0;
        for (int r = 0; r < p; ++r) s += input(r, j, i);
        const float e = s / static_cast<float>(p);
        bad += std::memcmp(&e, &data[j][i], sizeof e) != 0;
      }
    return bad;
  }
};

struct row {
  std::string workload, mode;
  std::size_t tensors = 0, bytes = 0;
  double seconds = 0, buckets = 0;
  long long wrong = -1;
};

enum class mode { per_tensor, grouped, engine };
constexpr const char* mode_name(mode m) {
  switch (m) {
  case mode::per_tensor: return "per-tensor";
  case mode::grouped: return "grouped";
  case mode::engine: return "engine";
  }
  return "?";
}

template <transport C> class runner {
public:
  runner(C& c, const config& cfg, const selector& sel) : c_(c), cfg_(cfg) {
    coll_.algo = cfg.algo;
    coll_.select = &sel;
    if (cfg.z) {
      // Measured once and shared by every per-tensor and grouped state (the
      // engine measures on its first bucket, in the warm-up).
      costs_ = measure_codec_costs<float>(c, cfg.z->codec);
    }
  }

  // One step of mode m on t (collective: every rank calls it). Returns the
  // collectives it ran.
  double step(mode m, tensors& t, std::vector<compress_state<float>>& st) {
    switch (m) {
    case mode::per_tensor:
      for (std::size_t j = 0; j < t.spans.size(); ++j) {
        if (cfg_.z) compressed_allreduce(c_, t.spans[j], *cfg_.z, st[j], op::avg{}, coll_);
        else allreduce(c_, t.spans[j], op::avg{}, coll_);
      }
      return static_cast<double>(t.spans.size());
    case mode::grouped:
      if (cfg_.z)
        fusion::grouped_compressed_allreduce(c_, std::span<const std::span<float>>(t.spans), *cfg_.z, std::span(st),
                                             op::avg{}, coll_, cfg_.eo.bucket_bytes, cfg_.eo.solo_bytes);
      else
        fusion::grouped_allreduce(c_, std::span<const std::span<float>>(t.spans), op::avg{}, coll_, cfg_.eo.bucket_bytes,
                                  cfg_.eo.solo_bytes);
      return grouped_buckets_;
    case mode::engine: break;
    }
    return 0;
  }

  row run(const workload& w, mode m) {
    tensors t(w);
    t.fill(c_.rank());
    std::vector<compress_state<float>> st(t.spans.size());
    for (auto& s : st) s.costs = costs_;
    grouped_buckets_ = static_cast<double>(grouped_plan(w));
    const iteration_plan ip = plan_iterations(w.bytes(), cfg_.iters, cfg_.warmup);
    row out{w.name, mode_name(m), w.counts.size(), w.bytes()};
    double t_local = 0;
    barrier(c_);
    if (m == mode::engine) {
      fusion::engine_options eo = cfg_.eo;
      eo.coll.algo = cfg_.algo;
      eo.coll.select = coll_.select;
      fusion::engine<C> eng(c_, eo); // owns c_ until the end of this block
      const auto one = [&] {
        for (auto& s : t.spans) {
          if (cfg_.z) eng.submit(s, {.compress = *cfg_.z});
          else eng.submit(s);
        }
        eng.flush();
      };
      for (int i = 0; i < ip.warmup; ++i) one();
      const auto b0 = eng.stats().buckets;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < ip.iters; ++i) one();
      t_local = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / ip.iters;
      out.buckets = static_cast<double>(eng.stats().buckets - b0) / ip.iters;
      if (!cfg_.z) { // the check: one step on fresh inputs
        t.fill(c_.rank());
        one();
        out.wrong = t.wrong(c_.size());
      }
    } else {
      for (int i = 0; i < ip.warmup; ++i) step(m, t, st);
      barrier(c_);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < ip.iters; ++i) out.buckets = step(m, t, st);
      t_local = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / ip.iters;
      if (!cfg_.z) {
        t.fill(c_.rank());
        step(m, t, st);
        out.wrong = t.wrong(c_.size());
      }
    }
    double v[2] = {t_local, static_cast<double>(out.wrong)};
    allreduce(c_, std::span<double>(v, 2), op::max{});
    out.seconds = v[0];
    out.wrong = static_cast<long long>(v[1]);
    return out;
  }

private:
  std::size_t grouped_plan(const workload& w) const {
    std::vector<fusion::tensor_desc> d;
    for (const std::size_t n : w.counts) d.push_back({.dt = dtype::f32, .count = n});
    return fusion::plan(d, {.bucket_bytes = cfg_.eo.bucket_bytes, .first_bucket_bytes = cfg_.eo.bucket_bytes,
                            .first = false,
                            .solo_bytes = cfg_.eo.solo_bytes ? *cfg_.eo.solo_bytes : fusion::solo_bytes_of(c_, coll_)})
        .size();
  }

  C& c_;
  const config& cfg_;
  options coll_;
  std::optional<codec_costs> costs_;
  double grouped_buckets_ = 0;
};

std::string fixed(double v, int prec) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

template <transport C> long long run_rank(C& c, const config& cfg) {
  const bool lead = c.rank() == 0;
  const selector sel = calibrate(c);
  runner<C> run(c, cfg, sel);
  options model_o;
  model_o.algo = cfg.algo;
  model_o.select = &sel;
  const std::size_t solo = cfg.eo.solo_bytes ? *cfg.eo.solo_bytes : fusion::solo_bytes_of(c, model_o);
  std::FILE* json = nullptr;
  if (lead && !cfg.json.empty()) {
    json = std::fopen(cfg.json.c_str(), "w");
    if (json == nullptr) throw std::runtime_error("--json: cannot open " + cfg.json);
  }
  if (lead) {
    std::printf("# gradsync-bench fusion  transport %s  ranks %d  f32 avg  algo %s  compression %s\n",
                cfg.transport.c_str(), c.size(), std::string(algorithm_name(cfg.algo)).c_str(),
                cfg.z ? cfg.z->codec.text.c_str() : "none");
    const std::string solo_text = solo == std::numeric_limits<std::size_t>::max()
                                      ? "every size fused"
                                      : "tensors >= " + human_bytes(solo) + " unfused";
    std::printf("# engine: bucket %s, first bucket %s, cycle %lld us, look-ahead %zu; grouped: bucket %s; %s%s\n",
                human_bytes(cfg.eo.bucket_bytes).c_str(), human_bytes(cfg.eo.first_bucket_bytes).c_str(),
                static_cast<long long>(cfg.eo.cycle_time.count()), cfg.eo.lookahead,
                human_bytes(cfg.eo.bucket_bytes).c_str(), solo_text.c_str(), cfg.eo.solo_bytes ? "" : " (cost model)");
    std::printf("# time = slowest rank's mean per step; algbw = bytes per step / time; speedup vs per-tensor\n");
    std::printf("%-10s %-11s %8s %12s %9s %12s %9s %8s %7s\n", "workload", "mode", "tensors", "bytes", "buckets",
                "time_us", "algbw", "speedup", "wrong");
  }
  long long wrong = 0;
  for (const std::string& wn : cfg.workloads) {
    const workload w = make_workload(wn, cfg);
    double base = 0;
    for (const mode m : {mode::per_tensor, mode::grouped, mode::engine}) {
      const row r = run.run(w, m);
      if (m == mode::per_tensor) base = r.seconds;
      if (r.wrong > 0) wrong += r.wrong;
      if (!lead) continue;
      const double algbw = static_cast<double>(r.bytes) / r.seconds / 1e9;
      const double speedup = base / r.seconds;
      std::printf("%-10s %-11s %8zu %12zu %9s %12s %9s %8s %7s\n", r.workload.c_str(), r.mode.c_str(), r.tensors,
                  r.bytes, fixed(r.buckets, 1).c_str(), fixed(r.seconds * 1e6, 1).c_str(), fixed(algbw, 3).c_str(),
                  fixed(speedup, 2).c_str(), r.wrong < 0 ? "-" : std::to_string(r.wrong).c_str());
      std::fflush(stdout);
      if (json != nullptr) {
        const nlohmann::json j = {{"bench", "fusion"},
                                  {"transport", cfg.transport},
                                  {"ranks", c.size()},
                                  {"workload", r.workload},
                                  {"mode", r.mode},
                                  {"tensors", r.tensors},
                                  {"bytes", r.bytes},
                                  {"buckets", r.buckets},
                                  {"time_us", r.seconds * 1e6},
                                  {"algbw_gbs", algbw},
                                  {"speedup", speedup},
                                  {"wrong", r.wrong},
                                  {"algo", std::string(algorithm_name(cfg.algo))},
                                  {"compression", cfg.z ? cfg.z->codec.text : std::string("none")},
                                  {"bucket_bytes", cfg.eo.bucket_bytes},
                                  {"first_bucket_bytes", cfg.eo.first_bucket_bytes},
                                  {"cycle_us", cfg.eo.cycle_time.count()},
                                  {"lookahead", cfg.eo.lookahead},
                                  {"solo_bytes", solo}};
        std::fprintf(json, "%s\n", j.dump().c_str());
      }
    }
  }
  if (json != nullptr) std::fclose(json);
  if (lead) std::printf("# %s\n", wrong == 0 ? (cfg.z ? "compressed: results not checked" : "all results correct")
                                             : ("FAILED: " + std::to_string(wrong) + " wrong elements").c_str());
  return wrong;
}

} // namespace
} // namespace fusion_bench

int fusion_main(std::string_view, int argc, char** argv) {
  using namespace fusion_bench;
  config cfg;
  CLI::App app{"Fused allreduce of many tensors (fusion::engine, grouped_allreduce) against one allreduce per "
               "tensor.",
               "gradsync-bench fusion"};
  transport_options tr;
  tr.ranks = 2;
  tr.add_to(app);
  std::string size = "4K", bucket = std::to_string(policy::fusion_bucket_bytes),
              first = std::to_string(policy::fusion_first_bucket_bytes), algo = "auto", codec, workloads = "uniform,resnet50";
  long long cycle_us = policy::fusion_cycle_time.count();
  app.add_option("-N,--tensors", cfg.tensors, "tensors of the uniform workload")->capture_default_str()->check(CLI::Range(1, 1 << 24));
  app.add_option("-s,--size", size, "bytes per tensor of the uniform workload (K/M suffixes)")->capture_default_str();
  app.add_option("--workload", workloads, "comma list: uniform, resnet50")->capture_default_str();
  app.add_option("-z,--codec", codec, std::string("fuse with compression (error feedback on): ") + compress::spec_help);
  app.add_option("-a,--algo", algo, "allreduce algorithm of every collective (auto: the calibrated model)")->capture_default_str();
  app.add_option("--bucket", bucket, "bucket bytes (engine and grouped)")->capture_default_str();
  app.add_option("--first-bucket", first, "the engine's first bucket of a step, bytes")->capture_default_str();
  app.add_option("--cycle-us", cycle_us, "the engine's cycle time in microseconds")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--lookahead", cfg.eo.lookahead, "the planner's look-ahead")->capture_default_str();
  std::string solo;
  app.add_option("--solo", solo, "tensors of at least this many bytes are not fused (default: the calibrated cost "
                                 "model's break-even, fusion::solo_bytes_of)");
  app.add_option("-n,--iters", cfg.iters, "timed steps (0: auto, by bytes per step)")->capture_default_str();
  app.add_option("-w,--warmup", cfg.warmup, "warm-up steps (-1: auto)")->capture_default_str();
  app.add_option("--json", cfg.json, "also write one JSON object per row to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  tr.resolve();
  cfg.transport = tr.name;
  cfg.ranks = tr.ranks;
  cfg.tensor_bytes = parse_bytes(size, "--size");
  if (cfg.tensor_bytes < sizeof(float)) throw std::invalid_argument("--size must hold at least one float");
  cfg.eo.bucket_bytes = parse_bytes(bucket, "--bucket");
  cfg.eo.first_bucket_bytes = parse_bytes(first, "--first-bucket");
  cfg.eo.cycle_time = std::chrono::microseconds(cycle_us);
  if (!solo.empty()) cfg.eo.solo_bytes = parse_bytes(solo, "--solo");
  if (!parse_algorithm(algo, cfg.algo)) throw std::invalid_argument("-a: unknown algorithm '" + algo + "'");
  cfg.workloads.clear();
  for (const std::string& name : split_commas(workloads)) {
    cfg.workloads.push_back(name);
    make_workload(name, cfg); // validates the name
  }
  if (!codec.empty()) {
    compression z{.codec = compress::parse_spec(codec)};
    compress::with_codec<float>(z.codec, 1024, [](const auto&, auto) {}); // a bad spec fails before any rank starts
    cfg.z = z;
  }
  long long wrong = 0;
  with_transport(cfg.transport, cfg.ranks, [&](auto& c) {
    const long long w = run_rank(c, cfg);
    if (c.rank() == 0) wrong = w;
  });
  return wrong == 0 ? 0 : 2;
}

} // namespace gradsync::bench
