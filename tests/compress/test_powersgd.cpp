// PowerSGD: exact recovery of rank-r matrices, orthonormal P, warm-started
// error falling to the known optimum (matrices built from chosen singular
// values), rank-deficient and zero input, poisoning, the two-step collective
// protocol through the step functions, corruption.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include <gradsync/compress/powersgd.hpp>

#include "corrupt.hpp"

namespace cz = gradsync::compress;
using gradsync::bfloat16;
using gradsync::half;

namespace {

using mat = std::vector<double>; // row-major

mat gaussian(std::mt19937_64& rng, std::size_t rows, std::size_t cols) {
  std::normal_distribution<double> g(0.0, 1.0);
  mat a(rows * cols);
  for (auto& v : a) v = g(rng);
  return a;
}

// A x B^T for A (rows x r), B (cols x r).
mat outer(const mat& a, const mat& b, std::size_t rows, std::size_t cols, std::size_t r) {
  mat m(rows * cols, 0.0);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < cols; ++c)
      for (std::size_t j = 0; j < r; ++j) m[i * cols + c] += a[i * r + j] * b[c * r + j];
  return m;
}

// Orthonormal columns (classical Gram-Schmidt twice, in double): the test's own.
mat orthonormal(std::mt19937_64& rng, std::size_t rows, std::size_t r) {
  mat a = gaussian(rng, rows, r);
  for (std::size_t j = 0; j < r; ++j) {
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t k = 0; k < j; ++k) {
        double d = 0.0;
        for (std::size_t i = 0; i < rows; ++i) d += a[i * r + k] * a[i * r + j];
        for (std::size_t i = 0; i < rows; ++i) a[i * r + j] -= d * a[i * r + k];
      }
    double nrm = 0.0;
    for (std::size_t i = 0; i < rows; ++i) nrm += a[i * r + j] * a[i * r + j];
    for (std::size_t i = 0; i < rows; ++i) a[i * r + j] /= std::sqrt(nrm);
  }
  return a;
}

template <class T> std::vector<T> to(const mat& m) {
  std::vector<T> v(m.size());
  for (std::size_t i = 0; i < m.size(); ++i) v[i] = T(static_cast<float>(m[i]));
  return v;
}

template <class T> double rel_error(const std::vector<T>& got, const mat& want) {
  double e = 0.0, w = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(static_cast<float>(got[i])) - want[i];
    e += d * d;
    w += want[i] * want[i];
  }
  return std::sqrt(e / w);
}

template <class T>
std::vector<std::byte> enc(const cz::powersgd<T>& c, const std::vector<T>& x, cz::powersgd_state& st) {
  return cz::encode_to_vector(c, std::span<const T>(x), st);
}

// P from a payload, as doubles, and max |P^T P - I|.
double orthogonality_defect(const std::vector<std::byte>& p, std::size_t rows, std::size_t r) {
  const std::byte* b = p.data() + cz::wire::header_bytes + 24;
  double worst = 0.0;
  for (std::size_t j = 0; j < r; ++j)
    for (std::size_t k = 0; k < r; ++k) {
      double d = 0.0;
      for (std::size_t i = 0; i < rows; ++i)
        d += static_cast<double>(cz::wire::load<float>(b + 4 * (i * r + j))) *
             cz::wire::load<float>(b + 4 * (i * r + k));
      worst = std::max(worst, std::fabs(d - (j == k ? 1.0 : 0.0)));
    }
  return worst;
}

} // namespace

