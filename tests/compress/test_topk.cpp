// Exact top-k: selection equals a full sort under the documented tie rule,
// edge sizes, non-finite inputs, decode/accumulate, buffer checks, corruption.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include <gradsync/compress/topk.hpp>

#include "corrupt.hpp"
#include "sparse_ref.hpp"

namespace cz = gradsync::compress;
using gradsync::bfloat16;
using gradsync::half;

namespace {

template <class T> std::vector<std::byte> enc(const cz::topk<T>& c, const std::vector<T>& x) {
  typename cz::topk<T>::state st;
  return cz::encode_to_vector(c, std::span<const T>(x), st);
}

// Encodes x, checks the payload against the full-sort reference and the
// decoded tensor against x restricted to the reference set.
template <class T> void check_against_sort(const std::vector<T>& x, std::size_t k) {
  const cz::topk<T> c{.k = k};
  const auto p = enc(c, x);
  CHECK(p.size() == c.max_encoded_bytes(x.size()));
  const auto ref = sparse_ref::top_indices(x, k);
  const auto got = sparse_ref::read<T>(p, cz::topk<T>::param_bytes);
  REQUIRE(got.index == ref);
  for (std::size_t j = 0; j < ref.size(); ++j) CHECK(sparse_ref::same_bits(got.value[j], x[ref[j]]));
  sparse_ref::check_decoded(x, ref, cz::decode_to_vector(c, p));
}

template <class T> void random_sweep(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int t = 0; t < 150; ++t) {
    const std::size_t n = rng() % 2500;
    const std::size_t k = rng() % (n + 4);
    check_against_sort(sparse_ref::tied_values<T>(rng, n), k);
  }
}

} // namespace

TEST_CASE("top-k equals the k first of a full sort (|x| desc, index asc), with ties") {
  random_sweep<float>(1);
  random_sweep<half>(2);
  random_sweep<bfloat16>(3);
  random_sweep<double>(4);
}

TEST_CASE("top-k on continuous values and one large tensor") {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(std::size_t{1} << 20);
  for (auto& v : x) v = g(rng);
  check_against_sort(x, 1000);
  check_against_sort(x, x.size() / 2);
  // Magnitudes that share the top digits and differ only in the low bits
  // exercise every radix digit.
  std::vector<float> y(5000);
  for (std::size_t i = 0; i < y.size(); ++i)
    y[i] = std::nextafter(1.0f, 2.0f) * (1.0f + static_cast<float>(rng() % 64) * 0x1p-23f) *
           (i % 2 ? -1.0f : 1.0f);
  for (std::size_t k : {1u, 17u, 2500u, 4999u}) check_against_sort(y, k);
}

TEST_CASE("top-k edge sizes: k = 0, k >= n, n = 0, n = 1, all zeros") {
  const std::vector<float> x = {1.0f, -5.0f, 3.0f};
  for (std::size_t k : {0u, 3u, 4u, 100u}) check_against_sort(x, k);
  check_against_sort(std::vector<float>{}, 0);
  check_against_sort(std::vector<float>{}, 5);
  check_against_sort(std::vector<float>{-2.5f}, 1);
  check_against_sort(std::vector<float>{-2.5f}, 0);

  const cz::topk<float> c{.k = 0};
  CHECK(c.workspace_bytes(10) == 0);
  const auto p = enc(c, x);
  CHECK(p.size() == cz::wire::header_bytes + 8);
  for (float v : cz::decode_to_vector(c, p)) CHECK(v == 0.0f);

  // All zeros: k entries of value 0 at indices 0..k-1 (tie rule), decode is zero, no NaN.
  const std::vector<half> z(1000, half(0.0f));
  const cz::topk<half> c7{.k = 7};
  const auto pz = enc(c7, z);
  const auto e = sparse_ref::read<half>(pz, 8);
  REQUIRE(e.index.size() == 7);
  for (std::uint32_t j = 0; j < 7; ++j) CHECK(e.index[j] == j);
  for (half v : cz::decode_to_vector(c7, pz)) CHECK(static_cast<float>(v) == 0.0f);
}

