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
///
/// ## Failures end the whole job
/// An exception on one rank must not leave the others waiting forever in a collective:
///  - abort_on_error(who, f) runs f and, if it throws, prints "who: rank r of n: what" and ends
///    the job with MPI_Abort (use it, or the same in your own handler, at the top of main);
///  - mpi_environment's destructor, when it runs while an exception unwinds the stack, aborts
///    the job instead of calling MPI_Finalize (which would wait for the other ranks);
///  - a collective timeout (set_collective_timeout, off by default) bounds how long a rank
///    waits in one operation: past it the rank finds out which ranks did not arrive, prints
///    them and aborts the job (see mpi_communicator::set_collective_timeout).

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

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
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

/// The rank of `rank` of `comm` in MPI_COMM_WORLD.
inline int world_rank_of(MPI_Comm comm, int rank) {
  MPI_Group g, w;
  MPI_Comm_group(comm, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &w);
  int out = rank;
  MPI_Group_translate_ranks(g, 1, &rank, w, &out);
  MPI_Group_free(&g);
  MPI_Group_free(&w);
  return out;
}

/// The collective timeout of one communicator (see mpi_communicator::set_collective_timeout).
///
/// Waiting: a watched operation is posted non-blocking and completed by polling MPI_Test, for
/// the first millisecond continuously, then with sleeps growing from 50 us to 2 ms (a waiting
/// rank uses little CPU, and finishes at most 2 ms late).
///
/// Who did not arrive: every rank numbers the collectives it starts on the communicator (the
/// same sequence on every rank, since all call them in the same order). While a rank polls, it
/// answers "census" queries on a private duplicate of the communicator with the number of the
/// last collective it started. A rank whose wait passes the deadline asks every other rank and
/// collects answers for a short grace period (answering queries itself meanwhile, so two ranks
/// timing out together see each other): a rank that answers with a number >= its own has
/// arrived; one that answers with a smaller number is behind, at an earlier operation; one that
/// does not answer is stopped or busy outside these calls (computing, or waiting in another
/// communicator). Both are named, as ranks of the communicator and of MPI_COMM_WORLD, and the
/// job is aborted. Point-to-point waits name their peer.
class mpi_watchdog {
public:
  /// Collective over `comm`: duplicates it for the census messages.
  mpi_watchdog(std::shared_ptr<MPI_Comm> comm, double seconds)
      : comm_(std::move(comm)), seconds_(seconds) {
    mpi_check(MPI_Comm_dup(*comm_, &census_), "set_collective_timeout");
    MPI_Comm_rank(*comm_, &rank_);
    MPI_Comm_size(*comm_, &size_);
  }
  mpi_watchdog(const mpi_watchdog&) = delete;
  mpi_watchdog& operator=(const mpi_watchdog&) = delete;
  ~mpi_watchdog() {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (!finalised) MPI_Comm_free(&census_);
  }

  double seconds() const noexcept { return seconds_; }
  /// Numbers a collective about to start.
  std::int64_t next() noexcept { return ++started_; }

  /// Completes `req` (an operation named `call`: collective number `seq`, or a point-to-point
  /// operation with `peer`), aborting the job past the deadline.
  void wait(MPI_Request* req, const char* call, std::int64_t seq, int peer,
            MPI_Status* status = MPI_STATUS_IGNORE) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto deadline = start + std::chrono::duration<double>(seconds_);
    auto pause = std::chrono::microseconds(50);
    int done = 0;
    mpi_check(MPI_Test(req, &done, status), call);
    while (!done) {
      const auto now = clock::now();
      if (now - start > std::chrono::milliseconds(1)) {
        serve();
        if (now > deadline) give_up(call, seq, peer);
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(2000));
      }
      mpi_check(MPI_Test(req, &done, status), call);
    }
  }

