#pragma once
/// \file parallel/counting.hpp
/// tessera::parallel::counting_communicator<C>: a Communicator that forwards every call to C
/// and counts the bytes this process hands to it, by kind of operation. For measuring a plan's
/// communication volume (benchmarks/parallel) against the analytic formula.
///
///   auto world = tessera::parallel::counting_communicator(mpi_communicator::world());
///   tessera::parallel::mesh<Plan, decltype(world)> m(world);
///   ... one training step ...
///   m.tensor.counts().all_reduce      // bytes this rank gave to tensor-group all-reduces
///
/// Counted: the elements passed times sizeof(T), for calls on groups of more than one process
/// (on a group of one nothing moves). all_gather counts what this rank sends; send and isend
/// count the message; receives, barriers and all_of count nothing. A bf16 all-reduce counts 2
/// bytes per element although the MPI backend widens it to fp32 on the wire. Copies share the
/// counts; split() starts fresh counts for the new group.

#include <tessera/parallel/communicator.hpp>

#include <cstdint>
#include <memory>
#include <utility>

namespace tessera::parallel {

/// Bytes handed to each kind of operation.
struct comm_counts {
  std::int64_t all_reduce = 0;     ///< all_reduce_sum and iall_reduce_sum
  std::int64_t all_gather = 0;     ///< this rank's part
  std::int64_t reduce_scatter = 0; ///< the whole send buffer (of both forms)
  std::int64_t broadcast = 0;
  std::int64_t send = 0; ///< send and isend
  std::int64_t total() const noexcept {
    return all_reduce + all_gather + reduce_scatter + broadcast + send;
  }
};

template <Communicator C>
class counting_communicator {
public:
  explicit counting_communicator(C inner)
      : inner_(std::move(inner)), counts_(std::make_shared<comm_counts>()) {}

  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }
  const comm_counts& counts() const noexcept { return *counts_; }
  void reset_counts() { *counts_ = {}; }
  C& inner() noexcept { return inner_; }

  template <CommScalar T>
  void all_reduce_sum(T* buf, std::int64_t n) {
    add(counts_->all_reduce, n * std::int64_t(sizeof(T)));
    inner_.all_reduce_sum(buf, n);
  }
  template <CommScalar T>
  request iall_reduce_sum(T* buf, std::int64_t n) {
    add(counts_->all_reduce, n * std::int64_t(sizeof(T)));
    return inner_.iall_reduce_sum(buf, n);
  }
  template <CommScalar T>
  void all_gather(const T* send, T* recv, std::int64_t n) {
    add(counts_->all_gather, n * std::int64_t(sizeof(T)));
    inner_.all_gather(send, recv, n);
  }
  template <CommScalar T>
  void reduce_scatter_sum(const T* send, T* recv, std::int64_t n) {
    add(counts_->reduce_scatter, n * std::int64_t(size()) * std::int64_t(sizeof(T)));
    inner_.reduce_scatter_sum(send, recv, n);
  }
  request ireduce_scatter_sum(float* buf, const std::int64_t* counts) {
    std::int64_t n = 0;
    for (int r = 0; r < size(); ++r) n += counts[r];
    add(counts_->reduce_scatter, n * std::int64_t(sizeof(float)));
    return inner_.ireduce_scatter_sum(buf, counts);
  }
  template <CommScalar T>
  void broadcast(T* buf, std::int64_t n, int root) {
    add(counts_->broadcast, n * std::int64_t(sizeof(T)));
    inner_.broadcast(buf, n, root);
  }
  template <CommScalar T>
  void send(const T* buf, std::int64_t n, int peer, int tag) {
    add(counts_->send, n * std::int64_t(sizeof(T)));
    inner_.send(buf, n, peer, tag);
  }
  template <CommScalar T>
  void recv(T* buf, std::int64_t n, int peer, int tag) {
    inner_.recv(buf, n, peer, tag);
  }
  template <CommScalar T>
  request isend(const T* buf, std::int64_t n, int peer, int tag) {
    add(counts_->send, n * std::int64_t(sizeof(T)));
    return inner_.isend(buf, n, peer, tag);
  }
  template <CommScalar T>
  request irecv(T* buf, std::int64_t n, int peer, int tag) {
    return inner_.irecv(buf, n, peer, tag);
  }
  bool all_of(bool flag) { return inner_.all_of(flag); }
  counting_communicator split(int colour, int key) const {
    return counting_communicator(inner_.split(colour, key));
  }
  void barrier() { inner_.barrier(); }
  [[noreturn]] void abort(int code) { inner_.abort(code); }

private:
  void add(std::int64_t& counter, std::int64_t bytes) const {
    if (inner_.size() > 1) counter += bytes;
  }

  C inner_;
  std::shared_ptr<comm_counts> counts_;
};

static_assert(Communicator<counting_communicator<single_process_communicator>>);

} // namespace tessera::parallel
