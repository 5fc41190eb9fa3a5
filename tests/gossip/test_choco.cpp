// CHOCO-Gossip: int8 and top-k reach consensus on static symmetric graphs
// and keep the average; the rounds match a serial replay of the published
// recursion (with the codec's own encode/decode) bit for bit; bad graphs,
// step sizes and codecs are rejected on every rank.
#include "reference.hpp"

#include <gradsync/gossip/choco.hpp>
#include <gradsync/transport/inproc.hpp>

#include <cstring>
#include <mutex>

using namespace gradsync;
using namespace gradsync::gossip;
namespace ref = gradsync::test::gossip_ref;

namespace {

float start(int r, std::size_t i) { return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * r) * (1 + r % 3)); }

// R CHOCO rounds on p ranks; x per rank afterwards (and the bytes rank 0 sent).
std::vector<std::vector<float>> run_choco(int p, const graph& g, std::size_t n, int rounds, const choco_config& z,
                                          std::size_t* sent0 = nullptr, const gossip_options& o = {}) {
  std::vector<std::vector<float>> x(static_cast<std::size_t>(p), std::vector<float>(n));
  inproc::run(p, [&](inproc::communicator& c) {
    c.group().set_timeout(std::chrono::seconds(60));
    auto& v = x[static_cast<std::size_t>(c.rank())];
    for (std::size_t i = 0; i < n; ++i) v[i] = start(c.rank(), i);
    choco_state<float> st;
    std::size_t sent = 0;
    for (int k = 0; k < rounds; ++k) sent += choco_gossip(c, std::span<float>(v), g, st, z, o).bytes_sent;
    if (sent0 && c.rank() == 0) *sent0 = sent;
  });
  return x;
}

std::vector<std::vector<long double>> widen_all(const std::vector<std::vector<float>>& x) {
  std::vector<std::vector<long double>> l(x.size());
  for (std::size_t r = 0; r < x.size(); ++r) l[r].assign(x[r].begin(), x[r].end());
  return l;
}

// Consensus distance relative to the start's, and the largest drift of the average.
std::pair<double, double> measure(int p, std::size_t n, const std::vector<std::vector<float>>& x) {
  std::vector<std::vector<float>> x0(static_cast<std::size_t>(p), std::vector<float>(n));
  for (int r = 0; r < p; ++r)
    for (std::size_t i = 0; i < n; ++i) x0[static_cast<std::size_t>(r)][i] = start(r, i);
  std::vector<long double> m0, m1;
  const long double d0 = ref::consensus_distance(widen_all(x0), &m0), d1 = ref::consensus_distance(widen_all(x), &m1);
  double drift = 0;
  for (std::size_t i = 0; i < n; ++i) drift = std::max(drift, static_cast<double>(std::abs(m1[i] - m0[i])));
  return {static_cast<double>(d1 / d0), drift};
}

// The average may drift by the rounding of each round's float update
// (|x| <= 3, half an ulp per element per round); a codec error that did not
// cancel would move it by the quantisation error, orders of magnitude more.
double drift_bound(int rounds) { return rounds * 3 * 0.6e-7 * 2; }

} // namespace

TEST_CASE("choco: int8 reaches consensus and keeps the average") {
  for (int p : {2, 3, 4, 8, 16})
    for (const graph& g : {ring(p), ring(p, weighting::metropolis_hastings), full(p), star(p)}) {
      INFO("p=" << p << " topology=" << g.name());
      choco_config z;
      z.codec = compress::parse_spec("int8");
      z.gamma = 0.5;
      const std::size_t n = 1000;
      const double lambda = slem(g);
      // Exact gossip would need ~log(1e-4)/log(lambda) rounds; give CHOCO 3x that.
      const int rounds = static_cast<int>(3 * std::ceil(std::log(1e-4) / std::log(std::max(lambda, 0.2)))) + 20;
      std::size_t sent = 0;
      const auto x = run_choco(p, g, n, rounds, z, &sent);
      const auto measured = measure(p, n, x);
      const double dist = measured.first, drift = measured.second;
      CHECK(dist < 1e-3);
      CHECK(drift < drift_bound(rounds));
      // int8 at block 256: n bytes + a 4-byte scale per block + the header, a quarter of the floats.
      CHECK(sent < static_cast<std::size_t>(rounds) * g.at(0).out(0).size() * (n + 64));
    }
}

TEST_CASE("choco: top-k reaches consensus with a small step") {
  for (int p : {4, 8}) {
    const graph g = ring(p);
    choco_config z;
    z.codec = compress::parse_spec("topk:density=0.1");
    z.gamma = 0.1;
    const std::size_t n = 500;
    const auto x = run_choco(p, g, n, 1500, z);
    const auto measured = measure(p, n, x);
    const double dist = measured.first, drift = measured.second;
    INFO("p=" << p << " distance " << dist << " drift " << drift);
    CHECK(dist < 1e-3);
    CHECK(drift < drift_bound(1500));
  }
}

