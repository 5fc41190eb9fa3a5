// fusion/planner.hpp: buckets against hand-computed expectations (capacity,
// the small first bucket, look-ahead, oversized tensors, keys, alignment),
// invariants of random plans checked against their definition, and the
// fused-buffer copies.
#include <doctest/doctest.h>

#include <gradsync/fusion/planner.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

using namespace gradsync;
using namespace gradsync::fusion;

namespace {

tensor_desc f32(std::size_t count, op_kind op = op_kind::avg, std::string codec = "") {
  return {.dt = dtype::f32, .count = count, .op = op, .codec = std::move(codec)};
}
tensor_desc of(dtype dt, std::size_t count) { return {.dt = dt, .count = count}; }

using idx = std::vector<std::size_t>;

plan_options opts(std::size_t bucket, std::size_t first, std::size_t lookahead, bool is_first) {
  return {.bucket_bytes = bucket, .first_bucket_bytes = first, .lookahead = lookahead, .first = is_first};
}

} // namespace

TEST_CASE("planner: capacity, and a small first bucket only when the plan starts a step") {
  const std::vector<tensor_desc> t(10, f32(64)); // 256 bytes each
  SUBCASE("first") {
    const auto b = plan(t, opts(1024, 512, 64, true));
    REQUIRE(b.size() == 3);
    CHECK(b[0].members == idx{0, 1});
    CHECK(b[0].offsets == idx{0, 256});
    CHECK(b[0].bytes == 512);
    CHECK(b[0].complete); // exactly at capacity
    CHECK(b[1].members == idx{2, 3, 4, 5});
    CHECK(b[1].offsets == idx{0, 256, 512, 768});
    CHECK(b[1].bytes == 1024);
    CHECK(b[1].complete);
    CHECK(b[2].members == idx{6, 7, 8, 9});
    CHECK(b[2].complete);
  }
  SUBCASE("not first") {
    const auto b = plan(t, opts(1024, 512, 64, false));
    REQUIRE(b.size() == 3);
    CHECK(b[0].members == idx{0, 1, 2, 3});
    CHECK(b[1].members == idx{4, 5, 6, 7});
    CHECK(b[2].members == idx{8, 9});
    CHECK(b[2].bytes == 512);
    CHECK_FALSE(b[2].complete); // more tensors could still join it
  }
  SUBCASE("closed by the next tensor that does not fit") {
    const std::vector<tensor_desc> u{f32(100), f32(100), f32(100)}; // 400 bytes: 0, 400 (aligned 400), 800
    const auto b = plan(u, opts(1000, 1000, 64, false));
    REQUIRE(b.size() == 2);
    CHECK(b[0].members == idx{0, 1});
    CHECK(b[0].offsets == idx{0, 400});
    CHECK(b[0].bytes == 800);
    CHECK(b[0].complete);
    CHECK(b[1].members == idx{2});
    CHECK_FALSE(b[1].complete);
  }
}

TEST_CASE("planner: members start at multiples of 16 bytes, padding counts toward capacity") {
  SUBCASE("f32 x 3") {
    const std::vector<tensor_desc> t(6, f32(3)); // 12 bytes at 0, 16, 32, 48, then 64 + 12 > 64
    const auto b = plan(t, opts(64, 64, 64, false));
    REQUIRE(b.size() == 2);
    CHECK(b[0].members == idx{0, 1, 2, 3});
    CHECK(b[0].offsets == idx{0, 16, 32, 48});
    CHECK(b[0].sizes == idx{12, 12, 12, 12});
    CHECK(b[0].bytes == 60);
    CHECK(b[0].elements() == 15);
    CHECK(b[0].element_offset(3) == 12);
    CHECK(b[0].complete);
    CHECK(b[1].members == idx{4, 5});
  }
  SUBCASE("f16 x 1 and f64 x 1") {
    const std::vector<tensor_desc> h(3, of(dtype::f16, 1));
    const auto b = plan(h, opts(1 << 20, 1 << 20, 64, false));
    REQUIRE(b.size() == 1);
    CHECK(b[0].offsets == idx{0, 16, 32});
    CHECK(b[0].bytes == 34);
    CHECK(b[0].elements() == 17);
    CHECK(b[0].element_offset(2) == 16);
    const std::vector<tensor_desc> d(2, of(dtype::f64, 1));
    CHECK(plan(d, opts(1 << 20, 1 << 20, 64, false))[0].offsets == idx{0, 16});
  }
  CHECK(align_up(0) == 0);
  CHECK(align_up(1) == 16);
  CHECK(align_up(16) == 16);
  CHECK(align_up(17) == 32);
}

