// Bounds a hostile payload or input cannot get past: size fields bounded by
// the payload before any loop (PowerSGD's shape), announced counts no memory
// holds (decode_to_vector), and doubles beyond the float range the codecs
// compute in (rejected at encode, never decoded as Inf or a poisoned block).
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <gradsync/compress/spec.hpp>

namespace cz = gradsync::compress;
using gradsync::errc;
using gradsync::error;

namespace {
void put_u64(std::vector<std::byte>& p, std::size_t at, std::uint64_t v) { std::memcpy(p.data() + at, &v, 8); }
} // namespace

TEST_CASE("powersgd: an empty matrix announcing 2^40 rows decodes at once (nothing to loop over)") {
  const cz::powersgd<float> c{.rows = 4, .cols = 0, .rank = 2};
  cz::powersgd_state st{.seed = 7};
  auto p = cz::encode_to_vector(c, std::span<const float>(), st);
  REQUIRE(p.size() == cz::wire::header_bytes + cz::powersgd<float>::param_bytes);
  put_u64(p, cz::wire::header_bytes, std::uint64_t{1} << 40); // rows; cols stays 0, so rows x cols = count = 0
  cz::wire::seal(p);
  // Before the fix this looped 2^40 times over the rows of an empty matrix.
  const auto out = cz::decode_to_vector(c, p);
  CHECK(out.empty());
  std::vector<float> acc;
  c.decode_accumulate(p, std::span(acc));
  // rows 2^40 with cols 1 and count 0 is inconsistent: rejected, not looped.
  put_u64(p, cz::wire::header_bytes + 8, 1);
  cz::wire::seal(p);
  CHECK_THROWS_AS(cz::decode_to_vector(c, p), error);
}

TEST_CASE("decode_to_vector: a count no memory holds is a gradsync::error, not std::bad_alloc") {
  const cz::fp16<float> c{};
  cz::no_state st;
  const std::vector<float> x{1.f, 2.f, 3.f};
  auto p = cz::encode_to_vector(c, std::span<const float>(x), st);
  put_u64(p, 8, std::uint64_t{1} << 60); // count (the body no longer matches, but allocation comes first)
  cz::wire::seal(p);
  try {
    (void)cz::decode_to_vector(c, p);
    FAIL("decoded");
  } catch (const error& e) {
    CHECK(e.op().rfind("decode", 0) == 0);
    INFO(e.what());
    CHECK((e.kind() == errc::internal || e.kind() == errc::corrupt_payload));
  } catch (const std::exception& e) {
    FAIL("not a gradsync::error: " << e.what());
  }
}

TEST_CASE("codecs over double: finite values beyond float's range are rejected at encode, naming the element") {
  for (const char* spec : {"int8", "int4", "sign", "terngrad", "qsgd", "topk:density=0.5", "approx_topk:density=0.5",
                           "randk:density=0.5", "threshold:tau=0.5", "powersgd:rank=1,cols=2"}) {
    INFO(spec);
    std::vector<double> x{1.0, -2.0, 1e300, 0.5};
    cz::with_codec<double>(cz::parse_spec(spec), x.size(), [&](const auto& c, auto state0) {
      auto st = state0;
      try {
        (void)cz::encode_to_vector(c, std::span<const double>(x), st);
        FAIL("encoded 1e300");
      } catch (const error& e) {
        CHECK(e.op().rfind("encode", 0) == 0);
        CHECK(std::string(e.reason()).find("element 2") != std::string::npos);
        CHECK(std::string(e.reason()).find("float range") != std::string::npos);
      }
      // Inside float's range (FLT_MAX itself) the codec encodes and decodes finite values.
      x[2] = static_cast<double>(std::numeric_limits<float>::max());
      auto st2 = state0;
      const auto p = cz::encode_to_vector(c, std::span<const double>(x), st2);
      const auto y = cz::decode_to_vector(c, p);
      REQUIRE(y.size() == x.size());
      for (const double v : y) CHECK(std::isfinite(v));
      x[2] = 1e300;
      // Infinity keeps the non-finite policy (poison or pass through), not this error.
      std::vector<double> inf{1.0, std::numeric_limits<double>::infinity(), 0.5, 2.0};
      auto st3 = state0;
      CHECK_NOTHROW((void)cz::encode_to_vector(c, std::span<const double>(inf), st3));
    });
  }
}

// A spec is read, never written, by with_codec: inproc ranks are threads
// sharing one compression, and a spec that recorded the keys it read (an
// unsynchronised map insert) crashed the sparse allreduce under load; TSan
// (tests/sanitize.sh) flags any write here.
TEST_CASE("codec specs: threads sharing one spec all build the codec; every codec still rejects keys it does not take") {
  using gradsync::compress::parse_spec;
  using gradsync::compress::with_codec;
  const char* specs[] = {"fp16", "bf16", "int8:block=128", "int4:block=32", "sign:block=64", "terngrad:block=64",
                         "qsgd:levels=5,block=256", "topk:density=0.1", "approx_topk:density=0.1", "randk:density=0.1",
                         "threshold:tau=2", "powersgd:rank=2,cols=16"};
  for (const char* text : specs) {
    const auto s = parse_spec(text);
    std::atomic<int> built{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&] {
        for (int i = 0; i < 50; ++i) with_codec<float>(s, 1024, [&](const auto&, auto) { built.fetch_add(1); });
      });
    for (auto& t : ts) t.join();
    CHECK(built.load() == 200);
    const std::string bad = std::string(text) + (std::string(text).find(':') == std::string::npos ? ":blok=3" : ",blok=3");
    CHECK_THROWS_WITH_AS(with_codec<float>(parse_spec(bad), 1024, [](const auto&, auto) {}),
                         doctest::Contains("takes no parameter 'blok'"), gradsync::error);
  }
}
