// libFuzzer target: every decoder, every element type, on arbitrary bytes.
// Byte 0 chooses a mode, the rest is the payload. Odd modes recompute the
// checksum first so mutations reach each codec's own validation. A decoder
// may only return or throw gradsync::error; anything else (a crash, another
// exception, a sanitizer report) is a finding.
//
// Built and run with clang by tests/fuzz/run_fuzz.py (meson test suite
// 'fuzz': a bounded run on the seed corpus tests/fuzz/corpus/decode).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
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

namespace cz = gradsync::compress;

namespace {

// Outputs are capped so a forged count cannot exhaust memory; a capped size
// differs from the header's count, which the decoder must then reject.
constexpr std::uint64_t max_elems = std::uint64_t{1} << 12;

template <class C> void try_decode(std::span<const std::byte> p) {
  using T = typename C::value_type;
  const C c{};
  std::uint64_t n = 0;
  try {
    n = cz::wire::count_of(p);
  } catch (const gradsync::error&) {
    n = 3; // still run the decoders on the structurally invalid payload
  }
  n = n > max_elems ? max_elems : n;
  std::vector<T> out(static_cast<std::size_t>(n));
  std::vector<gradsync::accum_t<T>> acc(static_cast<std::size_t>(n));
  try {
    c.decode(p, std::span(out));
  } catch (const gradsync::error&) {
  }
  try {
    c.decode_accumulate(p, std::span(acc));
  } catch (const gradsync::error&) {
  }
}

template <template <class> class C> void try_types(std::span<const std::byte> p) {
  try_decode<C<float>>(p);
  try_decode<C<double>>(p);
  try_decode<C<gradsync::half>>(p);
  try_decode<C<gradsync::bfloat16>>(p);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::vector<std::byte> p(reinterpret_cast<const std::byte*>(data + 1),
                           reinterpret_cast<const std::byte*>(data + size));
  if ((data[0] & 1) && p.size() >= cz::wire::header_bytes) cz::wire::seal(p);
  const std::span<const std::byte> s(p);
  try {
    try_types<cz::fp16>(s);
    try_types<cz::bf16>(s);
    try_types<cz::int8>(s);
    try_types<cz::int4>(s);
    try_types<cz::sign>(s);
    try_types<cz::terngrad>(s);
    try_types<cz::qsgd>(s);
    // Sparsifiers and PowerSGD.
    try_types<cz::topk>(s);
    try_types<cz::approx_topk>(s);
    try_types<cz::randomk>(s);
    try_types<cz::threshold>(s);
    try_types<cz::powersgd>(s);
  } catch (...) {
    std::abort(); // anything but gradsync::error escaping a decoder is a bug
  }
  return 0;
}
