// gradsync-bench: nccl-tests style benchmarks of gradsync's collectives (and,
// with -a native under MPI, of the MPI library's own) on any transport.
// main() only dispatches to the subcommands of subcommands.hpp.
#include <cstdio>
#include <exception>
#include <string_view>

#include "subcommands.hpp"

namespace {

struct subcommand {
  std::string_view name;
  int (*run)(std::string_view, int, char**);
  std::string_view summary;
};

constexpr subcommand table[] = {
#define GRADSYNC_BENCH_ENTRY(name, fn, summary) {name, &gradsync::bench::fn, summary},
    GRADSYNC_BENCH_SUBCOMMANDS(GRADSYNC_BENCH_ENTRY)
#undef GRADSYNC_BENCH_ENTRY
};

void usage(std::FILE* to, const char* prog) {
  std::fprintf(to, "usage: %s SUBCOMMAND [options]   (%s SUBCOMMAND --help for its options)\n\n", prog, prog);
  for (const auto& s : table)
    std::fprintf(to, "  %-16.*s %.*s\n", static_cast<int>(s.name.size()), s.name.data(),
                 static_cast<int>(s.summary.size()), s.summary.data());
}

} // namespace

int main(int argc, char** argv) {
  const char* prog = argc > 0 ? argv[0] : "gradsync-bench";
  if (argc < 2) {
    usage(stderr, prog);
    return 1;
  }
  const std::string_view cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    usage(stdout, prog);
    return 0;
  }
  for (const auto& s : table)
    if (s.name == cmd) {
      try {
        return s.run(cmd, argc - 1, argv + 1);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "gradsync-bench %s: %s\n", argv[1], e.what());
        return 1;
      }
    }
  std::fprintf(stderr, "gradsync-bench: unknown subcommand '%s'\n\n", argv[1]);
  usage(stderr, prog);
  return 1;
}