TEST_CASE("PowerSGD recovers a rank-r matrix exactly in one step, with orthonormal P") {
  std::mt19937_64 rng(1);
  const std::size_t rows = 96, cols = 64, r = 4;
  const mat m = outer(gaussian(rng, rows, r), gaussian(rng, cols, r), rows, cols, r);
  const cz::powersgd<float> c{.rows = rows, .cols = cols, .rank = r};
  cz::powersgd_state st{.seed = 3};
  const auto x = to<float>(m);
  const auto p = enc(c, x, st);
  CHECK(p.size() == c.max_encoded_bytes(x.size()));
  CHECK(p.size() == cz::wire::header_bytes + 24 + 4 * (rows + cols) * r);
  const double err = rel_error(cz::decode_to_vector(c, p), m);
  const double orth = orthogonality_defect(p, rows, r);
  std::printf("powersgd rank-4 96x64 float: relative error %.2e, |P^T P - I| %.2e\n", err, orth);
  CHECK(err < 1e-5);
  CHECK(orth < 1e-5);
  CHECK(st.replaced == 0);

  // Half and bfloat16 inputs are the rounded matrix: its best rank-4 error is
  // the rounding itself (2^-11 and 2^-8 relative per element).
  cz::powersgd_state sh{.seed = 3}, sb{.seed = 3};
  const cz::powersgd<half> ch{.rows = rows, .cols = cols, .rank = r};
  const cz::powersgd<bfloat16> cb{.rows = rows, .cols = cols, .rank = r};
  CHECK(rel_error(cz::decode_to_vector(ch, enc(ch, to<half>(m), sh)), m) < 2e-3);
  CHECK(rel_error(cz::decode_to_vector(cb, enc(cb, to<bfloat16>(m), sb)), m) < 1.5e-2);

  // decode_accumulate adds the same reconstruction.
  std::vector<float> acc(x.size(), 1.0f);
  c.decode_accumulate(p, std::span(acc));
  const auto d = cz::decode_to_vector(c, p);
  for (std::size_t i = 0; i < acc.size(); ++i) CHECK(acc[i] == 1.0f + d[i]);
}

TEST_CASE("PowerSGD warm start: the error falls over steps to the best rank-r error") {
  std::mt19937_64 rng(2);
  const std::size_t rows = 80, cols = 60, r = 4, full = 60;
  const mat u = orthonormal(rng, rows, full), v = orthonormal(rng, cols, full);
  mat us = u; // U diag(sigma)
  double best2 = 0.0;
  for (std::size_t j = 0; j < full; ++j) {
    const double sigma = std::pow(0.8, static_cast<double>(j));
    if (j >= r) best2 += sigma * sigma;
    for (std::size_t i = 0; i < rows; ++i) us[i * full + j] *= sigma;
  }
  const mat m = outer(us, v, rows, cols, full);
  double norm2 = 0.0;
  for (double x : m) norm2 += x * x;
  const double best = std::sqrt(best2 / norm2); // Eckart-Young, relative
  const cz::powersgd<float> c{.rows = rows, .cols = cols, .rank = r};
  cz::powersgd_state st{.seed = 11};
  const auto x = to<float>(m);
  std::vector<double> err;
  for (int t = 0; t < 15; ++t) {
    const auto p = enc(c, x, st);
    err.push_back(rel_error(cz::decode_to_vector(c, p), m));
    CHECK(orthogonality_defect(p, rows, r) < 1e-5);
  }
  std::printf("powersgd warm start, best rank-4 error %.5f: step 1 %.5f, step 2 %.5f, step 15 %.5f\n",
              best, err[0], err[1], err.back());
  for (std::size_t t = 1; t < err.size(); ++t) CHECK(err[t] <= err[t - 1] * (1.0 + 1e-5));
  for (double e : err) CHECK(e >= best * (1.0 - 1e-4));
  CHECK(err.front() > 1.05 * best);
  CHECK(err.back() < 1.01 * best);
  CHECK(st.step == 15);
}

