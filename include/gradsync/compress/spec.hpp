// gradsync: a codec named at run time. Trainers, the fusion engine and the
// bench pick codecs from configuration ("int8:block=256", "topk:density=0.01"),
// not from template arguments; `spec` is that text parsed and checked, and
// `with_codec<T>(spec, n, f)` builds the typed codec for n elements of T and
// hands it to a generic lambda, so every caller shares one table of names.
//
//   auto s = compress::parse_spec("qsgd:levels=7,block=512");
//   compress::with_codec<float>(s, n, [&](const auto& codec, auto state) { ... });
//
// Names and parameters (defaults in brackets): fp16, bf16, int8[block=256],
// int4[block=64], sign[block=1024], terngrad[block=256],
// qsgd[levels=7,block=128], topk[density=0.01], approx_topk[density=0.01],
// randk[density=0.01], threshold[tau=2.576], powersgd[rank=4,cols=1024].
// Unknown names, unknown keys and bad values throw gradsync::error (op "codec
// spec", errc::invalid_argument) naming the spec text.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>
#include <string_view>

#include "../core/error.hpp"
#include "../core/hash.hpp"
#include "approx_topk.hpp"
#include "blockwise.hpp"
#include "cast.hpp"
#include "codec.hpp"
#include "int4.hpp"
#include "int8.hpp"
#include "powersgd.hpp"
#include "qsgd.hpp"
#include "randk.hpp"
#include "sign.hpp"
#include "terngrad.hpp"
#include "threshold.hpp"
#include "topk.hpp"

namespace gradsync::compress {

/// Every codec name `with_codec` accepts (tests run each of them).
inline constexpr std::array<std::string_view, 12> codec_names = {
    "fp16", "bf16", "int8", "int4", "sign", "terngrad", "qsgd", "topk", "approx_topk", "randk", "threshold", "powersgd"};

/// Every codec name `with_codec` accepts, for help texts.
inline constexpr const char* spec_help =
    "fp16, bf16, int8[:block=256], int4[:block=64], sign[:block=1024], terngrad[:block=256], "
    "qsgd[:levels=7,block=128], topk[:density=0.01], approx_topk[:density=0.01], "
    "randk[:density=0.01], threshold[:tau=2.576] (N(0,1) input: 1% pass), powersgd[:rank=4,cols=1024]";

/// How a codec reduces across ranks (which collective schedule carries it).
enum class codec_family {
  quantizer,  ///< dense, fixed layout: decode-accumulate and re-encode along a ring
  sparse,     ///< (index, value) payloads of data-dependent size: allgather + sparse sum
  shared_randk, ///< random-k with indices every rank agrees on: reduce the values only
  low_rank,   ///< PowerSGD: two small factor allreduces
};

/// The family of codec type K (by its wire id).
template <class K> constexpr codec_family family_of() {
  switch (K::id) {
  case codec_id::topk:
  case codec_id::approx_topk:
  case codec_id::threshold: return codec_family::sparse;
  case codec_id::randomk: return codec_family::shared_randk;
  case codec_id::powersgd: return codec_family::low_rank;
  default: return codec_family::quantizer;
  }
}

/// A codec and its parameters, parsed from NAME[:key=value,...].
struct spec {
  std::string text, name;
  std::map<std::string, std::string> params;

  [[noreturn]] void fail(const std::string& why) const {
    throw error("codec spec", -1, -1, "'" + text + "': " + why);
  }
  /// Parameter `key` as a finite number (fallback when absent).
  /// Reads only: ranks that are threads share one spec.
  double number(const std::string& key, double fallback) const {
    const auto it = params.find(key);
    if (it == params.end()) return fallback;
    std::size_t end = 0;
    double v = 0;
    try {
      v = std::stod(it->second, &end);
    } catch (const std::exception&) {
      end = 0;
    }
    if (end != it->second.size() || !std::isfinite(v)) fail(key + "=" + it->second + " is not a number");
    return v;
  }
  /// Parameter `key` as a non-negative integer.
  std::size_t count(const std::string& key, std::size_t fallback) const {
    const double v = number(key, static_cast<double>(fallback));
    if (v < 0 || v != std::floor(v) || v > 1e15) fail(key + " must be a non-negative integer");
    return static_cast<std::size_t>(v);
  }
  /// Rejects keys outside `keys`, the ones the codec takes (typos must not
  /// pass silently).
  void allow_only(std::initializer_list<std::string_view> keys) const {
    for (const auto& [k, v] : params)
      if (std::find(keys.begin(), keys.end(), std::string_view(k)) == keys.end())
        fail("codec " + name + " takes no parameter '" + k + "'");
  }
  /// The reduction family of this codec (throws for unknown names).
  codec_family family() const {
    if (name == "topk" || name == "approx_topk" || name == "threshold") return codec_family::sparse;
    if (name == "randk") return codec_family::shared_randk;
    if (name == "powersgd") return codec_family::low_rank;
    if (name == "fp16" || name == "bf16" || name == "int8" || name == "int4" || name == "sign" ||
        name == "terngrad" || name == "qsgd")
      return codec_family::quantizer;
    fail(std::string("unknown codec '") + name + "' (" + spec_help + ")");
  }
  friend bool operator==(const spec& a, const spec& b) { return a.name == b.name && a.params == b.params; }
};

/// Folds a spec's name and parameters into hash `h` (equal specs, equal
/// hashes; what ranks compare to agree on a codec).
inline std::uint64_t spec_hash(std::uint64_t h, const spec& s) {
  h = gradsync::detail::fnv1a(h, s.name);
  for (const auto& [k, v] : s.params) {
    h = gradsync::detail::fnv1a(gradsync::detail::fnv1a(h, k), '=');
    h = gradsync::detail::fnv1a(gradsync::detail::fnv1a(h, v), ',');
  }
  return h;
}

/// Parses NAME[:key=value,key=value] (the codec itself is checked by with_codec).
inline spec parse_spec(std::string_view text) {
  spec c;
  c.text = std::string(text);
  const auto colon = c.text.find(':');
  c.name = c.text.substr(0, colon);
  if (c.name.empty()) c.fail("missing codec name");
  if (colon == std::string::npos) return c;
  const std::string rest = c.text.substr(colon + 1);
  std::size_t pos = 0;
  while (pos <= rest.size()) {
    const auto comma = std::min(rest.find(',', pos), rest.size());
    const std::string kv = rest.substr(pos, comma - pos);
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == kv.size())
      c.fail("expected key=value, got '" + kv + "'");
    c.params[kv.substr(0, eq)] = kv.substr(eq + 1);
    pos = comma + 1;
  }
  return c;
}

