#pragma once
/// \file parallel/mpi.hpp
/// tessera::parallel::mpi_communicator: the Communicator (parallel/communicator.hpp) over MPI,
/// and mpi_environment, which initialises and finalises MPI around a program.
///
///   int main(int argc, char** argv) {
///     tessera::parallel::mpi_environment mpi(argc, argv);
///     auto world = tessera::parallel::mpi_communicator::world();
///     ...
///   }
///
/// Link MPI::MPI_CXX (find_package(tessera COMPONENTS MPI)). The umbrella header
/// tessera/tessera.hpp does not include this file, so programs without MPI never need <mpi.h>;
/// without <mpi.h> on the include path this header declares stand-ins whose every use fails to
/// compile with a sentence saying what to link.
///
/// bf16 collectives that add (all_reduce_sum, iall_reduce_sum, reduce_scatter_sum) widen the
/// buffer to fp32, reduce in fp32 and round once to bf16: twice the bytes of a bf16 reduction,
/// but no per-hop rounding. Collectives that only move data carry bf16 as 16-bit words.

#include <tessera/parallel/communicator.hpp>

#if __has_include(<mpi.h>)
// tessera uses MPI's C API only; skip the deprecated C++ bindings (and their warnings).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <climits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace tessera::parallel {

namespace detail {
inline void mpi_check(int rc, const char* call) {
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw std::runtime_error(std::string("tessera::parallel::mpi_communicator::") + call +
                             ": MPI failed: " + std::string(text, std::size_t(len)));
  }
}
template <class T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, float>)
    return MPI_FLOAT;
  else
    return MPI_UINT16_T; // bfloat16 moved as its bits
}
inline int mpi_count(const char* call, std::int64_t n) {
  if (n > INT_MAX)
    throw value_error(std::string("tessera::parallel::mpi_communicator::") + call + ": " +
                      std::to_string(n) + " elements exceed MPI's int count");
  return static_cast<int>(n);
}
/// MPI_Test on a shared request; once complete, MPI sets it to MPI_REQUEST_NULL, and a later
/// MPI_Wait returns at once.
inline std::function<bool()> mpi_poll(std::shared_ptr<MPI_Request> req) {
  return [req] {
    int done = 0;
    MPI_Test(req.get(), &done, MPI_STATUS_IGNORE);
    return done != 0;
  };
}
inline std::vector<float> widen(const bfloat16* x, std::int64_t n) {
  std::vector<float> w(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) w[std::size_t(i)] = x[i].to_float();
  return w;
}
inline void narrow(const float* w, bfloat16* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = bfloat16::from_float(w[i]); // RNE
}
} // namespace detail

/// Initialises MPI (MPI_THREAD_FUNNELED: only the main thread calls MPI; Kokkos' OpenMP
/// threads never do) unless it already is, and finalises it on destruction if it initialised.
class mpi_environment {
public:
  mpi_environment(int& argc, char**& argv) {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised) {
      int provided = 0;
      detail::mpi_check(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided),
                        "mpi_environment");
      owner_ = true;
    }
  }
  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;
  ~mpi_environment() {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (owner_ && !finalised) MPI_Finalize();
  }

private:
  bool owner_ = false;
};

/// A Communicator over an MPI communicator. Copies share it; a communicator made by split()
/// is freed with its last copy.
class mpi_communicator {
public:
  /// MPI_COMM_WORLD (not freed).
  static mpi_communicator world() { return mpi_communicator(MPI_COMM_WORLD, false); }