TEST_CASE("planner: a tensor larger than the capacity is its own bucket") {
  const std::vector<tensor_desc> t{f32(25), f32(1000), f32(25), f32(25)}; // 100, 4000, 100, 100 bytes
  const auto b = plan(t, opts(1024, 1024, 64, false));
  REQUIRE(b.size() == 3);
  CHECK(b[0].members == idx{0}); // 112 + 4000 > 1024
  CHECK(b[0].complete);
  CHECK(b[1].members == idx{1});
  CHECK(b[1].bytes == 4000);
  CHECK(b[1].complete);
  CHECK(b[2].members == idx{2, 3});
  CHECK(b[2].offsets == idx{0, 112});
  CHECK_FALSE(b[2].complete);
  // As the first bucket of a step, too.
  const auto f = plan(std::vector<tensor_desc>{f32(1000), f32(1)}, opts(1 << 20, 1024, 64, true));
  REQUIRE(f.size() == 2);
  CHECK(f[0].members == idx{0});
  CHECK(f[0].complete);
  CHECK(f[1].members == idx{1}); // the second bucket has the large capacity
  CHECK_FALSE(f[1].complete);
}

TEST_CASE("planner: tensors of at least solo_bytes are never fused, and count as another key") {
  // 40, 400, 40, 40, 4000 bytes; solo from 400.
  const std::vector<tensor_desc> t{f32(10), f32(100), f32(10), f32(10), f32(1000)};
  plan_options o = opts(1 << 20, 1 << 20, 1, false);
  o.solo_bytes = 400;
  const auto b = plan(t, o);
  REQUIRE(b.size() == 4);
  CHECK(b[0].members == idx{0, 2}); // 1 is the first miss; the window (1 + 1) ends at 2
  CHECK(b[0].offsets == idx{0, 48});
  CHECK(b[0].complete);
  CHECK(b[1].members == idx{1});
  CHECK(b[1].complete);
  CHECK(b[2].members == idx{3});
  CHECK_FALSE(b[2].complete); // 4 is a miss, the window reaches past the input
  CHECK(b[3].members == idx{4});
  CHECK(b[3].complete);
  o.solo_bytes = 0; // every tensor alone
  CHECK(plan(t, o).size() == 5);
}

TEST_CASE("planner: look-ahead past tensors of other keys is bounded") {
  const tensor_desc A = f32(4), B = of(dtype::f16, 8);
  const std::vector<tensor_desc> t{A, B, B, B, A, A};
  SUBCASE("window 2: position 4 is 3 past the first miss (1)") {
    const auto b = plan(t, opts(1 << 20, 1 << 20, 2, false));
    REQUIRE(b.size() == 3);
    CHECK(b[0].members == idx{0});
    CHECK(b[0].complete); // its window [2, 3] lies inside the input
    CHECK(b[1].members == idx{1, 2, 3});
    CHECK_FALSE(b[1].complete); // first miss 4, window up to 6: past the input's end
    CHECK(b[2].members == idx{4, 5});
    CHECK_FALSE(b[2].complete);
  }
  SUBCASE("window 3 reaches position 4 but not 5") {
    const auto b = plan(t, opts(1 << 20, 1 << 20, 3, false));
    REQUIRE(b.size() == 3);
    CHECK(b[0].members == idx{0, 4});
    CHECK(b[0].offsets == idx{0, 16});
    CHECK(b[0].complete);
    CHECK(b[1].members == idx{1, 2, 3});
    CHECK(b[2].members == idx{5});
  }
  SUBCASE("window 0: consecutive runs only") {
    const std::vector<tensor_desc> u{A, A, B, A};
    const auto b = plan(u, opts(1 << 20, 1 << 20, 0, false));
    REQUIRE(b.size() == 3);
    CHECK(b[0].members == idx{0, 1});
    CHECK(b[0].complete);
    CHECK(b[1].members == idx{2});
    CHECK(b[2].members == idx{3});
  }
  SUBCASE("interleaved dtypes within the window fuse per dtype") {
    std::vector<tensor_desc> u;
    for (int i = 0; i < 8; ++i) u.push_back(i % 2 ? B : A);
    const auto b = plan(u, opts(1 << 20, 1 << 20, 64, false));
    REQUIRE(b.size() == 2);
    CHECK(b[0].members == idx{0, 2, 4, 6});
    CHECK(b[1].members == idx{1, 3, 5, 7});
  }
  SUBCASE("tensors taken by an earlier bucket are not misses") {
    // A B A B B B B A: bucket A takes 0, 2 (miss at 1; window 1 + 2 = 3, complete);
    // bucket B from 1 skips 2 (taken) and takes 3..6; 7 is its first miss.
    const std::vector<tensor_desc> u{A, B, A, B, B, B, B, A};
    const auto b = plan(u, opts(1 << 20, 1 << 20, 2, false));
    REQUIRE(b.size() == 3);
    CHECK(b[0].members == idx{0, 2});
    CHECK(b[1].members == idx{1, 3, 4, 5, 6});
    CHECK(b[2].members == idx{7});
  }
}

