// Wire format: header layout, every validation rule, checksum coverage.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gradsync/compress/codec.hpp>

namespace cz = gradsync::compress;
namespace wire = gradsync::compress::wire;
using gradsync::dtype;

namespace {

// A payload with 8 parameter bytes and a 13-byte body.
std::vector<std::byte> sample() {
  std::vector<std::byte> buf(wire::header_bytes + 8 + 13);
  wire::writer w(buf, cz::codec_id::int8, dtype::f16, 0x0102030405060708ull, 8, "encode.test");
  wire::param_writer(w.params()).put<std::uint32_t>(256).put<std::uint32_t>(0);
  for (std::size_t i = 0; i < 13; ++i) w.body()[i] = std::byte(i * 7 + 1);
  CHECK(w.finish(13) == buf.size());
  return buf;
}

std::string reason_of(std::span<const std::byte> p) {
  try {
    wire::open(p, cz::codec_id::int8, dtype::f16, 8, "decode.test");
  } catch (const gradsync::error& e) {
    CHECK(e.op() == "decode.test");
    CHECK(e.rank() == -1);
    CHECK(e.kind() == gradsync::errc::corrupt_payload);
    return e.reason();
  }
  return "";
}

} // namespace

TEST_CASE("header layout is the documented little-endian one") {
  const auto p = sample();
  const unsigned char expect[24] = {'G', 'S', 'C', 'Z', 1, 3, 3, 8,  8,  7,  6,  5,
                                    4,   3,   2,   1,   13, 0, 0, 0, 0, 0, 0, 0};
  CHECK(std::memcmp(p.data(), expect, 24) == 0);
  std::uint64_t sum;
  std::memcpy(&sum, p.data() + 24, 8);
  CHECK(sum == wire::checksum(p));
  const unsigned char params[8] = {0, 1, 0, 0, 0, 0, 0, 0}; // 256, 0
  CHECK(std::memcmp(p.data() + 32, params, 8) == 0);

  const wire::view v = wire::open(p, cz::codec_id::int8, dtype::f16, 8, "decode.test");
  CHECK(v.h.count == 0x0102030405060708ull);
  CHECK(v.h.body_bytes == 13);
  CHECK(v.params.size() == 8);
  CHECK(v.body.size() == 13);
  CHECK(v.body[12] == std::byte(12 * 7 + 1));
  CHECK(wire::param_reader(v.params).get<std::uint32_t>() == 256);
  CHECK(wire::count_of(p) == 0x0102030405060708ull);
  CHECK(wire::codec_of(p) == cz::codec_id::int8);
}

namespace {
std::uint64_t ref_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Independent reference: words with the checksum word zeroed, tail zero-padded.
std::uint64_t ref_checksum(std::span<const std::byte> p) {
  std::vector<unsigned char> bytes(p.size() + 8, 0);
  for (std::size_t i = 0; i < p.size(); ++i)
    bytes[i] = i >= 24 && i < 32 && p.size() >= 32 ? 0 : static_cast<unsigned char>(p[i]);
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i * 8 < p.size(); ++i) {
    std::uint64_t w = 0;
    for (int b = 0; b < 8; ++b) w |= std::uint64_t(bytes[i * 8 + b]) << (8 * b);
    sum += ref_mix(w ^ (i * 0x9e3779b97f4a7c15ull));
  }
  return ref_mix(sum ^ p.size());
}
} // namespace

TEST_CASE("checksum: reference formula, independent of the stored field") {
  auto p = sample();
  const std::uint64_t want = ref_checksum(p);
  CHECK(wire::checksum(p) == want);
  p[24] ^= std::byte{0xff}; // the stored field does not feed the checksum
  CHECK(wire::checksum(p) == want);
}

TEST_CASE("checksum: the wide (AVX-512) and baseline loops agree with the reference at every length") {
  std::vector<std::byte> p((std::size_t{1} << 20) + 13);
  std::uint64_t x = 88172645463325252ull;
  for (auto& b : p) { // xorshift64: every byte value, no pattern a loop could hide
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = std::byte(x >> 56);
  }
  MESSAGE((std::string("wide checksum loop on this CPU: ") + (gradsync::detail::host_has_avx512dq() ? "avx512" : "baseline")));
  for (std::size_t len = 32; len < 300; ++len) {
    const std::span<const std::byte> s(p.data(), len);
    const std::uint64_t want = ref_checksum(s);
    CHECK_MESSAGE(wire::checksum(s, true) == want, "length ", len);
    CHECK_MESSAGE(wire::checksum(s, false) == want, "length ", len);
  }
  CHECK(wire::checksum(p, true) == ref_checksum(p));
  CHECK(wire::checksum(p, false) == ref_checksum(p));
}

TEST_CASE("every single-bit flip anywhere is rejected") {
  const auto good = sample();
  for (std::size_t bit = 0; bit < good.size() * 8; ++bit) {
    auto p = good;
    p[bit / 8] ^= std::byte(1u << (bit % 8));
    CHECK_MESSAGE(!reason_of(p).empty(), "bit ", bit);
  }
}

