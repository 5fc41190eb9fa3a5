// Encoded exchanges (exchange_codec.hpp) over inproc ranks: for every codec
// that can encode an exchange, every block that arrives equals the codec's
// own decode(encode(block)) of what its sender held (rebuilt by the
// receiver, which knows every rank's input), bit for bit, forwards and
// backwards, alltoallv and graph plans, ranks 1..7, skewed and zero counts;
// fp16 exact on values it represents; the bytes counted; the failures:
// codecs that cannot encode an exchange, ranks that disagree on the codec,
// a workspace too small.
#include <doctest/doctest.h>

#include <gradsync/exchange_codec.hpp>
#include <gradsync/transport/inproc.hpp>

#include "all_fail.hpp"

#include <chrono>
#include <cmath>
#include <functional>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace gradsync;
using namespace std::chrono_literals;
using inproc::communicator;

// Element i of the item block rank s sends rank d (width w per item): a
// spread of magnitudes, signs and one exact zero per block.
double value_of(int s, int d, std::size_t i) {
  if (i == 3) return 0.0;
  const double x = std::sin(0.7 * s + 1.3 * d + 0.11 * static_cast<double>(i));
  return x * std::pow(10.0, static_cast<double>((s + d + static_cast<int>(i)) % 5) - 2.0);
}

// Items rank s sends rank d: skewed, some zero.
std::size_t items(int s, int d, int p) { return static_cast<std::size_t>((3 * s + 5 * d) % (p + 2)); }

// What the receiver must see for a block: decode(encode(block)) by the codec itself.
template <class T> std::vector<T> roundtrip(const compress::spec& s, const std::vector<T>& block) {
  std::vector<T> back(block.size());
  detail::with_exchange_codec<T>(s, "test", -1, [&](const auto& k) {
    typename std::decay_t<decltype(k)>::state st{};
    std::vector<std::byte> wire(k.max_encoded_bytes(block.size()));
    const std::size_t n = k.encode(std::span<const T>(block), st, {}, wire);
    k.decode(std::span<const std::byte>(wire).first(n), std::span<T>(back));
  });
  return back;
}

template <class T> std::vector<T> block_of(int s, int d, std::size_t n) {
  std::vector<T> b(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double v = value_of(s, d, i);
    if constexpr (std::is_same_v<T, double>) b[i] = v;
    else b[i] = static_cast<T>(static_cast<float>(v));
  }
  return b;
}

// Runs an alltoallv plan (graph: a directed ring r -> r+1, r -> r+2)
// forwards and backwards with `codec`; "" when every element matched.
template <class T>
std::string check_plan(int p, const std::string& codec, bool graph, std::size_t width, int hier_group = 0) {
  const compress::spec s = compress::parse_spec(codec);
  std::vector<std::string> errs(static_cast<std::size_t>(p));
  inproc::run(p, [&](communicator& c) {
    c.group().set_timeout(30s);
    const int r = c.rank();
    std::string& e = errs[static_cast<std::size_t>(r)];
    std::vector<int> to, from;
    if (graph) {
      for (const int k : {1, 2}) {
        to.push_back((r + k) % p);
        from.push_back((r - k + p) % p);
      }
    } else {
      for (int q = 0; q < p; ++q) to.push_back(q), from.push_back(q);
    }
    std::vector<std::size_t> sc, rc;
    for (const int q : to) sc.push_back(items(r, q, p));
    for (const int q : from) rc.push_back(items(q, r, p));
    options o; // hier_group > 0: the plan runs the two-level schedule over groups of that size
    if (hier_group > 0) o.algo = algorithm::hier, o.group_size = hier_group;
    const exchange_plan plan = graph ? exchange_plan(c, neighbors{from, to}, sc, rc) : exchange_plan(c, sc, rc, o);
    // Forwards: the blocks for `to` packed; backwards: the same blocks sent back.
    for (const bool back : {false, true}) {
      const auto& dst = back ? from : to;
      const auto& src = back ? to : from;
      std::vector<T> in, out;
      std::size_t raw = 0;
      for (std::size_t j = 0; j < dst.size(); ++j) {
        const std::size_t n = (back ? rc[j] : sc[j]) * width;
        const auto b = block_of<T>(r, dst[j], n);
        in.insert(in.end(), b.begin(), b.end());
        raw += n * sizeof(T);
      }
      std::size_t want_out = 0;
      for (std::size_t j = 0; j < src.size(); ++j) want_out += (back ? sc[j] : rc[j]) * width;
      out.assign(want_out + 1, static_cast<T>(-7.0));
      std::vector<std::byte> ws(encoded_workspace_bytes<T>(plan, width, s));
      const encoded_run got = run_encoded<T>(plan, c, in, std::span<T>(out), width, s, back, ws);
      if (got.raw_bytes != raw) e = "raw bytes " + std::to_string(got.raw_bytes) + " != " + std::to_string(raw);
      std::size_t at = 0;
      for (std::size_t j = 0; j < src.size() && e.empty(); ++j) {
        const std::size_t n = (back ? sc[j] : rc[j]) * width;
        const auto want = roundtrip<T>(s, block_of<T>(src[j], r, n));
        for (std::size_t i = 0; i < n; ++i)
          if (std::memcmp(&out[at + i], &want[i], sizeof(T)) != 0) {
            e = std::string(back ? "back" : "fwd") + ": element " + std::to_string(i) + " from rank " +
                std::to_string(src[j]) + " differs from decode(encode(block))";
            break;
          }
        at += n;
      }
      if (e.empty() && !(out[want_out] == static_cast<T>(-7.0))) e = "wrote past the output";
    }
  });
  for (std::size_t r = 0; r < errs.size(); ++r)
    if (!errs[r].empty()) return "rank " + std::to_string(r) + ": " + errs[r];
  return {};
}

} // namespace

