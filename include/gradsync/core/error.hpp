// gradsync: the one exception type of the library.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace gradsync {

/// Raised for every failure: invalid arguments, transport failures, corrupt
/// payloads. Carries which operation failed, on which rank, with which peer
/// (-1 when no peer is involved) and a readable reason.
class error : public std::runtime_error {
public:
  error(std::string op, int rank, int peer, std::string reason)
      : std::runtime_error(format(op, rank, peer, reason)), op_(std::move(op)),
        reason_(std::move(reason)), rank_(rank), peer_(peer) {}

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
