// core/host_simd.hpp and the array conversions of core/half.hpp: every host
// clone gives the bits of the scalar per-element functions, on every input.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gradsync/core/half.hpp>
#include <gradsync/core/host_simd.hpp>

namespace gd = gradsync::detail;

namespace {

constexpr gd::host_isa clones[] = {gd::host_isa::baseline, gd::host_isa::avx2};

std::uint16_t u16_at(const std::vector<std::byte>& b, std::size_t i) {
  std::uint16_t v;
  std::memcpy(&v, b.data() + 2 * i, 2);
  return v;
}

} // namespace

TEST_CASE("host_simd: reports the clone it runs") {
  MESSAGE((std::string("best host clone on this CPU: ") + (gd::best_host_isa() == gd::host_isa::avx2 ? "avx2+f16c" : "baseline")));
  int calls = 0;
  for (auto isa : clones) gd::host_vectorized(isa, [&calls](int k) { calls += k; }, 2);
  CHECK(calls == 4); // each clone runs the body exactly once
}

TEST_CASE("float_to_half_n / float_to_bf16_n: every float bit pattern, every clone, odd lengths") {
  // All 2^32 inputs in chunks; lengths not multiples of 8 exercise the tails.
  constexpr std::size_t chunk = (std::size_t{1} << 20) + 5;
  // The scalar reference once per chunk; each clone's output is compared
  // whole (memcmp), element by element only where it differs.
  std::vector<float> in(chunk);
  std::vector<std::uint16_t> want_h(chunk), want_b(chunk);
  std::vector<std::byte> h(2 * chunk), b(2 * chunk);
  std::uint64_t bad_half = 0, bad_bf16 = 0;
  const auto count_bad = [](const std::vector<std::byte>& got, const std::vector<std::uint16_t>& want, std::size_t n) {
    std::uint64_t bad = 0;
    if (std::memcmp(got.data(), want.data(), 2 * n) != 0)
      for (std::size_t i = 0; i < n; ++i) bad += u16_at(got, i) != want[i];
    return bad;
  };
  for (std::uint64_t start = 0; start < (std::uint64_t{1} << 32); start += chunk) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, (std::uint64_t{1} << 32) - start));
    for (std::size_t i = 0; i < n; ++i) {
      in[i] = gd::bits_float(static_cast<std::uint32_t>(start + i));
      want_h[i] = gd::float_to_half_bits(in[i]);
      want_b[i] = gd::float_to_bf16_bits(in[i]);
    }
    for (auto isa : clones) {
      // The baseline half conversion is the reference's own loop (put16_n
      // of float_to_half_bits): its first chunk checks the framing, the
      // other 2^32 inputs would repeat the reference.
      if (isa != gd::host_isa::baseline || start == 0) {
        gd::float_to_half_n(in.data(), h.data(), n, isa);
        bad_half += count_bad(h, want_h, n);
      }
      gd::float_to_bf16_n(in.data(), b.data(), n, isa);
      bad_bf16 += count_bad(b, want_b, n);
    }
  }
  CHECK(bad_half == 0);
  CHECK(bad_bf16 == 0);
}

TEST_CASE("half_to_float_n / bf16_to_float_n: every 16-bit pattern, every clone") {
  constexpr std::size_t n = 65536;
  std::vector<std::byte> in(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto v = static_cast<std::uint16_t>(i);
    std::memcpy(in.data() + 2 * i, &v, 2);
  }
  for (auto isa : clones) {
    for (std::size_t len : {n, n - 3}) { // a tail that is not a multiple of 8
      std::vector<float> h(len), b(len);
      gd::half_to_float_n(in.data(), h.data(), len, isa);
      gd::bf16_to_float_n(in.data(), b.data(), len, isa);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < len; ++i) {
        const auto v = static_cast<std::uint16_t>(i);
        bad += gd::float_bits(h[i]) != gd::float_bits(gd::half_bits_to_float(v));
        bad += gd::float_bits(b[i]) != gd::float_bits(gd::bf16_bits_to_float(v));
      }
      CHECK(bad == 0);
    }
  }
}
