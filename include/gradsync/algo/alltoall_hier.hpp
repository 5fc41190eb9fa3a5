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
// Uneven blocks (alltoallv, run_v): the same three phases, after a phase 0
// in which the members of each group exchange their send and receive
// counts (one small message per member pair inside the group), so a carrier
// knows the size of every block it forwards. Phase B's message starts with
// its blocks' counts, which the receiving member compares with its group's
// receive counts: ranks of different groups whose counts disagree are found
// there (errc::mismatch, naming both ranks and both counts), and phase C
// tells the receiving group, so every rank of it fails alike. A plan's runs
// (counts checked pairwise when it was made) skip phase 0 and the counts.
//
// B runs in steps d = 1..N-1 (group n sends to n + d, receives from n - d),
// windowed as the scattered schedule, so a window never waits on a message
// its peer posts in a later one. Cost (equal groups): 2 (g - 1)(alpha_in +
// N m beta_in) + ceil((N - 1) / g)(alpha_out + g^2 m beta_out) plus four
// local passes over the p blocks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
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

/// run_v's message buffers, one per peer and phase. A plan keeps them: a
/// run's sizes repeat, so later runs neither allocate nor zero pages
/// (in-process bench, 4 ranks in groups of 2, skewed blocks up to 1 MiB: a
/// plan's hier run took 13.7 ms with fresh buffers, 1.18 ms with kept ones).
struct buffers {
  std::vector<std::vector<std::byte>> out_a, in_a, out_b, in_b, out_c, in_c;
};

/// The counts of an alltoallv over groups `g` that every member of this
/// rank's group sees (phase 0 of run_v): member s's row is its p send counts
/// then its p receive counts. A plan exchanges them once (its counts are
/// fixed) and passes them to every run_v.
struct group_counts {
  std::vector<std::uint64_t> rows; // (group size) x 2p
  std::size_t p = 0;

  /// Member s's count for rank q: sent (or, `back`, received: a plan run
  /// backwards swaps the two).
  std::uint64_t sent(int s, int q, bool back = false) const { return rows[at(s, back ? p : 0, q)]; }
  std::uint64_t expects(int t, int q, bool back = false) const { return rows[at(t, back ? 0 : p, q)]; }

private:
  std::size_t at(int s, std::size_t half, int q) const {
    return static_cast<std::size_t>(s) * 2 * p + half + static_cast<std::size_t>(q);
  }
};

/// Phase 0 of run_v on its own: this rank's counts (elements) to every
/// member of its group and theirs back (g - 1 messages of 2p counts each way).
template <transport C>
group_counts exchange_counts(C& c, const rank_groups& g, std::span<const std::size_t> send_counts,
                             std::span<const std::size_t> recv_counts, int tag) {
  using std::size_t;
  const int p = c.size();
  const place at(g, c.rank());
  const std::vector<int>& mine = g.members[static_cast<size_t>(at.group)];
  const int gs = at.size, me = at.index;
  const size_t up = static_cast<size_t>(p);
  group_counts k{std::vector<std::uint64_t>(static_cast<size_t>(gs) * 2 * up), up};
  auto row = [&](int s) {
    return std::as_writable_bytes(std::span<std::uint64_t>(k.rows.data() + static_cast<size_t>(s) * 2 * up, 2 * up));
  };
  for (size_t q = 0; q < up; ++q) {
    k.rows[static_cast<size_t>(me) * 2 * up + q] = send_counts[q];
    k.rows[static_cast<size_t>(me) * 2 * up + up + q] = recv_counts[q];
  }
  exchange::pending<C> step;
  for (int d = 1; d < gs; ++d) {
    const int to = (me + d) % gs, from = (me - d + gs) % gs;
    step.recvs.push_back(c.irecv(row(from), mine[static_cast<size_t>(from)], tag));
    step.sends.push_back(c.isend(std::span<const std::byte>(row(me)), mine[static_cast<size_t>(to)], tag));
  }
  step.wait();
  return k;
}

