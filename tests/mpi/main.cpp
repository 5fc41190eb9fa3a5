// doctest main for the MPI suites (Debian's doctest 2.4.9 has no MPI
// extension). Every rank runs the same test cases in the same order:
// - rank 0 prints the usual console report, other ranks only their failures;
//   every line is prefixed with "[rank r]" so a failure names its rank;
// - the failure counts are combined, so every rank exits non-zero when any
//   rank failed (mpiexec then reports failure whichever rank it looks at);
// - a test case that ends early on one rank (an exception, a failed REQUIRE)
//   would leave the other ranks waiting in a collective the failing rank never
//   joins, so the listener below aborts the whole job right after reporting it.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <gradsync/transport/mpi.hpp>

#include <cstdio>
#include <exception>
#include <iostream>
#include <streambuf>
#include <string>

namespace {

int world_rank = 0;

// Writes whole lines, each prefixed with the rank, straight to a FILE (no
// buffering beyond the line, so nothing is lost if the job is aborted).
class rank_prefix_buf : public std::streambuf {
public:
  rank_prefix_buf(std::FILE* f, int rank) : f_(f), prefix_("[rank " + std::to_string(rank) + "] ") {}
  ~rank_prefix_buf() override { sync(); }

protected:
  int_type overflow(int_type ch) override {
    if (traits_type::eq_int_type(ch, traits_type::eof())) return traits_type::not_eof(ch);
    line_.push_back(traits_type::to_char_type(ch));
    if (ch == '\n') emit();
    return ch;
  }
  int sync() override {
    emit();
    return 0;
  }

private:
  void emit() {
    if (line_.empty()) return;
    const std::string out = prefix_ + line_;
    std::fwrite(out.data(), 1, out.size(), f_);
    std::fflush(f_);
    line_.clear();
  }
  std::FILE* f_;
  std::string prefix_, line_;
};

[[noreturn]] void abort_job(const std::string& why, int code) {
  std::cout.flush();
  std::fprintf(stderr, "[rank %d] %s: aborting every rank so that none waits for this one\n",
               world_rank, why.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code); // MPI_Abort does not return; be sure
}

// Aborts the job once a test case has ended early on this rank. Failed CHECKs
// do not end a test case, so they are only counted, not fatal.
struct abort_on_early_exit : doctest::IReporter {
  explicit abort_on_early_exit(const doctest::ContextOptions&) {}

  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& tc) override {
    name_ = tc.m_name;
    ended_early_ = false;
  }
  void test_case_reenter(const doctest::TestCaseData&) override { check(); }
  void test_case_end(const doctest::CurrentTestCaseStats& st) override {
    using R = doctest::TestCaseFailureReason::Enum;
    if (st.failure_flags & (R::Exception | R::Crash | R::TooManyFailedAsserts)) ended_early_ = true;
    check();
  }
  void test_case_exception(const doctest::TestCaseException&) override { ended_early_ = true; }
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData& ad) override {
    if (ad.m_failed && (ad.m_at & doctest::assertType::is_require)) ended_early_ = true;
  }
  void log_message(const doctest::MessageData& md) override {
    if (md.m_severity & doctest::assertType::is_require) ended_early_ = true;
  }
  void test_case_skipped(const doctest::TestCaseData&) override {}

private:
  void check() {
    if (ended_early_)
      abort_job("test case \"" + name_ + "\" ended early on this rank (exception or failed REQUIRE)", 3);
  }
  std::string name_;
  bool ended_early_ = false;
};

} // namespace

REGISTER_LISTENER("gradsync_mpi_abort_on_early_exit", 1, abort_on_early_exit);

int main(int argc, char** argv) {
  std::set_terminate([] { abort_job("std::terminate called", 4); });
  try {
    gradsync::mpi::session mpi(argc, argv);
    int size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    const bool root = world_rank == 0;
    rank_prefix_buf buf(root ? stdout : stderr, world_rank);
    std::ostream out(&buf);

    doctest::Context ctx;
    ctx.applyCommandLine(argc, argv);
    ctx.setCout(&out);
    if (!root) {
      ctx.setOption("minimal", true); // failures only
      ctx.setOption("no-version", true);
    }
    const int rc = ctx.run();
    out.flush();

    int failed_here = rc != 0 ? 1 : 0, failed_ranks = 0;
    MPI_Allreduce(&failed_here, &failed_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (root && failed_ranks > 0)
      out << failed_ranks << " of " << size << " ranks had failures (see [rank r] lines)\n";
    out.flush();
    if (ctx.shouldExit()) return rc; // --help, --list-test-cases, ...
    return failed_ranks > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    abort_job(std::string("uncaught exception: ") + e.what(), 2);
  } catch (...) {
    abort_job("uncaught non-standard exception", 2);
  }
}
