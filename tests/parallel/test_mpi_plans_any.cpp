// Any world size and degrees beyond two: plans with data<dyn> (the data degree is the world
// size / (tensor x pipeline), odd ones included) and tensor or pipeline degree 4, each trained
// on the same global batch as the single-process run and compared with it parameter by
// parameter (plan_check.hpp). Run at 1, 2, 3, 4 and 8 ranks; at each size, every plan that fits
// runs, and the test checks how many did (a plan skipped by mistake fails).
//
// The MLP (Linear 23-36, ReLU, Linear 36-20, GELU, Linear 20-10) splits its pair's width 36 by
// 2 and 4; FashionCNN's pairs (Conv2d 1-32 with Conv2d 32-64, Linear 3136-128 with Linear
// 128-10) split the widths 32 and 128 by 4 (and 8, 16, 32; a degree that does not divide them,
// such as 3, fails to compile naming the layer: tensor_split_check, as
// tests/compile_fail/parallel_tensor_indivisible*.cpp check). A global batch of 24 splits into D
// equal shares of M equal micro-batches for every D * M here.
#include "plan_check.hpp"

using namespace tessera_test;

namespace {

template <int D>
using data = tp::data<D>;
constexpr int any = int(tessera::dyn);

using mlp_plans =
    std::tuple<tp::plan<data<any>>, tp::plan<data<any>, tp::tensor<2>>,
               tp::plan<data<any>, tp::pipeline<2>>, tp::plan<data<any>, tp::tensor<4>>,
               tp::plan<tp::pipeline<4>, data<any>>,
               tp::plan<data<any>, tp::tensor<2>, tp::pipeline<2>>,
               tp::plan<tp::tensor<4>, tp::pipeline<2>>, tp::plan<data<3>>>;

using cnn_plans = std::tuple<tp::plan<data<any>>, tp::plan<data<any>, tp::tensor<4>>,
                             tp::plan<data<any>, tp::pipeline<4>>>;

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// How many plans of the tuple fit n processes, from their sizes alone (not Plan::fits):
/// exactly D x T x P, or for data<dyn> any multiple of T x P.
template <class... Plans>
int fitting(std::tuple<Plans...>*, int n) {
  return (int(Plans::data_size == any
                  ? n % (Plans::tensor_size * Plans::pipeline_size) == 0
                  : Plans::data_size * Plans::tensor_size * Plans::pipeline_size == n) +
          ... + 0);
}

} // namespace

TEST_CASE("plans of any world size: MLP fp32", "[parallel]") {
  const int ran = check_plans<MLP<tessera::fp32>, tp::one_f_one_b, 1, 2, mlp_plans>(
      "MLP fp32", fp32_tolerance, {.global_batch = 24});
  // 1: data=1; 2: data=2, (1,2,1), (1,1,2); 3: data<dyn>=3, data<3>; 4: data=4, (2,2,1),
  // (2,1,2), (1,4,1), (1,1,4), (1,2,2); 8: those as (8,..), ..., and (1,4,2).
  const int n = world_size();
  CHECK(ran == fitting(static_cast<mlp_plans*>(nullptr), n));
  CHECK(ran == (n == 1 ? 1 : n == 2 ? 3 : n == 3 ? 2 : n == 4 ? 6 : n == 8 ? 7 : ran));
}

TEST_CASE("plans of any world size: FashionCNN fp32, tensor and pipeline degree 4", "[parallel]") {
  const int ran = check_plans<FashionCNN<tessera::fp32>, tp::one_f_one_b, 1, 2, cnn_plans>(
      "FashionCNN fp32", fp32_tolerance, {.global_batch = 24, .steps = 3});
  const int n = world_size();
  CHECK(ran == fitting(static_cast<cnn_plans*>(nullptr), n));
  CHECK(ran == (n == 4 || n == 8 ? 3 : 1));
}