/// Seed of the states with_codec hands out (callers key their own streams).
inline constexpr std::uint64_t default_seed = 0x5eed;

/// Builds the codec `s` names for n elements of T and calls f(codec, state),
/// the state default-seeded (stochastic codecs: seed default_seed, rank 0).
template <float_element T, class F> void with_codec(const spec& s, std::size_t n, F&& f) {
  const std::string& z = s.name;
  const auto density = [&] {
    const double d = s.number("density", 0.01);
    if (!(d >= 0 && d <= 1)) s.fail("density outside [0, 1]");
    return d;
  };
  const auto density_k = [&] {
    return std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(density() * static_cast<double>(n))));
  };
  const auto block = [&](std::uint32_t def) {
    const std::size_t b = s.count("block", def);
    if (b < 1 || b > max_block) s.fail("block out of range [1, " + std::to_string(max_block) + "]");
    return static_cast<std::uint32_t>(b);
  };
  const stream_state seeded{default_seed, 0, 0};
  const auto blockwise_codec = [&](auto rule, auto state) {
    using Rule = decltype(rule);
    const compress::blockwise<Rule, T> c{.block = block(Rule::default_block)};
    s.allow_only({"block"});
    f(c, state);
  };
  if (z == "fp16") {
    s.allow_only({});
    f(compress::fp16<T>{}, no_state{});
  } else if (z == "bf16") {
    s.allow_only({});
    f(compress::bf16<T>{}, no_state{});
  } else if (z == "int8") {
    blockwise_codec(int8_rule{}, no_state{});
  } else if (z == "int4") {
    blockwise_codec(int4_rule{}, no_state{});
  } else if (z == "sign") {
    blockwise_codec(sign_rule{}, no_state{});
  } else if (z == "terngrad") {
    blockwise_codec(terngrad_rule{}, seeded);
  } else if (z == "qsgd") {
    compress::qsgd<T> c{.block = block(qsgd_rule::default_block)};
    const std::size_t levels = s.count("levels", c.rule.levels);
    if (levels < 1 || levels > 127) s.fail("levels out of range [1, 127]"); // qsgd_rule: 8-bit sign-magnitude codes
    c.rule.levels = static_cast<std::uint16_t>(levels);
    s.allow_only({"block", "levels"});
    f(c, seeded);
  } else if (z == "topk") {
    compress::topk<T> c{.k = density_k()};
    s.allow_only({"density"});
    f(c, no_state{});
  } else if (z == "approx_topk") {
    compress::approx_topk<T> c{.density = density()};
    s.allow_only({"density"});
    f(c, approx_topk_state{default_seed, 0, 0});
  } else if (z == "randk") {
    compress::randomk<T> c{.k = density_k()};
    s.allow_only({"density"});
    f(c, seeded);
  } else if (z == "threshold") {
    const double tau = s.number("tau", 2.576);
    if (!(tau >= 0 && tau <= static_cast<double>(std::numeric_limits<float>::max())))
      s.fail("tau must lie in [0, FLT_MAX] (it is compared in float)");
    compress::threshold<T> c{.tau = static_cast<float>(tau)};
    s.allow_only({"tau"});
    f(c, no_state{});
  } else if (z == "powersgd") {
    const std::size_t cols = std::max<std::size_t>(1, std::min(s.count("cols", 1024), std::max<std::size_t>(n, 1)));
    compress::powersgd<T> c{};
    c.rows = n / cols;
    c.cols = cols;
    c.rank = s.count("rank", 4);
    if (c.rank < 1) s.fail("rank must be at least 1");
    s.allow_only({"cols", "rank"});
    f(c, powersgd_state{.seed = default_seed});
  } else {
    s.fail("unknown codec '" + z + "' (" + spec_help + ")");
  }
}

} // namespace gradsync::compress
