// The corruption harness itself: it must pass a sound decoder and fail
// decoders with the defects it exists to find.
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include <gradsync/compress/cast.hpp>

#include "corrupt.hpp"

namespace cz = gradsync::compress;

namespace {

// fp16 with a defect injected into decoding.
enum class defect { none, writes_first, ignores_trailing, wrong_kind };

template <defect D> struct faulty {
  using value_type = float;
  using state = cz::no_state;
  static constexpr cz::codec_id id = cz::codec_id::fp16;
  static constexpr std::string_view name = "faulty";
  cz::fp16<float> real{};
  std::size_t max_encoded_bytes(std::size_t n) const { return real.max_encoded_bytes(n); }
  std::size_t workspace_bytes(std::size_t n) const { return real.workspace_bytes(n); }
  std::size_t encode(std::span<const float> in, state& st, std::span<std::byte> ws,
                     std::span<std::byte> out) const {
    return real.encode(in, st, ws, out);
  }
  void decode(std::span<const std::byte> p, std::span<float> out) const {
    if constexpr (D == defect::writes_first) std::fill(out.begin(), out.end(), 0.0f);
    relabel([&] { real.decode(trim(p, out.size()), out); });
  }
  void decode_accumulate(std::span<const std::byte> p, std::span<float> acc) const {
    if constexpr (D == defect::writes_first) std::fill(acc.begin(), acc.end(), 0.0f);
    relabel([&] { real.decode_accumulate(trim(p, acc.size()), acc); });
  }
  // wrong_kind: rejects the same payloads, but as bad arguments.
  template <class F> static void relabel(F f) {
    try {
      f();
    } catch (const gradsync::error& e) {
      if constexpr (D == defect::wrong_kind)
        throw gradsync::error(e.op(), e.rank(), e.peer(), e.reason(), gradsync::errc::invalid_argument);
      throw;
    }
  }
  static std::span<const std::byte> trim(std::span<const std::byte> p, std::size_t n) {
    if constexpr (D == defect::ignores_trailing) // accepts (and drops) extra bytes
      return p.first(std::min(p.size(), cz::wire::header_bytes + 2 * n));
    return p;
  }
};

std::vector<std::byte> payload() {
  std::vector<float> x(40, 0.5f);
  cz::no_state st;
  return cz::encode_to_vector(cz::fp16<float>{}, std::span<const float>(x), st);
}

const corrupt::options quick{.seed = 5, .bit_flips = 50, .byte_writes = 50, .resizes = 40,
                             .resealed = 50, .all_prefixes = true};

} // namespace

TEST_CASE("harness: a sound decoder passes") {
  CHECK(corrupt::check_decoder(faulty<defect::none>{}, payload(), quick).rejected > 100);
}
TEST_CASE("harness: catches a decoder that writes before validating" * doctest::should_fail()) {
  corrupt::check_decoder(faulty<defect::writes_first>{}, payload(), quick);
}
TEST_CASE("harness: catches a decoder that accepts trailing bytes" * doctest::should_fail()) {
  corrupt::check_decoder(faulty<defect::ignores_trailing>{}, payload(), quick);
}
TEST_CASE("harness: catches a decoder that rejects with a kind other than corrupt_payload" *
          doctest::should_fail()) {
  corrupt::check_decoder(faulty<defect::wrong_kind>{}, payload(), quick);
}

TEST_CASE("decode rejections are corrupt_payload; encode's bad arguments invalid_argument") {
  cz::fp16<float> c;
  auto p = payload();
  p[40] ^= std::byte{1}; // the checksum no longer matches
  std::vector<float> out(40);
  try {
    c.decode(p, std::span(out));
    FAIL("accepted a corrupted payload");
  } catch (const gradsync::error& e) {
    CHECK(e.kind() == gradsync::errc::corrupt_payload);
    CHECK(e.op() == "decode.fp16");
  }
  std::vector<float> x(40, 0.5f);
  std::vector<std::byte> small(8);
  cz::no_state st;
  try {
    (void)c.encode(std::span<const float>(x), st, {}, small);
    FAIL("encoded into 8 bytes");
  } catch (const gradsync::error& e) {
    CHECK(e.kind() == gradsync::errc::invalid_argument);
    CHECK(e.op() == "encode.fp16");
  }
}
