// Corruption harness shared by every codec test: feeds a decoder truncated,
// bit-flipped, overwritten, resized and re-sealed variants of a valid payload
// and checks that each is rejected with a gradsync::error from "decode.*"
// (rank -1, kind errc::corrupt_payload) and that a rejected decode left its
// output untouched.
//
// Usage in a codec test:
//   auto good = cz::encode_to_vector(codec, std::span<const float>(x), st);
//   corrupt::check_decoder(codec, good);                     // everything below
//   corrupt::expect_rejected(codec, crafted, "code -128");   // one targeted defect
#pragma once

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gradsync/compress/codec.hpp>

namespace corrupt {

namespace cz = gradsync::compress;

struct options {
  std::uint64_t seed = 1;
  int bit_flips = 2000;     // single and double bit flips, anywhere
  int byte_writes = 1000;   // 1..8 random bytes overwritten
  int resizes = 300;        // bytes appended, removed, inserted, cut from the middle
  int resealed = 2000;      // mutations with a recomputed checksum: reject or decode, never crash
  bool all_prefixes = true; // every strict prefix (payloads up to a few KiB)
};

/// What a run saw (for reporting; the checks themselves are asserted inside).
struct stats {
  std::size_t rejected = 0;
  std::size_t resealed_accepted = 0; // structurally valid after mutation (e.g. a code changed)
};

namespace detail {

/// Outcome of one decode attempt: empty when it decoded, else the reason.
struct outcome {
  bool threw = false;
  bool good_error = false; // gradsync::error with op "decode.*", rank -1, kind corrupt_payload
  std::string what;
};

template <class F> outcome attempt(F&& f) {
  outcome o;
  try {
    f();
  } catch (const gradsync::error& e) {
    o.threw = true;
    o.good_error = e.op().rfind("decode.", 0) == 0 && e.rank() == -1 &&
                   e.kind() == gradsync::errc::corrupt_payload;
    o.what = std::string(e.what()) + " [" + gradsync::errc_name(e.kind()) + "]";
  } catch (const std::exception& e) {
    o.threw = true;
    o.what = std::string("not a gradsync::error: ") + e.what();
  }
  return o;
}

template <class V> void fill_sentinel(std::vector<V>& v) {
  std::memset(static_cast<void*>(v.data()), 0x5a, v.size() * sizeof(V));
}
template <class V> bool is_sentinel(const std::vector<V>& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (std::size_t i = 0; i < v.size() * sizeof(V); ++i)
    if (p[i] != 0x5a) return false;
  return true;
}

} // namespace detail

/// Decodes `p` with both entry points into sentinel-filled outputs of `count`
/// elements. Returns "" when both decoded; otherwise the error text, after
/// asserting it is a proper decode error and that outputs are untouched.
/// `must_reject` makes a successful decode a test failure.
template <cz::codec C>
std::string probe(const C& c, std::span<const std::byte> p, std::size_t count, bool must_reject,
                  const std::string& what) {
  using T = typename C::value_type;
  std::vector<T> out(count);
  std::vector<gradsync::accum_t<T>> acc(count);
  detail::fill_sentinel(out);
  detail::fill_sentinel(acc);
  const auto d = detail::attempt([&] { c.decode(p, std::span(out)); });
  const auto a = detail::attempt([&] { c.decode_accumulate(p, std::span(acc)); });
  CHECK_MESSAGE(d.threw == a.threw, what, ": decode and decode_accumulate disagree");
  if (must_reject) CHECK_MESSAGE(d.threw, what, ": corrupted payload was accepted");
  if (d.threw) {
    CHECK_MESSAGE(d.good_error, what, ": ", d.what);
    CHECK_MESSAGE(detail::is_sentinel(out), what, ": rejected decode wrote output");
  }
  if (a.threw) {
    CHECK_MESSAGE(a.good_error, what, ": ", a.what);
    CHECK_MESSAGE(detail::is_sentinel(acc), what, ": rejected accumulate wrote output");
  }
  return d.threw ? d.what : a.what;
}

/// Asserts that decoding `p` (sized by its own header when it has one, else
/// by `count`) fails with a reason containing `needle`.
template <cz::codec C>
void expect_rejected(const C& c, std::span<const std::byte> p, std::size_t count,
                     const std::string& needle) {
  const std::string why = probe(c, p, count, true, needle);
  CHECK_MESSAGE(why.find(needle) != std::string::npos, "expected '", needle, "' in: ", why);
}

/// Runs every corruption family against a valid payload `good`.
template <cz::codec C>
stats check_decoder(const C& c, std::span<const std::byte> good, options o = {}) {
  stats s;
  const std::size_t n = static_cast<std::size_t>(cz::wire::count_of(good));
  REQUIRE(probe(c, good, n, false, "valid payload").empty());
  std::mt19937_64 rng(o.seed);
  auto pick = [&](std::size_t hi) { return static_cast<std::size_t>(rng() % hi); };
  const std::vector<std::byte> base(good.begin(), good.end());
  auto reject = [&](const std::vector<std::byte>& p, const char* what) {
    probe(c, p, n, true, what);
    ++s.rejected;
  };

  // Wrong output size: one element short and one too many (the payload is
  // not the one this output expects: a corrupt payload, like any other).
  if (n > 0) {
    std::vector<typename C::value_type> out(n - 1);
    CHECK(detail::attempt([&] { c.decode(good, std::span(out)); }).good_error);
  }
  {
    std::vector<gradsync::accum_t<typename C::value_type>> acc(n + 1);
    CHECK(detail::attempt([&] { c.decode_accumulate(good, std::span(acc)); }).good_error);
  }

  // Every strict prefix (or a spread of them for big payloads).
  const std::size_t step = o.all_prefixes ? 1 : std::max<std::size_t>(1, base.size() / 257);
  for (std::size_t len = 0; len < base.size(); len += step)
    reject(std::vector<std::byte>(base.begin(), base.begin() + len), "prefix");

  for (int t = 0; t < o.bit_flips; ++t) {
    auto p = base;
    const std::size_t b1 = pick(p.size() * 8);
    p[b1 / 8] ^= std::byte(1u << (b1 % 8));
    if (t % 2 == 1) { // a second flip elsewhere
      std::size_t b2 = pick(p.size() * 8);
      if (b2 == b1) b2 = (b1 + 1) % (p.size() * 8);
      p[b2 / 8] ^= std::byte(1u << (b2 % 8));
    }
    reject(p, "bit flip");
  }

  for (int t = 0; t < o.byte_writes; ++t) {
    auto p = base;
    const std::size_t k = 1 + pick(8);
    bool changed = false;
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t at = pick(p.size());
      const auto v = static_cast<std::byte>(rng());
      changed = changed || v != p[at];
      p[at] = v;
    }
    if (changed && p != base) reject(p, "random bytes");
  }

