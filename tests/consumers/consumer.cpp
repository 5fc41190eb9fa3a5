// The program every consumer project under tests/consumers/ builds against
// gradsync found its own way (Meson wrap, pkg-config, CMake). It exercises a
// collective, a compressed allreduce and the version macros, checks each
// result against values computed here, prints one line and exits 0 only if
// everything matched.
#include <gradsync/compressed.hpp>
#include <gradsync/gradsync.hpp>

#include <cmath>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  const std::string how = argc > 1 ? argv[1] : "?";
  constexpr int ranks = 3;
  constexpr std::size_t n = 1000;
  try {
    gradsync::inproc::run(ranks, [&](gradsync::inproc::communicator& comm) {
      const int r = comm.rank();
      // Sum over ranks of (r + 1) * (i % 7): (1 + 2 + 3) * (i % 7).
      std::vector<std::int32_t> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = (r + 1) * static_cast<std::int32_t>(i % 7);
      gradsync::allreduce(comm, std::span(v));
      for (std::size_t i = 0; i < n; ++i)
        if (v[i] != 6 * static_cast<std::int32_t>(i % 7))
          throw gradsync::error("consumer", r, -1, "allreduce element " + std::to_string(i) + " is " +
                                                       std::to_string(v[i]));
      // int8 keeps a value within 1/127 of its block's absolute maximum: the
      // average of the ranks' (r + 1) * 0.001 * i lies within that of 0.002 * i.
      std::vector<float> g(n);
      for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>(r + 1) * 0.001f * static_cast<float>(i);
      gradsync::compression z;
      z.codec = gradsync::compress::parse_spec("int8");
      gradsync::compress_state<float> st;
      gradsync::compressed_allreduce(comm, std::span(g), z, st);
      for (std::size_t i = 0; i < n; ++i) {
        const double want = 0.002 * static_cast<double>(i);
        if (std::fabs(g[i] - want) > 3.0 * 0.001 * static_cast<double>(n) / 127.0)
          throw gradsync::error("consumer", r, -1, "compressed mean element " + std::to_string(i) + " is " +
                                                       std::to_string(g[i]) + ", want " + std::to_string(want));
      }
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer (%s): %s\n", how.c_str(), e.what());
    return 1;
  }
  std::printf("gradsync %d.%d.%d via %s: ok\n", GRADSYNC_VERSION_MAJOR, GRADSYNC_VERSION_MINOR,
              GRADSYNC_VERSION_PATCH, how.c_str());
  return 0;
}
