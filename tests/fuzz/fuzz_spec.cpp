// libFuzzer target: codec specs ("topk:density=0.01", ...) on arbitrary text.
// parse_spec + with_codec may only build a codec or throw gradsync::error;
// a codec they build must encode and decode a small tensor without failing
// (PowerSGD: its rows x cols part; compressed_allreduce sends the rest dense).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <gradsync/compress/spec.hpp>

namespace cz = gradsync::compress;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 256) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<float> x(96);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 13) - 6.f;
  bool built = false;
  try {
    cz::with_codec<float>(cz::parse_spec(text), x.size(), [&](const auto& c, auto st0) {
      built = true;
      auto st = st0;
      std::span<const float> in(x);
      if constexpr (requires { c.rows * c.cols; }) in = in.first(c.rows * c.cols); // the tail goes dense
      const auto p = cz::encode_to_vector(c, in, st);
      const auto y = cz::decode_to_vector(c, p);
      if (y.size() != in.size()) std::abort();
    });
  } catch (const gradsync::error& e) {
    if (built) std::abort(); // a built codec failed on a plain tensor
  } catch (...) {
    std::abort();
  }
  return 0;
}