  for (int t = 0; t < o.resizes; ++t) {
    auto p = base;
    const std::size_t k = 1 + pick(16);
    switch (t % 4) {
    case 0: for (std::size_t j = 0; j < k; ++j) p.push_back(static_cast<std::byte>(rng())); break;
    case 1: p.resize(p.size() - std::min(k, p.size())); break;
    case 2: {
      const std::size_t at = pick(p.size() + 1);
      for (std::size_t j = 0; j < k; ++j)
        p.insert(p.begin() + static_cast<std::ptrdiff_t>(at), static_cast<std::byte>(rng()));
      break;
    }
    default: {
      const std::size_t at = pick(p.size());
      p.erase(p.begin() + static_cast<std::ptrdiff_t>(at),
              p.begin() + static_cast<std::ptrdiff_t>(std::min(p.size(), at + k)));
    }
    }
    reject(p, "length change");
  }

  // Re-sealed mutations reach the codec's own validation: a mutation may stay
  // valid (a code changed to another legal code), but a rejection must be clean.
  for (int t = 0; t < o.resealed; ++t) {
    auto p = base;
    const std::size_t k = 1 + pick(4);
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t at = pick(p.size());
      if (at >= 24 && at < 32) continue; // the checksum itself
      if (t % 3 == 0) p[at] = static_cast<std::byte>(rng());
      else p[at] ^= std::byte(1u << pick(8));
    }
    if (t % 7 == 0 && p.size() > cz::wire::header_bytes) { // resize the body, fix B
      const std::size_t body = p.size() - cz::wire::header_bytes;
      p.resize(cz::wire::header_bytes + pick(body + 16));
      const std::size_t P = static_cast<std::uint8_t>(p[7]);
      cz::wire::store<std::uint64_t>(p.data() + 16,
                                     p.size() >= 32 + P ? p.size() - 32 - P : 0);
    }
    cz::wire::seal(p);
    if (probe(c, p, n, false, "resealed mutation").empty()) ++s.resealed_accepted;
    else ++s.rejected;
  }
  return s;
}

} // namespace corrupt