TEST_CASE("PowerSGD on rank-deficient, zero and small matrices") {
  std::mt19937_64 rng(4);
  // Rank 2, asked for rank 5: two columns of P are replaced; still exact.
  const std::size_t rows = 40, cols = 30;
  const mat m2 = outer(gaussian(rng, rows, 2), gaussian(rng, cols, 2), rows, cols, 2);
  const cz::powersgd<float> c5{.rows = rows, .cols = cols, .rank = 5};
  cz::powersgd_state st{.seed = 9};
  const auto p2 = enc(c5, to<float>(m2), st);
  CHECK(st.replaced == 3);
  CHECK(orthogonality_defect(p2, rows, 5) < 1e-5);
  CHECK(rel_error(cz::decode_to_vector(c5, p2), m2) < 1e-5);
  // A degenerate warm start (all columns of Q equal) does not freeze it: the
  // replacement directions of P feed M^T back into Q, so the step after
  // recovers the full column space.
  st.q.assign(st.q.size(), 1.0f);
  const auto p2b = enc(c5, to<float>(m2), st);
  CHECK(st.replaced == 4);
  CHECK(rel_error(cz::decode_to_vector(c5, p2b), m2) > 1e-2);
  CHECK(rel_error(cz::decode_to_vector(c5, enc(c5, to<float>(m2), st)), m2) < 1e-5);

  // All zeros: zeros out, no NaN; P stays orthonormal (replacement directions).
  const std::vector<float> z(rows * cols, 0.0f);
  cz::powersgd_state sz;
  const auto pz = enc(c5, z, sz);
  CHECK(sz.replaced == 5);
  CHECK(orthogonality_defect(pz, rows, 5) < 1e-5);
  for (float v : cz::decode_to_vector(c5, pz)) CHECK(v == 0.0f);

  // rank > min(rows, cols): the rank is clamped and the matrix is sent exactly.
  const mat m3 = gaussian(rng, 3, 50);
  const cz::powersgd<float> c3{.rows = 3, .cols = 50, .rank = 8};
  CHECK(c3.used_rank() == 3);
  cz::powersgd_state s3;
  CHECK(rel_error(cz::decode_to_vector(c3, enc(c3, to<float>(m3), s3)), m3) < 1e-5);

  // Empty matrices.
  const cz::powersgd<float> c0{.rows = 0, .cols = 7, .rank = 2};
  cz::powersgd_state s0;
  CHECK(cz::decode_to_vector(c0, enc(c0, std::vector<float>{}, s0)).empty());

  // Parameter errors.
  std::vector<float> x(12);
  const cz::powersgd<float> bad{.rows = 3, .cols = 5, .rank = 1};
  std::vector<std::byte> ws(bad.workspace_bytes(15)), out(bad.max_encoded_bytes(15));
  CHECK_THROWS_WITH_AS(bad.encode(x, s0, ws, out), doctest::Contains("3 x 5"), gradsync::error);
  const cz::powersgd<float> r0{.rows = 3, .cols = 4, .rank = 0};
  CHECK_THROWS_WITH_AS(r0.encode(x, s0, ws, out), doctest::Contains("rank"), gradsync::error);
}

TEST_CASE("PowerSGD poisons non-finite input and keeps the warm start") {
  std::mt19937_64 rng(5);
  const std::size_t rows = 20, cols = 10;
  auto x = to<half>(gaussian(rng, rows, cols));
  const cz::powersgd<half> c{.rows = rows, .cols = cols, .rank = 2};
  cz::powersgd_state st{.seed = 1};
  enc(c, x, st);
  const auto q = st.q;
  x[33] = half(std::numeric_limits<float>::infinity());
  const auto p = enc(c, x, st);
  CHECK(st.q == q);
  for (half v : cz::decode_to_vector(c, p)) CHECK(std::isnan(static_cast<float>(v)));
  std::vector<float> acc(rows * cols, 0.0f);
  c.decode_accumulate(p, std::span(acc));
  for (float v : acc) CHECK(std::isnan(v));
  corrupt::check_decoder(c, p);
}

TEST_CASE("PowerSGD two-step protocol over ranks equals PowerSGD of the sum") {
  // Three "ranks" follow the documented protocol with the step functions;
  // the allreduces are plain sums here.
  std::mt19937_64 rng(6);
  const std::size_t rows = 50, cols = 40, r = 3, ranks = 3;
  std::vector<std::vector<float>> ms;
  mat sum(rows * cols, 0.0);
  for (std::size_t k = 0; k < ranks; ++k) {
    ms.push_back(to<float>(gaussian(rng, rows, cols)));
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += ms.back()[i];
  }
  const std::uint64_t seed = 77;
  std::vector<float> q(cols * r);
  cz::powersgd_initial_q(seed, cols, r, q.data());
  const cz::philox_stream rng0{seed, 0, cz::powersgd_key};
  std::vector<float> p(rows * r, 0.0f), pi(rows * r), qi(cols * r), qsum(cols * r, 0.0f);
  for (const auto& m : ms) { // steps 1-2
    cz::powersgd_multiply(m.data(), rows, cols, q.data(), r, pi.data());
    for (std::size_t x = 0; x < p.size(); ++x) p[x] += pi[x];
  }
  cz::powersgd_orthonormalize(p.data(), rows, r, rng0); // step 3
  for (const auto& m : ms) { // steps 4-5
    cz::powersgd_multiply_transposed(m.data(), rows, cols, p.data(), r, qi.data());
    for (std::size_t x = 0; x < qsum.size(); ++x) qsum[x] += qi[x];
  }
  std::vector<float> approx(rows * cols); // step 6
  cz::powersgd_reconstruct(p.data(), qsum.data(), rows, cols, r,
                           [&](std::size_t i, float v) { approx[i] = v; });

  const cz::powersgd<float> c{.rows = rows, .cols = cols, .rank = r};
  cz::powersgd_state st{.seed = seed};
  const auto single = cz::decode_to_vector(c, enc(c, to<float>(sum), st));
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < approx.size(); ++i) {
    diff += (approx[i] - single[i]) * (approx[i] - single[i]);
    norm += single[i] * single[i];
  }
  CHECK(std::sqrt(diff / norm) < 1e-5);
}

