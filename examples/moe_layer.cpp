// gradsync example: a mixture-of-experts layer trained with expert
// parallelism. Every rank owns `experts_per_rank` experts (a two-layer MLP
// each) and a batch of tokens; a gate replicated on every rank sends each
// token to its top-k experts:
//
//   gate (local)       logits = Wg x, p = softmax(logits), top-k experts
//   dispatch           alltoallv_dynamic of the experts' ids (this rank
//                      learns how many items each rank routes here), then an
//                      exchange_plan from those counts moves the token rows
//   experts            o = W2 relu(W1 x) for every item received
//   combine            plan.run_back: each output returns to its token
//   loss               y = sum_j p_j o_j against a fixed linear target
//   backward           plan.run sends d o_j = p_j dy to the experts, which
//                      accumulate their own weight gradients; the gate's
//                      gradient is allreduced (it is replicated)
//
// Rank 0 also trains the same layer in one process (every expert, every
// token, from the same seeds) and the run fails unless both give the same
// loss at every step (within 1e-9 relative: the gate's gradient is summed in
// another order across ranks) and the loss has fallen to below half.
//
//   moe_layer [--ranks 4] [--steps 100] [--transport inproc|mpi]
//   mpiexec -n 2 moe_layer --transport mpi
#include <gradsync/alltoall.hpp>
#include "reference_run.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace {

constexpr int dim = 8, hidden = 16, tokens_per_rank = 32, top_k = 2, experts_per_rank = 2;
double lr = 2.0; // --lr

// Deterministic values in [-1, 1) from a key (splitmix64): every rank and
// the reference draw the same numbers.
double draw(std::uint64_t key) {
  std::uint64_t z = key + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) / static_cast<double>(1ULL << 52) - 1.0;
}

struct expert {
  std::vector<double> w1 = std::vector<double>(hidden * dim), w2 = std::vector<double>(dim * hidden);
  std::vector<double> g1 = std::vector<double>(hidden * dim), g2 = std::vector<double>(dim * hidden);
  explicit expert(int e) {
    for (int i = 0; i < hidden * dim; ++i) w1[i] = 0.5 * draw(1000003ULL * e + i);
    for (int i = 0; i < dim * hidden; ++i) w2[i] = 0.5 * draw(2000003ULL * e + i);
  }
  // o = W2 relu(W1 x); h kept for the backward pass.
  void forward(const double* x, double* h, double* o) const {
    for (int j = 0; j < hidden; ++j) {
      double s = 0;
      for (int i = 0; i < dim; ++i) s += w1[j * dim + i] * x[i];
      h[j] = s > 0 ? s : 0;
    }
    for (int i = 0; i < dim; ++i) {
      double s = 0;
      for (int j = 0; j < hidden; ++j) s += w2[i * hidden + j] * h[j];
      o[i] = s;
    }
  }
  void backward(const double* x, const double* h, const double* d_o) {
    double dh[hidden];
    for (int j = 0; j < hidden; ++j) {
      double s = 0;
      for (int i = 0; i < dim; ++i) {
        g2[i * hidden + j] += d_o[i] * h[j];
        s += w2[i * hidden + j] * d_o[i];
      }
      dh[j] = h[j] > 0 ? s : 0;
    }
    for (int j = 0; j < hidden; ++j)
      for (int i = 0; i < dim; ++i) g1[j * dim + i] += dh[j] * x[i];
  }
  void step() {
    for (int i = 0; i < hidden * dim; ++i) w1[i] -= lr * g1[i], g1[i] = 0;
    for (int i = 0; i < dim * hidden; ++i) w2[i] -= lr * g2[i], g2[i] = 0;
  }
};

// Token g's input and target (y = A x, A fixed) at step s.
void token(int s, std::int64_t g, double* x, double* y) {
  for (int i = 0; i < dim; ++i) x[i] = draw(7000003ULL * static_cast<std::uint64_t>(s) + 10007ULL * g + i);
  for (int i = 0; i < dim; ++i) {
    double v = 0;
    for (int j = 0; j < dim; ++j) v += 0.3 * draw(9000001ULL + i * dim + j) * x[j];
    y[i] = v;
  }
}

