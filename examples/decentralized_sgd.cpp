// gradsync decentralized SGD: D-PSGD (Lian et al., 2017) against allreduce
// SGD on a seeded synthetic least-squares problem split across ranks.
//
// Rank r holds m rows A_r (Gaussian features) and targets b_r = A_r (x* +
// h d_r) + noise, d_r a rank-specific shift scaled by --hetero, so the
// ranks' local optima differ. The global loss is
// f(x) = 1/p sum_r 1/(2m) ||A_r x - b_r||^2, and f* its minimum (solved
// exactly by Cholesky on the gathered normal equations). Each step every
// rank draws a minibatch of its rows:
//   allreduce SGD   g = allreduce_avg(g_r(x)); x -= lr g        (models identical)
//   D-PSGD          x_r -= lr g_r(x_r); x_r = neighbor_allreduce(x_r)   (one gossip round)
// The loss is reported at the ranks' average model, with the consensus
// distance of the local models. Simulated wall time charges every step
// --compute-us plus the communication an alpha-beta network (--alpha-us,
// --gbps) predicts: the cheaper of ring (2(p-1) alpha + 2 (p-1)/p n beta) and
// recursive doubling (log2 p (alpha + n beta)) for the allreduce; alpha +
// out-degree n beta for a gossip round. D-PSGD is shown at equal steps and at
// the steps it fits in allreduce SGD's simulated time.
//
//   ./decentralized_sgd                         # 8 ranks as threads, one_peer gossip
//   ./decentralized_sgd --ranks 16 --topology ring --steps 500
//   ./decentralized_sgd --global-every 10       # periodic global averaging
//
// Exits non-zero unless every run reduced the excess loss f - f* below a
// tenth of its start and allreduce SGD's ranks hold identical models.
#include <gradsync/collectives.hpp>
#include <gradsync/gossip.hpp>
#include <gradsync/transport/inproc.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

struct config {
  int ranks = 8, dim = 64, rows = 1024, batch = 16, steps = 300;
  double lr = 0.05, hetero = 0.5, noise = 0.1;
  std::uint64_t seed = 1, global_every = 0;
  std::string topology = "one_peer";
  double compute_us = 100, alpha_us = 20, gbps = 10;
};

// A rank's shard of the problem.
struct shard {
  int d = 0, m = 0;
  std::vector<double> a, b; // a: m x d row-major
};

shard make_shard(const config& cfg, int r) {
  shard s{cfg.dim, cfg.rows, std::vector<double>(static_cast<std::size_t>(cfg.rows) * cfg.dim), std::vector<double>(static_cast<std::size_t>(cfg.rows))};
  std::mt19937_64 shared(cfg.seed), own(cfg.seed * 1000003 + static_cast<std::uint64_t>(r) + 1);
  std::normal_distribution<double> n01(0, 1);
  std::vector<double> target(static_cast<std::size_t>(cfg.dim));
  for (auto& v : target) v = n01(shared);
  for (auto& v : target) v += cfg.hetero * n01(own);
  for (int i = 0; i < cfg.rows; ++i) {
    double y = 0;
    for (int j = 0; j < cfg.dim; ++j) {
      const double v = n01(own);
      s.a[static_cast<std::size_t>(i) * cfg.dim + j] = v;
      y += v * target[static_cast<std::size_t>(j)];
    }
    s.b[static_cast<std::size_t>(i)] = y + cfg.noise * n01(own);
  }
  return s;
}

// Local loss 1/(2m) ||A x - b||^2.
double local_loss(const shard& s, std::span<const double> x) {
  double l = 0;
  for (int i = 0; i < s.m; ++i) {
    double e = -s.b[static_cast<std::size_t>(i)];
    for (int j = 0; j < s.d; ++j) e += s.a[static_cast<std::size_t>(i) * s.d + j] * x[static_cast<std::size_t>(j)];
    l += e * e;
  }
  return l / (2.0 * s.m);
}

// Minibatch gradient at x of rows drawn by (seed, rank, step).
void minibatch_grad(const shard& s, const config& cfg, int r, int step, std::span<const double> x, std::span<double> g) {
  std::mt19937_64 pick(cfg.seed ^ (static_cast<std::uint64_t>(r) << 40) ^ (static_cast<std::uint64_t>(step) * 0x9e3779b97f4a7c15ull));
  std::uniform_int_distribution<int> row(0, s.m - 1);
  std::fill(g.begin(), g.end(), 0.0);
  for (int k = 0; k < cfg.batch; ++k) {
    const int i = row(pick);
    const double* ai = &s.a[static_cast<std::size_t>(i) * s.d];
    double e = -s.b[static_cast<std::size_t>(i)];
    for (int j = 0; j < s.d; ++j) e += ai[j] * x[static_cast<std::size_t>(j)];
    for (int j = 0; j < s.d; ++j) g[static_cast<std::size_t>(j)] += e * ai[j] / cfg.batch;
  }
}

