// Error feedback: the telescoping identity sum(decoded) = sum(g) - e_T, a
// bounded residual where the plain codec drifts, DGC momentum correction and
// masking, the non-finite policy, saturation for half, state checks; every
// codec of the spec parser converging with its defaults under feedback.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <gradsync/compress/cast.hpp>
#include <gradsync/compress/error_feedback.hpp>
#include <gradsync/compress/int8.hpp>
#include <gradsync/compress/qsgd.hpp>
#include <gradsync/compress/sign.hpp>
#include <gradsync/compress/terngrad.hpp>
#include <gradsync/compressed.hpp>
#include <gradsync/transport/inproc.hpp>

#include "quant_common.hpp"

namespace cz = gradsync::compress;
using namespace quant;

static_assert(cz::codec<cz::error_feedback<cz::int8<float>>>);
static_assert(cz::codec<cz::error_feedback<cz::qsgd<gradsync::half>>>);

namespace {

double norm2(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

struct run_result {
  std::vector<double> sum_g, sum_dec; // in double, independent of the codec
  double max_g_norm = 0, max_g_abs = 0;
};

// T steps of gradient-like inputs through codec C (EF-wrapped or not).
template <class C> run_result run(const C& c, typename C::state& st, std::size_t n, int steps) {
  run_result r{std::vector<double>(n, 0.0), std::vector<double>(n, 0.0), 0.0, 0.0};
  for (int t = 0; t < steps; ++t) {
    auto g = gradient_like(n, 100 + static_cast<std::uint64_t>(t));
    for (float& v : g) v += 0.01f; // a persistent bias the sign codec would lose
    const auto p = cz::encode_to_vector(c, std::span<const float>(g), st);
    std::vector<float> y(n, 0.0f);
    c.decode_accumulate(p, std::span(y));
    double gn = 0;
    for (std::size_t i = 0; i < n; ++i) {
      r.sum_g[i] += g[i];
      r.sum_dec[i] += y[i];
      gn += double(g[i]) * g[i];
      r.max_g_abs = std::max(r.max_g_abs, double(std::fabs(g[i])));
    }
    r.max_g_norm = std::max(r.max_g_norm, std::sqrt(gn));
  }
  return r;
}

std::vector<double> diff(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

} // namespace

TEST_CASE("EF(int8): sum of decoded = sum of inputs - final residual; residual stays tiny") {
  const std::size_t n = 1000;
  const int steps = 100;
  cz::error_feedback<cz::int8<float>> c{.inner = {.block = 64}};
  decltype(c)::state st;
  const auto r = run(c, st, n, steps);
  REQUIRE(st.residual.size() == n);
  const auto gap = diff(r.sum_g, r.sum_dec);
  double worst = 0, res_max = 0;
  for (std::size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(gap[i] - st.residual[i]));
    res_max = std::max(res_max, double(std::fabs(st.residual[i])));
  }
  CHECK(worst <= 1e-5 * r.max_g_abs * steps); // float rounding of the per-step updates only
  // |e| <= max|e + g| / 254 per step: one quantisation step, not an accumulation.
  CHECK(res_max <= 1.01 * r.max_g_abs / 253);
}

TEST_CASE("EF(sign): bounded residual where plain sign drifts linearly") {
  const std::size_t n = 2048;
  const int steps = 200;
  cz::error_feedback<cz::sign<float>> ef{.inner = {.block = 256}};
  decltype(ef)::state st;
  const auto with = run(ef, st, n, steps);
  cz::sign<float> plain{.block = 256};
  cz::no_state none;
  const auto without = run(plain, none, n, steps);

  const double gap_ef = norm2(diff(with.sum_g, with.sum_dec));
  const double gap_plain = norm2(diff(without.sum_g, without.sum_dec));
  std::vector<double> e(st.residual.begin(), st.residual.end());
  CHECK(std::fabs(gap_ef - norm2(e)) <= 1e-4 * gap_ef + 1e-6); // the identity, in norm
  MESSAGE("sign over ", steps, " steps: |sum g - sum decoded| = ", gap_ef, " with EF, ", gap_plain,
          " without; max |g_t| = ", with.max_g_norm);
  CHECK(gap_ef <= 6 * with.max_g_norm); // bounded by a few gradients, independent of T
  CHECK(gap_plain >= 5 * gap_ef);       // what EF is for
}

TEST_CASE("EF(qsgd): the identity holds for a stochastic codec too") {
  const std::size_t n = 500;
  cz::error_feedback<cz::qsgd<float>> c{.inner = {.block = 50, .rule = {.levels = 3}}};
  decltype(c)::state st;
  st.inner = {.seed = 77, .step = 0, .rank = 2};
  const auto r = run(c, st, n, 50);
  CHECK(st.inner.step == 50);
  const auto gap = diff(r.sum_g, r.sum_dec);
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(gap[i] - st.residual[i]));
  CHECK(worst <= 1e-4);
}