TEST_CASE("choco: bitwise equal to a serial replay of the recursion") {
  const int p = 5;
  const graph g = ring(p, weighting::metropolis_hastings);
  const std::size_t n = 300;
  for (const char* codec : {"int8:block=64", "topk:density=0.05", "qsgd:levels=15", "fp16"}) {
    INFO("codec " << codec);
    choco_config z;
    z.codec = compress::parse_spec(codec);
    z.gamma = 0.3;
    const int rounds = 7;
    const auto got = run_choco(p, g, n, rounds, z);
    // Serial: every rank's x, xhat and s; each round encodes x - xhat per rank
    // with that rank's stream, and all ranks update from the same payloads.
    std::vector<std::vector<float>> x(static_cast<std::size_t>(p), std::vector<float>(n));
    std::vector<std::vector<float>> xh(static_cast<std::size_t>(p), std::vector<float>(n, 0)), s = xh;
    for (int r = 0; r < p; ++r)
      for (std::size_t i = 0; i < n; ++i) x[static_cast<std::size_t>(r)][i] = start(r, i);
    const auto w = ref::matrix_of(g, 0);
    compress::with_codec<float>(z.codec, n, [&](const auto& k, auto state0) {
      for (int round = 0; round < rounds; ++round) {
        std::vector<std::vector<float>> q(static_cast<std::size_t>(p));
        for (int r = 0; r < p; ++r) {
          auto state = state0;
          if constexpr (requires { state.rank; }) {
            state.seed = z.seed;
            state.step = static_cast<std::uint64_t>(round);
            state.rank = static_cast<std::uint32_t>(r);
          }
          std::vector<float> d(n);
          for (std::size_t i = 0; i < n; ++i) d[i] = x[static_cast<std::size_t>(r)][i] - xh[static_cast<std::size_t>(r)][i];
          const auto payload = compress::encode_to_vector(k, std::span<const float>(d), state);
          q[static_cast<std::size_t>(r)].assign(n, 0.0f);
          k.decode_accumulate(std::span<const std::byte>(payload), std::span<float>(q[static_cast<std::size_t>(r)]));
        }
        for (int i = 0; i < p; ++i) {
          const auto ui = static_cast<std::size_t>(i);
          // s_i += W_ii q_i first, then the neighbours in row order (ring: i-1, i+1 ascending).
          const auto add = [&](std::size_t j) {
            for (std::size_t e = 0; e < n; ++e) s[ui][e] += static_cast<float>(static_cast<double>(w[ui][j])) * q[j][e];
          };
          add(ui);
          for (const auto& nb : g.at(0).in(i)) add(static_cast<std::size_t>(nb.peer));
          for (std::size_t e = 0; e < n; ++e) xh[ui][e] += q[ui][e];
        }
        for (int i = 0; i < p; ++i)
          for (std::size_t e = 0; e < n; ++e) {
            const auto ui = static_cast<std::size_t>(i);
            x[ui][e] = x[ui][e] + static_cast<float>(z.gamma) * (s[ui][e] - xh[ui][e]);
          }
      }
    });
    for (int r = 0; r < p; ++r)
      CHECK(std::memcmp(got[static_cast<std::size_t>(r)].data(), x[static_cast<std::size_t>(r)].data(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("choco: periodic global averaging") {
  const int p = 4;
  choco_config z;
  gossip_options o;
  o.global_every = 5;
  const auto x = run_choco(p, ring(p), 64, 5, z, nullptr, o);
  for (int r = 1; r < p; ++r) CHECK(std::memcmp(x[static_cast<std::size_t>(r)].data(), x[0].data(), 64 * sizeof(float)) == 0);
  const auto measured = measure(p, 64, x);
  const double dist = measured.first, drift = measured.second;
  CHECK(dist == 0);
  CHECK(drift < drift_bound(5));
}

TEST_CASE("choco: bad graphs, steps and codecs are rejected on every rank") {
  const int p = 4;
  struct bad {
    graph g;
    double gamma;
    const char* codec;
    const char* says;
  };
  const std::vector<bad> cases = {{exponential(p), 0.5, "int8", "symmetric"},
                                  {one_peer_exponential(p), 0.5, "int8", "changes every step"},
                                  {star(p, weighting::uniform), 0.5, "int8", "row 0: W[0][1]"},
                                  {ring(p), 0.0, "int8", "gamma 0"},
                                  {ring(p), 1.5, "int8", "outside (0, 1]"},
                                  {ring(p), 0.5, "int9", "unknown codec"}};
  for (const auto& k : cases) {
    std::mutex mu;
    int caught = 0;
    inproc::run(p, [&](inproc::communicator& c) {
      c.group().set_timeout(std::chrono::seconds(10));
      std::vector<float> x(8, 1.0f);
      choco_state<float> st;
      choco_config z;
      z.gamma = k.gamma;
      z.codec = compress::parse_spec(k.codec);
      try {
        choco_gossip(c, std::span<float>(x), k.g, st, z);
      } catch (const error& e) {
        if (std::string(e.what()).find(k.says) != std::string::npos) {
          std::lock_guard lk(mu);
          ++caught;
        }
      }
      barrier(c);
    });
    INFO("expected '" << std::string(k.says) << "'");
    CHECK(caught == p);
  }
}