struct gate {
  int experts;
  std::vector<double> w, g;
  explicit gate(int e) : experts(e), w(e * dim), g(e * dim) {
    for (int i = 0; i < e * dim; ++i) w[i] = 0.3 * draw(5000011ULL + i);
  }
  // Softmax probabilities and the top-k experts (ties: the lower index).
  void route(const double* x, std::vector<double>& p, int* chosen) const {
    p.assign(experts, 0);
    double m = -1e300;
    for (int e = 0; e < experts; ++e) {
      double s = 0;
      for (int i = 0; i < dim; ++i) s += w[e * dim + i] * x[i];
      p[e] = s;
      m = std::max(m, s);
    }
    double z = 0;
    for (int e = 0; e < experts; ++e) z += (p[e] = std::exp(p[e] - m));
    for (int e = 0; e < experts; ++e) p[e] /= z;
    for (int j = 0; j < top_k; ++j) {
      int best = -1;
      for (int e = 0; e < experts; ++e)
        if ((j == 0 || e != chosen[0]) && (best < 0 || p[e] > p[best])) best = e;
      chosen[j] = best;
    }
  }
  // dL/dp at the chosen experts -> the gate's weight gradient (softmax backward).
  void backward(const double* x, const std::vector<double>& p, const int* chosen, const double* dp) {
    double dot = 0;
    for (int j = 0; j < top_k; ++j) dot += p[chosen[j]] * dp[j];
    for (int e = 0; e < experts; ++e) {
      double d = -p[e] * dot;
      for (int j = 0; j < top_k; ++j)
        if (chosen[j] == e) d += p[e] * dp[j];
      for (int i = 0; i < dim; ++i) g[e * dim + i] += d * x[i];
    }
  }
};

// The whole layer in one process: every expert, every token in global order.
std::vector<double> reference(int ranks, int steps) {
  const int experts = ranks * experts_per_rank;
  gate gt(experts);
  std::vector<expert> ex;
  for (int e = 0; e < experts; ++e) ex.emplace_back(e);
  const std::int64_t n = static_cast<std::int64_t>(ranks) * tokens_per_rank;
  std::vector<double> losses;
  std::vector<double> x(dim), y(dim), p, h(top_k * hidden), o(top_k * dim);
  for (int s = 0; s < steps; ++s) {
    double loss = 0;
    for (std::int64_t g = 0; g < n; ++g) {
      int chosen[top_k];
      token(s, g, x.data(), y.data());
      gt.route(x.data(), p, chosen);
      double dy[dim], dp[top_k];
      for (int j = 0; j < top_k; ++j) ex[chosen[j]].forward(x.data(), &h[j * hidden], &o[j * dim]);
      for (int i = 0; i < dim; ++i) {
        double v = 0;
        for (int j = 0; j < top_k; ++j) v += p[chosen[j]] * o[j * dim + i];
        loss += 0.5 * (v - y[i]) * (v - y[i]);
        dy[i] = (v - y[i]) / static_cast<double>(n);
      }
      for (int j = 0; j < top_k; ++j) {
        double d_o[dim], dw = 0;
        for (int i = 0; i < dim; ++i) d_o[i] = p[chosen[j]] * dy[i], dw += o[j * dim + i] * dy[i];
        dp[j] = dw;
        ex[chosen[j]].backward(x.data(), &h[j * hidden], d_o);
      }
      gt.backward(x.data(), p, chosen, dp);
    }
    for (auto& e : ex) e.step();
    for (int i = 0; i < experts * dim; ++i) gt.w[i] -= lr * gt.g[i], gt.g[i] = 0;
    losses.push_back(loss / static_cast<double>(n));
  }
  return losses;
}