TEST_CASE("encoded exchange: every block is the codec's decode(encode(block)), ranks 1..7, both directions") {
  for (const char* codec : {"fp16", "bf16", "int8", "int8:block=7", "int4", "int4:block=16", "sign"})
    for (const int p : {1, 2, 3, 4, 7})
      for (const bool graph : {false, true}) {
        CHECK_MESSAGE(check_plan<double>(p, codec, graph, 5).empty(),
                      codec << " p=" << p << " graph=" << graph << ": " << check_plan<double>(p, codec, graph, 5));
        CHECK_MESSAGE(check_plan<float>(p, codec, graph, 1).empty(), codec << " p=" << p << " graph=" << graph);
      }
  CHECK(check_plan<half>(3, "int8", false, 4).empty());
  // a hier plan: the encoded sizes are not the plan's counts, so each run exchanges the group's first
  for (const int p : {1, 3, 4, 7})
    for (const int g : {1, 2, 3}) CHECK_MESSAGE(check_plan<float>(p, "int8", false, 3, g).empty(), "hier p=" << p << " g=" << g);
  CHECK(check_plan<bfloat16>(3, "fp16", true, 2).empty());
}

TEST_CASE("encoded alltoall and alltoallv: decode(encode(block)) from every rank, ranks 1..7, every schedule") {
  for (const char* codec : {"fp16", "bf16", "int8", "int4:block=16", "sign"})
    for (const int p : {1, 2, 3, 4, 7})
      for (const algorithm a : {algorithm::automatic, algorithm::pairwise, algorithm::scattered, algorithm::hier}) {
        const compress::spec s = compress::parse_spec(codec);
        std::vector<std::string> errs(static_cast<std::size_t>(p));
        inproc::run(p, [&](communicator& c) {
          const int r = c.rank();
          std::string& e = errs[static_cast<std::size_t>(r)];
          std::vector<std::size_t> sc(static_cast<std::size_t>(p)), rc(sc.size());
          std::vector<float> in;
          for (int q = 0; q < p; ++q) {
            sc[static_cast<std::size_t>(q)] = items(r, q, p) * 3;
            rc[static_cast<std::size_t>(q)] = items(q, r, p) * 3;
            const auto b = block_of<float>(r, q, sc[static_cast<std::size_t>(q)]);
            in.insert(in.end(), b.begin(), b.end());
          }
          std::size_t total = 0;
          for (const std::size_t n : rc) total += n;
          std::vector<float> out(total, -7.0f);
          options o;
          o.algo = a;
          o.group_size = 2; // hier's groups
          alltoallv_encoded<float>(c, in, sc, std::span<float>(out), rc, s, o);
          std::size_t at = 0;
          for (int q = 0; q < p && e.empty(); ++q) {
            const auto want = roundtrip<float>(s, block_of<float>(q, r, rc[static_cast<std::size_t>(q)]));
            if (std::memcmp(out.data() + at, want.data(), want.size() * sizeof(float)) != 0)
              e = "alltoallv: the block from rank " + std::to_string(q) + " differs from decode(encode(block))";
            at += want.size();
          }
          // Equal blocks of 11 elements.
          std::vector<float> ein, eout(static_cast<std::size_t>(p) * 11, -7.0f);
          for (int q = 0; q < p; ++q) {
            const auto b = block_of<float>(r, q, 11);
            ein.insert(ein.end(), b.begin(), b.end());
          }
          const encoded_run got = alltoall_encoded<float>(c, ein, std::span<float>(eout), s, o);
          if (got.raw_bytes != ein.size() * sizeof(float)) e = "alltoall: raw bytes " + std::to_string(got.raw_bytes);
          for (int q = 0; q < p && e.empty(); ++q)
            if (std::memcmp(eout.data() + static_cast<std::size_t>(q) * 11, roundtrip<float>(s, block_of<float>(q, r, 11)).data(),
                            11 * sizeof(float)) != 0)
              e = "alltoall: the block from rank " + std::to_string(q) + " differs from decode(encode(block))";
        });
        for (std::size_t r = 0; r < errs.size(); ++r)
          CHECK_MESSAGE(errs[r].empty(), codec << " p=" << p << " " << algorithm_name(a) << " rank " << r << ": " << errs[r]);
      }
  // Ranks that disagree on the codec fail together here too.
  test::expect_all_fail(3, errc::mismatch, "ranks disagree on the call", [](communicator& c) {
    std::vector<float> in(3 * 8, 0.25f), out(in.size());
    alltoall_encoded<float>(c, in, std::span<float>(out), compress::parse_spec(c.rank() == 2 ? "bf16" : "fp16"));
  });
}