TEST_CASE("EF momentum correction: transmits the momentum sum; masking clears sent entries") {
  const std::size_t n = 300;
  const float m = 0.9f;
  // Nearly lossless inner codec: decoded sum tracks sum_t u_t, u_t = m u + g.
  cz::error_feedback<cz::fp16<float>> c{.inner = {}, .momentum = m, .mask_momentum = false};
  decltype(c)::state st;
  std::vector<double> u(n, 0.0), sum_u(n, 0.0), sum_dec(n, 0.0);
  for (int t = 0; t < 40; ++t) {
    const auto g = gradient_like(n, 500 + static_cast<std::uint64_t>(t));
    const auto p = cz::encode_to_vector(c, std::span<const float>(g), st);
    std::vector<float> y(n, 0.0f);
    c.decode_accumulate(p, std::span(y));
    for (std::size_t i = 0; i < n; ++i) {
      u[i] = m * u[i] + g[i];
      sum_u[i] += u[i];
      sum_dec[i] += y[i];
    }
  }
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(sum_u[i] - sum_dec[i] - st.residual[i]));
    scale = std::max(scale, std::fabs(sum_u[i]));
    CHECK(st.momentum[i] == doctest::Approx(u[i]).epsilon(1e-4));
  }
  CHECK(worst <= 1e-5 * scale);

  // Masking with int8: elements that quantise to 0 keep their momentum.
  cz::error_feedback<cz::int8<float>> mk{.inner = {.block = 8}, .momentum = 0.5f};
  decltype(mk)::state ms;
  const std::vector<float> g = {100.0f, 0.1f, -0.2f, 50.0f, 0.3f, 0.0f, -100.0f, 0.01f};
  const auto p = cz::encode_to_vector(mk, std::span<const float>(g), ms);
  std::vector<float> y(g.size(), 0.0f);
  mk.decode_accumulate(p, std::span(y));
  for (std::size_t i = 0; i < g.size(); ++i) {
    CAPTURE(i);
    CHECK(ms.momentum[i] == (y[i] != 0.0f ? 0.0f : g[i])); // step 1: u = g
    CHECK(ms.residual[i] == g[i] - y[i]);
  }
}

TEST_CASE("EF non-finite input: payload shows it, residual and momentum are kept") {
  cz::error_feedback<cz::int8<float>> c{.inner = {.block = 4}, .momentum = 0.5f};
  decltype(c)::state st;
  const std::vector<float> g1 = {1.0f, 2.0f, 3.0f, 4.0f, 0.5f, 0.25f, 0.125f, 1.0f};
  cz::encode_to_vector(c, std::span<const float>(g1), st);
  const auto e = st.residual, u = st.momentum;
  auto g2 = g1;
  g2[5] = qnan;
  const auto p = cz::encode_to_vector(c, std::span<const float>(g2), st);
  std::vector<float> y(8, 0.0f);
  c.decode_accumulate(p, std::span(y));
  for (int i = 0; i < 4; ++i) CHECK(std::isfinite(y[i]));
  for (int i = 4; i < 8; ++i) CHECK(std::isnan(y[i]));
  CHECK(st.residual == e);
  CHECK(st.momentum == u);
  g2[5] = inf;
  cz::encode_to_vector(c, std::span<const float>(g2), st);
  CHECK(st.residual == e);
}

TEST_CASE("EF half: the corrected value saturates, the excess stays in the residual") {
  using gradsync::half;
  cz::error_feedback<cz::int8<half>> c{.inner = {.block = 2}};
  decltype(c)::state st;
  st.residual = {60000.0f, -60000.0f, 1.0f};
  const std::vector<half> g = {half(60000.0f), half(-60000.0f), half(1.0f)};
  const auto p = cz::encode_to_vector(c, std::span<const half>(g), st);
  std::vector<float> y(3, 0.0f);
  c.decode_accumulate(p, std::span(y));
  CHECK(std::isfinite(y[0]));
  CHECK(y[0] == doctest::Approx(65504.0f).epsilon(0.005));
  CHECK(st.residual[0] == 120000.0f - y[0]);
  CHECK(st.residual[1] == -120000.0f - y[1]);
}