// f* by the normal equations (collective): H = mean_r A_r^T A_r / m, c = mean_r A_r^T b_r / m.
template <class C> std::vector<double> optimum(C& c, const shard& s) {
  const auto d = static_cast<std::size_t>(s.d);
  std::vector<double> h(d * d + d, 0.0);
  for (int i = 0; i < s.m; ++i) {
    const double* ai = &s.a[static_cast<std::size_t>(i) * d];
    for (std::size_t j = 0; j < d; ++j) {
      for (std::size_t k = 0; k < d; ++k) h[j * d + k] += ai[j] * ai[k] / s.m;
      h[d * d + j] += ai[j] * s.b[static_cast<std::size_t>(i)] / s.m;
    }
  }
  gradsync::allreduce(c, std::span<double>(h), gradsync::op::avg{});
  // Cholesky H = L L^T in place (H is positive definite: m >> d Gaussian rows).
  for (std::size_t j = 0; j < d; ++j) {
    for (std::size_t k = 0; k < j; ++k) h[j * d + j] -= h[j * d + k] * h[j * d + k];
    h[j * d + j] = std::sqrt(h[j * d + j]);
    for (std::size_t i = j + 1; i < d; ++i) {
      for (std::size_t k = 0; k < j; ++k) h[i * d + j] -= h[i * d + k] * h[j * d + k];
      h[i * d + j] /= h[j * d + j];
    }
  }
  std::vector<double> x(h.begin() + static_cast<std::ptrdiff_t>(d * d), h.end());
  for (std::size_t i = 0; i < d; ++i) { // L y = c
    for (std::size_t k = 0; k < i; ++k) x[i] -= h[i * d + k] * x[k];
    x[i] /= h[i * d + i];
  }
  for (std::size_t i = d; i-- > 0;) { // L^T x = y
    for (std::size_t k = i + 1; k < d; ++k) x[i] -= h[k * d + i] * x[k];
    x[i] /= h[i * d + i];
  }
  return x;
}

// Global loss at the ranks' average model, and the consensus distance (collective).
template <class C> std::pair<double, double> evaluate(C& c, const shard& s, std::span<const double> x) {
  std::vector<double> mean(x.begin(), x.end());
  gradsync::allreduce(c, std::span<double>(mean), gradsync::op::avg{});
  double v[2] = {local_loss(s, mean), 0};
  for (std::size_t j = 0; j < x.size(); ++j) v[1] += (x[j] - mean[j]) * (x[j] - mean[j]);
  gradsync::allreduce(c, std::span<double>(v, 2), gradsync::op::sum{});
  return {v[0] / c.size(), std::sqrt(v[1])};
}

struct result {
  int steps = 0;
  double sim_ms = 0, loss = 0, consensus = 0;
};

// Modelled seconds of one step's communication.
double allreduce_seconds(const config& cfg, int p, std::size_t bytes) {
  if (p == 1) return 0;
  const double a = cfg.alpha_us * 1e-6, b = 8 / (cfg.gbps * 1e9), n = static_cast<double>(bytes);
  const double ring = 2 * (p - 1) * a + 2.0 * (p - 1) / p * n * b;
  const double rd = std::ceil(std::log2(p)) * (a + n * b);
  return std::min(ring, rd);
}
double gossip_seconds(const config& cfg, const gradsync::gossip::graph& g, std::size_t bytes) {
  std::size_t deg = 0;
  for (std::size_t t = 0; t < g.period(); ++t)
    for (int r = 0; r < g.size(); ++r) deg = std::max(deg, g.at(t).out(r).size());
  if (deg == 0) return 0;
  return cfg.alpha_us * 1e-6 + static_cast<double>(deg * bytes) * 8 / (cfg.gbps * 1e9);
}