TEST_CASE("each header rule has its own clear reason") {
  const auto good = sample();
  CHECK(reason_of(good).empty());
  auto mutate = [&](auto f, bool reseal = true) {
    auto p = good;
    f(p);
    if (reseal && p.size() >= wire::header_bytes) wire::seal(p);
    return reason_of(p);
  };
  CHECK(mutate([](auto& p) { p.resize(31); }).find("truncated") != std::string::npos);
  CHECK(mutate([](auto& p) { p.clear(); }).find("truncated") != std::string::npos);
  CHECK(mutate([](auto& p) { p[0] = std::byte{'X'}; }).find("magic") != std::string::npos);
  CHECK(mutate([](auto& p) { p[4] = std::byte{2}; }).find("version 2") != std::string::npos);
  CHECK(mutate([](auto& p) { p[5] = std::byte{4}; }).find("payload is int4") !=
        std::string::npos);
  CHECK(mutate([](auto& p) { p[6] = std::byte{1}; }).find("encoded from f32") !=
        std::string::npos);
  CHECK(mutate([](auto& p) { p[6] = std::byte{9}; }).find("unknown element dtype") !=
        std::string::npos);
  CHECK(mutate([](auto& p) { p[7] = std::byte{4}; }).find("multiple of 8") != std::string::npos);
  CHECK(mutate([](auto& p) { p[7] = std::byte{0}; p[16] = std::byte{21}; })
            .find("expects 8") != std::string::npos);
  CHECK(mutate([](auto& p) { p.push_back(std::byte{0}); }).find("length mismatch") !=
        std::string::npos);
  CHECK(mutate([](auto& p) { p.pop_back(); }).find("length mismatch") != std::string::npos);
  CHECK(mutate([](auto& p) { p[16] = std::byte{0xff}; p[23] = std::byte{0xff}; })
            .find("length mismatch") != std::string::npos);
  CHECK(mutate([](auto& p) { p[40] ^= std::byte{1}; }, false).find("checksum") !=
        std::string::npos);
}

namespace {
// The kind of the gradsync::error f() throws (it must throw one).
template <class F> gradsync::errc kind_of(F f) {
  try {
    f();
  } catch (const gradsync::error& e) {
    return e.kind();
  }
  FAIL("no gradsync::error thrown");
  return gradsync::errc::internal;
}
} // namespace

TEST_CASE("writer refuses a short output; checked_mad catches overflow") {
  using gradsync::errc;
  std::vector<std::byte> small(39);
  // An encoder's own output is the caller's argument, not a payload.
  CHECK(kind_of([&] { wire::writer(small, cz::codec_id::int8, dtype::f32, 1, 8, "encode.t"); }) ==
        errc::invalid_argument);
  CHECK(kind_of([&] { wire::writer(small, cz::codec_id::int8, dtype::f32, 1, 3, "encode.t"); }) ==
        errc::invalid_argument);
  CHECK(wire::checked_mad(3, 5, 7, "t") == 22);
  // Sizes from a header are a corrupt payload by default; an encoder says otherwise.
  CHECK(kind_of([] { wire::checked_mad(1ull << 32, 1ull << 32, 0, "t"); }) == errc::corrupt_payload);
  CHECK(kind_of([] { wire::checked_mad(1, ~0ull, 1, "t"); }) == errc::corrupt_payload);
  CHECK(kind_of([] { wire::checked_mad(1, ~0ull, 1, "t", errc::invalid_argument); }) ==
        errc::invalid_argument);
  CHECK(kind_of([] { wire::check_payload(false, "decode.t", "x"); }) == errc::corrupt_payload);
  CHECK(kind_of([] { wire::check(false, "encode.t", "x"); }) == errc::invalid_argument);
  // count_of / codec_of read a header: corrupt payloads.
  CHECK(kind_of([&] { (void)wire::count_of(std::span<const std::byte>(small).first(8)); }) ==
        errc::corrupt_payload);
}

TEST_CASE("workspace cursor aligns every piece within the planned size") {
  std::vector<std::byte> ws(1 + cz::workspace_piece<double>(3) + cz::workspace_piece<char>(5) +
                            cz::workspace_piece<float>(7));
  // Start misaligned on purpose.
  cz::workspace_cursor c{std::span(ws).subspan(1), "encode.t"};
  auto a = c.take<double>(3);
  auto b = c.take<char>(5);
  auto f = c.take<float>(7);
  CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % cz::workspace_align == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % cz::workspace_align == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(f.data()) % cz::workspace_align == 0);
  CHECK(f.size() == 7);
  // Running out of workspace is the caller's buffer, not the payload.
  CHECK(kind_of([&] { (void)c.take<double>(1000); }) == gradsync::errc::invalid_argument);
}