TEST_CASE("EF argument checks") {
  cz::error_feedback<cz::int8<float>> c{};
  decltype(c)::state st;
  std::vector<float> g(10, 1.0f), h(11, 1.0f);
  cz::encode_to_vector(c, std::span<const float>(g), st);
  CHECK_THROWS_WITH_AS(cz::encode_to_vector(c, std::span<const float>(h), st),
                       doctest::Contains("one state per tensor"), gradsync::error);
  st.reset();
  cz::encode_to_vector(c, std::span<const float>(h), st); // fine after reset
  c.momentum = 1.0f;
  CHECK_THROWS_AS(cz::encode_to_vector(c, std::span<const float>(h), st), gradsync::error);
  c.momentum = 0.0f;
  std::vector<std::byte> ws(c.workspace_bytes(11) - 1), out(c.max_encoded_bytes(11));
  CHECK_THROWS_AS(c.encode(std::span<const float>(h), st, ws, out), gradsync::error);
  // Empty tensors work.
  decltype(c)::state e;
  const auto p = cz::encode_to_vector(c, std::span<const float>(), e);
  CHECK(cz::wire::count_of(p) == 0);
}

// ---------------------------------------------------------------------------
// Every codec of the spec parser, with its default parameters and
// gradsync::compression's defaults (error feedback on), run by
// compressed_allreduce on a fixed gradient per rank for 300 steps.
//
// The contraction argument: if one encode leaves E||x - C(x)||^2 <=
// (1 - delta) ||x||^2, then e' = (g + e) - C(g + e) gives ||e'|| <= rho
// (||g|| + ||e||) with rho = sqrt(1 - delta), so the residual never exceeds
// c(delta) ||g||, c = rho / (1 - rho). The quantizer schedules encode an
// element up to p times per step (each ring hop, then the owner), and a
// rank's residual takes the errors of partial sums of up to p ranks' inputs,
// so their bound is p c(delta) max_r ||g_r||; the sparse codecs and random-k
// encode each rank's own input once: c(delta) max_r ||g_r||.

