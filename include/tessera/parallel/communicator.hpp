#pragma once
/// \file parallel/communicator.hpp
/// The communicator concept every parallel plan runs on, and its single-process backend.
///
/// A communicator is a group of `size()` processes, this one being `rank()`. Collectives are
/// called by every member with the same counts; buffers are host memory (device-aware MPI is not
/// assumed: data_parallel.hpp stages gradients through host buffers, and the pipeline and
/// tensor-parallel paths refuse device memory at compile time). Element types are
/// `float` and `tessera::bfloat16`; bf16 sums are computed in fp32 and rounded once to bf16
/// (round to nearest even), so a bf16 all-reduce equals the fp32 all-reduce of the widened
/// values, rounded.
///
///   all_reduce_sum(buf, n)                      buf[i] = sum over ranks of buf[i]
///   all_gather(send, recv, n)                   recv[r * n + i] = send[i] of rank r
///   reduce_scatter_sum(send, recv, n)           recv[i] = sum over ranks of send[rank * n + i]
///   broadcast(buf, n, root)                     buf = root's buf
///   send(buf, n, peer, tag) / recv(buf, n, peer, tag)
///   iall_reduce_sum / isend / irecv             the same, returning a request to wait() on
///   ireduce_scatter_sum(buf, counts)            fp32, in place, rank r's count counts[r]:
///                                               buf[i] = sum over ranks of buf[off + i],
///                                               off = counts[0] + ... + counts[rank - 1],
///                                               for i < counts[rank]; a request
///   all_of(flag)                                logical and of flag over ranks
///   split(colour, key)                          sub-communicators (MPI_Comm_split semantics)
///   barrier(), abort(code)
///
/// Backends: single_process_communicator (here, size 1, no MPI) and mpi_communicator
/// (tessera/parallel/mpi.hpp).

#include <tessera/config/error.hpp>
#include <tessera/precision/traits.hpp>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tessera::parallel {

/// A pending non-blocking operation. wait() completes it (and finishes any post-processing,
/// such as narrowing a bf16 sum); it is called at most once, and the destructor calls it if the
/// owner forgot, so buffers are never left in flight.
class request {
public:
  request() = default;
  /// `finish` blocks until done; `poll`, if given, returns whether the operation has completed
  /// without blocking (and lets the library make progress, as MPI_Test does).
  explicit request(std::function<void()> finish, std::function<bool()> poll = nullptr)
      : finish_(std::move(finish)), poll_(std::move(poll)) {}
  request(request&& o) noexcept
      : finish_(std::exchange(o.finish_, nullptr)), poll_(std::exchange(o.poll_, nullptr)) {}
  request& operator=(request&& o) noexcept {
    if (this != &o) {
      wait();
      finish_ = std::exchange(o.finish_, nullptr);
      poll_ = std::exchange(o.poll_, nullptr);
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  ~request() { wait(); }

  /// Blocks until the operation has completed; a no-op afterwards.
  void wait() {
    if (finish_) std::exchange(finish_, nullptr)();
  }
  /// True while wait() still has work to do.
  bool pending() const noexcept { return static_cast<bool>(finish_); }

  /// Non-blocking: drives the operation (MPI only progresses inside MPI calls) and returns
  /// whether the transfer has completed; wait() is still needed for any post-processing.
  bool poll() {
    if (!finish_) return true;
    return poll_ ? poll_() : false;
  }

private:
  std::function<void()> finish_;
  std::function<bool()> poll_;
};

namespace detail {
/// T is the storage type of some precision (float, bfloat16, float16, ...).
template <class T>
concept PrecisionStorage = requires {
  typename precision_of_t<T>;
};
} // namespace detail

/// Element types communicators carry: the wire types of the precisions
/// (precision_traits<P>::wire_type: float and bfloat16; fp16 travels as float, fp8 as bfloat16).
template <class T>
concept CommScalar = detail::PrecisionStorage<T> && std::same_as<T, wire_t<precision_of_t<T>>>;

/// What a parallel plan needs from a group of processes (see the file comment).
template <class C>
concept Communicator = std::move_constructible<C> &&
    requires(C& c, const C& cc, float* f, const float* cf, bfloat16* b, const bfloat16* cb,
             std::int64_t n, const std::int64_t* counts, int peer, bool flag) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  c.all_reduce_sum(f, n);
  c.all_reduce_sum(b, n);
  { c.iall_reduce_sum(f, n) } -> std::same_as<request>;
  { c.iall_reduce_sum(b, n) } -> std::same_as<request>;
  c.all_gather(cf, f, n);
  c.all_gather(cb, b, n);
  c.reduce_scatter_sum(cf, f, n);
  c.reduce_scatter_sum(cb, b, n);
  { c.ireduce_scatter_sum(f, counts) } -> std::same_as<request>;
  c.broadcast(f, n, peer);
  c.broadcast(b, n, peer);
  c.send(cf, n, peer, peer);
  c.recv(f, n, peer, peer);
  c.send(cb, n, peer, peer);
  c.recv(b, n, peer, peer);
  { c.isend(cf, n, peer, peer) } -> std::same_as<request>;
  { c.irecv(f, n, peer, peer) } -> std::same_as<request>;
  { c.isend(cb, n, peer, peer) } -> std::same_as<request>;
  { c.irecv(b, n, peer, peer) } -> std::same_as<request>;
  { c.all_of(flag) } -> std::same_as<bool>;
  { c.split(peer, peer) } -> std::same_as<C>;
  c.barrier();
};

namespace detail {
/// Throws value_error unless 0 <= n and 0 <= peer < size; names the call.
inline void check_comm_args(const char* call, std::int64_t n, int peer, int size) {
  if (n < 0)
    throw value_error(std::string("tessera::parallel::") + call + ": the element count " +
                      std::to_string(n) + " is negative");
  if (peer < 0 || peer >= size)
    throw value_error(std::string("tessera::parallel::") + call + ": rank " + std::to_string(peer) +
                      " is outside the communicator of size " + std::to_string(size));
}
} // namespace detail

/// The communicator of a process alone: size 1, rank 0. Collectives are identities (a bf16
/// sum of one term is exact); a send to itself is queued until the matching recv (same tag,
/// first in first out), so a plan of world size 1 runs unchanged without MPI.
class single_process_communicator {
public:
  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }

