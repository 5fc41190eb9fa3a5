// gradsync: a sub-communicator view over any transport. Local rank i is the
// parent's rank members[i]; tags are shifted by a fixed amount so that two
// views of one parent (e.g. the levels of a hierarchical schedule) can never
// match each other's messages. No communication is needed to build one.
#pragma once

#include <algorithm>
#include <limits>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../core/error.hpp"
#include "capabilities.hpp"
#include "transport.hpp"

namespace gradsync {

/// Ranks split into groups, each listed in ascending rank order; groups are
/// ordered by their lowest rank.
struct rank_groups {
  std::vector<std::vector<int>> members;
  std::vector<int> group_of; // rank -> group index

  /// Contiguous groups of `size` ranks (the last one may be shorter).
  static rank_groups blocks(int ranks, int size) {
    rank_groups g;
    size = std::max(1, size);
    for (int r = 0; r < ranks; ++r) {
      if (r % size == 0) g.members.emplace_back();
      g.members.back().push_back(r);
      g.group_of.push_back(static_cast<int>(g.members.size()) - 1);
    }
    return g;
  }
  /// Groups of ranks with equal `key(rank)`.
  template <class Key> static rank_groups by(int ranks, Key&& key) {
    rank_groups g;
    std::vector<int> keys;
    for (int r = 0; r < ranks; ++r) {
      const int k = static_cast<int>(key(r));
      const auto it = std::find(keys.begin(), keys.end(), k);
      const auto idx = static_cast<int>(it - keys.begin());
      if (it == keys.end()) {
        keys.push_back(k);
        g.members.emplace_back();
      }
      g.members[static_cast<std::size_t>(idx)].push_back(r);
      g.group_of.push_back(idx);
    }
    return g;
  }
  int count() const noexcept { return static_cast<int>(members.size()); }
  /// Size of the largest group.
  int max_size() const noexcept {
    std::size_t m = 0;
    for (const auto& v : members) m = std::max(m, v.size());
    return static_cast<int>(m);
  }
  /// Whether all groups have the same size.
  bool uniform() const noexcept {
    for (const auto& v : members)
      if (v.size() != members.front().size()) return false;
    return true;
  }
};

/// The groups of `c`: blocks of `group_size` when it is positive, else by
/// node when the transport knows nodes, else one group of all ranks.
template <transport C> rank_groups groups_of(const C& c, int group_size) {
  if (group_size > 0) return rank_groups::blocks(c.size(), group_size);
  if constexpr (node_aware<C>) return rank_groups::by(c.size(), [&](int r) { return c.node_of(r); });
  return rank_groups::blocks(c.size(), c.size());
}

/// Ranks `members` of a parent communicator, renumbered 0..members.size()-1.
/// Holds a reference: the parent must outlive the view.
template <transport C> class subgroup {
public:
  static constexpr std::string_view name = "subgroup";

  /// View of `parent` restricted to `members` (distinct parent ranks that
  /// include the caller's), with every tag shifted by `tag_shift`.
  subgroup(C& parent, std::vector<int> members, int tag_shift = 0)
      : parent_(&parent), members_(std::move(members)), shift_(tag_shift) {
    const int pr = parent.rank();
    const char* op = "subgroup";
    std::vector<int> sorted = members_;
    std::sort(sorted.begin(), sorted.end());
    GRADSYNC_REQUIRE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), op, pr,
            "a parent rank is listed twice");
    for (int m : members_)
      GRADSYNC_REQUIRE(m >= 0 && m < parent.size(), op, pr,
              "member " + std::to_string(m) + " out of range [0, " + std::to_string(parent.size()) + ")");
    const auto it = std::find(members_.begin(), members_.end(), pr);
    GRADSYNC_REQUIRE(it != members_.end(), op, pr, "the calling rank is not a member");
    rank_ = static_cast<int>(it - members_.begin());
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return static_cast<int>(members_.size()); }
  /// The parent's rank of local rank `r`.
  int parent_rank(int r) const { return members_.at(static_cast<std::size_t>(r)); }
  C& parent() const noexcept { return *parent_; }

  auto isend(std::span<const std::byte> data, int peer, int tag) {
    return parent_->isend(data, to_parent(peer, "subgroup.send"), shifted(tag, "subgroup.send"));
  }
  auto irecv(std::span<std::byte> data, int peer, int tag) {
    return parent_->irecv(data, to_parent(peer, "subgroup.recv"), shifted(tag, "subgroup.recv"));
  }
  /// Synchronous send, when the parent has it.
  auto issend(std::span<const std::byte> data, int peer, int tag)
    requires synchronous_sender<C>
  {
    return parent_->issend(data, to_parent(peer, "subgroup.send"), shifted(tag, "subgroup.send"));
  }
  /// Receive of up to `capacity.size()` bytes, when the parent has it.
  auto irecv_upto(std::span<std::byte> capacity, int peer, int tag)
    requires upto_receiver<C>
  {
    return parent_->irecv_upto(capacity, to_parent(peer, "subgroup.recv"), shifted(tag, "subgroup.recv"));
  }
  /// Node of local rank `r`, when the parent knows nodes.
  int node_of(int r) const
    requires node_map<C>
  {
    return parent_->node_of(parent_rank(r));
  }
  /// Aborts the parent (every rank of it, not only this view's), when the
  /// parent can abort.
  void abort(const std::string& reason)
    requires abortable<C>
  {
    parent_->abort(reason);
  }
  /// The parent's timeout (a view has none of its own), when it has one.
  std::chrono::milliseconds timeout() const
    requires timed<C>
  {
    return parent_->timeout();
  }
  void set_timeout(std::chrono::milliseconds t)
    requires timed<C>
  {
    parent_->set_timeout(t);
  }
  /// The parent's timeline (its events carry the parent's rank), when it has one.
  timeline* trace() const
    requires traced<C>
  {
    return parent_->trace();
  }

private:
  int shifted(int tag, const char* op) const {
    GRADSYNC_REQUIRE(shift_ >= 0 ? tag <= std::numeric_limits<int>::max() - shift_
                                 : tag >= std::numeric_limits<int>::min() - shift_,
                     op, rank_, "tag " + std::to_string(tag) + " + the view's shift " + std::to_string(shift_) +
                                    " overflows int");
    return tag + shift_;
  }
  int to_parent(int peer, const char* op) const {
    GRADSYNC_REQUIRE(peer >= 0 && peer < size(), op, rank_,
            "peer " + std::to_string(peer) + " out of range [0, " + std::to_string(size()) + ")");
    return members_[static_cast<std::size_t>(peer)];
  }
  C* parent_;
  std::vector<int> members_;
  int shift_ = 0;
  int rank_ = 0;
};

namespace detail {
// A view has exactly the capabilities of its parent that it can forward.
template <class C>
inline constexpr bool subgroup_forwards =
    upto_receiver<subgroup<C>> == upto_receiver<C> && node_map<subgroup<C>> == node_map<C> &&
    abortable<subgroup<C>> == abortable<C> && timed<subgroup<C>> == timed<C> && traced<subgroup<C>> == traced<C> &&
    synchronous_sender<subgroup<C>> == synchronous_sender<C> && !shared_arena<subgroup<C>>;
} // namespace detail

} // namespace gradsync
