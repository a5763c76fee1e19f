// expect: P stages need exactly P - 1 cut points
#include <tessera/parallel/plan.hpp>

int snippet() {
  return tessera::parallel::plan<
      tessera::parallel::pipeline<3, tessera::parallel::cut_at<4>>>::world_size;
}