  /// Wraps `comm`; `owned` frees it (MPI_Comm_free) with the last copy.
  mpi_communicator(MPI_Comm comm, bool owned) {
    comm_ = owned ? std::shared_ptr<MPI_Comm>(new MPI_Comm(comm),
                                              [](MPI_Comm* c) {
                                                int finalised = 0;
                                                MPI_Finalized(&finalised);
                                                if (!finalised) MPI_Comm_free(c);
                                                delete c;
                                              })
                  : std::make_shared<MPI_Comm>(comm);
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  MPI_Comm native() const noexcept { return *comm_; }

  template <CommScalar T>
  void all_reduce_sum(T* buf, std::int64_t n) {
    detail::check_comm_args("all_reduce_sum", n, 0, size_);
    const int count = detail::mpi_count("all_reduce_sum", n);
    if constexpr (std::is_same_v<T, float>) {
      detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, *comm_),
                        "all_reduce_sum");
    } else {
      std::vector<float> w = detail::widen(buf, n);
      detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, w.data(), count, MPI_FLOAT, MPI_SUM, *comm_),
                        "all_reduce_sum");
      detail::narrow(w.data(), buf, n);
    }
  }

  template <CommScalar T>
  request iall_reduce_sum(T* buf, std::int64_t n) {
    detail::check_comm_args("iall_reduce_sum", n, 0, size_);
    const int count = detail::mpi_count("iall_reduce_sum", n);
    auto req = std::make_shared<MPI_Request>();
    if constexpr (std::is_same_v<T, float>) {
      detail::mpi_check(
          MPI_Iallreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, *comm_, req.get()),
          "iall_reduce_sum");
      return request([req] { MPI_Wait(req.get(), MPI_STATUS_IGNORE); }, detail::mpi_poll(req));
    } else {
      auto w = std::make_shared<std::vector<float>>(detail::widen(buf, n));
      detail::mpi_check(
          MPI_Iallreduce(MPI_IN_PLACE, w->data(), count, MPI_FLOAT, MPI_SUM, *comm_, req.get()),
          "iall_reduce_sum");
      return request(
          [req, w, buf, n] {
            MPI_Wait(req.get(), MPI_STATUS_IGNORE);
            detail::narrow(w->data(), buf, n);
          },
          detail::mpi_poll(req));
    }
  }

  template <CommScalar T>
  void all_gather(const T* send, T* recv, std::int64_t n) {
    detail::check_comm_args("all_gather", n, 0, size_);
    const int count = detail::mpi_count("all_gather", n * size_);
    (void)count;
    detail::mpi_check(MPI_Allgather(send, int(n), detail::mpi_type<T>(), recv, int(n),
                                    detail::mpi_type<T>(), *comm_),
                      "all_gather");
  }

  template <CommScalar T>
  void reduce_scatter_sum(const T* send, T* recv, std::int64_t n) {
    detail::check_comm_args("reduce_scatter_sum", n, 0, size_);
    detail::mpi_count("reduce_scatter_sum", n * size_);
    if constexpr (std::is_same_v<T, float>) {
      detail::mpi_check(MPI_Reduce_scatter_block(send, recv, int(n), MPI_FLOAT, MPI_SUM, *comm_),
                        "reduce_scatter_sum");
    } else {
      std::vector<float> w = detail::widen(send, n * size_), r(static_cast<std::size_t>(n));
      detail::mpi_check(
          MPI_Reduce_scatter_block(w.data(), r.data(), int(n), MPI_FLOAT, MPI_SUM, *comm_),
          "reduce_scatter_sum");
      detail::narrow(r.data(), recv, n);
    }
  }

  template <CommScalar T>
  void broadcast(T* buf, std::int64_t n, int root) {
    detail::check_comm_args("broadcast", n, root, size_);
    detail::mpi_check(
        MPI_Bcast(buf, detail::mpi_count("broadcast", n), detail::mpi_type<T>(), root, *comm_),
        "broadcast");
  }

  template <CommScalar T>
  void send(const T* buf, std::int64_t n, int peer, int tag) {
    detail::check_comm_args("send", n, peer, size_);
    detail::mpi_check(
        MPI_Send(buf, detail::mpi_count("send", n), detail::mpi_type<T>(), peer, tag, *comm_),
        "send");
  }

  /// Throws value_error if the message has fewer elements than n (more is an MPI error).
  template <CommScalar T>
  void recv(T* buf, std::int64_t n, int peer, int tag) {
    detail::check_comm_args("recv", n, peer, size_);
    MPI_Status status;
    detail::mpi_check(MPI_Recv(buf, detail::mpi_count("recv", n), detail::mpi_type<T>(), peer, tag,
                               *comm_, &status),
                      "recv");
    int got = 0;
    MPI_Get_count(&status, detail::mpi_type<T>(), &got);
    if (got != n)
      throw value_error("tessera::parallel::mpi_communicator::recv: the message from rank " +
                        std::to_string(peer) + " with tag " + std::to_string(tag) + " has " +
                        std::to_string(got) + " elements, the receive expects " +
                        std::to_string(n));
  }

  /// The buffer must stay alive and unchanged until the request completes.
  template <CommScalar T>
  request isend(const T* buf, std::int64_t n, int peer, int tag) {
    detail::check_comm_args("isend", n, peer, size_);
    auto req = std::make_shared<MPI_Request>();
    detail::mpi_check(MPI_Isend(buf, detail::mpi_count("isend", n), detail::mpi_type<T>(), peer,
                                tag, *comm_, req.get()),
                      "isend");
    return request([req] { MPI_Wait(req.get(), MPI_STATUS_IGNORE); }, detail::mpi_poll(req));
  }

  template <CommScalar T>
  request irecv(T* buf, std::int64_t n, int peer, int tag) {
    detail::check_comm_args("irecv", n, peer, size_);
    auto req = std::make_shared<MPI_Request>();
    detail::mpi_check(MPI_Irecv(buf, detail::mpi_count("irecv", n), detail::mpi_type<T>(), peer,
                                tag, *comm_, req.get()),
                      "irecv");
    return request([req] { MPI_Wait(req.get(), MPI_STATUS_IGNORE); }, detail::mpi_poll(req));
  }

  bool all_of(bool flag) {
    int v = flag ? 1 : 0;
    detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LAND, *comm_), "all_of");
    return v != 0;
  }

  /// MPI_Comm_split: ranks with the same colour form a communicator, ordered by key.
  mpi_communicator split(int colour, int key) const {
    MPI_Comm sub;
    detail::mpi_check(MPI_Comm_split(*comm_, colour, key, &sub), "split");
    return mpi_communicator(sub, true);
  }

  void barrier() { detail::mpi_check(MPI_Barrier(*comm_), "barrier"); }

  /// MPI_Abort: ends every process of the job with `code`.
  [[noreturn]] void abort(int code) {
    MPI_Abort(*comm_, code);
    std::exit(code); // MPI_Abort does not return; this keeps [[noreturn]] honest
  }