TEST_CASE("encoded exchange: fp16 is exact on values it represents; int8 shrinks the wire ~4x for doubles") {
  inproc::run(3, [](communicator& c) {
    const int r = c.rank(); // values k / 8 with k < 2048: exact in fp16
    const std::vector<std::size_t> counts(3, 100);
    const exchange_plan plan(c, counts, counts);
    std::vector<double> in(300), out(300);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<double>((r + 1) * 100 + static_cast<int>(i)) / 8.0;
    const encoded_run h = run_encoded<double>(plan, c, in, std::span<double>(out), 1, compress::parse_spec("fp16"));
    for (int q = 0; q < 3; ++q)
      for (std::size_t i = 0; i < 100; ++i)
        REQUIRE(out[static_cast<std::size_t>(q) * 100 + i] ==
                static_cast<double>((q + 1) * 100 + static_cast<int>(static_cast<std::size_t>(r) * 100 + i)) / 8.0);
    CHECK(h.raw_bytes == 2400);
    CHECK(h.sent_bytes < h.raw_bytes / 3); // 2 of 8 bytes per element plus a header per block
    const encoded_run q = run_encoded<double>(plan, c, in, std::span<double>(out), 1, compress::parse_spec("int8"));
    CHECK(q.sent_bytes < h.sent_bytes);
    CHECK(q.sent_bytes > h.raw_bytes / 8);
  });
}

TEST_CASE("encoded exchange: codecs that cannot encode an exchange, disagreeing ranks, a short workspace") {
  const auto fails = test::expect_all_fail;
  auto run_with = [](communicator& c, const std::string& codec, std::size_t ws_bytes = 0) {
    const std::vector<std::size_t> counts(static_cast<std::size_t>(c.size()), 64);
    const exchange_plan plan(c, counts, counts);
    std::vector<float> in(64 * counts.size(), 0.5f), out(in.size());
    std::vector<std::byte> ws(ws_bytes);
    run_encoded<float>(plan, c, in, std::span<float>(out), 1, compress::parse_spec(codec), false, ws);
  };
  for (const char* codec : {"topk:density=0.1", "randk", "powersgd", "threshold"})
    fails(2, errc::invalid_argument, "payload size depends on the data", [&](communicator& c) { run_with(c, codec); });
  for (const char* codec : {"qsgd", "terngrad"})
    fails(2, errc::invalid_argument, "stochastic", [&](communicator& c) { run_with(c, codec); });
  // Ranks that disagree on the codec or its parameters: every rank fails alike.
  for (const auto& ab : {std::pair{"int8", "fp16"}, std::pair{"int8:block=256", "int8:block=128"},
                         std::pair{"int4", "int8"}})
    for (const int p : {2, 3})
      fails(p, errc::mismatch, "ranks disagree on the call",
            [&](communicator& c) { run_with(c, c.rank() == p - 1 ? ab.second : ab.first); });
  fails(2, errc::invalid_argument, "workspace holds 10 bytes", [&](communicator& c) { run_with(c, "int8", 10); });
}
