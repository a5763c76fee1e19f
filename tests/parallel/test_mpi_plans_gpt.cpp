// The character GPT of examples/train_char_gpt.cpp (same layer types, tiny sizes) under every
// plan of the eight (data, tensor, pipeline) in {1, 2}^3 whose size is the world's, against the
// single-process run of the example's composition: nn::Embedding in front of an nn::Sequential
// of the position embedding, the blocks, the final LayerNorm and the lm_head.
//
// Under a plan the model is one nn::Sequential whose first layer is nn::TokenEmbedding (the
// Embedding as a layer on ids (B, T)): stage 0 of a pipeline reads the token ids, every later
// stage a (B, T, D) activation; the last stage's loss reads targets (B, T). Under tensor=2
// each block is split inside (parallel::TensorParallelResidual): the attention by heads (each
// rank 1 of the 2 heads: its q, k, v columns of the QKV projection, its columns of the output
// projection, one all-reduce forward and one backward), the MLP Linear, GELU, Linear column- then
// row-parallel, the LayerNorms replicated; the embeddings, LN_f and the lone lm_head replicated.
//
// Bounds: the plan without splits (1 rank) must give bit-identical weights: the same layers
// and kernels as the reference, composed as one Sequential instead of Embedding + Sequential.
// The others sum in another order (over 2 micro-batches under a pipeline, over the data ranks
// times 1/D, over the tensor ranks for the row-parallel partial products and the column-
// parallel input gradients; the head-split attention's core is the whole layer's tiled kernel
// on its heads, the same sums per head), a few fp32 ulps per gradient; 3 SGD steps (lr 0.05,
// momentum 0.9) keep the weight differences ~1e-7, and the bound is fp32_tolerance = 1e-5
// (plan_check.hpp), far below what a real mistake does (a missed 1/D or 1/M, a head's columns
// sliced from the wrong place, a partial sum not reduced: >= 1e-3).
//
// Memory: the head-split attention keeps, between forward and backward, bytes linear in t
// (tiled core: the log-sum-exp per row, not the probabilities), equal to a formula from the
// shapes at t = 64, 128, 256 (nn::saved_activation_bytes), and its outputs and input gradients
// match the whole layer's (1 rank; pairs of ranks splitting the heads 2 ways).
#include "gpt_run.hpp"

#include <cstdint>
#include <random>

using namespace tessera_test;
using namespace tessera_test::gpt;

namespace {

using P = tessera::fp32;

// The balanced 2-stage cut falls between blocks (after layer 3 or 4 of 8).
constexpr auto gpt_bounds = tp::stage_bounds<GPT<P>, 2>::value;
static_assert(gpt_bounds[1] >= 3 && gpt_bounds[1] <= 5);

// The tensor split of the blocks: attention by heads, the MLP column then row, LN replicated.
using Split = tp::tensor_split_t<GPT<P>, 2>;
using split_attn = std::remove_cvref_t<decltype(std::declval<Split&>().template layer<2>())>;
using split_mlp = std::remove_cvref_t<decltype(std::declval<Split&>().template layer<3>())>;
static_assert(
    std::is_same_v<split_attn, tp::TensorParallelResidual<2, layer_norm<P>,
                                                          tp::HeadParallelAttention<D, H, 2, P>>>);
static_assert(std::is_same_v<
              split_mlp,
              tp::TensorParallelResidual<2, layer_norm<P>, tp::ColumnParallelLinear<D, 4 * D, 2, P>,
                                         nn::GELU, tp::RowParallelLinear<4 * D, D, 2, P>>>);

} // namespace

TEST_CASE("plans: tiny character GPT fp32 against the single process", "[parallel][gpt]") {
  const int ran = gpt::check_gpt_plans<P>({.global_batch = 8, .steps = 3}, fp32_tolerance);
  CHECK(ran == gpt::plans_for(tp::mpi_communicator::world().size()));
}