  template <CommScalar T>
  void all_reduce_sum(T* /*buf*/, std::int64_t n) {
    detail::check_comm_args("all_reduce_sum", n, 0, 1);
  }
  template <CommScalar T>
  request iall_reduce_sum(T* buf, std::int64_t n) {
    all_reduce_sum(buf, n);
    return request{};
  }
  template <CommScalar T>
  void all_gather(const T* send, T* recv, std::int64_t n) {
    detail::check_comm_args("all_gather", n, 0, 1);
    if (n > 0 && send != recv) std::memmove(recv, send, sizeof(T) * std::size_t(n));
  }
  template <CommScalar T>
  void reduce_scatter_sum(const T* send, T* recv, std::int64_t n) {
    detail::check_comm_args("reduce_scatter_sum", n, 0, 1);
    if (n > 0 && send != recv) std::memmove(recv, send, sizeof(T) * std::size_t(n));
  }
  request ireduce_scatter_sum(float* /*buf*/, const std::int64_t* counts) {
    detail::check_comm_args("ireduce_scatter_sum", counts[0], 0, 1); // a sum of one: in place
    return request{};
  }
  template <CommScalar T>
  void broadcast(T* /*buf*/, std::int64_t n, int root) {
    detail::check_comm_args("broadcast", n, root, 1);
  }
  template <CommScalar T>
  void send(const T* buf, std::int64_t n, int peer, int tag) {
    detail::check_comm_args("send", n, peer, 1);
    const auto* bytes = reinterpret_cast<const unsigned char*>(buf);
    mailbox_->messages.emplace_back(
        tag, std::vector<unsigned char>(bytes, bytes + sizeof(T) * std::size_t(n)));
  }
  template <CommScalar T>
  void recv(T* buf, std::int64_t n, int peer, int tag) {
    detail::check_comm_args("recv", n, peer, 1);
    auto& all = mailbox_->messages;
    const auto it =
        std::find_if(all.begin(), all.end(), [&](const auto& e) { return e.first == tag; });
    if (it == all.end())
      throw value_error("tessera::parallel::single_process_communicator::recv: no message with "
                        "tag " +
                        std::to_string(tag) +
                        " was sent (a single process would wait "
                        "forever)");
    const std::vector<unsigned char>& m = it->second;
    if (m.size() != sizeof(T) * std::size_t(n))
      throw value_error("tessera::parallel::single_process_communicator::recv: the message "
                        "with tag " +
                        std::to_string(tag) + " has " + std::to_string(m.size()) +
                        " bytes, the receive expects " + std::to_string(sizeof(T) * n));
    if (n > 0) std::memcpy(buf, m.data(), m.size());
    all.erase(it);
  }
  template <CommScalar T>
  request isend(const T* buf, std::int64_t n, int peer, int tag) {
    send(buf, n, peer, tag);
    return request{};
  }
  /// Completes at wait(), so the matching send may come after this call.
  template <CommScalar T>
  request irecv(T* buf, std::int64_t n, int peer, int tag) {
    detail::check_comm_args("irecv", n, peer, 1);
    return request([self = *this, buf, n, peer, tag]() mutable { self.recv(buf, n, peer, tag); });
  }
  bool all_of(bool flag) { return flag; }
  /// Every split of a single process is a single process (sharing no mailbox).
  single_process_communicator split(int /*colour*/, int /*key*/) const { return {}; }
  void barrier() {}
  [[noreturn]] void abort(int code) { std::exit(code); }

private:
  // Messages in send order, each with its tag; recv takes the oldest of its tag. (Not a map of
  // deques: hipcc 5.2 (clang 15) crashes instantiating one inside make_shared.)
  struct mailbox {
    std::vector<std::pair<int, std::vector<unsigned char>>> messages;
  };
  std::shared_ptr<mailbox> mailbox_ = std::make_shared<mailbox>();
};

static_assert(Communicator<single_process_communicator>);

} // namespace tessera::parallel
