// gradsync-bench check-cost: what the call check (algo/verify.hpp: every rank
// agrees on the call) costs a small allreduce. Unchecked and checked calls
// alternate in blocks within one run (never, always, always, never, ...), so
// the two settings see the same machine state; the per-call time of a block
// is the slowest rank's; the table gives the median and minimum over blocks
// and the median's difference. docs/reliability.md records its runs.
#include "common.hpp"
#include "subcommands.hpp"
#include "transports.hpp"

#include <gradsync/gradsync.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace gradsync::bench {
namespace {

struct check_cost_config {
  std::string transport = "inproc";
  int ranks = 2;
  std::string sizes = "8,4K";
  std::string algo = "rd";
  int blocks = 20;
  int per_block = 20000;
};

struct cost_row {
  std::size_t bytes = 0;
  double never_med = 0, never_min = 0, always_med = 0, always_min = 0;
};

double quantile(std::vector<double> v, double f) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(f * static_cast<double>(v.size() - 1))];
}

// One size: alternating blocks of `per_block` calls; false if any result is wrong.
template <class C> bool time_size(C& c, const check_cost_config& cfg, algorithm a, std::size_t bytes, cost_row& out) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
  // Max of equal values: the result equals the input, so calls can repeat in place.
  std::vector<float> x(n, 1.0f + static_cast<float>(n % 7));
  options o[2];
  o[0].algo = o[1].algo = a;
  o[0].verify = verification::never;
  o[1].verify = verification::always;
  options quiet;
  quiet.verify = verification::never;
  for (int w = 0; w < std::max(200, cfg.per_block / 10); ++w) allreduce(c, std::span(x), op::max{}, o[w & 1]);
  std::vector<double> t[2];
  for (int b = 0; b < 2 * cfg.blocks; ++b) {
    const int k = (b & 1) ^ ((b >> 1) & 1); // never, always, always, never, ...
    barrier(c, quiet);
    const double t0 = now();
    for (int i = 0; i < cfg.per_block; ++i) allreduce(c, std::span(x), op::max{}, o[k]);
    double us = (now() - t0) / cfg.per_block * 1e6;
    allreduce(c, std::span(&us, 1), op::max{}, quiet);
    t[k].push_back(us);
  }
  out = {bytes, quantile(t[0], 0.5), quantile(t[0], 0), quantile(t[1], 0.5), quantile(t[1], 0)};
  const float want = 1.0f + static_cast<float>(n % 7);
  return std::all_of(x.begin(), x.end(), [&](float v) { return v == want; });
}

} // namespace

int check_cost_main(std::string_view subcommand, int argc, char** argv) {
  check_cost_config cfg;
  CLI::App app{"the call check's cost on a small allreduce (never and always alternating)",
               "gradsync-bench " + std::string(subcommand)};
  app.add_option("-t,--transport", cfg.transport, "transport (inproc, shm, mpi)")->capture_default_str();
  app.add_option("--ranks", cfg.ranks, "ranks (in-process and forked shm; MPI takes mpiexec's)")->capture_default_str();
  app.add_option("-b,--sizes", cfg.sizes, "comma-separated sizes in bytes (K, M suffixes)")->capture_default_str();
  app.add_option("-a,--algo", cfg.algo, "allreduce schedule")->capture_default_str();
  app.add_option("--blocks", cfg.blocks, "blocks per setting")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--per-block", cfg.per_block, "calls per block")->check(CLI::Range(1, 100000000))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  algorithm a = algorithm::automatic;
  if (!parse_algorithm(cfg.algo, a)) {
    std::fprintf(stderr, "check-cost: unknown algorithm '%s'\n", cfg.algo.c_str());
    return 2;
  }
  std::vector<std::size_t> sizes;
  for (const auto& s : split_commas(cfg.sizes)) sizes.push_back(parse_bytes(s, "size"));
  std::atomic<bool> ok{true};
  with_transport(cfg.transport, cfg.ranks, [&](auto& c) {
    std::vector<cost_row> rows;
    for (const std::size_t b : sizes) {
      cost_row r;
      if (!time_size(c, cfg, a, b, r)) ok.store(false);
      rows.push_back(r);
    }
    if (c.rank() != 0) return;
    std::printf("# check-cost: allreduce max, %s, %d ranks, %s; %d blocks of %d calls per setting, alternating;"
                " us per call (slowest rank per block)\n",
                cfg.transport.c_str(), c.size(), cfg.algo.c_str(), cfg.blocks, cfg.per_block);
    std::printf("%10s %12s %12s %12s %12s %12s %9s\n", "bytes", "never med", "never min", "always med", "always min",
                "cost (med)", "cost %");
    for (const auto& r : rows)
      std::printf("%10zu %12.3f %12.3f %12.3f %12.3f %+12.3f %+8.1f%%\n", r.bytes, r.never_med, r.never_min,
                  r.always_med, r.always_min, r.always_med - r.never_med, 100 * (r.always_med / r.never_med - 1));
  });
  if (!ok.load()) std::fprintf(stderr, "check-cost: a result was wrong\n");
  return ok.load() ? 0 : 1;
}

} // namespace gradsync::bench
