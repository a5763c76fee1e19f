#pragma once
/// \file parallel/fp8_sync.hpp
/// fp8 scaling states under parallel plans: every rank's states equal to the single process's.
///
/// An fp8 layer keeps one train::fp8_meta per fp8 tensor (weight, input, output gradient) and
/// records the amax of what it quantized. Under a plan a rank quantizes only a slice of the
/// tensor the single process quantizes:
///  - data parallel: its share of the batch (inputs and output gradients);
///  - tensor split: its shard (a column-parallel layer's weight rows and output gradient
///    columns, a row-parallel layer's weight columns and input features; replicated tensors
///    are whole and equal on every rank of the group);
///  - pipeline with M micro-batches: one micro-batch at a time, M records per step where the
///    single process makes one.
/// The single process's amax of the whole tensor over the step is the maximum over those
/// slices. So a plan stage defers its records (defer_fp8_records: record() only keeps the
/// running maximum, the scale stays the step's), and after each step sync_fp8_states takes the
/// maximum of the pending amaxes over the tensor group and the data group and commits it: one
/// history entry per step, the single process's. Ranks of different pipeline stages hold
/// different layers and share no fp8 tensor.
///
/// What matches exactly, and what does not:
///  - delayed scaling (train::delayed_scaling): the scale comes from the history, which is the
///    single process's on every rank after every step; the quantized operands are the single
///    process's (sliced), so the plans differ from it only in the order of fp32 sums (as in
///    fp32 and bf16), up to the fp8 roundings those differences flip. Under a data split of D
///    each rank's loss is the mean over its share, so its output gradients, and their amaxes,
///    are D times the single process's: the same payloads once the scale comes from the history
///    (D a power of two), but at the first step (scale 1, no history yet) gradients in E5M2's
///    subnormal range keep bits the single process rounds away.
///  - current scaling (train::current_scaling): the scale of a quantization comes from the amax
///    of the tensor being quantized, measured just before. A plan stage makes each of its
///    current-scaling states agree on it (reduce_current_amaxes: the slice's amax, max-reduced
///    over the tensor group and the data group, one all-gather of a float on each inside every
///    cast), so under data and tensor splits every rank quantizes with the single process's
///    scale (the output gradients' times D, a power of two for D = 2, 4, 8: the same payloads)
///    and the plans differ from it only in the order of fp32 sums, as with delayed scaling.
///    Under a pipeline with M > 1 micro-batches each micro-batch is quantized as it comes, with
///    the amax of the micro-batch (over the groups), before the step's other micro-batches
///    exist: there the results agree with the single process only within fp8's rounding (E4M3
///    2^-4, E5M2 2^-3 relative per operand). The fallback scale (the last usable amax, used
///    when a tensor's amax is zero or not finite) is synchronised like a delayed history entry.
///
/// A step is one plan_stage::forward_backward or plan_stage::evaluate (parallel/runner.hpp calls
/// sync_fp8_states at the end of both). Every rank of a group must call it the same number of
/// times with the same layers, as for every collective; a tensor recorded on some ranks of a
/// group and not on others is reported as a value_error on all of them.

#include <tessera/config/error.hpp>
#include <tessera/parallel/communicator.hpp>
#include <tessera/parallel/tensor_parallel.hpp>
#include <tessera/train/fp8_recipe.hpp>

#include <boost/hana/flatten.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/tuple.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessera::parallel {

/// Every fp8 scaling state of `model` as one boost::hana tuple of train::fp8_meta pointers, in
/// the order of its layers and of each layer's fp8_states(): a model with fp8_states()
/// (nn::Sequential, a layer), a pipeline stage (layers reached through size() and
/// layer<K>()), or an interleaved stage (its chunks, reached through chunk<c>(), in order). A
/// model without fp8 layers has none. What a plan checkpoint saves per rank.
template <class Model>
auto fp8_states_in(Model& model) {
  if constexpr (requires { model.fp8_states(); }) {
    return model.fp8_states();
  } else if constexpr (requires { model.template layer<0>(); }) {
    return [&]<std::size_t... K>(std::index_sequence<K...>) {
      return boost::hana::flatten(
          boost::hana::make_tuple(fp8_states_in(model.template layer<K>())...));
    }
    (std::make_index_sequence<Model::size()>{});
  } else if constexpr (requires { model.template chunk<0>(); }) {
    return [&]<int... c>(std::integer_sequence<int, c...>) {
      return boost::hana::flatten(
          boost::hana::make_tuple(fp8_states_in(model.template chunk<c>())...));
    }
    (std::make_integer_sequence<int, Model::chunks>{});
  } else {
    return boost::hana::make_tuple();
  }
}

/// Calls f(meta) for every fp8 scaling state (train::fp8_meta&) of `model`, in fp8_states_in's
/// order.
template <class Model, class F>
void for_each_fp8_state(Model& model, F&& f) {
  boost::hana::for_each(fp8_states_in(model), [&](auto* meta) { f(*meta); });
}

/// The number of fp8 scaling states of `model` (see for_each_fp8_state).
template <class Model>
std::size_t count_fp8_states(Model& model) {
  std::size_t n = 0;
  for_each_fp8_state(model, [&](auto&) { ++n; });
  return n;
}