namespace {

namespace gp = gradsync::policy;

// Rank r's gradient, the same every step: a smooth part every rank shares
// plus rank-specific hashed noise (|g| < 2, RMS about 0.9).
float fixed_grad(int r, std::size_t i) {
  std::uint64_t z = (static_cast<std::uint64_t>(r + 1) << 40) ^ i;
  z = (z ^ (z >> 31)) * 0x7fb5d329728ea185ull;
  z = (z ^ (z >> 27)) * 0x81dadef4bc2dd44dull;
  const double u = static_cast<double>(z >> 11) * 0x1p-53 - 0.5;
  return static_cast<float>(std::sin(0.01 * static_cast<double>(i)) + 2.0 * u);
}

double feedback_bound(double delta) {
  const double rho = std::sqrt(1.0 - delta);
  return rho / (1.0 - rho);
}

// Worst-case delta of one encode of `name` at its default parameters, for
// tensors of n elements (0: no relative contraction exists).
double worst_delta(std::string_view name, std::size_t n) {
  const auto nb = [](std::uint32_t block) { return static_cast<double>(block); };
  const double k = std::ceil(0.01 * static_cast<double>(n)); // density 0.01
  if (name == "fp16") return 1 - 0x1p-22;                    // relative rounding <= 2^-11 (normal range)
  if (name == "bf16") return 1 - 0x1p-16;                    // <= 2^-8
  if (name == "int8") return 1 - nb(gp::int8_block) / (254.0 * 254.0); // |error| <= max|x| / 254 <= ||x|| / 254
  if (name == "int4") return 1 - nb(gp::int4_block) / (14.0 * 14.0);   // <= max|x| / 14
  if (name == "sign") return 1 / nb(gp::sign_block); // 1 - ||x||_1^2 / (block ||x||^2): a lone spike
  // Feedback form: lambda = ||x||^2 / (max|x| ||x||_1), least (2 / (1 + sqrt(block)))
  // for one spike over an even floor of sqrt(block) - 1 in all.
  if (name == "terngrad") return 2 / (1 + std::sqrt(nb(gp::terngrad_block)));
  // Feedback form: 1 / (1 + Var / ||x||^2), Var <= min(n / (4 s^2), sqrt(n) / s) ||x||^2.
  if (name == "qsgd") {
    const double s = gp::qsgd_levels, b = nb(gp::qsgd_bucket);
    return 1 / (1 + std::min(b / (4 * s * s), std::sqrt(b) / s));
  }
  // The k largest hold at least k/n of ||x||^2; random-k's k entries, k/n in expectation.
  if (name == "topk" || name == "approx_topk" || name == "randk") return k / static_cast<double>(n);
  return 0; // threshold (nothing below tau is sent), powersgd (x may miss the subspace)
}

struct ef_outcome {
  double res_early = 0, res_late = 0; // max over ranks of ||e_{r,t}||, t <= T/2 and t > T/2
  double contraction = 0;             // one rank: mean over t of ||e_{t+1}||^2 / ||g + e_t||^2
  double err = 0;                     // ||sum_t output_t / T - mean_r g_r||
  double g_max = 0, g_avg = 0;        // max_r ||g_r||, ||mean_r g_r||
  bool finite = true;
};

// `steps` calls of compressed_allreduce (op::avg) with codec `name` at its
// default parameters and a default gradsync::compression, on p inproc ranks.
ef_outcome run_defaults(std::string_view name, int p, gradsync::compressed_algorithm algo, std::size_t n,
                        int steps) {
  using namespace gradsync;
  compression z{.codec = compress::parse_spec(name)};
  z.algo = algo;
  const auto ranks = static_cast<std::size_t>(p), T = static_cast<std::size_t>(steps);
  std::vector<std::vector<double>> res(ranks, std::vector<double>(T, 0.0));
  std::vector<double> out_sum(n, 0.0), ratio(T, 0.0);
  std::vector<char> finite(ranks, 1);
  std::vector<std::vector<float>> g(ranks, std::vector<float>(n));
  for (std::size_t r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < n; ++i) g[r][i] = fixed_grad(static_cast<int>(r), i);
  inproc::run(p, [&](inproc::communicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    compress_state<float> st;
    std::vector<float> v(n);
    for (std::size_t t = 0; t < T; ++t) {
      v = g[r];
      double in2 = 0; // ||g + e_t||^2 (one rank)
      if (p == 1)
        for (std::size_t i = 0; i < n; ++i) {
          const double x = static_cast<double>(v[i]) + (st.residual.empty() ? 0.0 : st.residual[i]);
          in2 += x * x;
        }
      compressed_allreduce(c, std::span<float>(v), z, st);
      double e2 = 0;
      bool ok = true;
      for (const float e : st.residual) {
        e2 += static_cast<double>(e) * e;
        ok &= std::isfinite(e);
      }
      for (const float x : v) ok &= std::isfinite(x);
      finite[r] &= static_cast<char>(ok);
      res[r][t] = std::sqrt(e2);
      if (p == 1) ratio[t] = e2 / in2;
      if (r == 0)
        for (std::size_t i = 0; i < n; ++i) out_sum[i] += v[i];
    }
  });
  ef_outcome o;
  double avg2 = 0, err2 = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double mean = 0;
    for (std::size_t r = 0; r < ranks; ++r) mean += g[r][i];
    mean /= p;
    avg2 += mean * mean;
    const double d = out_sum[i] / static_cast<double>(T) - mean;
    err2 += d * d;
  }
  o.g_avg = std::sqrt(avg2);
  o.err = std::sqrt(err2);
  for (std::size_t r = 0; r < ranks; ++r) {
    double g2 = 0;
    for (const float x : g[r]) g2 += static_cast<double>(x) * x;
    o.g_max = std::max(o.g_max, std::sqrt(g2));
    o.finite &= finite[r] != 0;
    for (std::size_t t = 0; t < T; ++t) {
      double& m = t < T / 2 ? o.res_early : o.res_late;
      m = std::max(m, res[r][t]);
    }
  }
  if (p == 1) {
    for (const double q : ratio) o.contraction += q;
    o.contraction /= static_cast<double>(T);
  }
  return o;
}

} // namespace