TEST_CASE("top-k sends NaN and Inf first and decodes them unchanged") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(100, 1.0f);
  x[10] = 1e30f;
  x[40] = -inf;
  x[70] = nan;
  x[90] = inf;
  check_against_sort(x, 2); // NaN, then the first infinity (index 40)
  const cz::topk<float> c{.k = 4};
  const auto d = cz::decode_to_vector(c, enc(c, x));
  CHECK(std::isnan(d[70]));
  CHECK(d[40] == -inf);
  CHECK(d[90] == inf);
  CHECK(d[10] == 1e30f);
  CHECK(d[0] == 0.0f);
  std::vector<bfloat16> xb(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xb[i] = bfloat16(x[i]);
  check_against_sort(xb, 3);
}

TEST_CASE("top-k decode_accumulate adds into the accumulator in float") {
  std::vector<half> x = {half(1.0f), half(-8.0f), half(0.5f), half(4.0f), half(-0.25f)};
  const cz::topk<half> c{.k = 2};
  const auto p = enc(c, x);
  std::vector<float> acc = {10.0f, 10.0f, 10.0f, 10.0f, 10.0f};
  c.decode_accumulate(p, std::span(acc));
  CHECK(acc == std::vector<float>{10.0f, 2.0f, 10.0f, 14.0f, 10.0f});
}

TEST_CASE("top-k encode checks its buffers") {
  const std::vector<float> x(100, 1.0f);
  const cz::topk<float> c{.k = 10};
  cz::no_state st;
  std::vector<std::byte> ws(c.workspace_bytes(x.size()));
  std::vector<std::byte> out(c.max_encoded_bytes(x.size()) - 1);
  CHECK_THROWS_WITH_AS(c.encode(x, st, ws, out), doctest::Contains("max_encoded_bytes"),
                       gradsync::error);
  out.resize(out.size() + 1);
  std::vector<std::byte> small(ws.size() - 1);
  CHECK_THROWS_WITH_AS(c.encode(x, st, small, out), doctest::Contains("workspace"),
                       gradsync::error);
}

TEST_CASE("top-k decoders reject truncated, corrupted and inconsistent payloads") {
  std::mt19937_64 rng(11);
  const auto x = sparse_ref::tied_values<float>(rng, 300);
  const cz::topk<float> c{.k = 20};
  const auto p = enc(c, x);
  const auto s = corrupt::check_decoder(c, p);
  CHECK(s.rejected > 5000);
  const auto xh = sparse_ref::tied_values<half>(rng, 64);
  corrupt::check_decoder(cz::topk<half>{.k = 64}, enc(cz::topk<half>{.k = 64}, xh));
  corrupt::check_decoder(cz::topk<bfloat16>{.k = 0},
                         enc(cz::topk<bfloat16>{.k = 0}, std::vector<bfloat16>(9)));

  // Targeted content defects behind a valid checksum.
  const auto e = sparse_ref::read<float>(p, 8);
  corrupt::expect_rejected(c, sparse_ref::with_index(p, 8, 19, 300), 300, "outside");
  corrupt::expect_rejected(c, sparse_ref::with_index(p, 8, 5, e.index[4]), 300,
                           "not above the previous");
  corrupt::expect_rejected(c, sparse_ref::with_index(p, 8, 0, e.index[1] + 1), 300,
                           "not above the previous");
  corrupt::expect_rejected(c, sparse_ref::with_param(p, 0, 21), 300, "body is");
  corrupt::expect_rejected(c, sparse_ref::with_param(p, 0, 301), 300, "entries for");
  corrupt::expect_rejected(c, sparse_ref::with_param(p, 0, ~0ull >> 2), 300, "");
  // A payload of another codec or dtype.
  std::vector<half> out(300);
  CHECK_THROWS_WITH_AS(cz::topk<half>{.k = 20}.decode(p, std::span(out)),
                       doctest::Contains("dtype mismatch"), gradsync::error);
}
