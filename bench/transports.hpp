// gradsync-bench: the transports a subcommand can run on. Each is one small
// launcher, `run_<name>(ranks, body)`, that calls `body(comm)` once per rank
// (threads, forked processes or MPI processes) and returns on rank 0 after all
// ranks finished; an error on any rank surfaces as an exception or aborts the
// job, never as a hang. Adding a transport = one launcher, one line in
// with_transport, its name in transport_names and its communicator type in
// GRADSYNC_BENCH_COMMUNICATORS.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include <gradsync/core/error.hpp>
#include <gradsync/transport/inproc.hpp>

#if defined(GRADSYNC_BENCH_MPI)
#include <gradsync/transport/mpi.hpp>
#endif

// A simulator build (GRADSYNC_BENCH_SIM: SimGrid SMPI, bench/sim/build.sh)
// has MPI alone: SMPI's ranks are simulated actors in one process, which
// threads and forked processes of the other transports would escape.
#if defined(__linux__) && __has_include(<gradsync/transport/shm.hpp>) && !defined(GRADSYNC_BENCH_SIM)
#define GRADSYNC_BENCH_SHM 1
#include <csignal>
#include <filesystem>
#include <sys/wait.h>
#include <unistd.h>

#include <gradsync/transport/shm.hpp>
#if defined(GRADSYNC_BENCH_MPI)
#include <gradsync/transport/shm_mpi.hpp>
#endif
#endif

// The communicator types compiled in, as an X-macro list (the sweeps are
// explicitly instantiated for each).
#if defined(GRADSYNC_BENCH_MPI)
#define GRADSYNC_BENCH_COMM_MPI(X) X(::gradsync::mpi::communicator)
#else
#define GRADSYNC_BENCH_COMM_MPI(X)
#endif
#if defined(GRADSYNC_BENCH_SHM)
#define GRADSYNC_BENCH_COMM_SHM(X) X(::gradsync::shm::communicator)
#else
#define GRADSYNC_BENCH_COMM_SHM(X)
#endif
#if defined(GRADSYNC_BENCH_SIM)
#define GRADSYNC_BENCH_COMMUNICATORS(X) GRADSYNC_BENCH_COMM_MPI(X)
#else
#define GRADSYNC_BENCH_COMMUNICATORS(X) \
  X(::gradsync::inproc::communicator) GRADSYNC_BENCH_COMM_MPI(X) GRADSYNC_BENCH_COMM_SHM(X)
#endif

namespace gradsync::bench {

/// Names of the transports compiled into this binary.
inline std::vector<std::string_view> transport_names() {
#if defined(GRADSYNC_BENCH_SIM)
  std::vector<std::string_view> v;
#else
  std::vector<std::string_view> v{"inproc"};
#endif
#if defined(GRADSYNC_BENCH_MPI)
  v.push_back("mpi");
#endif
#if defined(GRADSYNC_BENCH_SHM)
  v.push_back("shm");
#endif
  return v;
}

/// True when this process was started by mpiexec and MPI is compiled in.
inline bool under_mpiexec() {
#if defined(GRADSYNC_BENCH_MPI)
  return mpi::launched_by_mpiexec();
#else
  return false;
#endif
}

/// -t, --ranks and --timeline.
struct transport_options {
  std::string name; ///< empty until resolve(): mpi under mpiexec, else inproc
  int ranks = 4;
  CLI::Option* ranks_opt = nullptr;
  std::string timeline; ///< GRADSYNC_TIMELINE for the communicators of this run