// The layer over `c`: this rank's experts and tokens; returns the loss per step.
template <class C> std::vector<double> train(C& c, int steps, std::uint64_t& wire_bytes) {
  const int p = c.size(), r = c.rank(), experts = p * experts_per_rank;
  const auto np = static_cast<std::size_t>(p);
  gate gt(experts);
  std::vector<expert> mine;
  for (int k = 0; k < experts_per_rank; ++k) mine.emplace_back(r * experts_per_rank + k);
  const std::int64_t n = static_cast<std::int64_t>(p) * tokens_per_rank;
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    // Gate, and the items (token, slot) per destination in (token, slot) order.
    std::vector<std::vector<double>> xs(tokens_per_rank, std::vector<double>(dim)), ys = xs, ps(tokens_per_rank);
    std::vector<std::array<int, top_k>> chosen(tokens_per_rank);
    std::vector<std::vector<std::pair<int, int>>> items(np); // (token, slot) by destination
    for (int t = 0; t < tokens_per_rank; ++t) {
      token(s, static_cast<std::int64_t>(r) * tokens_per_rank + t, xs[t].data(), ys[t].data());
      gt.route(xs[t].data(), ps[t], chosen[t].data());
      for (int j = 0; j < top_k; ++j) items[static_cast<std::size_t>(chosen[t][j] / experts_per_rank)].push_back({t, j});
    }
    std::vector<std::size_t> send_counts(np);
    std::vector<std::int32_t> ids;
    std::vector<double> rows;
    for (std::size_t q = 0; q < np; ++q) {
      send_counts[q] = items[q].size();
      for (const auto& [t, j] : items[q]) {
        ids.push_back(chosen[t][j]);
        rows.insert(rows.end(), xs[t].begin(), xs[t].end());
      }
    }
    // Dispatch: the ids with learned counts, then a plan for the rows.
    std::vector<std::size_t> recv_counts(np);
    std::vector<std::int32_t> their_ids;
    gradsync::alltoallv_dynamic(c, std::span<const std::int32_t>(ids), send_counts, their_ids,
                                std::span<std::size_t>(recv_counts));
    const gradsync::exchange_plan plan(c, send_counts, recv_counts);
    std::vector<double> in(plan.recv_items() * dim), out(plan.recv_items() * dim), hid(plan.recv_items() * hidden);
    plan.run(c, std::span<const double>(rows), std::span<double>(in), dim);
    for (std::size_t k = 0; k < plan.recv_items(); ++k)
      mine[static_cast<std::size_t>(their_ids[k] - r * experts_per_rank)].forward(&in[k * dim], &hid[k * hidden], &out[k * dim]);
    // Combine: every output back to its token, in the order it was sent.
    std::vector<double> back(plan.send_items() * dim);
    plan.run_back(c, std::span<const double>(out), std::span<double>(back), dim);
    std::vector<std::vector<double>> o(tokens_per_rank, std::vector<double>(top_k * dim));
    for (std::size_t q = 0, k = 0; q < np; ++q)
      for (const auto& [t, j] : items[q]) std::copy_n(&back[k++ * dim], dim, &o[t][j * dim]);
    double loss = 0;
    std::vector<std::vector<double>> d_o(tokens_per_rank, std::vector<double>(top_k * dim));
    for (int t = 0; t < tokens_per_rank; ++t) {
      double dy[dim], dp[top_k] = {0, 0};
      for (int i = 0; i < dim; ++i) {
        double v = 0;
        for (int j = 0; j < top_k; ++j) v += ps[t][chosen[t][j]] * o[t][j * dim + i];
        loss += 0.5 * (v - ys[t][i]) * (v - ys[t][i]);
        dy[i] = (v - ys[t][i]) / static_cast<double>(n);
      }
      for (int j = 0; j < top_k; ++j)
        for (int i = 0; i < dim; ++i) d_o[t][j * dim + i] = ps[t][chosen[t][j]] * dy[i], dp[j] += o[t][j * dim + i] * dy[i];
      gt.backward(xs[t].data(), ps[t], chosen[t].data(), dp);
    }
    // Backward: each output's gradient to its expert, which accumulates in
    // the order the reference does (sources in rank order, then token, slot).
    std::vector<double> grads, d_in(plan.recv_items() * dim);
    for (std::size_t q = 0; q < np; ++q)
      for (const auto& [t, j] : items[q]) grads.insert(grads.end(), &d_o[t][j * dim], &d_o[t][j * dim] + dim);
    plan.run(c, std::span<const double>(grads), std::span<double>(d_in), dim);
    for (std::size_t k = 0; k < plan.recv_items(); ++k)
      mine[static_cast<std::size_t>(their_ids[k] - r * experts_per_rank)].backward(&in[k * dim], &hid[k * hidden], &d_in[k * dim]);
    for (auto& e : mine) e.step();
    gradsync::allreduce(c, std::span<double>(gt.g)); // the replicated gate
    for (int i = 0; i < experts * dim; ++i) gt.w[i] -= lr * gt.g[i], gt.g[i] = 0;
    gradsync::allreduce(c, std::span<double>(&loss, 1));
    losses.push_back(loss / static_cast<double>(n));
    wire_bytes += (ids.size() - send_counts[static_cast<std::size_t>(r)]) * (sizeof(std::int32_t) + 3 * dim * sizeof(double));
  }
  return losses;
}

template <class C> int run_rank(C& c, int steps) {
  std::uint64_t mine = 0;
  const std::vector<double> got = train(c, steps, mine);
  auto wire = static_cast<std::int64_t>(mine);
  gradsync::allreduce(c, std::span<std::int64_t>(&wire, 1), gradsync::op::sum{});
  if (c.rank() != 0) return 0;
  const std::vector<double> want = reference(c.size(), steps);
  const int bad = example::steps_differing(got, want);
  std::printf("%d ranks x %d experts, %d tokens each, top-%d: %llu bytes exchanged between ranks in %d steps\n",
              c.size(), experts_per_rank, tokens_per_rank, top_k, static_cast<unsigned long long>(wire), steps);
  return example::verdict(bad, got);
}

} // namespace

int main(int argc, char** argv) {
  return example::main("moe_layer", argc, argv, lr, [](auto& c, int steps) { return run_rank(c, steps); });
}
