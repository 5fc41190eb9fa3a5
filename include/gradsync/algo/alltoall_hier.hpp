// gradsync: the two-level alltoall for equal blocks, for many ranks per node
// behind a shared network link: one message per pair of groups (nodes)
// crosses between groups, so a small-block alltoall pays the network's
// per-message latency and small-message inefficiency once per node pair
// instead of once per rank pair.
//
// Groups n = 0..N-1 (any sizes g_n; rank = member l of group n). Member
// n' mod g_n of group n carries n's traffic to group n', and member
// n mod g_n' of n' receives it:
//   A (inside the group): each rank sends member j its block for member j
//     itself (final) and its blocks for every rank of the groups j carries;
//   B (across groups, one message per group pair): the carrier sends the
//     receiving member of n' the g_n x g_n' blocks of n's ranks for n''s
//     ranks, ordered by destination;
//   C (inside the group): the receiving member hands each member of its
//     group the blocks for it from every group it received.
// With N groups of g a rank sends g - 1 messages of ~N blocks in A and in
// C and ~(N - 1) / g messages of g^2 blocks in B (p - 1 single blocks in a
// flat schedule), and every byte crosses a group boundary once.
//
// B runs in steps d = 1..N-1 (group n sends to n + d, receives from n - d),
// windowed as the scattered schedule, so a window never waits on a message
// its peer posts in a later one. Cost (equal groups): 2 (g - 1)(alpha_in +
// N m beta_in) + ceil((N - 1) / g)(alpha_out + g^2 m beta_out) plus four
// local passes over the p blocks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "../transport/subgroup.hpp"
#include "exchange.hpp"

namespace gradsync::algo::alltoall_hier {

/// What rank r needs of groups `g`: its group, its index there, and how
/// many ranks live in the remote groups each member of its group carries.
struct place {
  int group = 0, index = 0, size = 1;
  std::vector<std::size_t> remote; // member j -> ranks of the groups n' != n with n' mod size == j