namespace detail {

/// The groups a plan stage's current amaxes are reduced over (reduce_current_amaxes), and the
/// buffer the all-gathers land in (sized once: a cast allocates nothing).
template <Communicator C>
struct amax_groups {
  C* data = nullptr;
  const tensor_group* tensor = nullptr;
  std::vector<float> gathered;
};

/// The maximum of `amax` over `comm` (NaN-propagating), gathered into `buf`; `amax` itself for
/// one process.
template <class Comm>
float max_over(Comm& comm, float amax, std::vector<float>& buf) {
  if (comm.size() <= 1) return amax;
  buf.resize(std::size_t(comm.size()));
  comm.all_gather(&amax, buf.data(), 1);
  float m = buf[0];
  for (float a : buf) m = train::detail::max_or_nan(m, a);
  return m;
}

/// train::fp8_meta::amax_reduction over an amax_groups<C>: the tensor group, then the data group.
template <Communicator C>
float reduce_amax_over_groups(void* context, float amax) {
  auto& g = *static_cast<amax_groups<C>*>(context);
  return max_over(*g.data, max_over(*g.tensor, amax, g.gathered), g.gathered);
}

} // namespace detail

/// Makes every current-scaling fp8 state of `model` take the maximum of a cast's amax over the
/// tensor group and the data group of `groups` (train::fp8_meta::reduce_current_amax_with; see
/// the file comment): what a plan stage does once, at construction. `groups` must outlive the
/// model's use. Every rank of both groups then casts in the same order (they run the same
/// layers), each cast a collective. Delayed-scaling states are left alone.
template <class Model, Communicator C>
void reduce_current_amaxes(Model& model, detail::amax_groups<C>& groups) {
  for_each_fp8_state(model, [&](auto& meta) {
    if constexpr (std::remove_cvref_t<decltype(meta)>::needs_current_amax)
      meta.reduce_current_amax_with(&detail::reduce_amax_over_groups<C>, &groups);
  });
}

/// Defers (or, with on = false, stops deferring) the records of every fp8 state of `model`
/// (train::fp8_meta::defer_records): what a plan stage does once, at construction.
template <class Model>
void defer_fp8_records(Model& model, bool on = true) {
  for_each_fp8_state(model, [&](auto& meta) { meta.defer_records(on); });
}

namespace detail {

/// (pending flag, amax) pairs of n states: the maximum over `size` ranks' blocks of 2n floats,
/// NaN-propagating, into `out`. Throws value_error when the flags disagree.
inline void max_over_blocks(const std::vector<float>& all, int size, std::vector<float>& out,
                            const char* group) {
  const std::size_t n2 = out.size();
  for (std::size_t k = 0; k < n2; k += 2) {
    float flag = all[k], amax = all[k + 1];
    for (int r = 1; r < size; ++r) {
      const float f = all[std::size_t(r) * n2 + k], a = all[std::size_t(r) * n2 + k + 1];
      if (f != flag)
        throw value_error("tessera::parallel::sync_fp8_states: fp8 tensor " +
                          std::to_string(k / 2) + " of this stage recorded an amax on some " +
                          "ranks of its " + group + " group and not on others; every rank of " +
                          "a group must run the same passes between two synchronisations");
      amax = train::detail::max_or_nan(amax, a);
    }
    out[k] = flag;
    out[k + 1] = amax;
  }
}

} // namespace detail

/// Commits every deferred fp8 state of `model` with the maximum of its pending amax over the
/// tensor group and the data group (see the file comment): afterwards each state's history and
/// scale are the same on every rank that shares the tensor, and the single process's. Collective
/// over both groups (an all-gather of 2 floats per state on each, none when a group is one
/// process). States with nothing pending (e.g. the output gradients after an evaluation) are
/// left as they are.
template <class Model, Communicator C>
void sync_fp8_states(Model& model, C& data, const tensor_group& tensor) {
  const std::size_t n = count_fp8_states(model);
  if (n == 0) return;
  std::vector<float> mine;
  mine.reserve(2 * n);
  for_each_fp8_state(model, [&](auto& meta) {
    mine.push_back(meta.has_pending() ? 1.f : 0.f);
    mine.push_back(meta.pending_amax());
  });
  const auto n2 = static_cast<std::int64_t>(mine.size());
  if (tensor.size() > 1) {
    std::vector<float> all(std::size_t(tensor.size()) * mine.size());
    tensor.all_gather(mine.data(), all.data(), n2);
    detail::max_over_blocks(all, tensor.size(), mine, "tensor");
  }
  if (data.size() > 1) {
    std::vector<float> all(std::size_t(data.size()) * mine.size());
    data.all_gather(mine.data(), all.data(), n2);
    detail::max_over_blocks(all, data.size(), mine, "data");
  }
  std::size_t k = 0;
  for_each_fp8_state(model, [&](auto& meta) {
    if (mine[k] != 0.f) meta.commit(mine[k + 1]);
    k += 2;
  });
}

} // namespace tessera::parallel