namespace {

/// x (B, t, D) with values in [-1, 1) from a fixed generator.
tessera::Tensor<P, tessera::extents<tessera::dyn, tessera::dyn, D>>
attention_input(tessera::index_t B, tessera::index_t t, std::uint32_t seed) {
  tessera::Tensor<P, tessera::extents<tessera::dyn, tessera::dyn, D>> x("x", B, t);
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (tessera::index_t i = 0; i < x.size(); ++i) x.data()[i] = u(g);
  return x;
}

/// The bytes HeadParallelAttention<D, H, TP> (fp32) keeps between forward and backward for an
/// input of (B, t, D) floats, from the shapes: the input x (the QKV projection's saved input,
/// shared with the caller), the QKV projection's output (B, t, 3D/TP), this rank's heads' output
/// o (B, t, D/TP, the output projection's saved input), the output projection's output (B, t,
/// D), the core's fp32 q, k, k^T, v, v^T (5 of B t D/TP) and the log-sum-exp per row (B H/TP t).
template <int TP>
std::size_t head_parallel_saved_bytes(tessera::index_t B, tessera::index_t t) {
  const tessera::index_t floats = B * t * D + B * t * 3 * D / TP + B * t * D / TP + B * t * D +
                                  5 * B * t * D / TP + B * (H / TP) * t;
  return std::size_t(floats) * sizeof(float);
}

/// Runs forward and backward of HeadParallelAttention<D, H, TP> bound to `group` at t = 64,
/// 128, 256 (tiles of 16 rows: 4 to 16 tiles), checks the saved bytes against the formula
/// and against the whole layer's outputs and input gradients.
template <int TP>
void check_head_parallel_memory(const tp::tensor_group& group) {
  Kokkos::DefaultExecutionSpace exec;
  constexpr tessera::index_t B = 2;
  tp::HeadParallelAttention<D, H, TP, P> split(11);
  if constexpr (TP > 1) split.bind(group);
  nn::CausalSelfAttention<D, H, P> whole(11);
  split.set_tile(16);
  whole.set_tile(16);
  std::size_t previous = 0;
  for (const tessera::index_t t : {64, 128, 256}) {
    INFO("tensor " << TP << ", t = " << t);
    const auto x = attention_input(B, t, std::uint32_t(t));
    const auto y = split.forward(exec, x);
    const auto y_ref = whole.forward(exec, x);
    const std::size_t saved = nn::saved_activation_bytes(split);
    CHECK(saved == head_parallel_saved_bytes<TP>(B, t));
    // Linear in t: doubling t doubles the bytes (the probability matrix alone, B H/T t^2
    // floats, would quadruple; at t = 256 it would exceed everything counted here).
    if (previous != 0) CHECK(saved == 2 * previous);
    CHECK(saved < std::size_t(B * (H / TP) * t * t) * sizeof(float));
    previous = saved;
    float worst = 0;
    for (tessera::index_t i = 0; i < y.size(); ++i)
      worst = std::max(worst, std::fabs(y.data()[i] - y_ref.data()[i]));
    CHECK(worst <= fp32_tolerance);
    const auto dy = attention_input(B, t, std::uint32_t(1000 + t));
    const auto dx = split.backward(exec, dy);
    const auto dx_ref = whole.backward(exec, dy);
    worst = 0;
    for (tessera::index_t i = 0; i < dx.size(); ++i)
      worst = std::max(worst, std::fabs(dx.data()[i] - dx_ref.data()[i]));
    CHECK(worst <= fp32_tolerance);
    if constexpr (TP == 1) CHECK(worst == 0.f); // one rank: the whole layer's arithmetic
  }
  split.release_activations();
  CHECK(nn::saved_activation_bytes(split) == 0);
}

} // namespace

TEST_CASE("plans: head-parallel attention keeps memory linear in t", "[parallel][gpt][memory]") {
  check_head_parallel_memory<1>(tp::tensor_group{});
  auto world = tp::mpi_communicator::world();
  if (world.size() % 2 == 0) {
    // Pairs of ranks split the heads 2 ways.
    MPI_Comm pair;
    MPI_Comm_split(MPI_COMM_WORLD, world.rank() / 2, world.rank(), &pair);
    check_head_parallel_memory<2>(tp::tensor_group(tp::mpi_communicator(pair, true)));
  }
}