private:
  static constexpr int query_tag = 1, answer_tag = 2;

  /// Answers pending census queries with the number of the last collective started.
  void serve() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, query_tag, census_, &flag, &st);
      if (!flag) return;
      std::int64_t q = 0;
      MPI_Recv(&q, 1, MPI_INT64_T, st.MPI_SOURCE, query_tag, census_, MPI_STATUS_IGNORE);
      const std::int64_t a = started_;
      MPI_Send(&a, 1, MPI_INT64_T, st.MPI_SOURCE, answer_tag, census_);
    }
  }

  std::string seconds_text() const {
    char t[32];
    std::snprintf(t, sizeof t, "%g", seconds_);
    return t;
  }

  std::string name(int r) const {
    const int w = world_rank_of(*comm_, r);
    return std::to_string(r) + (w != r ? " (world rank " + std::to_string(w) + ")" : "");
  }

  [[noreturn]] void give_up(const char* call, std::int64_t seq, int peer) {
    std::string msg = std::string("tessera::parallel::mpi_communicator::") + call + ": rank " +
                      name(rank_) + " of " + std::to_string(size_) + " waited " + seconds_text() +
                      " s (the collective timeout); ";
    if (seq == 0) {
      msg += "its peer, rank " + name(peer) + ", did not take part";
    } else {
      // The census: ask everyone, collect answers for a grace period.
      std::vector<std::int64_t> answer(std::size_t(size_), -1);
      std::vector<MPI_Request> sent;
      sent.reserve(std::size_t(size_));
      for (int r = 0; r < size_; ++r)
        if (r != rank_) {
          sent.emplace_back();
          MPI_Isend(&seq, 1, MPI_INT64_T, r, query_tag, census_, &sent.back());
        }
      answer[std::size_t(rank_)] = started_;
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::duration<double>(std::min(2.0, std::max(0.2, seconds_)));
      int missing = size_ - 1;
      while (missing > 0 && std::chrono::steady_clock::now() < until) {
        serve();
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, answer_tag, census_, &flag, &st);
        if (!flag) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          continue;
        }
        std::int64_t a = 0;
        MPI_Recv(&a, 1, MPI_INT64_T, st.MPI_SOURCE, answer_tag, census_, MPI_STATUS_IGNORE);
        if (answer[std::size_t(st.MPI_SOURCE)] < 0) --missing;
        answer[std::size_t(st.MPI_SOURCE)] = a;
      }
      std::string absent, detail;
      for (int r = 0; r < size_; ++r) {
        const std::int64_t a = answer[std::size_t(r)];
        if (a >= seq) continue;
        absent += (absent.empty() ? "" : ", ") + std::to_string(r);
        detail += "; rank " + name(r) +
                  (a < 0 ? ": no answer (stopped, or busy outside tessera's MPI calls)"
                         : ": behind, at collective #" + std::to_string(a));
      }
      msg += "rank(s) " +
             (absent.empty() ? std::string("none (the operation is stuck in MPI)") : absent) +
             " did not arrive at collective #" + std::to_string(seq) + detail;
    }
    msg += "; aborting the job";
    std::fprintf(stderr, "%s\n", msg.c_str());
    std::fflush(stderr);
    MPI_Abort(*comm_, 1);
    std::exit(1); // MPI_Abort does not return
  }

  std::shared_ptr<MPI_Comm> comm_; // kept alive while a request may still wait on it
  MPI_Comm census_ = MPI_COMM_NULL;
  double seconds_ = 0;
  int rank_ = 0, size_ = 1;
  std::int64_t started_ = 0;
};

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
/// A destructor that runs while an exception unwinds the stack (one thrown after construction)
/// aborts the job instead of finalising: this rank would otherwise wait in MPI_Finalize while
/// the others wait for it in a collective.
class mpi_environment {
public:
  mpi_environment(int& argc, char**& argv) : unwinding_(std::uncaught_exceptions()) {
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
    if (!owner_ || finalised) return;
    int size = 1, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (std::uncaught_exceptions() > unwinding_ && size > 1) {
      std::fprintf(stderr,
                   "tessera::parallel::mpi_environment: rank %d of %d is leaving main by an "
                   "exception; aborting the job so that no rank waits for it forever\n",
                   rank, size);
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Finalize();
  }

private:
  bool owner_ = false;
  int unwinding_ = 0; ///< std::uncaught_exceptions() at construction
};

/// Runs f() and returns what it returns. If f throws, prints "who: rank r of n: what()" on
/// stderr and ends the whole job with MPI_Abort(MPI_COMM_WORLD, code) (when MPI is initialised
/// and the world has more than one rank; otherwise the exception propagates), so that a failure
/// on one rank never leaves the others waiting in a collective.
template <class F>
decltype(auto) abort_on_error(const char* who, F&& f, int code = 1) {
  try {
    return f();
  } catch (const std::exception& e) {
    int initialised = 0, finalised = 0, size = 1, rank = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (!initialised || finalised) throw;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (size == 1) throw;
    std::fprintf(stderr, "%s: rank %d of %d: %s\n", who, rank, size, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code); // MPI_Abort does not return
  }
}

/// A Communicator over an MPI communicator. Copies share it; a communicator made by split()
/// is freed with its last copy.
///
/// Collective timeout (off by default): set_collective_timeout(seconds) makes every later
/// collective, point-to-point operation and request wait of this handle (and of its copies and
/// splits made afterwards) give up after `seconds`, name the ranks that did not arrive and abort
/// the job (detail::mpi_watchdog describes how). Off, the operations are MPI's blocking calls.
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

