// torch_gradsync: a torch.distributed backend named "gradsync" and a DDP
// communication hook, both running gradsync's collectives (engine.hpp).
//
// `import torch_gradsync` registers the backend with
// torch.distributed.Backend.register_backend; init_process_group("gradsync")
// then calls create() with the Store torch hands every backend. Under
// mpiexec the group runs over MPI, otherwise the processes (on one machine)
// join a shared-memory segment whose name rank 0 publishes in the Store.
//
// Arguments are checked in the call (bad input raises there); the collective
// itself runs on the group's worker thread in call order, as Gloo's and
// NCCL's groups do, so a call returns at once and DDP's backward goes on
// computing while its buckets are reduced. Errors of the run (ranks that
// disagree, a dead peer) raise from Work.wait() as RuntimeError naming the
// op and the rank.
#include <torch/extension.h>

#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <string>
#include <utility>
#include <vector>

#include "engine.hpp"

namespace torch_gradsync {
namespace {

// Runs f, turning any std::exception into a c10::Error (RuntimeError in Python).
template <class F> void guarded(F&& f) {
  try {
    f();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what());
  }
}

[[noreturn]] void fail(const char* op, int rank, const std::string& why) {
  TORCH_CHECK(false, "gradsync: ", op, " (rank ", rank, "): ", why);
}

// gradsync's element type for a reduction over `t`.
elem reduce_elem(const at::Tensor& t, const char* op, int rank) {
  switch (t.scalar_type()) {
  case at::kFloat: return elem::f32;
  case at::kDouble: return elem::f64;
  case at::kHalf: return elem::f16;
  case at::kBFloat16: return elem::bf16;
  case at::kInt: return elem::i32;
  case at::kLong: return elem::i64;
  default:
    fail(op, rank, std::string("dtype ") + c10::toString(t.scalar_type()) +
                       " is not supported (float32, float64, float16, bfloat16, int32, int64)");
  }
}

// For ops that only move bytes, any dtype: its bytes as elements of 8, 4 or 2
// bytes (or of its own type). Returns the element type and scales `count`.
elem move_elem(const at::Tensor& t, std::size_t& count, const char* op, int rank) {
  switch (t.scalar_type()) {
  case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16: case at::kInt: case at::kLong:
    return reduce_elem(t, op, rank);
  default: break;
  }
  const std::size_t bytes = count * t.element_size();
  for (const auto& [e, w] : {std::pair{elem::i64, 8u}, std::pair{elem::i32, 4u}, std::pair{elem::f16, 2u}})
    if (bytes % w == 0) {
      count = bytes / w;
      return e;
    }
  fail(op, rank, std::string("dtype ") + c10::toString(t.scalar_type()) + " with an odd byte count (" +
                     std::to_string(bytes) + ") is not supported");
}

red reduction(const c10d::ReduceOp& o, const char* op, int rank) {
  switch (static_cast<c10d::ReduceOp::RedOpType>(o)) {
  case c10d::ReduceOp::SUM: return red::sum;
  case c10d::ReduceOp::PRODUCT: return red::prod;
  case c10d::ReduceOp::MIN: return red::min;
  case c10d::ReduceOp::MAX: return red::max;
  case c10d::ReduceOp::AVG: return red::avg;
  default: fail(op, rank, "reduce op is not supported (SUM, PRODUCT, MIN, MAX, AVG)");
  }
}

void check_tensor(const at::Tensor& t, const char* op, int rank, const char* what) {
  if (!t.defined()) fail(op, rank, std::string(what) + " is undefined");
  if (!t.device().is_cpu()) fail(op, rank, std::string(what) + " is on " + t.device().str() + ": CPU tensors only");
  if (t.is_sparse()) fail(op, rank, std::string(what) + " is sparse: dense tensors only");
}

const at::Tensor& single(const std::vector<at::Tensor>& ts, const char* op, int rank) {
  if (ts.size() != 1) fail(op, rank, "takes one tensor per process, got " + std::to_string(ts.size()));
  check_tensor(ts[0], op, rank, "tensor");
  return ts[0];
}

void same_layout(const at::Tensor& a, const at::Tensor& b, const char* op, int rank, const std::string& what) {
  if (a.scalar_type() != b.scalar_type())
    fail(op, rank, what + " has dtype " + c10::toString(b.scalar_type()) + ", the input " +
                       c10::toString(a.scalar_type()));
  if (a.numel() != b.numel())
    fail(op, rank, what + " holds " + std::to_string(b.numel()) + " elements, the input " +
                       std::to_string(a.numel()));
}

// Writes a contiguous result back into `t` when `t` was not contiguous itself.
void write_back(const at::Tensor& t, const at::Tensor& c) {
  if (!c.is_same(t)) t.copy_(c);
}

// A Work completed by the worker once its collective has run (or failed).
class async_work final : public c10d::Work {
public:
  async_work(int rank, c10d::OpType type, std::vector<at::Tensor> result)
      : Work(rank, type), result_(std::move(result)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}
  /// On the worker, once: the future first (DDP waits on it), then wait().
  void complete(std::exception_ptr error) {
    if (error)
      future_->setError(error);
    else
      future_->markCompleted(c10::IValue(result_));
    finish(error);
  }
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

private:
  std::vector<at::Tensor> result_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// One thread running posted tasks in order; the destructor runs what is
// still queued, then joins (a group never drops a collective it accepted).
class worker {
public:
  worker() : thread_([this] { loop(); }) {}
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;
  ~worker() {
    {
      const std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    // A group destroyed from Python (at exit, or when the last reference
    // goes) holds the GIL here, while the worker's last task may need it
    // (completing a future runs Python callbacks; a tensor's deleter): join
    // without it, or both wait forever (seen in tests/torch/test_errors.py).
    if (Py_IsInitialized() && PyGILState_Check()) {
      pybind11::gil_scoped_release nogil;
      thread_.join();
    } else {
      thread_.join();
    }
  }
  void post(std::function<void()> task) {
    {
      const std::lock_guard lock(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

private:
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task(); // tasks catch their own errors
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_; // last: starts once the rest is built
};

} // namespace

class ProcessGroupGradsync final : public c10d::ProcessGroup {
public:
  ProcessGroupGradsync(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout)
      : ProcessGroup(rank, size) {
    guarded([&] {
      if (mpi_launched()) {
        engine_ = make_mpi_engine(rank, size, timeout);
        return;
      }
      // Rank 0 publishes the segment's name (empty: it failed); the others wait for it.
      const std::string key = "gradsync/shm-segment";
      const auto share = [&](const std::string& name) -> std::string {
        if (rank == 0) {
          store->set(key, std::vector<uint8_t>(name.begin(), name.end()));
          return name;
        }
        store->wait({key}, timeout);
        const std::vector<uint8_t> v = store->get(key);
        return std::string(v.begin(), v.end());
      };
      engine_ = make_shm_engine(rank, size, share, timeout);
    });
    init();
  }

  const std::string getBackendName() const override { return "gradsync"; }
  /// "shm" or "mpi".
  std::string transport() const { return engine_->transport(); }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const char* op = "allreduce";
    single(tensors, op, rank_);
    at::Tensor& t = tensors[0];
    const elem e = reduce_elem(t, op, rank_);
    const red r = reduction(opts.reduceOp, op, rank_);
    return run(c10d::OpType::ALLREDUCE, tensors, [this, t, c = t.contiguous(), e, r]() mutable {
      engine_->allreduce(c.data_ptr(), static_cast<std::size_t>(c.numel()), e, r);
      write_back(t, c);
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    const char* op = "allreduce_coalesced";
    struct part {
      at::Tensor t, c;
      elem e;
    };
    std::vector<part> parts;
    for (auto& t : tensors) {
      check_tensor(t, op, rank_, "tensor");
      parts.push_back({t, t.contiguous(), reduce_elem(t, op, rank_)});
    }
    const red r = reduction(opts.reduceOp, op, rank_);
    return run(c10d::OpType::ALLREDUCE_COALESCED, tensors, [this, parts, r]() mutable {
      for (auto& x : parts) {
        engine_->allreduce(x.c.data_ptr(), static_cast<std::size_t>(x.c.numel()), x.e, r);
        write_back(x.t, x.c);
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const char* op = "broadcast";
    single(tensors, op, rank_);
    at::Tensor& t = tensors[0];
    check_root(opts.rootRank, opts.rootTensor, op);
    at::Tensor c = t.contiguous();
    std::size_t n = static_cast<std::size_t>(c.numel());
    const elem e = move_elem(c, n, op, rank_);
    const int root = static_cast<int>(opts.rootRank);
    return run(c10d::OpType::BROADCAST, tensors, [this, t, c, n, e, root]() mutable {
      engine_->broadcast(c.data_ptr(), n, e, root);
      write_back(t, c);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    const char* op = "reduce";
    single(tensors, op, rank_);
    at::Tensor& t = tensors[0];
    check_root(opts.rootRank, opts.rootTensor, op);
    const elem e = reduce_elem(t, op, rank_);
    const red r = reduction(opts.reduceOp, op, rank_);
    const int root = static_cast<int>(opts.rootRank);
    return run(c10d::OpType::REDUCE, tensors, [this, t, c = t.contiguous(), e, r, root]() mutable {
      engine_->reduce(c.data_ptr(), c.data_ptr(), static_cast<std::size_t>(c.numel()), e, r, root);
      write_back(t, c);
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    const char* op = "allgather";
    const at::Tensor& in = single(inputs, op, rank_);
    if (outputs.size() != 1) fail(op, rank_, "takes one output list per process, got " + std::to_string(outputs.size()));
    auto& outs = outputs[0];
    if (outs.size() != static_cast<std::size_t>(size_))
      fail(op, rank_, "output list holds " + std::to_string(outs.size()) + " tensors, the group " +
                          std::to_string(size_) + " ranks");
    for (std::size_t q = 0; q < outs.size(); ++q) {
      check_tensor(outs[q], op, rank_, "output");
      same_layout(in, outs[q], op, rank_, "output " + std::to_string(q));
    }
    at::Tensor flat = at::empty({static_cast<int64_t>(size_) * in.numel()}, in.options());
    auto gather = gather_task(flat, in, op);
    return run(c10d::OpType::ALLGATHER, outs, [gather, flat, outs, n = in.numel()]() mutable {
      gather();
      for (std::size_t q = 0; q < outs.size(); ++q)
        outs[q].copy_(flat.narrow(0, static_cast<int64_t>(q) * n, n).view(outs[q].sizes()));
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    const char* op = "_allgather_base";
    check_tensor(input, op, rank_, "input");
    check_tensor(output, op, rank_, "output");
    if (output.scalar_type() != input.scalar_type() || output.numel() != input.numel() * size_)
      fail(op, rank_, "output must hold ranks x input = " + std::to_string(size_) + " x " +
                          std::to_string(input.numel()) + " elements of the input's dtype, holds " +
                          std::to_string(output.numel()) + " of " + c10::toString(output.scalar_type()));
    at::Tensor c = output.contiguous();
    auto gather = gather_task(c, input, op);
    return run(c10d::OpType::_ALLGATHER_BASE, {output}, [gather, output, c]() mutable {
      gather();
      write_back(output, c);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const char* op = "reduce_scatter";
    single(outputs, op, rank_);
    at::Tensor& out = outputs[0];
    if (inputs.size() != 1) fail(op, rank_, "takes one input list per process, got " + std::to_string(inputs.size()));
    auto& ins = inputs[0];
    if (ins.size() != static_cast<std::size_t>(size_))
      fail(op, rank_, "input list holds " + std::to_string(ins.size()) + " tensors, the group " +
                          std::to_string(size_) + " ranks");
    for (std::size_t q = 0; q < ins.size(); ++q) {
      check_tensor(ins[q], op, rank_, "input");
      same_layout(out, ins[q], op, rank_, "input " + std::to_string(q));
    }
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : ins) flat_parts.push_back(t.reshape({-1}));
    return run(c10d::OpType::REDUCE_SCATTER, outputs, scatter_task(out, at::cat(flat_parts), opts, op));
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    const char* op = "_reduce_scatter_base";
    check_tensor(input, op, rank_, "input");
    check_tensor(output, op, rank_, "output");
    if (output.scalar_type() != input.scalar_type() || input.numel() != output.numel() * size_)
      fail(op, rank_, "input must hold ranks x output = " + std::to_string(size_) + " x " +
                          std::to_string(output.numel()) + " elements of the output's dtype, holds " +
                          std::to_string(input.numel()) + " of " + c10::toString(input.scalar_type()));
    return run(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, scatter_task(output, input.contiguous(), opts, op));
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return run(c10d::OpType::BARRIER, {}, [this] { engine_->barrier(); });
  }

  /// Runs `task` on the group's worker after the collectives called before
  /// (the DDP hook posts its buckets here).
  void post(std::function<void()> task) { worker_->post(std::move(task)); }

  /// A compressor for the DDP hook (codec by name).
  std::unique_ptr<compressor> make_compressor(const std::string& codec) {
    std::unique_ptr<compressor> c;
    guarded([&] { c = engine_->make_compressor(codec); });
    return c;
  }

private:
  void check_root(int64_t root, int64_t root_tensor, const char* op) const {
    if (root < 0 || root >= size_)
      fail(op, rank_, "root " + std::to_string(root) + " out of range [0, " + std::to_string(size_) + ")");
    if (root_tensor != 0) fail(op, rank_, "root tensor must be 0 (one tensor per process)");
  }
  // Posts f (on the worker, after the calls before it); the returned Work
  // completes when f has run, with its error if it threw.
  template <class F>
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType type, std::vector<at::Tensor> result, F&& f) {
    auto work = c10::make_intrusive<async_work>(rank_, type, std::move(result));
    worker_->post([work, f = std::forward<F>(f)]() mutable {
      std::exception_ptr error;
      try {
        guarded(f);
      } catch (...) {
        error = std::current_exception();
      }
      work->complete(error);
    });
    return work;
  }
  // A task: flat (contiguous, size() x in.numel() elements) <- every rank's `in`.
  std::function<void()> gather_task(const at::Tensor& flat, const at::Tensor& input, const char* op) {
    at::Tensor in = input.contiguous();
    std::size_t n = static_cast<std::size_t>(in.numel());
    const elem e = move_elem(in, n, op, rank_);
    return [this, flat, in, n, e] { engine_->allgather(in.data_ptr(), flat.data_ptr(), n, e); };
  }
  // A task: out <- block rank() of the reduction of every rank's `flat`.
  std::function<void()> scatter_task(const at::Tensor& out, const at::Tensor& flat,
                                     const c10d::ReduceScatterOptions& opts, const char* op) {
    const elem e = reduce_elem(out, op, rank_);
    const red r = reduction(opts.reduceOp, op, rank_);
    return [this, out, flat, c = out.contiguous(), e, r]() mutable {
      engine_->reduce_scatter(flat.data_ptr(), c.data_ptr(), static_cast<std::size_t>(c.numel()), e, r);
      write_back(out, c);
    };
  }

  std::unique_ptr<engine> engine_;
  std::unique_ptr<worker> worker_ = std::make_unique<worker>(); // after engine_: drained before it goes
};

/// The DDP communication hook: each gradient bucket averaged over the ranks
/// by gradsync's compressed allreduce, error feedback per bucket.
class CompressedHook final : public c10d::CommHookInterface {
public:
  CompressedHook(c10::intrusive_ptr<ProcessGroupGradsync> pg, const std::string& codec)
      : pg_(std::move(pg)), c_(pg_->make_compressor(codec)) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    at::Tensor& buf = bucket.getBufferRef();
    const char* op = "comm_hook";
    check_tensor(buf, op, pg_->getRank(), "gradient bucket");
    if (!buf.is_contiguous()) fail(op, pg_->getRank(), "gradient bucket is not contiguous");
    elem e;
    switch (buf.scalar_type()) {
    case at::kFloat: e = elem::f32; break;
    case at::kDouble: e = elem::f64; break;
    case at::kHalf: e = elem::f16; break;
    case at::kBFloat16: e = elem::bf16; break;
    default: fail(op, pg_->getRank(), std::string("gradient dtype ") + c10::toString(buf.scalar_type()) +
                                          " cannot be compressed (floating-point only)");
    }
    auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get());
    pg_->post([c = c_, fut, buf, e, key = bucket.getIndex()]() mutable {
      try {
        guarded([&] { c->allreduce_mean(buf.data_ptr(), static_cast<std::size_t>(buf.numel()), e, key); });
      } catch (...) {
        fut->setError(std::current_exception());
        return;
      }
      fut->markCompleted(c10::IValue(buf));
    });
    return fut;
  }

  at::Tensor parseHookResult(const c10::IValue& result) override {
    if (result.isTensor()) return result.toTensor();
    TORCH_CHECK(result.isTensorList(), "gradsync: comm_hook result is neither a tensor nor a tensor list");
    return result.toTensorVector().at(0);
  }

  std::string last_path() const { return c_->last_path(); }

private:
  c10::intrusive_ptr<ProcessGroupGradsync> pg_;
  std::shared_ptr<compressor> c_; // shared with the buckets still queued
};

} // namespace torch_gradsync

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  using torch_gradsync::ProcessGroupGradsync;
  // Registers c10d's Python types (ProcessGroup, Store, Reducer) that ours derive from and take.
  py::module::import("torch.distributed");
  m.doc() = "gradsync collectives as a torch.distributed backend ('gradsync') and a DDP comm hook";
  py::class_<ProcessGroupGradsync, c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupGradsync>>(
      m, "ProcessGroupGradsync")
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int, std::chrono::milliseconds>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("transport", &ProcessGroupGradsync::transport);
  m.def(
      "create",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout) {
        py::gil_scoped_release nogil;
        return c10::make_intrusive<ProcessGroupGradsync>(store, rank, size, timeout);
      },
      "The backend's creator (torch.distributed.Backend.register_backend calls it)", py::arg("store"),
      py::arg("rank"), py::arg("size"), py::arg("timeout"));
  m.def(
      "register_comm_hook",
      [](c10d::Reducer& reducer, const c10::intrusive_ptr<ProcessGroupGradsync>& pg, const std::string& codec) {
        reducer.register_comm_hook(std::make_unique<torch_gradsync::CompressedHook>(pg, codec));
      },
      "Sends every gradient bucket of the DDP model whose reducer this is through gradsync's compressed "
      "allreduce with codec `codec` (int8, topk:0.01, powersgd:rank=4, automatic, automatic:CODEC, none)",
      py::arg("reducer"), py::arg("process_group"), py::arg("codec"));
  py::module::import("torch.distributed").attr("Backend").attr("register_backend")("gradsync", m.attr("create"));
}
