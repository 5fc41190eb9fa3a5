// gradsync: operating-system process helpers for the transports.
#pragma once

#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <system_error>

namespace gradsync::detail {

/// The message of OS error number `e` ("No such file or directory").
inline std::string sys_error(int e) { return std::error_code(e, std::system_category()).message(); }

/// The state letter of process `pid` in /proc (R, S, D, T stopped, t
/// traced, Z zombie, X dead; 'X' too when the process is gone), or '?' where
/// there is no procfs and the process answers kill(pid, 0).
inline char process_state(int pid) {
  if (pid <= 0) return 'X';
  if (::kill(pid, 0) != 0 && errno == ESRCH) return 'X';
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  std::FILE* f = std::fopen(path, "r");
  if (!f) return '?';
  char buf[512];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* close = std::strrchr(buf, ')'); // the command name may contain spaces
  if (!close || close[1] == '\0' || close[2] == '\0') return '?';
  return close[2];
}

/// True unless process `pid` is gone. A killed child its parent has not yet
/// reaped still answers kill(pid, 0), so the zombie state counts as dead.
inline bool process_alive(int pid) {
  const char s = process_state(pid);
  return s != 'Z' && s != 'X';
}

/// True if process `pid` is stopped (SIGSTOP, SIGTSTP) or held by a tracer:
/// alive, but it will not answer until resumed.
inline bool process_stopped(int pid) {
  const char s = process_state(pid);
  return s == 'T' || s == 't';
}

} // namespace gradsync::detail
