// gradsync: the one exception type of the library.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace gradsync {

/// What kind of failure an error is, so that callers can branch on it.
enum class errc {
  invalid_argument, ///< bad input detected before any message moved (the default)
  timeout,          ///< a wait exceeded the call's or the communicator's timeout
  peer_failed,      ///< a peer rank died, left or failed the call
  mismatch,         ///< ranks disagree on the call (sizes, kind, dtype, op, root)
  corrupt_payload,  ///< an encoded payload failed validation
  aborted,          ///< the communicator was aborted (by any rank or thread)
  internal,         ///< an operating-system or library call failed
};

/// Name of an error kind ("timeout", ...).
constexpr const char* errc_name(errc k) noexcept {
  switch (k) {
  case errc::invalid_argument: return "invalid argument";
  case errc::timeout: return "timeout";
  case errc::peer_failed: return "peer failed";
  case errc::mismatch: return "mismatch";
  case errc::corrupt_payload: return "corrupt payload";
  case errc::aborted: return "aborted";
  case errc::internal: return "internal";
  }
  return "?";
}

/// Raised for every failure: invalid arguments, transport failures, corrupt
/// payloads. Carries its kind, which operation failed, on which rank, with
/// which peer (-1 when no peer is involved) and a readable reason.
class error : public std::runtime_error {
public:
  error(std::string op, int rank, int peer, std::string reason,
        errc kind = errc::invalid_argument)
      : std::runtime_error(format(op, rank, peer, reason)), op_(std::move(op)),
        reason_(std::move(reason)), rank_(rank), peer_(peer), kind_(kind) {}
  error(errc kind, std::string op, int rank, int peer, std::string reason)
      : error(std::move(op), rank, peer, std::move(reason), kind) {}

  /// The kind of failure (branch on this, not on the text).
  errc kind() const noexcept { return kind_; }

  /// Name of the failing operation, e.g. "allreduce" or "inproc.recv".
  const std::string& op() const noexcept { return op_; }
  /// Rank that detected the failure (-1 when not known, e.g. a codec).
  int rank() const noexcept { return rank_; }
  /// Peer rank involved, or -1.
  int peer() const noexcept { return peer_; }
  /// The reason alone, without operation and rank.
  const std::string& reason() const noexcept { return reason_; }

private:
  static std::string format(const std::string& op, int rank, int peer,
                            const std::string& reason) {
    std::string s = "gradsync: " + op;
    if (rank >= 0) {
      s += " (rank " + std::to_string(rank);
      if (peer >= 0) s += ", peer " + std::to_string(peer);
      s += ")";
    } else if (peer >= 0) {
      s += " (peer " + std::to_string(peer) + ")";
    }
    return s + ": " + reason;
  }
  std::string op_, reason_;
  int rank_, peer_;
  errc kind_;
};

/// Throws gradsync::error unless `cond` holds.
inline void require(bool cond, const char* op, int rank, const std::string& reason,
                    int peer = -1) {
  if (!cond) throw error(op, rank, peer, reason);
}

/// require() for hot paths: the reason (and the peer) are evaluated only when
/// `cond` fails, so a passing check costs a compare, not a string build
/// (validation runs on every collective call).
/// Usage: GRADSYNC_REQUIRE(cond, op, rank, reason[, peer]).
#define GRADSYNC_REQUIRE(cond, ...)                                                                \
  do {                                                                                             \
    if (!(cond)) ::gradsync::require(false, __VA_ARGS__);                                          \
  } while (0)

} // namespace gradsync
