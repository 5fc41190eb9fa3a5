// gradsync-bench gossip: what a gossip round costs beside the allreduce it
// replaces. Per message size and topology (-g, repeatable), on every rank:
//   round_us       the slowest rank's mean time of one neighbor_allreduce
//                  round (f32, steps advancing, so one_peer cycles partners);
//   sent/rank      the most payload bytes any rank sent in one round;
//   best_ar_us     the fastest allreduce (op avg) of the same size among -a,
//                  measured in the same run, and which one it was;
//   ratio          round_us / best_ar_us;
//   consensus      ||x_R - mean|| / ||x_0 - mean|| after R rounds (-R; 0: one
//                  period of a dynamic topology, else 10) from fixed inputs,
//                  beside the SLEM's prediction slem^R.
// `hier:TOPO` gossips among group leaders (--group-size ranks per group),
// `shard:TOPO` through every rank of a group, one block each (sharded_gossip.hpp).
//
//   gradsync-bench gossip -g one_peer -g ring --ranks 8
//   gradsync-bench gossip -t shm --ranks 4 -g one_peer -b 1M -e 16M
//   mpiexec -n 2 gradsync-bench gossip -t mpi -g one_peer
//
// --check fails the run (exit 2) when a consensus error exceeds
// max(4 slem^R, 1e-5): the exact topologies (one_peer on 2^k ranks, full)
// must reach the average to rounding.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <gradsync/collectives.hpp>
#include <gradsync/gossip.hpp>

#include "common.hpp"
#include "subcommands.hpp"
#include "timing.hpp"
#include "transports.hpp"

