// torch_gradsync: the engine over gradsync's shared-memory transport, and
// the helpers every build has.
#include <gradsync/transport/shm.hpp>

#include "engine_impl.hpp"

namespace torch_gradsync {

std::size_t elem_bytes(elem t) {
  return detail::with_elem(t, [](auto v) { return sizeof(v); });
}

std::unique_ptr<engine> make_shm_engine(int rank, int size, const std::function<std::string(const std::string&)>& share,
                                        std::chrono::milliseconds timeout) {
  gradsync::shm::communicator comm(rank, size, share);
  comm.set_timeout(timeout);
  return std::make_unique<detail::engine_on<gradsync::shm::communicator>>(std::move(comm));
}

} // namespace torch_gradsync
