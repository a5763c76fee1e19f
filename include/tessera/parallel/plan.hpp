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
/// The data policy may carry a ZeRO stage, plan<data<dyn, zero<2>>, tensor<2>> (zero_stage;
/// parallel/zero.hpp): it changes how the optimizer runs over the data group, not the mesh.
///
/// Mesh axis order: tensor is the innermost (fastest varying) axis, then data, then pipeline
/// outermost, as Megatron-LM orders them (tp, dp, pp): the ranks of a tensor group are
/// neighbours (rank = t + T * (d + D * p)), so the two all-reduces per Linear pair that tensor
/// parallelism needs stay on one node when ranks fill nodes in order.
///
/// The data degree may be left to run time, data<tessera::dyn>: D = world size / (T * P),
///
///   using Q = plan<data<dyn>, tensor<2>>;              // 2, 4, 6, ... processes
///   static_assert(Q::fits(6) && !Q::fits(3) && Q::shape_on(6).data == 3);
///
/// parallel::mesh fills it in (mesh::shape); the rank arithmetic of such a plan is mesh_shape's
/// (coordinates, rank_of, ... are compile-time statics only of plans with fixed sizes).
///
/// A policy given twice, an argument that is not a policy, a size of zero, or dyn for the tensor
/// or pipeline degree fails to compile with a sentence naming the rule.

#include <tessera/parallel/policies.hpp>

#include <boost/hana/count_if.hpp>
#include <boost/hana/find_if.hpp>
#include <boost/hana/integral_constant.hpp>
#include <boost/hana/optional.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>

#include <array>
#include <string>
#include <type_traits>

namespace tessera::parallel {

/// A rank's position on the mesh.
struct coordinates_t {
  int data = 0;
  int tensor = 0;
  int pipeline = 0;
  friend constexpr bool operator==(const coordinates_t&, const coordinates_t&) = default;
};

/// The sizes of a mesh's three axes, known at run time: a plan's (parallel::mesh::shape), with
/// the data degree of data<dyn> filled in. Everything about rank placement is computed here;
/// a plan with compile-time sizes exposes the same functions as constexpr statics.
///
/// Axis order: tensor innermost (fastest varying), then data, then pipeline outermost, as
/// Megatron-LM orders them (tp, dp, pp): rank = t + T * (d + D * p).
struct mesh_shape {
  int data = 1;
  int tensor = 1;
  int pipeline = 1;
  friend constexpr bool operator==(const mesh_shape&, const mesh_shape&) = default;

  /// The number of processes.
  constexpr int world() const noexcept { return data * tensor * pipeline; }
  /// The size of one axis.
  constexpr int size(axis a) const noexcept {
    return a == axis::tensor ? tensor : a == axis::data ? data : pipeline;
  }
  /// The mesh position of `rank` (0 <= rank < world()).
  constexpr coordinates_t coordinates(int rank) const noexcept {
    return {(rank / tensor) % data, rank % tensor, rank / (tensor * data)};
  }
  /// The rank at a mesh position; inverse of coordinates().
  constexpr int rank_of(coordinates_t c) const noexcept {
    return c.tensor + tensor * (c.data + data * c.pipeline);
  }
  /// MPI_Comm_split colour of `rank` for the communicator along axis `a`: ranks that agree on
  /// the two other coordinates share a colour (and so a group along `a`).
  constexpr int group_color(axis a, int rank) const noexcept {
    const coordinates_t c = coordinates(rank);
    switch (a) {
    case axis::tensor:
      return c.data + data * c.pipeline;
    case axis::data:
      return c.tensor + tensor * c.pipeline;
    default:
      return c.tensor + tensor * c.data;
    }
  }
  /// The position of `rank` inside its group along axis `a` (the MPI_Comm_split key).
  constexpr int group_rank(axis a, int rank) const noexcept {
    const coordinates_t c = coordinates(rank);
    return a == axis::tensor ? c.tensor : a == axis::data ? c.data : c.pipeline;
  }
  /// "plan(data=3, tensor=2, pipeline=1)".
  std::string name() const {
    return "plan(data=" + std::to_string(data) + ", tensor=" + std::to_string(tensor) +
           ", pipeline=" + std::to_string(pipeline) + ")";
  }
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

/// The ZeRO stage of the plan's data policy, 0 without one.
template <class... Policies>
struct zero_stage_of : std::integral_constant<int, 0> {};
template <class First, class... Rest>
struct zero_stage_of<First, Rest...> : zero_stage_of<Rest...> {};
template <int D, class Z, class... Rest>
struct zero_stage_of<data<D, Z>, Rest...> : std::integral_constant<int, Z::stage> {};

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

