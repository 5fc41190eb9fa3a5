// torch_gradsync: the boundary between the PyTorch extension (extension.cpp,
// compiled as C++17 against torch's headers) and gradsync (engine_*.cpp,
// C++20). Nothing here names a torch or a gradsync type, so each side
// compiles with its own standard and only one translation unit pays for
// torch's headers.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace torch_gradsync {

/// Element types the engine reduces (the ones gradsync has).
enum class elem { f32, f64, f16, bf16, i32, i64 };
/// Reductions (torch's SUM, PRODUCT, MIN, MAX and AVG).
enum class red { sum, prod, min, max, avg };

/// Bytes per element of `t`.
std::size_t elem_bytes(elem t);

/// DDP gradient compression of one hook: codec by name, error feedback per
/// bucket (keyed by the bucket's index), averaging over ranks.
class compressor {
public:
  virtual ~compressor() = default;
  /// Averages `count` floats of `t` (f32, f64, f16 or bf16) at `data` over
  /// every rank, compressed, in place; state of bucket `key` kept across calls.
  virtual void allreduce_mean(void* data, std::size_t count, elem t, std::size_t key) = 0;
  /// Path the last call took ("ring", "sparse", "dense", ...).
  virtual std::string last_path() const = 0;
};

/// One rank's gradsync communicator and the collectives the process group
/// runs on it. Every method throws std::exception (gradsync::error) on bad
/// input or a failed peer; calls are serialised (any thread may call).
class engine {
public:
  virtual ~engine() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "shm" or "mpi".
  virtual std::string transport() const = 0;
  virtual void allreduce(void* data, std::size_t count, elem t, red op) = 0;
  /// `in`: size() blocks of `block` elements; `out`: `block` elements.
  virtual void reduce_scatter(const void* in, void* out, std::size_t block, elem t, red op) = 0;
  /// `out`: size() blocks of `count` elements.
  virtual void allgather(const void* in, void* out, std::size_t count, elem t) = 0;
  virtual void broadcast(void* data, std::size_t count, elem t, int root) = 0;
  /// `out` is written at the root only.
  virtual void reduce(const void* in, void* out, std::size_t count, elem t, red op, int root) = 0;
  virtual void barrier() = 0;
  /// A compressor running codec `codec` ("int8", "topk:0.01", "powersgd:rank=4",
  /// "automatic[:CODEC]", "none"); throws for an unknown codec.
  virtual std::unique_ptr<compressor> make_compressor(const std::string& codec) = 0;
};

/// Joins the shared-memory group of `size` processes on this machine; the
/// segment's name travels through `share` (rank 0 passes it, the others
/// receive it: torch's Store).
std::unique_ptr<engine> make_shm_engine(int rank, int size, const std::function<std::string(const std::string&)>& share,
                                        std::chrono::milliseconds timeout);

/// True when built with MPI and this process was started by mpiexec.
bool mpi_launched();
/// MPI_COMM_WORLD (initialising MPI if needed); its rank and size must equal
/// `rank` and `size`.
std::unique_ptr<engine> make_mpi_engine(int rank, int size, std::chrono::milliseconds timeout);

} // namespace torch_gradsync