  void add_to(CLI::App& app) {
    std::vector<std::string> known;
    for (auto n : transport_names()) known.emplace_back(n);
    std::string names;
    for (const auto& n : known) names += (names.empty() ? "" : "|") + n;
    app.add_option("-t,--transport", name, names + " (default: mpi when started by mpiexec, else inproc)")
        ->check(CLI::IsMember(known));
    ranks_opt = app.add_option("--ranks", ranks, "ranks of the inproc and shm transports")
                    ->capture_default_str()
                    ->check(CLI::Range(1, 1024));
    app.add_option("--timeline", timeline,
                   "write every call's phases as Chrome trace JSON to this file (GRADSYNC_TIMELINE: a process "
                   "per rank writes FILE.rank<r>, or FILE with %r replaced by the rank)");
  }
  /// Fills in the default and rejects contradictions (throws std::invalid_argument).
  void resolve() {
#if defined(GRADSYNC_BENCH_SIM)
    if (name.empty()) name = "mpi";
#else
    if (name.empty()) name = under_mpiexec() ? "mpi" : "inproc";
#endif
    if (name == "mpi" && ranks_opt && ranks_opt->count() > 0)
      throw std::invalid_argument("--ranks does not apply to -t mpi: the world size is mpiexec's -n");
    if (!timeline.empty()) ::setenv("GRADSYNC_TIMELINE", timeline.c_str(), 1); // read as communicators are made
  }
};

template <class Body> void run_inproc(int ranks, Body& body) {
  inproc::run(ranks, [&](inproc::communicator& c) { body(c); });
}

#if defined(GRADSYNC_BENCH_MPI)
// Ranks are the processes of MPI_COMM_WORLD. A failing rank aborts the job:
// its peers may be blocked in a collective it will never join.
// Runs body(make()) on this MPI process; a failure reports and aborts the job.
template <class Make, class Body> void run_mpi_process(Make make, Body& body) {
  mpi::session s;
  try {
    auto c = make();
    body(c);
  } catch (const std::exception& e) {
    int r = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    std::fprintf(stderr, "gradsync-bench: rank %d: %s\n", r, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

template <class Body> void run_mpi(int, Body& body) {
  run_mpi_process([] { return mpi::communicator(MPI_COMM_WORLD); }, body);
}
#endif

#if defined(GRADSYNC_BENCH_SHM)
// Ranks 1.. are forked children, rank 0 is this process; they meet in a fresh
// private directory. A failing child exits non-zero (its peers see it die);
// if rank 0 fails, it terminates the children it started.
template <class Body> void run_shm(int ranks, Body& body) {
#if defined(GRADSYNC_BENCH_MPI)
  // Under mpiexec the ranks are the MPI processes; MPI only carries the rendezvous.
  if (under_mpiexec()) return run_mpi_process([] { return shm::from_mpi(MPI_COMM_WORLD); }, body);
#endif
  char tmpl[] = "/tmp/gradsync-bench-XXXXXX";
  if (!::mkdtemp(tmpl)) throw error("bench.shm", 0, -1, "cannot create a rendezvous directory in /tmp");
  const std::filesystem::path dir = tmpl;
  std::fflush(nullptr); // children must not repeat buffered output
  std::vector<pid_t> kids;
  std::exception_ptr err;
  try {
    for (int r = 1; r < ranks; ++r) {
      const pid_t pid = ::fork();
      if (pid < 0) throw error("bench.shm", 0, -1, "fork failed for rank " + std::to_string(r));
      if (pid == 0) {
        int rc = 0;
        try {
          shm::communicator c(dir, r, ranks);
          body(c);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "gradsync-bench: rank %d: %s\n", r, e.what());
          rc = 1;
        }
        std::fflush(nullptr);
        ::_exit(rc);
      }
      kids.push_back(pid);
    }
    shm::communicator c(dir, 0, ranks);
    body(c);
  } catch (...) {
    err = std::current_exception();
    for (pid_t k : kids) ::kill(k, SIGTERM);
  }
  int failed = 0;
  for (pid_t k : kids) {
    int st = 0;
    while (::waitpid(k, &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failed;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (err) std::rethrow_exception(err);
  require(failed == 0, "bench.shm", 0, std::to_string(failed) + " child rank(s) failed");
}
#endif

/// Runs `body(comm)` on every rank of transport `name` (validated by
/// transport_options); `ranks` is ignored by mpi.
template <class Body> void with_transport(std::string_view name, int ranks, Body&& body) {
#if !defined(GRADSYNC_BENCH_SIM)
  if (name == "inproc") return run_inproc(ranks, body);
#endif
#if defined(GRADSYNC_BENCH_MPI)
  if (name == "mpi") return run_mpi(ranks, body);
#endif
#if defined(GRADSYNC_BENCH_SHM)
  if (name == "shm") return run_shm(ranks, body);
#endif
  throw error("bench", -1, -1, "transport '" + std::string(name) + "' is not compiled into this binary");
}

} // namespace gradsync::bench