  /// True for data<dyn>: the data degree is the world size / (tensor_size * pipeline_size),
  /// known at run time (parallel::mesh::shape).
  static constexpr bool dynamic_data = detail::size_on<axis::data, Policies...>() == dyn;
  /// The data degree; dyn (-1) for data<dyn>.
  static constexpr int data_size = detail::size_on<axis::data, Policies...>();
  static constexpr int tensor_size = detail::size_on<axis::tensor, Policies...>();
  static constexpr int pipeline_size = detail::size_on<axis::pipeline, Policies...>();
  /// The number of processes the plan runs on; dyn (-1) for data<dyn> (any positive multiple
  /// of tensor_size * pipeline_size: see fits()).
  static constexpr int world_size =
      dynamic_data ? int(dyn) : data_size * tensor_size * pipeline_size;
  /// The ZeRO stage of the data split (data<D, zero<S>>; 0 without it): see parallel/zero.hpp.
  static constexpr int zero_stage = detail::zero_stage_of<Policies...>::value;
  /// Pipeline cut points: `balanced` or cut_at<I...>.
  using cuts = typename detail::pipeline_cuts<Policies...>::type;

  /// Mesh axes from innermost (fastest varying rank) to outermost.
  static constexpr std::array<axis, 3> axes = {axis::tensor, axis::data, axis::pipeline};

  /// Whether the plan runs on `world` processes: exactly world_size, or for data<dyn> a
  /// positive multiple of tensor_size * pipeline_size.
  static constexpr bool fits(int world) noexcept {
    if constexpr (dynamic_data)
      return world >= tensor_size * pipeline_size && world % (tensor_size * pipeline_size) == 0;
    else
      return world == world_size;
  }

  /// The mesh on `world` processes (fits(world) must hold): data<dyn>'s degree filled in.
  static constexpr mesh_shape shape_on(int world) noexcept {
    if constexpr (dynamic_data)
      return {world / (tensor_size * pipeline_size), tensor_size, pipeline_size};
    else
      return {data_size, tensor_size, pipeline_size};
  }

  /// The mesh of a plan with compile-time sizes.
  static constexpr mesh_shape shape() noexcept requires(!dynamic_data) {
    return {data_size, tensor_size, pipeline_size};
  }

  /// The size of one axis (compile-time sizes only; else mesh::shape.size).
  static constexpr int size(axis a) noexcept requires(!dynamic_data) { return shape().size(a); }

  /// The mesh position of `rank` (0 <= rank < world_size; compile-time sizes only, else
  /// mesh::shape.coordinates).
  static constexpr coordinates_t coordinates(int rank) noexcept requires(!dynamic_data) {
    return shape().coordinates(rank);
  }

  /// The rank at a mesh position; inverse of coordinates().
  static constexpr int rank_of(coordinates_t c) noexcept requires(!dynamic_data) {
    return shape().rank_of(c);
  }

  /// MPI_Comm_split colour of `rank` for the communicator along axis `a`: ranks that agree on
  /// the two other coordinates share a colour (and so a group along `a`).
  static constexpr int group_color(axis a, int rank) noexcept requires(!dynamic_data) {
    return shape().group_color(a, rank);
  }

  /// The position of `rank` inside its group along axis `a` (the MPI_Comm_split key).
  static constexpr int group_rank(axis a, int rank) noexcept requires(!dynamic_data) {
    return shape().group_rank(a, rank);
  }

  /// Idle fraction of a GPipe or 1F1B step with `micro_batches` micro-batches:
  /// (P - 1) / (M + P - 1) (Huang et al. 2019, GPipe, section 2.2).
  static constexpr double bubble_fraction(int micro_batches) noexcept {
    return double(pipeline_size - 1) / double(micro_batches + pipeline_size - 1);
  }

  /// "plan(data=2, tensor=1, pipeline=2)"; "plan(data=dyn, tensor=2, pipeline=1)" for data<dyn>.
  static std::string name() {
    return "plan(data=" + (dynamic_data ? std::string("dyn") : std::to_string(data_size)) +
           ", tensor=" + std::to_string(tensor_size) +
           ", pipeline=" + std::to_string(pipeline_size) + ")";
  }

  /// Why `world` processes do not fit the plan (empty when fits(world)): names the plan, the
  /// world size and the rule.
  static std::string misfit(int world) {
    if (fits(world)) return "";
    if constexpr (dynamic_data) {
      const int tp = tensor_size * pipeline_size;
      return name() +
             " takes its data-parallel degree from the world size, which must be a "
             "positive multiple of tensor x pipeline = " +
             std::to_string(tp) + ", but the world has " + std::to_string(world) +
             " processes (launch it with mpiexec -n " + std::to_string(tp) + ", " +
             std::to_string(2 * tp) + ", " + std::to_string(3 * tp) + ", ...)";
    } else {
      return name() + " needs " + std::to_string(world_size) + " processes but the world has " +
             std::to_string(world) + " (launch it with mpiexec -n " + std::to_string(world_size) +
             ")";
    }
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
