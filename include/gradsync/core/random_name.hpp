// gradsync: unpredictable names for operating-system objects (shared-memory
// segments), so another user cannot guess and pre-create them.
#pragma once

#include <sys/random.h>

#include <cerrno>
#include <cstddef>
#include <string>
#include <string_view>

#include "error.hpp"
#include "process.hpp"

namespace gradsync::detail {

/// `prefix` followed by 32 hex digits of kernel randomness; a getrandom
/// failure throws gradsync::error (errc::internal) naming `op` and `rank`.
inline std::string random_name(std::string_view prefix, const char* op, int rank) {
  unsigned char b[16];
  std::size_t got = 0;
  while (got < sizeof b) {
    const ssize_t r = getrandom(b + got, sizeof b - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw error(errc::internal, op, rank, -1, "getrandom failed: " + sys_error(errno));
    }
    got += static_cast<std::size_t>(r);
  }
  static constexpr char hex[] = "0123456789abcdef";
  std::string s(prefix);
  for (unsigned char c : b) {
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}

} // namespace gradsync::detail
