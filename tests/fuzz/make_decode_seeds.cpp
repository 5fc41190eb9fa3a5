// Writes the seed corpus of fuzz_decode: one valid payload per codec and
// element type, each prefixed by fuzz_decode's mode byte (0: as is).
//   g++ -std=c++20 -Iinclude tests/fuzz/make_decode_seeds.cpp -o /tmp/seeds && /tmp/seeds tests/fuzz/corpus/decode
#include <cstdio>
#include <string>
#include <vector>

#include <gradsync/compress/spec.hpp>

namespace cz = gradsync::compress;

template <class T> void write_all(const std::string& dir, const char* tname) {
  std::vector<T> x(200);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = T(static_cast<float>(i % 17) * 0.25f - 2.f);
  for (const char* spec : {"fp16", "bf16", "int8", "int4", "sign", "terngrad", "qsgd", "topk:density=0.1",
                           "approx_topk:density=0.1", "randk:density=0.1", "threshold:tau=1", "powersgd:rank=2,cols=20"}) {
    cz::with_codec<T>(cz::parse_spec(spec), x.size(), [&](const auto& c, auto st0) {
      auto st = st0;
      const auto p = cz::encode_to_vector(c, std::span<const T>(x), st);
      std::string name = std::string(spec);
      for (char& ch : name)
        if (ch == ':' || ch == '=' || ch == ',') ch = '_';
      const std::string path = dir + "/" + name + "_" + tname;
      std::FILE* f = std::fopen(path.c_str(), "wb");
      const unsigned char mode = 0;
      std::fwrite(&mode, 1, 1, f);
      std::fwrite(p.data(), 1, p.size(), f);
      std::fclose(f);
    });
  }
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  write_all<float>(argv[1], "f32");
  write_all<double>(argv[1], "f64");
  write_all<gradsync::half>(argv[1], "f16");
  write_all<gradsync::bfloat16>(argv[1], "bf16");
}