template <class C> int run_rank(C& c, const config& cfg) {
  const int r = c.rank(), p = c.size();
  const shard s = make_shard(cfg, r);
  const std::vector<double> xstar = optimum(c, s);
  double fstar = local_loss(s, xstar);
  gradsync::allreduce(c, std::span<double>(&fstar, 1), gradsync::op::avg{});
  const gradsync::gossip::graph g = gradsync::gossip::named(cfg.topology, p);
  const std::size_t bytes = static_cast<std::size_t>(cfg.dim) * sizeof(double);
  const double step_ar = cfg.compute_us * 1e-6 + allreduce_seconds(cfg, p, bytes);
  const double step_gossip = cfg.compute_us * 1e-6 + gossip_seconds(cfg, g, bytes);
  const int steps_equal_time = static_cast<int>(std::floor(cfg.steps * step_ar / step_gossip));
  std::vector<double> zero(static_cast<std::size_t>(cfg.dim), 0.0), grad(zero.size());
  const double f0 = evaluate(c, s, zero).first - fstar;

  // Allreduce SGD.
  std::vector<double> x = zero;
  for (int k = 0; k < cfg.steps; ++k) {
    minibatch_grad(s, cfg, r, k, x, grad);
    gradsync::allreduce(c, std::span<double>(grad), gradsync::op::avg{});
    for (std::size_t j = 0; j < x.size(); ++j) x[j] -= cfg.lr * grad[j];
  }
  auto [loss_ar, cons_ar] = evaluate(c, s, x);
  const result ar{cfg.steps, cfg.steps * step_ar * 1e3, loss_ar - fstar, cons_ar};
  std::vector<double> hi = x, lo = x; // allreduce SGD keeps identical models on every rank
  gradsync::allreduce(c, std::span<double>(hi), gradsync::op::max{});
  gradsync::allreduce(c, std::span<double>(lo), gradsync::op::min{});
  const bool identical = std::memcmp(hi.data(), lo.data(), hi.size() * sizeof(double)) == 0;

  // D-PSGD: the same minibatches, one gossip round per step.
  gradsync::gossip::gossip_options o;
  o.global_every = cfg.global_every;
  x = zero;
  result at_steps, at_time;
  for (int k = 0; k < std::max(cfg.steps, steps_equal_time); ++k) {
    minibatch_grad(s, cfg, r, k, x, grad);
    for (std::size_t j = 0; j < x.size(); ++j) x[j] -= cfg.lr * grad[j];
    gradsync::gossip::neighbor_allreduce(c, std::span<double>(x), g, static_cast<std::uint64_t>(k), o);
    if (k + 1 == cfg.steps || k + 1 == steps_equal_time) {
      const auto [l, cd] = evaluate(c, s, x);
      const double ms = (k + 1) * step_gossip * 1e3;
      if (k + 1 == cfg.steps) at_steps = {k + 1, ms, l - fstar, cd};
      if (k + 1 == steps_equal_time) at_time = {k + 1, ms, l - fstar, cd};
    }
  }
  int status = identical ? 0 : 1;
  for (const result& res : {ar, at_steps, at_time})
    if (!(res.loss < f0 / 10)) status = 1;
  if (r == 0) {
    std::printf("# decentralized_sgd: %d ranks, dim %d, %d rows per rank, batch %d, lr %g, hetero %g, seed %llu\n", p,
                cfg.dim, cfg.rows, cfg.batch, cfg.lr, cfg.hetero, static_cast<unsigned long long>(cfg.seed));
    std::printf("# simulated step = %.0f us compute + alpha %.0f us, %.0f Gbit/s: allreduce %.1f us, gossip round "
                "(%s, slem %.3f) %.1f us\n",
                cfg.compute_us, cfg.alpha_us, cfg.gbps, (step_ar * 1e6 - cfg.compute_us), g.name().c_str(),
                gradsync::gossip::slem(g), (step_gossip * 1e6 - cfg.compute_us));
    std::printf("# loss = f(average model) - f*, f* = %.6f; start %.4f\n", fstar, f0);
    std::printf("%-32s %7s %10s %12s %12s\n", "method", "steps", "sim_ms", "excess_loss", "consensus");
    const auto line = [](const char* what, const result& res) {
      std::printf("%-32s %7d %10.2f %12.4e %12.4e\n", what, res.steps, res.sim_ms, res.loss, res.consensus);
    };
    line("allreduce SGD", ar);
    const std::string name = "D-PSGD " + cfg.topology;
    line((name + " (equal steps)").c_str(), at_steps);
    line((name + " (equal sim. time)").c_str(), at_time);
    if (!identical) std::printf("# FAILED: allreduce SGD's ranks hold different models\n");
    if (status) std::printf("# FAILED: a run did not reduce the excess loss below a tenth of its start\n");
  }
  return status;
}

} // namespace

int main(int argc, char** argv) {
  config cfg;
  CLI::App app{"D-PSGD (gossip) against allreduce SGD on a synthetic least-squares problem", "decentralized_sgd"};
  app.add_option("--ranks", cfg.ranks, "ranks (threads of this process)")->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("--dim", cfg.dim, "model dimension")->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--rows", cfg.rows, "rows of data per rank")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--batch", cfg.batch, "minibatch rows per rank and step")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--steps", cfg.steps, "steps of allreduce SGD (and of D-PSGD at equal steps)")->capture_default_str()->check(CLI::Range(1, 1 << 24));
  app.add_option("--lr", cfg.lr, "learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--hetero", cfg.hetero, "spread of the ranks' local optima")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--seed", cfg.seed, "seed of the data and the minibatches")->capture_default_str();
  app.add_option("--topology", cfg.topology, gradsync::gossip::topology_help)->capture_default_str();
  app.add_option("--global-every", cfg.global_every, "D-PSGD: exact global average every H steps (0: never)")->capture_default_str();
  app.add_option("--compute-us", cfg.compute_us, "simulated compute per step, microseconds")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--alpha-us", cfg.alpha_us, "simulated latency per message, microseconds")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--gbps", cfg.gbps, "simulated link bandwidth, Gbit/s")->capture_default_str()->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    gradsync::gossip::named(cfg.topology, cfg.ranks); // a bad name fails before any rank starts
    int status = 0;
    gradsync::inproc::run(cfg.ranks, [&](gradsync::inproc::communicator& comm) {
      const int rc = run_rank(comm, cfg);
      if (comm.rank() == 0) status = rc;
    });
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decentralized_sgd: %s\n", e.what());
    return 1;
  }
}
