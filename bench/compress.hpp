// gradsync-bench compress: what the host (compress.cpp, g++) and device
// (compress_gpu.cu, nvcc) halves share: the codec spec on the command line,
// the codec factory, the measured point and the error metric.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <gradsync/compress/approx_topk.hpp>
#include <gradsync/compress/cast.hpp>
#include <gradsync/compress/int4.hpp>
#include <gradsync/compress/int8.hpp>
#include <gradsync/compress/powersgd.hpp>
#include <gradsync/compress/qsgd.hpp>
#include <gradsync/compress/randk.hpp>
#include <gradsync/compress/sign.hpp>
#include <gradsync/compress/terngrad.hpp>
#include <gradsync/compress/threshold.hpp>
#include <gradsync/compress/topk.hpp>
#include <gradsync/core/dtype.hpp>

#include "common.hpp"

namespace gradsync::bench::compress_bench {

namespace gc = gradsync::compress;

/// A codec on the command line: NAME[:key=value,key=value].
struct codec_spec {
  std::string text, name;
  std::map<std::string, std::string> params;
  mutable std::map<std::string, bool> used;

  double number(const std::string& key, double fallback) const {
    used[key] = true;
    const auto it = params.find(key);
    if (it == params.end()) return fallback;
    std::size_t end = 0;
    double v = 0;
    try {
      v = std::stod(it->second, &end);
    } catch (const std::exception&) {
      end = 0;
    }
    if (end != it->second.size() || !std::isfinite(v))
      throw std::invalid_argument("-z " + text + ": " + key + "=" + it->second + " is not a number");
    return v;
  }
  std::size_t count(const std::string& key, std::size_t fallback) const {
    const double v = number(key, static_cast<double>(fallback));
    if (v < 0 || v != std::floor(v) || v > 1e15)
      throw std::invalid_argument("-z " + text + ": " + key + " must be a non-negative integer");
    return static_cast<std::size_t>(v);
  }
  /// Rejects keys the codec does not take (typos must not pass silently).
  void check_used() const {
    for (const auto& [k, v] : params)
      if (!used.count(k))
        throw std::invalid_argument("-z " + text + ": codec " + name + " takes no parameter '" +
                                    k + "'");
  }
};

inline codec_spec parse_spec(const std::string& s) {
  codec_spec c;
  c.text = s;
  const auto colon = s.find(':');
  c.name = s.substr(0, colon);
  if (colon == std::string::npos) return c;
  std::string rest = s.substr(colon + 1);
  std::size_t pos = 0;
  while (pos <= rest.size()) {
    const auto comma = std::min(rest.find(',', pos), rest.size());
    const std::string kv = rest.substr(pos, comma - pos);
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == kv.size())
      throw std::invalid_argument("-z " + s + ": expected key=value, got '" + kv + "'");
    c.params[kv.substr(0, eq)] = kv.substr(eq + 1);
    pos = comma + 1;
  }
  return c;
}

inline constexpr const char* codec_help =
    "codec and parameters, repeatable: fp16, bf16, int8[:block=256], int4[:block=64], "
    "sign[:block=1024], terngrad[:block=1024], qsgd[:levels=7,block=512], "
    "topk[:density=0.01], approx_topk[:density=0.01], randk[:density=0.01], "
    "threshold[:tau=2.576] (N(0,1) input: 1% pass), powersgd[:rank=4,cols=1024]";

/// One measured (codec, size) point.
struct point {
  double encode_s = 0, decode_s = 0; // best of the timed iterations
  std::size_t payload = 0;
  double rel_l2 = 0;
};

template <class T> double rel_l2(std::span<const T> x, std::span<const T> y) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double a = static_cast<double>(widen(x[i])), b = static_cast<double>(widen(y[i]));
    num += (b - a) * (b - a);
    den += a * a;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

/// Builds the codec `spec` names for n elements of T and calls f(codec, state).
template <class T, class F> void with_codec(const codec_spec& spec, std::size_t n, F&& f) {
  const std::string& z = spec.name;
  const auto density_k = [&] {
    const double d = spec.number("density", 0.01);
    if (!(d >= 0 && d <= 1)) throw std::invalid_argument("-z " + spec.text + ": density outside [0, 1]");
    return std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(d * static_cast<double>(n))));
  };
  const auto block = [&](std::uint32_t def) {
    const std::size_t b = spec.count("block", def);
    if (b < 1 || b > gc::max_block) throw std::invalid_argument("-z " + spec.text + ": block out of range");
    return static_cast<std::uint32_t>(b);
  };
  const gc::stream_state seeded{0x5eed, 0, 0};
  // The quantisers without rule parameters: only the block size.
  const auto blockwise = [&](auto rule, auto state) {
    using Rule = decltype(rule);
    const gc::blockwise<Rule, T> c{.block = block(Rule::default_block)};
    spec.check_used();
    f(c, state);
  };
  if (z == "fp16") {
    spec.check_used();
    f(gc::fp16<T>{}, gc::no_state{});
  } else if (z == "bf16") {
    spec.check_used();
    f(gc::bf16<T>{}, gc::no_state{});
  } else if (z == "int8") {
    blockwise(gc::int8_rule{}, gc::no_state{});
  } else if (z == "int4") {
    blockwise(gc::int4_rule{}, gc::no_state{});
  } else if (z == "sign") {
    blockwise(gc::sign_rule{}, gc::no_state{});
  } else if (z == "terngrad") {
    blockwise(gc::terngrad_rule{}, seeded);
  } else if (z == "qsgd") {
    gc::qsgd<T> c{.block = block(gc::qsgd_rule::default_block)};
    c.rule.levels = static_cast<std::uint16_t>(spec.count("levels", c.rule.levels));
    spec.check_used();
    f(c, seeded);
  } else if (z == "topk") {
    gc::topk<T> c{.k = density_k()};
    spec.check_used();
    f(c, gc::no_state{});
  } else if (z == "approx_topk") {
    gc::approx_topk<T> c{.density = spec.number("density", 0.01)};
    spec.check_used();
    f(c, gc::approx_topk_state{0x5eed, 0, 0});
  } else if (z == "randk") {
    gc::randomk<T> c{.k = density_k()};
    spec.check_used();
    f(c, seeded);
  } else if (z == "threshold") {
    gc::threshold<T> c{.tau = static_cast<float>(spec.number("tau", 2.576))};
    spec.check_used();
    f(c, gc::no_state{});
  } else if (z == "powersgd") {
    const std::size_t cols = std::max<std::size_t>(1, std::min(spec.count("cols", 1024), n));
    gc::powersgd<T> c{};
    c.rows = n / cols;
    c.cols = cols;
    c.rank = spec.count("rank", 4);
    spec.check_used();
    f(c, gc::powersgd_state{.seed = 0x5eed});
  } else {
    throw std::invalid_argument("-z: unknown codec '" + z + "' (" + codec_help + ")");
  }
}

/// True when this build has the CUDA half (compress_gpu.cu).
bool gpu_built();
/// Throws std::runtime_error unless a CUDA device can run the device paths.
void gpu_require();
/// Device encode/decode of `spec` on n elements of type `t` (host data x,
/// uploaded first): best times of plan.iters after plan.warmup, payload size,
/// relative L2 error of the device-decoded tensor.
point gpu_measure(const codec_spec& spec, dtype t, const void* x, std::size_t n,
                  iteration_plan plan);

} // namespace gradsync::bench::compress_bench
