// torch_gradsync: stand-in for the distributed-autograd context header that
// c10d/reducer.hpp includes and Debian's libtorch-dev 1.13 does not ship.
// reducer.hpp uses two names from it: DistAutogradContext::GradCallback (in a
// static_assert) and ContextPtr (a member's type). Both are declared as the
// real header declares them, so the Reducer's layout is unchanged. This
// directory is searched after the system's (-idirafter): a torch that ships
// the real header uses it.
#pragma once

#include <functional>
#include <memory>

#include <ATen/core/Tensor.h>

namespace torch::distributed::autograd {

class DistAutogradContext {
public:
  using GradCallback = std::function<bool(at::Tensor&)>;
};
using ContextPtr = std::shared_ptr<DistAutogradContext>;

} // namespace torch::distributed::autograd
