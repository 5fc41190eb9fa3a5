// gradsync: random-k allreduce with a shared seed. Every rank derives the
// same k indices from (seed, step) (compress/randk.hpp's keyed permutation,
// shared key), so only the k selected values travel: they are gathered into
// a dense k-vector, allreduced by the caller's dense allreduce (2 (p-1)/p k
// elements per rank instead of n) and scattered back; the other elements of
// the result are zero. Every rank gets the same values (the dense allreduce
// is bitwise identical on all ranks).
//
// Scaling: without error feedback the result is the unbiased estimate
// (values times n/k, as the codec decodes); under error feedback unscaled
// (residual = input minus what was sent: the unselected elements), which
// keeps the compressor contractive (compress/randk.hpp).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../compress/randk.hpp"
#include "../core/dtype.hpp"
#include "../core/timeline.hpp"

namespace gradsync::algo::randk_allreduce {

/// Random-k allreduce in place on `data` (n elements): k = codec.entries(n)
/// values at the indices of (seed, step). `values` holds k elements (T) and
/// `index` k entries; `dense(span<T>)` allreduces them on every rank.
/// `residual` (n accumulators or nullptr) gets the unsent elements added.
/// With a timeline, the gather is an "encode" phase and the scatter a "decode".
template <compress::float_element T, class Dense>
void allreduce(const compress::randomk<T>& codec, std::uint64_t seed, std::uint64_t step, T* data, std::size_t n,
               accum_t<T>* residual, std::span<T> values, std::span<std::uint64_t> index, Dense&& dense,
               timeline* trace = nullptr) {
  using A = accum_t<T>;
  const std::size_t k = codec.entries(n);
  {
    const auto phase = element_phase(trace, "encode", "codec", n);
    const compress::random_permutation perm = compress::randomk<T>::permutation(
        seed, static_cast<std::uint32_t>(step), compress::randomk_shared_key, n);
    for (std::size_t j = 0; j < k; ++j) {
      index[j] = perm(j);
      values[j] = data[index[j]];
    }
    if (residual) { // what was not sent is added; what was sent leaves
      for (std::size_t i = 0; i < n; ++i)
        if (const A e = widen(data[i]); std::isfinite(static_cast<double>(e))) residual[i] += e;
      for (std::size_t j = 0; j < k; ++j)
        if (const A e = widen(values[j]); std::isfinite(static_cast<double>(e))) residual[index[j]] -= e;
    }
  }
  dense(values.first(k));
  const auto phase = element_phase(trace, "decode", "codec", n);
  const A scale = residual || !codec.unbiased || k == 0 ? A(1) : static_cast<A>(static_cast<double>(n) / k);
  for (std::size_t i = 0; i < n; ++i) data[i] = T(0.0f);
  for (std::size_t j = 0; j < k; ++j) data[index[j]] = narrow<T>(widen(values[j]) * scale);
}

} // namespace gradsync::algo::randk_allreduce
