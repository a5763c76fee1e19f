#pragma once
/// \file parallel/plan.hpp
/// tessera::parallel::plan<Policies...>: data, tensor and pipeline splits composed at compile
/// time into a 3-D mesh of ranks.
///
///   using P = plan<data<2>, tensor<2>, pipeline<2>>;   // any order, each policy at most once
///   static_assert(P::world_size == 8);
///   constexpr auto c = P::coordinates(5);              // {data = 0, tensor = 1, pipeline = 1}
///   static_assert(P::rank_of(c) == 5);
///
/// Mesh axis order: tensor is the innermost (fastest varying) axis, then data, then pipeline
/// outermost, as Megatron-LM orders them (tp, dp, pp): the ranks of a tensor group are
/// neighbours (rank = t + T * (d + D * p)), so the two all-reduces per Linear pair that tensor
/// parallelism needs stay on one node when ranks fill nodes in order.
///
/// A policy given twice, an argument that is not a policy, or a size of zero fails to compile
/// with a sentence naming the rule.

#include <tessera/parallel/policies.hpp>

#include <boost/hana/count_if.hpp>
#include <boost/hana/find_if.hpp>
#include <boost/hana/integral_constant.hpp>
#include <boost/hana/optional.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>

#include <array>
#include <string>

namespace tessera::parallel {

/// A rank's position on the mesh.
struct coordinates_t {
  int data = 0;
  int tensor = 0;
  int pipeline = 0;
  friend constexpr bool operator==(const coordinates_t&, const coordinates_t&) = default;
};

namespace detail {
namespace hana = boost::hana;

/// The axis a type splits, or -1 for a type that is not a policy (so counting never hard-errors
/// before the plan's own static_assert explains the problem).
template <class T>
constexpr int axis_of() {
  if constexpr (is_policy<T>::value)
    return static_cast<int>(T::axis);
  else
    return -1;
}

template <axis A, class... Policies>
constexpr std::size_t count_axis() {
  return decltype(hana::count_if(hana::tuple_t<Policies...>, [](auto t) {
    return hana::bool_c<axis_of<typename decltype(t)::type>() == static_cast<int>(A)>;
  }))::value;
}

/// The size of the policy on axis A, 1 when the plan has none.
template <axis A, class... Policies>
constexpr int size_on() {
  auto found = hana::find_if(hana::tuple_t<Policies...>, [](auto t) {
    return hana::bool_c<axis_of<typename decltype(t)::type>() == static_cast<int>(A)>;
  });
  if constexpr (decltype(hana::is_just(found))::value)
    return decltype(+*found)::type::size;
  else
    return 1;
}

template <class... Policies>
struct pipeline_cuts {
  using type = balanced;
};
template <class First, class... Rest>
struct pipeline_cuts<First, Rest...> : pipeline_cuts<Rest...> {};
template <int P, class C, class... Rest>
struct pipeline_cuts<pipeline<P, C>, Rest...> {
  using type = C;
};
} // namespace detail

/// A parallelism plan: the composition of at most one data<D>, tensor<T> and pipeline<P>
/// policy, in any order. Everything about the mesh is constexpr.
template <class... Policies>
struct plan {
  static_assert((is_policy<Policies>::value && ...),
                "tessera::parallel::plan<...>: every argument must be a policy: data<D>, "
                "tensor<T> or pipeline<P>");
  static_assert(detail::count_axis<axis::data, Policies...>() <= 1,
                "tessera::parallel::plan<...>: the data policy is given more than once; give "
                "each of data, tensor and pipeline at most once");
  static_assert(detail::count_axis<axis::tensor, Policies...>() <= 1,
                "tessera::parallel::plan<...>: the tensor policy is given more than once; give "
                "each of data, tensor and pipeline at most once");
  static_assert(detail::count_axis<axis::pipeline, Policies...>() <= 1,
                "tessera::parallel::plan<...>: the pipeline policy is given more than once; "
                "give each of data, tensor and pipeline at most once");

  static constexpr int data_size = detail::size_on<axis::data, Policies...>();
  static constexpr int tensor_size = detail::size_on<axis::tensor, Policies...>();
  static constexpr int pipeline_size = detail::size_on<axis::pipeline, Policies...>();
  /// The number of processes the plan runs on.
  static constexpr int world_size = data_size * tensor_size * pipeline_size;
  /// Pipeline cut points: `balanced` or cut_at<I...>.
  using cuts = typename detail::pipeline_cuts<Policies...>::type;

  /// Mesh axes from innermost (fastest varying rank) to outermost.
  static constexpr std::array<axis, 3> axes = {axis::tensor, axis::data, axis::pipeline};

  /// The size of one axis.
  static constexpr int size(axis a) noexcept {
    return a == axis::tensor ? tensor_size : a == axis::data ? data_size : pipeline_size;
  }

  /// The mesh position of `rank` (0 <= rank < world_size).
  static constexpr coordinates_t coordinates(int rank) noexcept {
    return {(rank / tensor_size) % data_size, rank % tensor_size, rank / (tensor_size * data_size)};
  }

  /// The rank at a mesh position; inverse of coordinates().
  static constexpr int rank_of(coordinates_t c) noexcept {
    return c.tensor + tensor_size * (c.data + data_size * c.pipeline);
  }

  /// MPI_Comm_split colour of `rank` for the communicator along axis `a`: ranks that agree on
  /// the two other coordinates share a colour (and so a group along `a`).
  static constexpr int group_color(axis a, int rank) noexcept {
    const coordinates_t c = coordinates(rank);
    switch (a) {
    case axis::tensor:
      return c.data + data_size * c.pipeline;
    case axis::data:
      return c.tensor + tensor_size * c.pipeline;
    default:
      return c.tensor + tensor_size * c.data;
    }
  }

  /// The position of `rank` inside its group along axis `a` (the MPI_Comm_split key).
  static constexpr int group_rank(axis a, int rank) noexcept {
    const coordinates_t c = coordinates(rank);
    return a == axis::tensor ? c.tensor : a == axis::data ? c.data : c.pipeline;
  }

  /// Idle fraction of a GPipe or 1F1B step with `micro_batches` micro-batches:
  /// (P - 1) / (M + P - 1) (Huang et al. 2019, GPipe, section 2.2).
  static constexpr double bubble_fraction(int micro_batches) noexcept {
    return double(pipeline_size - 1) / double(micro_batches + pipeline_size - 1);
  }

  /// "plan(data=2, tensor=1, pipeline=2)".
  static std::string name() {
    return "plan(data=" + std::to_string(data_size) + ", tensor=" + std::to_string(tensor_size) +
           ", pipeline=" + std::to_string(pipeline_size) + ")";
  }
};

template <class T>
struct is_plan : std::false_type {};
template <class... P>
struct is_plan<plan<P...>> : std::true_type {};

/// Any plan<...>.
template <class T>
concept Plan = is_plan<T>::value;

} // namespace tessera::parallel
