// gradsync: Bruck's alltoall for equal blocks: ceil(log2 p) rounds instead
// of p - 1 messages, for small blocks and many ranks, where the per-message
// latency outweighs sending each byte about log2(p) / 2 times.
//
//   rotate:  tmp[i] = this rank's block for rank r + i (mod p)
//   round k = 1, 2, 4, ... < p: send every tmp[i] with bit k of i set to
//            r + k, receive the same positions from r - k (packed)
//   unrotate: out[r - i (mod p)] = tmp[i]
//
// After the rounds, tmp[i] holds the block rank r - i sent to r: each round
// moves a block k ranks further, and the bits of i add up to its distance.
// Cost: ceil(log2 p) (alpha + beta m ceil(p / 2)) for blocks of m bytes,
// plus three local copies of the p blocks. Any p, no power of two needed.
#pragma once

#include <cstddef>
#include <cstring>

#include "exchange.hpp"

namespace gradsync::algo::alltoall_bruck {

/// Scratch bytes for p blocks of `block` bytes: the rotated blocks and two
/// packing buffers (a round moves at most ceil(p / 2) blocks).
inline std::size_t scratch_bytes(int p, std::size_t block) {
  const auto n = static_cast<std::size_t>(p);
  return p <= 1 ? 0 : block * (n + 2 * (n - n / 2));
}

/// Equal-block alltoall: `send` and `recv` hold p blocks of `block` bytes
/// each (the same buffer for in place), `scratch` scratch_bytes(p, block).
template <transport C>
void run(C& c, const std::byte* send, std::byte* recv, std::size_t block, int tag, std::byte* scratch) {
  const int p = c.size(), r = c.rank();
  const auto np = static_cast<std::size_t>(p);
  if (p == 1) {
    if (block != 0 && send != recv) std::memmove(recv, send, block);
    return;
  }
  std::byte* tmp = scratch;
  const std::size_t half = np - np / 2;
  std::byte* out_pack = tmp + block * np;
  std::byte* in_pack = out_pack + block * half;
  for (std::size_t i = 0; i < np; ++i)
    if (block != 0) std::memcpy(tmp + i * block, send + ((static_cast<std::size_t>(r) + i) % np) * block, block);
  for (int k = 1; k < p; k <<= 1) {
    std::size_t n = 0;
    for (std::size_t i = 1; i < np; ++i)
      if (i & static_cast<std::size_t>(k)) {
        if (block != 0) std::memcpy(out_pack + n * block, tmp + i * block, block);
        ++n;
      }
    exchange::pending<C> round;
    round.recvs.push_back(c.irecv(std::span<std::byte>(in_pack, n * block), (r - k + p) % p, tag));
    round.sends.push_back(c.isend(std::span<const std::byte>(out_pack, n * block), (r + k) % p, tag));
    round.wait();
    n = 0;
    for (std::size_t i = 1; i < np; ++i)
      if (i & static_cast<std::size_t>(k)) {
        if (block != 0) std::memcpy(tmp + i * block, in_pack + n * block, block);
        ++n;
      }
  }
  for (std::size_t i = 0; i < np; ++i)
    if (block != 0) std::memcpy(recv + ((static_cast<std::size_t>(r) + np - i) % np) * block, tmp + i * block, block);
}

} // namespace gradsync::algo::alltoall_bruck
