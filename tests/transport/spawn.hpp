// Ranks as forked processes over the shared-memory transport, for the shm
// suites (tests/transport/test_shm.cpp, test_shm_disagreement.cpp,
// test_shm_single_copy.cpp): each
// rank runs a function on its own communicator; the parent collects how it
// ended and what it said, kills ranks that hang, and checks that the
// rendezvous left nothing behind.
#pragma once

#include <doctest/doctest.h>

#include <gradsync/core/error.hpp>
#include <gradsync/transport/shm.hpp>

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace gradsync::test {

// What one forked rank did (spawn()).
struct outcome {
  bool exited = false; // exited normally (else killed, or hung and killed)
  int code = -1;       // exit code: 0 ok, 1 exception
  int signal = 0;
  bool hung = false;
  std::string segment; // its segment's /dev/shm name
  std::string message; // the exception text, if any
};

// Runs fn(comm) on `p` forked ranks that rendezvous in a fresh directory; kills
// them all if they have not finished within `limit`. The directory must be
// empty afterwards (the rendezvous file is removed once all ranks attached),
// unless `expect_empty` is false: then the caller checks and removes it.
// `before_join(r)` runs in rank r's process before it joins (e.g. to set its
// own environment).
inline std::vector<outcome> spawn(int p, const std::function<void(shm::communicator&)>& fn,
                                  std::chrono::milliseconds limit = std::chrono::seconds(40),
                                  const std::function<void(const std::filesystem::path&)>& prepare = nullptr,
                                  bool expect_empty = true,
                                  const std::function<void(int)>& before_join = nullptr) {
  char tmpl[] = "/tmp/gradsync-shm-test-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::filesystem::path dir = tmpl;
  if (prepare) prepare(dir);
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  std::vector<int> fds;
  for (int r = 0; r < p; ++r) {
    int fd[2];
    REQUIRE(::pipe(fd) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, SIG_DFL); // not doctest's
      ::close(fd[0]);
      std::string out;
      int code = 0;
      auto say = [&](const std::string& s) {
        for (std::size_t off = 0; off < s.size();) {
          const ssize_t n = ::write(fd[1], s.data() + off, s.size() - off);
          if (n <= 0) break;
          off += static_cast<std::size_t>(n);
        }
      };
      try {
        if (before_join) before_join(r);
        shm::communicator c(dir, r, p);
        say(c.segment_name() + "\n");
        fn(c);
      } catch (const error& e) { // its kind too, for tests to check
        out = std::string("[kind: ") + gradsync::errc_name(e.kind()) + "] " + e.what();
        code = 1;
      } catch (const std::exception& e) {
        out = e.what();
        code = 1;
      }
      say(out);
      ::_exit(code);
    }
    ::close(fd[1]);
    pids.push_back(pid);
    fds.push_back(fd[0]);
  }
  std::vector<outcome> res(static_cast<std::size_t>(p));
  std::vector<bool> done(static_cast<std::size_t>(p), false);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (int left = p; left > 0;) {
    for (std::size_t r = 0; r < pids.size(); ++r) {
      if (done[r]) continue;
      int st = 0;
      if (::waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        done[r] = true;
        --left;
        res[r].exited = WIFEXITED(st);
        res[r].code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        res[r].signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (std::size_t r = 0; r < pids.size(); ++r)
        if (!done[r]) {
          ::kill(pids[r], SIGKILL);
          ::waitpid(pids[r], nullptr, 0);
          res[r].hung = true;
          done[r] = true;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (std::size_t r = 0; r < fds.size(); ++r) {
    std::string all;
    char buf[4096];
    for (ssize_t n; (n = ::read(fds[r], buf, sizeof buf)) > 0;) all.append(buf, static_cast<std::size_t>(n));
    ::close(fds[r]);
    const auto nl = all.find('\n');
    if (nl != std::string::npos && all.rfind("/gradsync-", 0) == 0) {
      res[r].segment = all.substr(0, nl);
      res[r].message = all.substr(nl + 1);
    } else {
      res[r].message = all;
    }
  }
  if (!expect_empty) return res; // the caller checks and removes the directory
  CHECK_MESSAGE(std::filesystem::is_empty(dir), "rendezvous directory not cleaned up");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return res;
}

// Whether a rank's segment (outcome::segment) left no trace in /dev/shm.
inline bool segment_gone(const std::string& name) {
  return !name.empty() && !std::filesystem::exists("/dev/shm" + name);
}

} // namespace gradsync::test