TEST_CASE("PowerSGD decoders reject truncated, corrupted and inconsistent payloads") {
  std::mt19937_64 rng(8);
  const std::size_t rows = 12, cols = 9;
  const cz::powersgd<float> c{.rows = rows, .cols = cols, .rank = 2};
  cz::powersgd_state st;
  const auto p = enc(c, to<float>(gaussian(rng, rows, cols)), st);
  corrupt::check_decoder(c, p);
  const cz::powersgd<bfloat16> cb{.rows = 4, .cols = 4, .rank = 4};
  corrupt::check_decoder(cb, enc(cb, to<bfloat16>(gaussian(rng, 4, 4)), st));

  auto with = [&](std::size_t at, auto v) {
    std::vector<std::byte> q = p;
    cz::wire::store(q.data() + at, v);
    cz::wire::seal(q);
    return q;
  };
  const std::size_t par = cz::wire::header_bytes, body = par + 24;
  corrupt::expect_rejected(c, with(par, std::uint64_t{13}), rows * cols, "does not hold");
  corrupt::expect_rejected(c, with(par + 16, std::uint32_t{10}), rows * cols, "rank");
  corrupt::expect_rejected(c, with(par + 16, std::uint32_t{0}), rows * cols, "rank");
  corrupt::expect_rejected(c, with(par + 16, std::uint32_t{3}), rows * cols, "body is");
  corrupt::expect_rejected(c, with(par + 20, std::uint32_t{2}), rows * cols, "flags");
  corrupt::expect_rejected(c, with(par + 20, std::uint32_t{1}), rows * cols, "poisoned");
  corrupt::expect_rejected(c, with(body + 12, std::numeric_limits<float>::quiet_NaN()),
                           rows * cols, "not finite");
  corrupt::expect_rejected(c, with(par, ~std::uint64_t{0}), rows * cols, "");
}

TEST_CASE("powersgd per-element functions shared with the device path") {
  // Two roundings, never an FMA: (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 rounds to
  // 1 + 2^-11 (a tie, to even), so the sum is exactly 0; an FMA would give 2^-24.
  const float a = 1.0f + 0x1p-12f;
  CHECK(cz::powersgd_mac(-(1.0f + 0x1p-11f), a, a) == 0.0f);
  CHECK(cz::powersgd_msub(1.0f + 0x1p-11f, a, a) == 0.0f);
  // Directions are 2u - 1 of the Philox uniform, exactly.
  const cz::philox_stream s{7, 3, cz::powersgd_key};
  for (std::uint64_t x = 0; x < 100; ++x)
    CHECK(cz::powersgd_direction(s, x) == 2.0f * s.uniform(x) - 1.0f);
  // powersgd_element over powersgd_factor is what powersgd_reconstruct sinks.
  const std::vector<float> p = {0.5f, -1.25f, 3.0f, 0.75f, 2.0f, -0.5f}; // 3 x 2
  const std::vector<float> q = {1.5f, 0.25f, -2.0f, 4.0f};              // 2 x 2
  const cz::powersgd_factor pf{reinterpret_cast<const std::byte*>(p.data())};
  const cz::powersgd_factor qf{reinterpret_cast<const std::byte*>(q.data())};
  cz::powersgd_reconstruct(p.data(), q.data(), 3, 2, 2, [&](std::size_t e, float v) {
    const std::size_t i = e / 2, c = e % 2;
    CHECK(v == cz::powersgd_element(pf, qf, i, c, 2));
    CHECK(v == p[i * 2] * q[c * 2] + p[i * 2 + 1] * q[c * 2 + 1]);
  });
}
