// gradsync: compressed gossip, CHOCO-Gossip (Koloskova, Stich and Jaggi,
// 2019). Each rank keeps a public copy x-hat of its vector, which its
// neighbours track exactly; a round sends only the codec's encoding q of
// the change x - x-hat, every rank adds the decoded q's into the copies, and
// x moves a step gamma toward the neighbours' copies:
//   q_i = Q(x_i - xhat_i);  xhat_j += q_j for i and its neighbours j;
//   x_i += gamma * (sum_j W[i][j] xhat_j - xhat_i).
// Rank i stores only xhat_i and s_i = sum_j W[i][j] xhat_j (updated by the
// weighted q's), so memory is two vectors whatever the degree. With a
// doubly stochastic W the average of x over ranks never changes (to
// rounding); for consensus gamma must be small enough for the codec's error
// (int8: 0.5 works; top-k at density d: about d). Any codec of
// compress/spec.hpp serves; sparse codecs' payloads vary in size and arrive
// through receives of up to a capacity (upto_receiver).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../collectives.hpp"
#include "../compress/spec.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../transport/capabilities.hpp"
#include "exchange.hpp"
#include "options.hpp"
#include "topology.hpp"

namespace gradsync::gossip {

/// What a CHOCO round compresses with and how far it moves.
struct choco_config {
  compress::spec codec = compress::parse_spec("int8");
  /// Consensus step size gamma in (0, 1].
  double gamma = 0.5;
  /// Seed of stochastic codecs (combined with the rank and the round).
  std::uint64_t seed = compress::default_seed;
};

/// Per-vector CHOCO state, kept by the caller across rounds: the public copy
/// xhat_i, s_i = sum_j W[i][j] xhat_j, the round counter and scratch. Starts
/// empty (xhat = s = 0 on the first round); every rank must reset together.
template <compress::float_element T> struct choco_state {
  std::vector<accum_t<T>> x_hat, s;
  std::uint64_t step = 0;
  std::vector<T> diff;
  std::vector<accum_t<T>> q;
  std::vector<std::byte> payload, workspace, received;
  void reset() {
    x_hat.clear();
    s.clear();
    step = 0;
  }
};

/// One CHOCO-Gossip round in place on `x` (see the file comment). `g` must
/// be static, symmetric and doubly stochastic (validated on every rank before
/// any message moves); `z.codec` any codec name; every rank passes the same
/// graph, config and count and its own state. With o.global_every, some
/// rounds are an exact allreduce average instead (x-hat is kept, so the
/// compressed rounds continue from it). Host memory.
template <transport C, compress::float_element T>
round_report choco_gossip(C& c, std::span<T> x, const graph& g, choco_state<T>& st, const choco_config& z,
                          const gossip_options& o = {}) {
  static_assert(upto_receiver<C>, "choco_gossip needs a transport with irecv_upto (every built-in one)");
  using A = accum_t<T>;
  const char* name = "choco_gossip";
  const int r = c.rank();
  const scoped_timeout guard(c, o.collective.timeout);
  validate(g, c.size(), property::doubly_stochastic | property::symmetric | property::static_graph, name, r);
  gradsync::detail::check_span(x, name, r, "data");
  GRADSYNC_REQUIRE(std::isfinite(z.gamma) && z.gamma > 0 && z.gamma <= 1, name, r,
                   "gamma " + std::to_string(z.gamma) + " is outside (0, 1]");
  const std::size_t n = x.size();
  if (st.x_hat.size() != n || st.s.size() != n) {
    st.x_hat.assign(n, A(0));
    st.s.assign(n, A(0));
  }
  const std::uint64_t round = st.step++;
  round_report rep;
  compress::with_codec<T>(z.codec, n, [&](const auto& k, auto state) {
    if (o.global_step(round)) { // after the spec is checked, so a bad codec fails on every round
      allreduce(c, x, op::avg{}, o.dense());
      rep.global = true;
      return;
    }
    if constexpr (requires { state.seed; }) state.seed = z.seed;
    if constexpr (requires { state.step; }) state.step = round;
    if constexpr (requires { state.rank; }) state.rank = static_cast<std::uint32_t>(r);
    const mixing& m = g.at(0);
    const auto in = m.in(r);
    const std::size_t cap = (k.max_encoded_bytes(n) + 15) / 16 * 16;
    st.diff.resize(n);
    st.q.resize(n);
    st.payload.resize(cap);
    st.workspace.resize(k.workspace_bytes(n));
    st.received.resize(cap * in.size());
    for (std::size_t i = 0; i < n; ++i) st.diff[i] = narrow<T>(widen(x[i]) - st.x_hat[i]);
    const std::size_t bytes = k.encode(std::span<const T>(st.diff), state, st.workspace, st.payload);
    const lane l{std::span<const std::byte>(st.payload.data(), bytes), st.received.data(), cap, o.collective.tag, true};
    received_sizes sizes;
    std::uint64_t extra = compress::spec_hash(gradsync::detail::fnv_basis, z.codec);
    extra = gradsync::detail::fnv1a(gradsync::detail::fnv1a(extra, z.gamma), z.seed);
    gradsync::detail::run_call(c, name, detail::round_fingerprint<T>(call_kind::choco_gossip, n, m, round, extra),
                               n * sizeof(T), o.collective,
                               [&] { rep.bytes_sent = exchange(c, m, std::span<const lane>(&l, 1), &sizes); });
    // Own q: the copy every neighbour decodes from the same payload.
    const auto accumulate = [&](std::span<const std::byte> p, double w, bool own) {
      std::fill(st.q.begin(), st.q.end(), A(0));
      k.decode_accumulate(p, std::span<A>(st.q));
      const A wa = static_cast<A>(w);
      for (std::size_t i = 0; i < n; ++i) {
        if (own) st.x_hat[i] += st.q[i];
        st.s[i] += wa * st.q[i];
      }
    };
    accumulate(std::span<const std::byte>(st.payload.data(), bytes), m.self(r), true);
    for (std::size_t j = 0; j < in.size(); ++j)
      accumulate(std::span<const std::byte>(st.received.data() + j * cap, sizes[0][j]), in[j].weight, false);
    const A gamma = static_cast<A>(z.gamma);
    for (std::size_t i = 0; i < n; ++i) x[i] = narrow<T>(widen(x[i]) + gamma * (st.s[i] - st.x_hat[i]));
  });
  return rep;
}

} // namespace gradsync::gossip
