// libFuzzer target: the GRADSYNC_ALGO parser (parse_algo_table) on arbitrary
// text. It may only return a table or throw gradsync::error; a returned
// table must be well formed (known algorithms, lo < hi, no overlaps).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <gradsync/algo/select.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto rules = gradsync::parse_algo_table(text);
    for (std::size_t i = 0; i < rules.size(); ++i) {
      if (gradsync::algorithm_name(rules[i].algo) == "?") std::abort();
      if (rules[i].lo >= rules[i].hi) std::abort();
      for (std::size_t j = 0; j < i; ++j)
        if (rules[i].lo < rules[j].hi && rules[j].lo < rules[i].hi) std::abort();
    }
  } catch (const gradsync::error&) {
  } catch (...) {
    std::abort();
  }
  return 0;
}
