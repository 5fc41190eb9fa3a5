// gradsync: the exchange phase of every gossip operation. One step's mixing
// matrix says whom a rank hears (its row) and whom it sends to (its column);
// exchange() posts every receive, then every send, then waits for all, so a
// round costs one message latency however many neighbours there are (and a
// rendezvous transport such as inproc cannot deadlock on the order). Plain
// point-to-point only: no neighbourhood collectives, no threads, so it runs
// on every transport (MPI at MPI_THREAD_SINGLE, SMPI included).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "../algo/verify.hpp"
#include "../core/dtype.hpp"
#include "../core/hash.hpp"
#include "../transport/capabilities.hpp"
#include "../transport/transport.hpp"
#include "topology.hpp"

namespace gradsync::gossip {

/// One message stream of an exchange: `send` goes to every out-neighbour
/// with `tag`; in-neighbour k's message lands at recv + k * stride (exactly
/// send.size() bytes, or up to `stride` when `upto`).
struct lane {
  std::span<const std::byte> send;
  std::byte* recv = nullptr;
  std::size_t stride = 0;
  int tag = 0;
  bool upto = false;
};

namespace detail {
// The fingerprint of a gossip round over `count` elements of T: the codec
// field folds the step's matrix, the step number and `extra` (a codec's
// parameters), so ranks on different graphs, steps or codecs disagree.
template <class T>
call_fingerprint round_fingerprint(call_kind k, std::size_t count, const mixing& m, std::uint64_t step,
                                   std::uint64_t extra = 0) {
  call_fingerprint f;
  f.kind = k;
  f.dt = static_cast<std::uint8_t>(dtype_traits<T>::id);
  f.count = count;
  const std::uint64_t h = gradsync::detail::fnv1a(gradsync::detail::fnv1a(m.hash(), step), extra);
  f.codec = h ? h : 1;
  return f;
}
} // namespace detail

/// Bytes received per lane and in-neighbour (only filled for `upto` lanes).
using received_sizes = std::vector<std::vector<std::size_t>>;

/// Exchanges the lanes with rank c.rank()'s neighbours in `m`: every rank
/// of the communicator must call it with the same matrix and lane shapes.
/// Returns the bytes this rank sent.
template <transport C>
std::size_t exchange(C& c, const mixing& m, std::span<const lane> lanes, received_sizes* sizes = nullptr) {
  const int r = c.rank();
  const auto in = m.in(r);
  const auto out = m.out(r);
  for (const lane& l : lanes)
    GRADSYNC_REQUIRE(!l.upto || upto_receiver<C>, "gossip.exchange", r,
                     std::string("transport '") + std::string(C::name) + "' cannot receive messages of varying size");
  std::vector<decltype(c.irecv(std::span<std::byte>(), 0, 0))> recvs;
  std::vector<decltype(c.isend(std::span<const std::byte>(), 0, 0))> sends;
  recvs.reserve(in.size() * lanes.size());
  sends.reserve(out.size() * lanes.size());
  for (const lane& l : lanes)
    if (!l.upto)
      for (std::size_t k = 0; k < in.size(); ++k)
        recvs.push_back(c.irecv(std::span<std::byte>(l.recv + k * l.stride, l.send.size()), in[k].peer, l.tag));
  const auto send_all = [&] {
    std::size_t sent = 0;
    for (const lane& l : lanes)
      for (const edge& e : out) {
        sends.push_back(c.isend(l.send, e.peer, l.tag));
        sent += l.send.size();
      }
    return sent;
  };
  std::size_t sent = 0;
  if constexpr (upto_receiver<C>) {
    std::vector<decltype(c.irecv_upto(std::span<std::byte>(), 0, 0))> ups;
    for (const lane& l : lanes)
      if (l.upto)
        for (std::size_t k = 0; k < in.size(); ++k)
          ups.push_back(c.irecv_upto(std::span<std::byte>(l.recv + k * l.stride, l.stride), in[k].peer, l.tag));
    sent = send_all();
    for (auto& q : recvs) q.wait();
    if (sizes) sizes->assign(lanes.size(), std::vector<std::size_t>(in.size(), 0));
    std::size_t u = 0;
    for (std::size_t li = 0; li < lanes.size(); ++li)
      if (lanes[li].upto)
        for (std::size_t k = 0; k < in.size(); ++k, ++u) {
          ups[u].wait();
          if (sizes) (*sizes)[li][k] = ups[u].received();
        }
  } else {
    sent = send_all();
    for (auto& q : recvs) q.wait();
  }
  for (auto& q : sends) q.wait();
  return sent;
}

/// The combine phase: x <- W[i][i] x + sum_k W[i][j_k] recv_k, computed with
/// the executor's axpby as x = w_1 recv_1 + W[i][i] x, then x = w_k recv_k + x
/// for k = 2.. in the order the row lists them (so a serial reference that
/// follows that order reproduces it bit for bit). A rank with no in-neighbour
/// keeps x (multiplied by its self weight when that is not 1, which only
/// a column-stochastic matrix allows).
/// In-neighbour k's vector is at from[k] (shared memory reads them in place).
template <class E, class T>
void combine_neighbors(E& ex, const mixing& m, int rank, T* x, const T* const* from, std::size_t n) {
  const auto in = m.in(rank);
  if (in.empty()) {
    if (m.self(rank) != 1.0) ex.axpby(x, 0.0, x, m.self(rank), n);
    return;
  }
  for (std::size_t k = 0; k < in.size(); ++k) ex.axpby(x, in[k].weight, from[k], k == 0 ? m.self(rank) : 1.0, n);
}

/// The same combine with the received vectors one after another at recv.
template <class E, class T>
void combine_neighbors(E& ex, const mixing& m, int rank, T* x, const T* recv, std::size_t n) {
  std::vector<const T*> from(m.in(rank).size());
  for (std::size_t k = 0; k < from.size(); ++k) from[k] = recv + k * n;
  combine_neighbors(ex, m, rank, x, static_cast<const T* const*>(from.data()), n);
}

/// The same combine on one double (push-sum's weight), in the same order.
inline double combine_scalar(const mixing& m, int rank, double x, const double* recv) {
  const auto in = m.in(rank);
  if (in.empty()) return m.self(rank) * x;
  for (std::size_t k = 0; k < in.size(); ++k) x = in[k].weight * recv[k] + (k == 0 ? m.self(rank) : 1.0) * x;
  return x;
}

/// The largest in-degree of any rank over one period of `g` (scratch sizing).
inline std::size_t max_in_degree(const graph& g, int rank) {
  std::size_t d = 0;
  for (std::size_t t = 0; t < g.period(); ++t)
    if (rank >= 0 && rank < g.at(t).size()) d = std::max(d, g.at(t).in(rank).size());
  return d;
}

} // namespace gradsync::gossip