/// Alltoallv over groups `g` (the same on every rank): exchange `l` (counts
/// and displacements in elements of l.elem bytes; not in place). `known`:
/// the group's counts from exchange_counts (a plan's, matching l's counts;
/// `back`: l runs them backwards), or null to exchange them first (phase 0). Scratch is allocated here: its
/// size depends on other ranks' counts, which no local query can know; a
/// caller that runs the same counts again (an exchange plan) passes `keep`,
/// whose buffers then stay allocated between runs. At most `window` group
/// steps of phase B in flight. `op` names the call in errors.
template <transport C>
void run_v(C& c, const rank_groups& g, const exchange::layout& l, int tag, int window, const char* op,
           const group_counts* known = nullptr, bool back = false, buffers* keep = nullptr) {
  using std::size_t;
  using u64 = std::uint64_t;
  const int p = c.size(), r = c.rank();
  exchange::copy_self(l, r);
  if (p == 1) return;
  const place at(g, r);
  const std::vector<int>& mine = g.members[static_cast<size_t>(at.group)];
  const int gs = at.size, me = at.index, n = at.group, groups = g.count();
  const size_t ugs = static_cast<size_t>(gs), e = l.elem;
  auto members = [&](int k) -> const std::vector<int>& { return g.members[static_cast<size_t>(k)]; };
  // The groups this rank carries to and receives from (k mod gs == me).
  auto mine_to_carry = [&](int k) { return k != n && k % gs == me; };

  // Phase 0: every member's send and receive counts.
  group_counts fresh;
  if (!known) fresh = exchange_counts(c, g, l.send_counts, l.recv_counts, tag);
  const group_counts& counts = known ? *known : fresh;
  const bool swap = known && back;
  auto sent = [&](int s, int q) -> u64 { return counts.sent(s, q, swap); };
  auto expects = [&](int t, int q) -> u64 { return counts.expects(t, q, swap); };
  // Two ranks whose counts disagree: what the first difference seen says.
  // The schedule still runs to its end with sizes every peer expects (no
  // rank is left waiting), and then fails: pairs inside the group now (every
  // member sees the same rows, so all fail alike), pairs of two groups in
  // phase B (phase C then tells the receiving group).
  std::string wrong;
  auto disagree = [&](int from, int to, u64 sends, u64 expected) {
    if (wrong.empty())
      wrong = "rank " + std::to_string(from) + " sends rank " + std::to_string(to) + " " + std::to_string(sends) +
              " elements, which expects " + std::to_string(expected);
  };
  for (int s = 0; s < gs; ++s)
    for (int t = 0; t < gs; ++t)
      if (sent(s, mine[static_cast<size_t>(t)]) != expects(t, mine[static_cast<size_t>(s)]))
        disagree(mine[static_cast<size_t>(s)], mine[static_cast<size_t>(t)], sent(s, mine[static_cast<size_t>(t)]),
                 expects(t, mine[static_cast<size_t>(s)]));

  // A: to member j, this rank's block for j, then its blocks for the ranks
  // of the groups j carries (group order, member order).
  auto part_elems = [&](int s, int j) { // what member s sends member j in phase A
    u64 m = sent(s, mine[static_cast<size_t>(j)]);
    for (int k = 0; k < groups; ++k)
      if (k != n && k % gs == j)
        for (const int q : members(k)) m += sent(s, q);
    return m;
  };
  buffers fresh_buffers;
  buffers& bufs = keep ? *keep : fresh_buffers;
  for (auto* v : {&bufs.out_a, &bufs.in_a, &bufs.out_c, &bufs.in_c}) v->resize(ugs);
  for (auto* v : {&bufs.out_b, &bufs.in_b}) v->resize(static_cast<size_t>(groups));
  auto &out_a = bufs.out_a, &in_a = bufs.in_a, &out_b = bufs.out_b, &in_b = bufs.in_b, &out_c = bufs.out_c,
       &in_c = bufs.in_c;
  {
    exchange::pending<C> step;
    for (int k = 1; k < gs; ++k) {
      const int to = (me + k) % gs, from = (me - k + gs) % gs;
      auto& in = in_a[static_cast<size_t>(from)];
      in.resize(static_cast<size_t>(part_elems(from, me)) * e);
      step.recvs.push_back(c.irecv(std::span<std::byte>(in), mine[static_cast<size_t>(from)], tag));
      auto& out = out_a[static_cast<size_t>(to)];
      out.resize(static_cast<size_t>(part_elems(me, to)) * e);
      std::byte* w = out.data();
      auto put = [&](int q) {
        const size_t b = l.send_bytes(q);
        if (b != 0) std::memcpy(w, l.send_at(q), b);
        w += b;
      };
      put(mine[static_cast<size_t>(to)]);
      for (int k2 = 0; k2 < groups; ++k2)
        if (k2 != n && k2 % gs == to)
          for (const int q : members(k2)) put(q);
      step.sends.push_back(c.isend(std::span<const std::byte>(out), mine[static_cast<size_t>(to)], tag));
    }
    step.wait();
  }
  // The group's blocks for this rank are final.
  for (int s = 0; s < gs && wrong.empty(); ++s)
    if (s != me) {
      const size_t b = l.recv_bytes(mine[static_cast<size_t>(s)]);
      if (b != 0) std::memcpy(l.recv_at(mine[static_cast<size_t>(s)]), in_a[static_cast<size_t>(s)].data(), b);
    }
  // Where member s's blocks for the carried groups start in what it sent.
  auto carried_from = [&](int s) -> const std::byte* {
    return s == me ? nullptr : in_a[static_cast<size_t>(s)].data() + static_cast<size_t>(sent(s, mine[static_cast<size_t>(me)])) * e;
  };

  // B, step d: to group n + d (if this rank carries it): a header of
  // |k| x gs counts (destination member, then source member), then the
  // blocks in that order; from group n - d (if this rank receives for it).
  // A plan's run (`known`) sends no header: every rank's counts were checked
  // pairwise when the plan was made (with 8 B blocks on 8-rank groups the
  // header doubled each message: SMPI, 256 ranks, 103 us where the same
  // bytes without it took 65).
  auto header_bytes = [&](std::size_t blocks) { return known ? std::size_t{0} : blocks * sizeof(u64); };
  {
    // Cursor into each member's carried blocks, walking groups in order.
    std::vector<const std::byte*> cursor(ugs);
    for (int s = 0; s < gs; ++s) cursor[static_cast<size_t>(s)] = carried_from(s);
    for (int k = 0; k < groups; ++k) {
      if (!mine_to_carry(k)) continue;
      const auto& them = members(k);
      const size_t hdr = header_bytes(them.size() * ugs);
      u64 total = 0;
      for (const int t : them)
        for (int s = 0; s < gs; ++s) total += sent(s, t);
      auto& out = out_b[static_cast<size_t>(k)];
      out.resize(hdr + static_cast<size_t>(total) * e);
      // Blocks of member s for group k, in k's member order, start at cursor[s].
      std::vector<std::vector<const std::byte*>> from(ugs, std::vector<const std::byte*>(them.size()));
      for (int s = 0; s < gs; ++s)
        for (size_t t = 0; t < them.size(); ++t) {
          if (s == me) {
            from[static_cast<size_t>(s)][t] = l.send_at(them[t]);
          } else {
            from[static_cast<size_t>(s)][t] = cursor[static_cast<size_t>(s)];
            cursor[static_cast<size_t>(s)] += static_cast<size_t>(sent(s, them[t])) * e;
          }
        }
      std::byte* w = out.data() + hdr;
      size_t i = 0;
      for (size_t t = 0; t < them.size(); ++t)
        for (int s = 0; s < gs; ++s, ++i) {
          const u64 m = sent(s, them[t]);
          if (hdr != 0) std::memcpy(out.data() + i * sizeof(u64), &m, sizeof m);
          const size_t b = static_cast<size_t>(m) * e;
          if (b != 0) std::memcpy(w, from[static_cast<size_t>(s)][t], b);
          w += b;
        }
    }
  }
  window = std::max(1, window);
  for (int d0 = 1; d0 < groups; d0 += window) {
    exchange::pending<C> batch;
    for (int d = d0; d < std::min(groups, d0 + window); ++d) {
      const int dst = (n + d) % groups, src = (n - d + groups) % groups;
      if (mine_to_carry(src)) {
        const auto& them = members(src);
        const int sender = them[static_cast<size_t>(n % static_cast<int>(them.size()))];
        u64 total = 0;
        for (int t = 0; t < gs; ++t)
          for (const int s : them) total += expects(t, s);
        auto& in = in_b[static_cast<size_t>(src)];
        in.resize(header_bytes(ugs * them.size()) + static_cast<size_t>(total) * e);
        batch.recvs.push_back(c.irecv(std::span<std::byte>(in), sender, tag));
      }
      if (mine_to_carry(dst)) {
        const auto& them = members(dst);
        const int receiver = them[static_cast<size_t>(n % static_cast<int>(them.size()))];
        batch.sends.push_back(c.isend(std::span<const std::byte>(out_b[static_cast<size_t>(dst)]), receiver, tag));
      }
    }
    try {
      batch.wait();
    } catch (const error& x) { // a size mismatch: this group learns it in phase C
      if (x.kind() != errc::mismatch) throw;
      // Unless the call check saw another call: this rank then stops sending
      // (its group, waiting on it, finds it exchanging fingerprints).
      if constexpr (inband_checked<C>)
        if (c.check_disagreed()) throw;
      if (wrong.empty()) wrong = x.reason();
    }
  }
  // The counts of what arrived against what this group expects.
  for (int k = 0; k < groups && wrong.empty() && !known; ++k) {
    if (!mine_to_carry(k)) continue;
    const auto& them = members(k);
    size_t i = 0;
    for (int t = 0; t < gs; ++t)
      for (size_t s = 0; s < them.size(); ++s, ++i) {
        u64 m;
        std::memcpy(&m, in_b[static_cast<size_t>(k)].data() + i * sizeof(u64), sizeof m);
        if (m != expects(t, them[s])) disagree(them[s], mine[static_cast<size_t>(t)], m, expects(t, them[s]));
      }
  }

  // C: member t gets a status word (0: the counts agreed), then the blocks
  // for it from every group this rank received, group by group, each in
  // source member order; this rank's own land directly.
  auto blocks_of = [&](int k, int t) { // group k's blocks for member t, in what arrived from k
    const auto& them = members(k);
    const std::byte* b = in_b[static_cast<size_t>(k)].data() + header_bytes(ugs * them.size());
    for (int t2 = 0; t2 < t; ++t2)
      for (const int s : them) b += static_cast<size_t>(expects(t2, s)) * e;
    return b;
  };
  const u64 status = wrong.empty() ? 0 : 1;
  for (int t = 0; t < gs; ++t) {
    if (t == me) {
      if (!wrong.empty()) continue;
      for (int k = 0; k < groups; ++k)
        if (mine_to_carry(k)) {
          const std::byte* b = blocks_of(k, me);
          for (const int s : members(k)) {
            const size_t m = l.recv_bytes(s);
            if (m != 0) std::memcpy(l.recv_at(s), b, m);
            b += m;
          }
        }
      continue;
    }
    u64 total = 0;
    for (int k = 0; k < groups; ++k)
      if (mine_to_carry(k))
        for (const int s : members(k)) total += expects(t, s);
    auto& out = out_c[static_cast<size_t>(t)];
    out.resize(sizeof(u64) + static_cast<size_t>(total) * e); // full size even when failed: sizes stay matched
    std::memcpy(out.data(), &status, sizeof status);
    if (status) continue;
    std::byte* w = out.data() + sizeof(u64);
    for (int k = 0; k < groups; ++k)
      if (mine_to_carry(k)) {
        const size_t b = [&] {
          size_t sum = 0;
          for (const int s : members(k)) sum += static_cast<size_t>(expects(t, s)) * e;
          return sum;
        }();
        if (b != 0) std::memcpy(w, blocks_of(k, t), b);
        w += b;
      }
  }
  {
    exchange::pending<C> step;
    for (int k = 1; k < gs; ++k) {
      const int to = (me + k) % gs, from = (me - k + gs) % gs;
      size_t bytes = 0; // what member `from` receives for this rank
      for (int k2 = 0; k2 < groups; ++k2)
        if (k2 != n && k2 % gs == from)
          for (const int s : members(k2)) bytes += l.recv_bytes(s);
      auto& in = in_c[static_cast<size_t>(from)];
      in.resize(sizeof(u64) + bytes);
      step.recvs.push_back(c.irecv(std::span<std::byte>(in), mine[static_cast<size_t>(from)], tag));
      step.sends.push_back(c.isend(std::span<const std::byte>(out_c[static_cast<size_t>(to)]), mine[static_cast<size_t>(to)], tag));
    }
    step.wait();
  }
  if (!wrong.empty()) throw error(errc::mismatch, op, r, -1, wrong);
  for (int s = 0; s < gs; ++s) {
    if (s == me) continue;
    const auto& in = in_c[static_cast<size_t>(s)];
    u64 st;
    std::memcpy(&st, in.data(), sizeof st);
    if (st != 0)
      throw error(errc::mismatch, op, r, mine[static_cast<size_t>(s)],
                  "rank " + std::to_string(mine[static_cast<size_t>(s)]) +
                      " received counts from another group that disagree with its receivers' (its error names them)");
    const std::byte* b = in.data() + sizeof(u64);
    for (int k = 0; k < groups; ++k)
      if (k != n && k % gs == s)
        for (const int q : members(k)) {
          const size_t m = l.recv_bytes(q);
          if (m != 0) std::memcpy(l.recv_at(q), b, m);
          b += m;
        }
  }
}

} // namespace gradsync::algo::alltoall_hier
