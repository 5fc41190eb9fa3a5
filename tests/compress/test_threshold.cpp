// Threshold sparsifier: the sent set is {i : |x_i| >= tau} (plus NaN), edge
// cases, invalid tau, accumulation, corruption and content validation.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include <gradsync/compress/threshold.hpp>

#include "corrupt.hpp"
#include "sparse_ref.hpp"

namespace cz = gradsync::compress;
using gradsync::bfloat16;
using gradsync::half;

namespace {

template <class T> std::vector<std::byte> enc(float tau, const std::vector<T>& x) {
  const cz::threshold<T> c{.tau = tau};
  cz::no_state st;
  return cz::encode_to_vector(c, std::span<const T>(x), st);
}

// Reference set by plain float comparisons.
template <class T> void check_threshold(const std::vector<T>& x, float tau) {
  std::vector<std::uint32_t> ref;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float v = static_cast<float>(x[i]);
    if (std::isnan(v) || std::fabs(v) >= tau) ref.push_back(static_cast<std::uint32_t>(i));
  }
  const auto p = enc(tau, x);
  const auto got = sparse_ref::read<T>(p, 16);
  REQUIRE(got.index == ref);
  std::uint64_t sent;
  std::memcpy(&sent, p.data() + cz::wire::header_bytes + 8, 8);
  CHECK(sent == ref.size());
  sparse_ref::check_decoded(x, ref, cz::decode_to_vector(cz::threshold<T>{.tau = tau}, p));
}

template <class T> void random_sweep(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int t = 0; t < 60; ++t) {
    const std::size_t n = rng() % 3000;
    const float tau = 0.25f * static_cast<float>(rng() % 12); // on the tie values, and between
    check_threshold(sparse_ref::tied_values<T>(rng, n), tau);
  }
}

} // namespace

TEST_CASE("threshold sends exactly the elements with |x| >= tau") {
  random_sweep<float>(1);
  random_sweep<half>(2);
  random_sweep<bfloat16>(3);
  random_sweep<double>(4);
}

TEST_CASE("threshold edge cases: tau 0, empty, single, all zeros, non-finite") {
  const std::vector<float> x = {0.0f, -0.0f, 1e-30f, -2.0f};
  check_threshold(x, 0.0f); // everything, zeros included
  CHECK(enc(0.0f, x).size() == cz::threshold<float>{}.max_encoded_bytes(4));
  check_threshold(std::vector<float>{}, 1.0f);
  check_threshold(std::vector<float>{0.5f}, 1.0f);
  check_threshold(std::vector<float>{-1.0f}, 1.0f);
  const std::vector<half> z(500, half(0.0f));
  const auto pz = enc(0.5f, z);
  CHECK(pz.size() == cz::wire::header_bytes + 16);
  for (half v : cz::decode_to_vector(cz::threshold<half>{.tau = 0.5f}, pz))
    CHECK(static_cast<float>(v) == 0.0f);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> y = {0.1f, nan, -inf, 0.2f, inf, 3e38f};
  check_threshold(y, 1e37f);
  const auto d = cz::decode_to_vector(cz::threshold<float>{.tau = 1e37f}, enc(1e37f, y));
  CHECK(std::isnan(d[1]));
  CHECK(d[2] == -inf);
  CHECK(d[4] == inf);
  CHECK(d[5] == 3e38f);
  CHECK(d[0] == 0.0f);

  for (float bad : {-1.0f, nan, inf}) {
    const cz::threshold<float> c{.tau = bad};
    cz::no_state st;
    std::vector<std::byte> out(c.max_encoded_bytes(y.size()));
    CHECK_THROWS_WITH_AS(c.encode(y, st, {}, out), doctest::Contains("tau"), gradsync::error);
  }
}

TEST_CASE("threshold decode_accumulate adds in float") {
  const std::vector<bfloat16> x = {bfloat16(3.0f), bfloat16(0.5f), bfloat16(-2.0f)};
  std::vector<float> acc = {1.0f, 1.0f, 1.0f};
  cz::threshold<bfloat16>{.tau = 1.0f}.decode_accumulate(enc(1.0f, x), std::span(acc));
  CHECK(acc == std::vector<float>{4.0f, 1.0f, -1.0f});
}

TEST_CASE("threshold decoders reject truncated, corrupted and inconsistent payloads") {
  std::mt19937_64 rng(11);
  const auto x = sparse_ref::tied_values<float>(rng, 400);
  const cz::threshold<float> c{.tau = 0.9f};
  const auto p = enc(0.9f, x);
  const auto e = sparse_ref::read<float>(p, 16);
  REQUIRE(e.index.size() > 10);
  corrupt::check_decoder(c, p);
  const auto xh = sparse_ref::tied_values<half>(rng, 50);
  corrupt::check_decoder(cz::threshold<half>{.tau = 0.5f}, enc(0.5f, xh));

  const std::size_t k = e.index.size();
  corrupt::expect_rejected(c, sparse_ref::with_index(p, 16, k - 1, 400), 400, "outside");
  corrupt::expect_rejected(c, sparse_ref::with_index(p, 16, 1, e.index[0]), 400,
                           "not above the previous");
  corrupt::expect_rejected(c, sparse_ref::with_param(p, 8, k + 1), 400, "body is");
  // A value below tau behind a valid checksum.
  auto q = p;
  cz::wire::store<float>(q.data() + cz::wire::header_bytes + 16 + 4 * k + 4 * 2, 0.5f);
  cz::wire::seal(q);
  corrupt::expect_rejected(c, q, 400, "below tau");
  // tau and padding: u64 at offset 0 holds (tau, pad).
  corrupt::expect_rejected(c, sparse_ref::with_param(p, 0, 0xbf800000u), 400, "tau"); // -1
  corrupt::expect_rejected(c, sparse_ref::with_param(p, 0, 0x7fc00000u), 400, "tau"); // NaN
  std::uint32_t tau_bits;
  std::memcpy(&tau_bits, p.data() + cz::wire::header_bytes, 4);
  corrupt::expect_rejected(c, sparse_ref::with_param(p, 0, tau_bits | (1ull << 40)), 400,
                           "padding");
}