private:
  std::shared_ptr<MPI_Comm> comm_;
  int rank_ = 0;
  int size_ = 1;
};

static_assert(Communicator<mpi_communicator>);

} // namespace tessera::parallel

#else // no <mpi.h>

namespace tessera::parallel {
namespace detail {
template <class T>
inline constexpr bool mpi_missing = false;
}

/// Stand-in: <mpi.h> was not found. Any use fails to compile with the reason.
class mpi_communicator {
public:
  template <class T = void>
  static mpi_communicator world() {
    static_assert(detail::mpi_missing<T>,
                  "tessera::parallel::mpi_communicator: <mpi.h> was not found; link MPI::MPI_CXX "
                  "(find_package(tessera COMPONENTS MPI)) to use tessera/parallel/mpi.hpp");
    return {};
  }
};

/// Stand-in: <mpi.h> was not found. Any use fails to compile with the reason.
class mpi_environment {
public:
  template <class T = void>
  mpi_environment(int&, char**&, T* = nullptr) {
    static_assert(detail::mpi_missing<T>,
                  "tessera::parallel::mpi_environment: <mpi.h> was not found; link MPI::MPI_CXX "
                  "(find_package(tessera COMPONENTS MPI)) to use tessera/parallel/mpi.hpp");
  }
};
} // namespace tessera::parallel

#endif