TEST_CASE("planner: keys (dtype, op, codec, memory space) never share a bucket") {
  std::vector<tensor_desc> t{f32(4), f32(4, op_kind::sum), f32(4, op_kind::avg, "int8"), of(dtype::f64, 2), f32(4),
                             f32(4, op_kind::avg, "int8"), f32(4, op_kind::avg, "int8;seed=2"), f32(4, op_kind::sum)};
  t.push_back(f32(4));
  t.back().space = memory_space::device;
  const auto b = plan(t, opts(1 << 20, 1 << 20, 64, false));
  REQUIRE(b.size() == 6);
  CHECK(b[0].members == idx{0, 4});
  CHECK(b[1].members == idx{1, 7});
  CHECK(b[2].members == idx{2, 5});
  CHECK(b[2].key.codec == "int8");
  CHECK(b[3].members == idx{3});
  CHECK(b[3].key.dt == dtype::f64);
  CHECK(b[4].members == idx{6});
  CHECK(b[5].members == idx{8});
  CHECK(b[5].key.space == memory_space::device);
  CHECK(b[0].key.str() != b[5].key.str());
  CHECK(b[1].key.op == op_kind::sum);
}

TEST_CASE("planner: random sequences keep the rule's invariants") {
  std::mt19937_64 rng(7);
  const dtype types[] = {dtype::f32, dtype::f16, dtype::f64, dtype::i32};
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = rng() % 60;
    std::vector<tensor_desc> t(n);
    for (std::size_t i = 0; i < n; ++i) {
      t[i].id = i;
      t[i].dt = types[rng() % 4];
      t[i].count = rng() % 4 == 0 ? rng() % 2000 : rng() % 40;
      t[i].op = rng() % 3 == 0 ? op_kind::sum : op_kind::avg;
    }
    const plan_options o = opts(64 + rng() % 4000, 16 + rng() % 1000, rng() % 6, rng() % 2 == 0);
    const auto b = plan(t, o);
    std::vector<int> seen(n, 0);
    std::size_t prev_first = 0;
    for (std::size_t k = 0; k < b.size(); ++k) {
      const bucket& x = b[k];
      REQUIRE(!x.members.empty());
      CHECK((k == 0 || x.members[0] > prev_first)); // opened in order
      prev_first = x.members[0];
      const std::size_t cap = k == 0 && o.first ? o.first_bucket_bytes : o.bucket_bytes;
      CHECK((x.members.size() == 1 || x.bytes <= cap));
      std::size_t end = 0;
      for (std::size_t m = 0; m < x.members.size(); ++m) {
        const auto& d = t[x.members[m]];
        ++seen[x.members[m]];
        CHECK(same_key(d, t[x.members[0]]));
        CHECK((m == 0 || x.members[m] > x.members[m - 1]));
        CHECK(x.offsets[m] % member_align == 0);
        CHECK(x.offsets[m] >= end);
        CHECK(x.offsets[m] < end + member_align + (m == 0 ? 1 : 0));
        CHECK(x.sizes[m] == d.bytes());
        end = x.offsets[m] + d.bytes();
      }
      CHECK(x.bytes == end);
      // The first member starts at the first tensor not in an earlier bucket.
      for (std::size_t i = 0; i < x.members[0]; ++i) CHECK(seen[i] == 1);
    }
    for (std::size_t i = 0; i < n; ++i) CHECK(seen[i] == 1);
  }
}

TEST_CASE("planner: pack writes members and zero padding in one pass, unpack restores them") {
  std::vector<tensor_desc> t{of(dtype::f16, 3), of(dtype::f16, 0), of(dtype::f16, 9), of(dtype::f16, 1)};
  const auto b = plan(t, opts(1 << 20, 1 << 20, 64, false));
  REQUIRE(b.size() == 1);
  CHECK(b[0].offsets == idx{0, 16, 16, 48});
  CHECK(b[0].bytes == 50);
  std::vector<std::vector<std::uint16_t>> src{{1, 2, 3}, {}, {4, 5, 6, 7, 8, 9, 10, 11, 12}, {13}};
  std::vector<std::byte> fused(64, std::byte{0xee});
  pack(b[0], fused, [&](std::size_t k) { return std::as_bytes(std::span<const std::uint16_t>(src[b[0].members[k]])); });
  std::vector<std::uint16_t> expect(25, 0);
  expect[0] = 1, expect[1] = 2, expect[2] = 3;
  for (int i = 0; i < 9; ++i) expect[8 + i] = static_cast<std::uint16_t>(4 + i);
  expect[24] = 13;
  CHECK(std::memcmp(fused.data(), expect.data(), 50) == 0);
  CHECK(fused[50] == std::byte{0xee}); // nothing past the bucket
  std::vector<std::vector<std::uint16_t>> dst{std::vector<std::uint16_t>(3), {}, std::vector<std::uint16_t>(9),
                                              std::vector<std::uint16_t>(1)};
  unpack(b[0], std::span<const std::byte>(fused),
         [&](std::size_t k) { return std::as_writable_bytes(std::span<std::uint16_t>(dst[b[0].members[k]])); });
  CHECK(dst == src);
  // Wrong sizes are refused, not overrun.
  std::vector<std::byte> small(10);
  CHECK_THROWS_AS(pack(b[0], small, [&](std::size_t k) { return std::as_bytes(std::span<const std::uint16_t>(src[k])); }),
                  error);
  CHECK_THROWS_AS(pack(b[0], fused, [&](std::size_t) { return std::as_bytes(std::span<const std::uint16_t>(src[0])); }),
                  error);
}