namespace gradsync::bench {
namespace gossip_bench {
namespace {

struct config {
  std::string transport;
  std::vector<std::string> topologies{"one_peer", "ring"};
  std::vector<algorithm> baselines;
  sweep_options sweep;
  int rounds = 0, group_size = 0;
  bool check = false;
};

// The topology a -g name means on a communicator of p ranks (the groups' for
// hier: and shard:).
enum class family { flat, hier, shard };
struct chosen {
  gossip::graph g;
  family f = family::flat;
};
chosen choose(const std::string& name, int p, int group_size) {
  for (const auto& [prefix, f] : {std::pair{std::string("hier:"), family::hier}, std::pair{std::string("shard:"), family::shard}})
    if (name.rfind(prefix, 0) == 0) {
      if (group_size <= 0 || p % group_size)
        throw std::invalid_argument(prefix + " needs --group-size dividing the ranks");
      return {gossip::named(name.substr(prefix.size()), p / group_size), f};
    }
  return {gossip::named(name, p), family::flat};
}

// Fixed, rank-dependent inputs (the consensus measurement starts from these).
void fill(std::vector<float>& x, int r) {
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(std::sin(0.001 * static_cast<double>(i) + 1.7 * r));
}

// ||x - mean over ranks|| over all ranks (collective).
template <transport C> double distance(C& c, const std::vector<float>& x) {
  std::vector<double> mean(x.begin(), x.end());
  allreduce(c, std::span<double>(mean), op::avg{});
  double d = 0;
  for (std::size_t i = 0; i < x.size(); ++i) d += (x[i] - mean[i]) * (x[i] - mean[i]);
  allreduce(c, std::span<double>(&d, 1), op::sum{});
  return std::sqrt(d);
}

template <transport C> double slowest(C& c, double t) {
  allreduce(c, std::span<double>(&t, 1), op::max{});
  return t;
}

template <transport C, class F> double time_loop(C& c, const iteration_plan& ip, F&& one) {
  for (int i = 0; i < ip.warmup; ++i) one(i);
  barrier(c);
  const double t0 = now();
  for (int i = 0; i < ip.iters; ++i) one(ip.warmup + i);
  return batch_seconds(c, t0, now(), ip.iters);
}

std::string fixed(double v, int prec) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

template <transport C> int run_rank(C& c, const config& cfg) {
  const bool lead = c.rank() == 0;
  const int p = c.size();
  std::FILE* json = nullptr;
  if (lead && !cfg.sweep.json.empty()) {
    json = std::fopen(cfg.sweep.json.c_str(), "w");
    if (json == nullptr) throw std::runtime_error("--json: cannot open " + cfg.sweep.json);
  }
  if (lead) {
    std::printf("# gradsync-bench gossip  transport %s  ranks %d  f32\n", cfg.transport.c_str(), p);
    std::printf("# round_us = slowest rank's mean per round; sent/rank = most bytes a rank sent per round;\n"
                "# best_ar = fastest allreduce (avg) of the same size in this run; consensus after R rounds\n");
    std::printf("%12s %-20s %11s %12s %11s %-13s %7s %4s %10s %10s\n", "bytes", "topology", "round_us", "sent/rank",
                "best_ar_us", "best_ar", "ratio", "R", "consensus", "slem^R");
  }
  int failed = 0;
  for (const std::size_t bytes : cfg.sweep.sizes()) {
    const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
    const iteration_plan ip = plan_iterations(n * sizeof(float), cfg.sweep.iters, cfg.sweep.warmup);
    std::vector<float> x(n);
    // The baseline: every listed allreduce, the fastest kept.
    double best = 0;
    std::string best_name;
    for (const algorithm a : cfg.baselines) {
      fill(x, c.rank());
      options o;
      o.algo = a;
      const double t = time_loop(c, ip, [&](int) { allreduce(c, std::span<float>(x), op::avg{}, o); });
      if (best_name.empty() || t < best) {
        best = t;
        best_name = std::string(algorithm_name(a));
        if (a == algorithm::automatic) best_name += ":" + std::string(algorithm_name(allreduce_algorithm<float>(c, n, o)));
      }
    }
    for (const std::string& name : cfg.topologies) {
      const chosen ch = choose(name, p, cfg.group_size);
      const auto round = [&](std::uint64_t step) {
        switch (ch.f) {
        case family::hier: return gossip::hierarchical_neighbor_allreduce(c, std::span<float>(x), ch.g, step, cfg.group_size);
        case family::shard: return gossip::sharded_neighbor_allreduce(c, std::span<float>(x), ch.g, step, cfg.group_size);
        case family::flat: break;
        }
        return gossip::neighbor_allreduce(c, std::span<float>(x), ch.g, step);
      };
      fill(x, c.rank());
      double sent = 0;
      const double t = time_loop(c, ip, [&](int i) { sent = static_cast<double>(round(static_cast<std::uint64_t>(i)).bytes_sent); });
      sent = slowest(c, sent);
      const int rounds = cfg.rounds > 0 ? cfg.rounds : (ch.g.dynamic() ? static_cast<int>(ch.g.period()) : 10);
      fill(x, c.rank());
      const double d0 = distance(c, x);
      for (int k = 0; k < rounds; ++k) round(static_cast<std::uint64_t>(k));
      const double err = d0 > 0 ? distance(c, x) / d0 : 0;
      const double lambda = gossip::slem(ch.g);
      const double predicted = std::pow(lambda, rounds);
      const bool bad = cfg.check && !(err <= std::max(4 * predicted, 1e-5));
      failed += bad;
      if (!lead) continue;
      std::printf("%12zu %-20s %11s %12.0f %11s %-13s %7s %4d %10.2e %10.2e%s\n", n * sizeof(float), name.c_str(),
                  fixed(t * 1e6, 1).c_str(), sent, fixed(best * 1e6, 1).c_str(), best_name.c_str(),
                  fixed(t / best, 3).c_str(), rounds, err, predicted, bad ? "  FAILED" : "");
      std::fflush(stdout);
      if (json != nullptr) {
        const nlohmann::json j = {{"bench", "gossip"},          {"transport", cfg.transport}, {"ranks", p},
                                  {"bytes", n * sizeof(float)}, {"topology", name},           {"round_us", t * 1e6},
                                  {"sent_bytes", sent},         {"best_allreduce_us", best * 1e6},
                                  {"best_allreduce", best_name}, {"ratio", t / best},          {"rounds", rounds},
                                  {"consensus_error", err},     {"slem", lambda},             {"slem_pow_rounds", predicted},
                                  {"group_size", cfg.group_size}};
        std::fprintf(json, "%s\n", j.dump().c_str());
      }
    }
  }
  if (json != nullptr) std::fclose(json);
  if (lead && cfg.check) std::printf("# %s\n", failed == 0 ? "consensus within bounds" : "FAILED: consensus out of bounds");
  return failed;
}

} // namespace
} // namespace gossip_bench

int gossip_main(std::string_view, int argc, char** argv) {
  using namespace gossip_bench;
  config cfg;
  cfg.sweep.min = "4K";
  cfg.sweep.max = "16M";
  cfg.sweep.factor = 4;
  CLI::App app{"Gossip rounds (neighbor_allreduce) per topology beside the best allreduce of the same size.",
               "gradsync-bench gossip"};
  transport_options tr;
  tr.add_to(app);
  cfg.sweep.add_to(app);
  std::vector<std::string> topo;
  std::string algos = "ring,tree,rd,rabenseifner,auto";
  app.add_option("-g,--topology", topo, std::string("topology (repeatable): ") + gossip::topology_help +
                                            "; hier:TOPO gossips among groups of --group-size through one leader each, shard:TOPO through every rank "
                                            "(a block each) (default one_peer, ring)");
  app.add_option("-a,--algos", algos, "allreduce algorithms of the baseline (the fastest is shown)")->capture_default_str();
  app.add_option("-R,--rounds", cfg.rounds, "rounds of the consensus measurement (0: one period, at least 10 for static)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--group-size", cfg.group_size, "ranks per group of hier:TOPO and shard:TOPO")->capture_default_str();
  app.add_flag("--check", cfg.check, "exit 2 when a consensus error exceeds max(4 slem^R, 1e-5)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  tr.resolve();
  cfg.transport = tr.name;
  if (!topo.empty()) cfg.topologies = topo;
  for (const std::string& name : split_commas(algos)) {
    algorithm a{};
    if (!parse_algorithm(name, a)) throw std::invalid_argument("-a: unknown algorithm '" + name + "'");
    cfg.baselines.push_back(a);
  }
  cfg.sweep.sizes(); // validates the sizes before any rank starts
  int failed = 0;
  with_transport(cfg.transport, tr.ranks, [&](auto& c) {
    for (const auto& name : cfg.topologies) choose(name, c.size(), cfg.group_size); // a bad name fails on every rank
    const int f = run_rank(c, cfg);
    if (c.rank() == 0) failed = f;
  });
  return failed == 0 ? 0 : 2;
}

} // namespace gradsync::bench