  place(const rank_groups& g, int r) {
    group = g.group_of[static_cast<std::size_t>(r)];
    const auto& mine = g.members[static_cast<std::size_t>(group)];
    index = static_cast<int>(std::find(mine.begin(), mine.end(), r) - mine.begin());
    size = static_cast<int>(mine.size());
    remote.assign(static_cast<std::size_t>(size), 0);
    for (int n = 0; n < g.count(); ++n)
      if (n != group) remote[static_cast<std::size_t>(n % size)] += g.members[static_cast<std::size_t>(n)].size();
  }
  /// Blocks this rank carries for the group (its index's groups).
  std::size_t carried() const { return remote[static_cast<std::size_t>(index)]; }
};

/// Scratch bytes rank r needs for blocks of `block` bytes: its packed input
/// (p blocks; later what phase C brings), what phase A brings (g(1 + R)
/// blocks, R = carried()), and phase B's outgoing and incoming blocks (g R
/// each; the outgoing region serves phase C's sends too).
inline std::size_t scratch_bytes(const rank_groups& g, int r, std::size_t block) {
  const int p = static_cast<int>(g.group_of.size());
  if (p <= 1) return 0;
  const place at(g, r);
  const std::size_t gs = static_cast<std::size_t>(at.size), carried = at.carried();
  return block * (static_cast<std::size_t>(p) + gs * (1 + carried) + 2 * gs * carried);
}

/// Equal-block alltoall over groups `g` (the same on every rank): `send`
/// and `recv` hold p blocks of `block` bytes (the same buffer for in place),
/// `scratch` scratch_bytes(g, rank, block); at most `window` group steps of
/// phase B in flight.
template <transport C>
void run(C& c, const rank_groups& g, const std::byte* send, std::byte* recv, std::size_t block, int tag,
         std::byte* scratch, int window) {
  const int p = c.size(), r = c.rank();
  if (p == 1) {
    if (block != 0 && send != recv) std::memmove(recv, send, block);
    return;
  }
  using std::size_t;
  const place at(g, r);
  const std::vector<int>& mine = g.members[static_cast<size_t>(at.group)];
  const int gs = at.size, l = at.index, n = at.group, groups = g.count();
  const size_t ugs = static_cast<size_t>(gs), carried = at.carried();
  auto members = [&](int k) -> const std::vector<int>& { return g.members[static_cast<size_t>(k)]; };
  auto copy = [block](std::byte* to, const std::byte* from) {
    if (block != 0) std::memcpy(to, from, block);
  };
  auto bytes = [block](size_t blocks) { return block * blocks; };

  // Scratch: packed (p blocks, later phase C's arrivals), gathered (gs
  // parts of 1 + carried), outgoing (gs x carried, phase B then C), incoming.
  std::byte* packed = scratch;
  std::byte* gathered = packed + bytes(static_cast<size_t>(p));
  std::byte* outgoing = gathered + bytes(ugs * (1 + carried));
  std::byte* incoming = outgoing + bytes(ugs * carried);

  // A: part j = [block for member j] + blocks for the groups j carries.
  std::vector<size_t> part(ugs + 1, 0);
  for (size_t j = 0; j < ugs; ++j) part[j + 1] = part[j] + 1 + at.remote[j];
  {
    std::vector<size_t> next(part.begin(), part.end() - 1);
    for (size_t j = 0; j < ugs; ++j) copy(packed + bytes(next[j]++), send + bytes(static_cast<size_t>(mine[j])));
    for (int k = 0; k < groups; ++k)
      if (k != n)
        for (const int q : members(k)) copy(packed + bytes(next[static_cast<size_t>(k % gs)]++), send + bytes(static_cast<size_t>(q)));
  }
  auto part_of = [&](int s) -> const std::byte* { // member s's part for this rank
    return s == l ? packed + bytes(part[static_cast<size_t>(l)]) : gathered + bytes((1 + carried) * static_cast<size_t>(s));
  };
  {
    exchange::pending<C> step;
    for (int k = 1; k < gs; ++k) {
      const int to = (l + k) % gs, from = (l - k + gs) % gs;
      step.recvs.push_back(c.irecv(std::span<std::byte>(gathered + bytes((1 + carried) * static_cast<size_t>(from)), bytes(1 + carried)),
                                   mine[static_cast<size_t>(from)], tag));
      const size_t j = static_cast<size_t>(to);
      step.sends.push_back(c.isend(std::span<const std::byte>(packed + bytes(part[j]), bytes(part[j + 1] - part[j])),
                                   mine[j], tag));
    }
    step.wait();
  }
  // The group's blocks for this rank are final; the carried ones regroup by
  // destination group, then destination rank, then source member.
  std::vector<size_t> at_group(static_cast<size_t>(groups), 0); // offset (blocks) of a carried group's message
  {
    size_t off = 0;
    for (int k = 0; k < groups; ++k)
      if (k != n && k % gs == l) {
        at_group[static_cast<size_t>(k)] = off;
        off += members(k).size() * ugs;
      }
  }
  for (int s = 0; s < gs; ++s) {
    const std::byte* from = part_of(s);
    copy(recv + bytes(static_cast<size_t>(mine[static_cast<size_t>(s)])), from);
    size_t i = 1;
    for (int k = 0; k < groups; ++k)
      if (k != n && k % gs == l)
        for (size_t t = 0; t < members(k).size(); ++t, ++i)
          copy(outgoing + bytes(at_group[static_cast<size_t>(k)] + t * ugs + static_cast<size_t>(s)), from + bytes(i));
  }

  // B, step d: to group n + d (if this rank carries it), from group n - d
  // (if this rank receives for it): one message of g_n x g_k blocks each,
  // arriving ordered by this group's member, then the source (the same
  // offsets: the groups this rank sends to are those it receives from).
  window = std::max(1, window);
  for (int d0 = 1; d0 < groups; d0 += window) {
    exchange::pending<C> batch;
    for (int d = d0; d < std::min(groups, d0 + window); ++d) {
      const int dst = (n + d) % groups, src = (n - d + groups) % groups;
      if (src % gs == l) {
        const auto& them = members(src);
        const int sender = them[static_cast<size_t>(n % static_cast<int>(them.size()))];
        batch.recvs.push_back(c.irecv(std::span<std::byte>(incoming + bytes(at_group[static_cast<size_t>(src)]), bytes(them.size() * ugs)), sender, tag));
      }
      if (dst % gs == l) {
        const auto& them = members(dst);
        const int receiver = them[static_cast<size_t>(n % static_cast<int>(them.size()))];
        batch.sends.push_back(c.isend(std::span<const std::byte>(outgoing + bytes(at_group[static_cast<size_t>(dst)]), bytes(them.size() * ugs)),
                                      receiver, tag));
      }
    }
    batch.wait();
  }

  // C: member t gets, from every group received, the blocks for it (packed
  // into the outgoing region, free again); this rank's own land directly.
  // Member s's arrive in `packed` (free since A): its groups' blocks in
  // group order, each group's in member order.
  std::vector<size_t> arrive(ugs + 1, 0);
  for (size_t s = 0; s < ugs; ++s) arrive[s + 1] = arrive[s] + (s == static_cast<size_t>(l) ? 0 : at.remote[s]);
  for (int t = 0; t < gs; ++t) {
    size_t i = 0;
    for (int k = 0; k < groups; ++k)
      if (k != n && k % gs == l) {
        const auto& them = members(k);
        for (size_t s = 0; s < them.size(); ++s, ++i) {
          const std::byte* b = incoming + bytes(at_group[static_cast<size_t>(k)] + static_cast<size_t>(t) * them.size() + s);
          if (t == l) copy(recv + bytes(static_cast<size_t>(them[s])), b);
          else copy(outgoing + bytes(static_cast<size_t>(t) * carried + i), b);
        }
      }
  }
  {
    exchange::pending<C> step;
    for (int k = 1; k < gs; ++k) {
      const int to = (l + k) % gs, from = (l - k + gs) % gs;
      const size_t f = static_cast<size_t>(from);
      step.recvs.push_back(c.irecv(std::span<std::byte>(packed + bytes(arrive[f]), bytes(at.remote[f])), mine[f], tag));
      step.sends.push_back(c.isend(std::span<const std::byte>(outgoing + bytes(static_cast<size_t>(to) * carried), bytes(carried)),
                                   mine[static_cast<size_t>(to)], tag));
    }
    step.wait();
  }
  for (int s = 0; s < gs; ++s) {
    if (s == l) continue;
    size_t i = arrive[static_cast<size_t>(s)];
    for (int k = 0; k < groups; ++k)
      if (k != n && k % gs == s)
        for (const int q : members(k)) copy(recv + bytes(static_cast<size_t>(q)), packed + bytes(i++));
  }
}

} // namespace gradsync::algo::alltoall_hier