  /// Sets the collective timeout of this handle (copies made from now on share it; earlier
  /// copies keep theirs); 0 turns it off. A collective: every member calls it (it duplicates
  /// the communicator for the watchdog's own messages). Throws value_error for a negative or
  /// non-finite value.
  void set_collective_timeout(double seconds) {
    if (!(seconds >= 0) || seconds > 1e9)
      throw value_error("tessera::parallel::mpi_communicator::set_collective_timeout: " +
                        std::to_string(seconds) + " s is not a finite time >= 0");
    watch_ = seconds > 0 ? std::make_shared<detail::mpi_watchdog>(comm_, seconds) : nullptr;
  }
  /// The collective timeout in seconds; 0 when off.
  double collective_timeout() const noexcept { return watch_ ? watch_->seconds() : 0.0; }

  template <CommScalar T>
  void all_reduce_sum(T* buf, std::int64_t n) {
    detail::check_comm_args("all_reduce_sum", n, 0, size_);
    const int count = detail::mpi_count("all_reduce_sum", n);
    if constexpr (std::is_same_v<T, float>) {
      collective(
          "all_reduce_sum",
          [&] { return MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, *comm_); },
          [&](MPI_Request* r) {
            return MPI_Iallreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, *comm_, r);
          });
    } else {
      std::vector<float> w = detail::widen(buf, n);
      collective(
          "all_reduce_sum",
          [&] { return MPI_Allreduce(MPI_IN_PLACE, w.data(), count, MPI_FLOAT, MPI_SUM, *comm_); },
          [&](MPI_Request* r) {
            return MPI_Iallreduce(MPI_IN_PLACE, w.data(), count, MPI_FLOAT, MPI_SUM, *comm_, r);
          });
      detail::narrow(w.data(), buf, n);
    }
  }

  template <CommScalar T>
  request iall_reduce_sum(T* buf, std::int64_t n) {
    detail::check_comm_args("iall_reduce_sum", n, 0, size_);
    const int count = detail::mpi_count("iall_reduce_sum", n);
    auto req = std::make_shared<MPI_Request>();
    const std::int64_t seq = watch_ ? watch_->next() : 0;
    if constexpr (std::is_same_v<T, float>) {
      detail::mpi_check(
          MPI_Iallreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, *comm_, req.get()),
          "iall_reduce_sum");
      return request([req, w = watch_, seq] { finish(w, req.get(), "iall_reduce_sum", seq, -1); },
                     detail::mpi_poll(req));
    } else {
      auto w = std::make_shared<std::vector<float>>(detail::widen(buf, n));
      detail::mpi_check(
          MPI_Iallreduce(MPI_IN_PLACE, w->data(), count, MPI_FLOAT, MPI_SUM, *comm_, req.get()),
          "iall_reduce_sum");
      return request(
          [req, w, buf, n, watch = watch_, seq] {
            finish(watch, req.get(), "iall_reduce_sum", seq, -1);
            detail::narrow(w->data(), buf, n);
          },
          detail::mpi_poll(req));
    }
  }

  /// fp32, in place, variable counts (communicator.hpp): MPI_Ireduce_scatter with MPI_IN_PLACE.
  request ireduce_scatter_sum(float* buf, const std::int64_t* counts) {
    auto c = std::make_shared<std::vector<int>>(std::size_t(size_));
    std::int64_t total = 0;
    for (int r = 0; r < size_; ++r) {
      detail::check_comm_args("ireduce_scatter_sum", counts[r], 0, size_);
      (*c)[std::size_t(r)] = detail::mpi_count("ireduce_scatter_sum", counts[r]);
      total += counts[r];
    }
    detail::mpi_count("ireduce_scatter_sum", total);
    auto req = std::make_shared<MPI_Request>();
    const std::int64_t seq = watch_ ? watch_->next() : 0;
    detail::mpi_check(
        MPI_Ireduce_scatter(MPI_IN_PLACE, buf, c->data(), MPI_FLOAT, MPI_SUM, *comm_, req.get()),
        "ireduce_scatter_sum");
    return request(
        [req, c, w = watch_, seq] { finish(w, req.get(), "ireduce_scatter_sum", seq, -1); },
        detail::mpi_poll(req));
  }

  template <CommScalar T>
  void all_gather(const T* send, T* recv, std::int64_t n) {
    detail::check_comm_args("all_gather", n, 0, size_);
    detail::mpi_count("all_gather", n * size_);
    const MPI_Datatype t = detail::mpi_type<T>();
    collective(
        "all_gather", [&] { return MPI_Allgather(send, int(n), t, recv, int(n), t, *comm_); },
        [&](MPI_Request* r) {
          return MPI_Iallgather(send, int(n), t, recv, int(n), t, *comm_, r);
        });
  }

  template <CommScalar T>
  void reduce_scatter_sum(const T* send, T* recv, std::int64_t n) {
    detail::check_comm_args("reduce_scatter_sum", n, 0, size_);
    detail::mpi_count("reduce_scatter_sum", n * size_);
    const auto sum = [&](const float* s, float* r) {
      collective(
          "reduce_scatter_sum",
          [&] { return MPI_Reduce_scatter_block(s, r, int(n), MPI_FLOAT, MPI_SUM, *comm_); },
          [&](MPI_Request* q) {
            return MPI_Ireduce_scatter_block(s, r, int(n), MPI_FLOAT, MPI_SUM, *comm_, q);
          });
    };
    if constexpr (std::is_same_v<T, float>) {
      sum(send, recv);
    } else {
      std::vector<float> w = detail::widen(send, n * size_), r(static_cast<std::size_t>(n));
      sum(w.data(), r.data());
      detail::narrow(r.data(), recv, n);
    }
  }

  template <CommScalar T>
  void broadcast(T* buf, std::int64_t n, int root) {
    detail::check_comm_args("broadcast", n, root, size_);
    const int count = detail::mpi_count("broadcast", n);
    collective(
        "broadcast", [&] { return MPI_Bcast(buf, count, detail::mpi_type<T>(), root, *comm_); },
        [&](MPI_Request* r) {
          return MPI_Ibcast(buf, count, detail::mpi_type<T>(), root, *comm_, r);
        });
  }

  template <CommScalar T>
  void send(const T* buf, std::int64_t n, int peer, int tag) {
    detail::check_comm_args("send", n, peer, size_);
    const int count = detail::mpi_count("send", n);
    if (!watch_) {
      detail::mpi_check(MPI_Send(buf, count, detail::mpi_type<T>(), peer, tag, *comm_), "send");
      return;
    }
    MPI_Request r;
    detail::mpi_check(MPI_Isend(buf, count, detail::mpi_type<T>(), peer, tag, *comm_, &r), "send");
    watch_->wait(&r, "send", 0, peer);
  }

  /// Throws value_error if the message has fewer elements than n (more is an MPI error).
  template <CommScalar T>
  void recv(T* buf, std::int64_t n, int peer, int tag) {
    detail::check_comm_args("recv", n, peer, size_);
    const int count = detail::mpi_count("recv", n);
    MPI_Status status;
    if (!watch_) {
      detail::mpi_check(MPI_Recv(buf, count, detail::mpi_type<T>(), peer, tag, *comm_, &status),
                        "recv");
    } else {
      MPI_Request r;
      detail::mpi_check(MPI_Irecv(buf, count, detail::mpi_type<T>(), peer, tag, *comm_, &r),
                        "recv");
      watch_->wait(&r, "recv", 0, peer, &status);
    }
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
    return request([req, w = watch_, peer] { finish(w, req.get(), "isend", 0, peer); },
                   detail::mpi_poll(req));
  }

  template <CommScalar T>
  request irecv(T* buf, std::int64_t n, int peer, int tag) {
    detail::check_comm_args("irecv", n, peer, size_);
    auto req = std::make_shared<MPI_Request>();
    detail::mpi_check(MPI_Irecv(buf, detail::mpi_count("irecv", n), detail::mpi_type<T>(), peer,
                                tag, *comm_, req.get()),
                      "irecv");
    return request([req, w = watch_, peer] { finish(w, req.get(), "irecv", 0, peer); },
                   detail::mpi_poll(req));
  }

  bool all_of(bool flag) {
    int v = flag ? 1 : 0;
    collective(
        "all_of", [&] { return MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LAND, *comm_); },
        [&](MPI_Request* r) {
          return MPI_Iallreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LAND, *comm_, r);
        });
    return v != 0;
  }

  /// MPI_Comm_split: ranks with the same colour form a communicator, ordered by key. The new
  /// communicator gets this one's collective timeout.
  mpi_communicator split(int colour, int key) const {
    MPI_Comm sub;
    detail::mpi_check(MPI_Comm_split(*comm_, colour, key, &sub), "split");
    mpi_communicator out(sub, true);
    if (watch_) out.set_collective_timeout(watch_->seconds());
    return out;
  }

  void barrier() {
    collective(
        "barrier", [&] { return MPI_Barrier(*comm_); },
        [&](MPI_Request* r) { return MPI_Ibarrier(*comm_, r); });
  }

  /// MPI_Abort: ends every process of the job with `code`.
  [[noreturn]] void abort(int code) {
    MPI_Abort(*comm_, code);
    std::exit(code); // MPI_Abort does not return
  }

private:
  /// A collective: the blocking call, or, with a timeout, the non-blocking one watched.
  template <class Blocking, class Nonblocking>
  void collective(const char* call, Blocking&& blocking, Nonblocking&& nonblocking) {
    if (!watch_) {
      detail::mpi_check(blocking(), call);
      return;
    }
    const std::int64_t seq = watch_->next();
    MPI_Request r;
    detail::mpi_check(nonblocking(&r), call);
    watch_->wait(&r, call, seq, -1);
  }
  static void finish(const std::shared_ptr<detail::mpi_watchdog>& w, MPI_Request* req,
                     const char* call, std::int64_t seq, int peer) {
    if (w)
      w->wait(req, call, seq, peer);
    else
      MPI_Wait(req, MPI_STATUS_IGNORE);
  }

  std::shared_ptr<MPI_Comm> comm_;
  std::shared_ptr<detail::mpi_watchdog> watch_; ///< null: no collective timeout
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