TEST_CASE("every codec with its defaults converges under error feedback (compressed_allreduce, 1-4 ranks)") {
  using gradsync::compressed_algorithm;
  CHECK(gradsync::compression{}.error_feedback); // what a default caller runs
  { // codec_names is the parser's whole list: the names of spec_help, in order
    std::vector<std::string> help;
    const std::string text = gradsync::compress::spec_help;
    for (std::size_t at = 0; at < text.size();) {
      const std::size_t end = std::min(text.find(", ", at), text.size());
      const std::string item = text.substr(at, end - at);
      help.push_back(item.substr(0, item.find_first_of("[ ")));
      at = end + 2;
    }
    CHECK(help == std::vector<std::string>(gradsync::compress::codec_names.begin(), gradsync::compress::codec_names.end()));
    CHECK_THROWS_AS(gradsync::compress::parse_spec("int9").family(), gradsync::error);
  }
  const std::size_t n = 5127; // PowerSGD's default 1024 columns: 5 rows at rank 4, 7 elements left
  const int steps = 300;
  std::ostringstream table;
  table << "codec        p  schedule  max|e|/G  bound/G   E-ratio(p=1)  err/|avg|  (G = max_r |g_r|, T = " << steps
        << ")\n";
  for (const std::string_view name : gradsync::compress::codec_names) {
    const auto family = gradsync::compress::parse_spec(name).family();
    const bool quantizer = family == gradsync::compress::codec_family::quantizer;
    const bool slow_sparse = name == "topk" || name == "approx_topk" || name == "randk";
    const double delta = worst_delta(name, n);
    for (int p = 1; p <= 4; ++p) {
      std::vector<compressed_algorithm> algos = {compressed_algorithm::automatic};
      if (quantizer && p > 1) algos = {compressed_algorithm::ring, compressed_algorithm::two_step};
      for (const auto algo : algos) {
        const std::string schedule = algo == compressed_algorithm::ring       ? "ring"
                                     : algo == compressed_algorithm::two_step ? "two-step"
                                     : quantizer                              ? "(one)"
                                                                              : "family";
        INFO(name << ", " << p << " ranks, " << schedule);
        const ef_outcome o = run_defaults(name, p, algo, n, steps);
        const double G = o.g_max;
        // (a) the residual bound of the contraction argument (above). sign's
        // worst case (a lone spike per block of 1024) and PowerSGD (none)
        // give no useful bound; threshold has an absolute one: every element
        // left behind is below tau = 2.576, so ||e|| < tau sqrt(n).
        double bound = delta > 0 ? (quantizer ? p : 1) * feedback_bound(delta) * G
                                 : std::numeric_limits<double>::infinity();
        if (name == "threshold") bound = 2.576 * std::sqrt(static_cast<double>(n));
        bound += 1e-5 * G; // float rounding of the near-lossless casts
        CHECK(o.finite);  // (c) no NaN or Inf, in any output or residual
        CHECK(std::max(o.res_early, o.res_late) <= bound);
        // ... and no growth once the transient is over (catches divergence
        // where the bound is loose: a diverging residual grows geometrically).
        CHECK(o.res_late <= 1.5 * o.res_early + 1e-6 * G);
        // The contraction itself, on the codec's own inputs g + e at one rank
        // (in expectation for the stochastic codecs: a mean over the steps).
        if (p == 1) CHECK(o.contraction <= (delta > 0 ? 1 - delta / 2 : 1.0));
        // (b) the running average converges to the true average: exactly
        // sum_t output_t / T = mean g - sum_r e_r / (p T), so the error is
        // below the residual bound / T. Within 5 % of |mean g| after 300
        // steps, except for the 1 %-density sparsifiers: their residual
        // stays near n/k gradients (random-k: sqrt((1 - k/n)(2 - k/n)) n/k),
        // so 5 % takes some 10 (top-k) to 25 (random-k) times n/k steps;
        // for them the bound / T.
        if (slow_sparse) CHECK(o.err <= feedback_bound(delta) * G / steps);
        else CHECK(o.err <= 0.05 * o.g_avg);
        char ratio[32] = "-";
        if (p == 1) std::snprintf(ratio, sizeof ratio, "%.4g", o.contraction);
        char line[160];
        std::snprintf(line, sizeof line, "%-12s %d  %-8s  %8.3g  %8.3g  %12s  %9.3g\n", std::string(name).c_str(), p,
                      schedule.c_str(), std::max(o.res_early, o.res_late) / G, bound / G, ratio, o.err / o.g_avg);
        table << line;
      }
    }
  }
  MESSAGE(table.str());
}
