// expect: so M must be a multiple of the P stages
#include <tessera/parallel/schedule.hpp>

// 3 micro-batches on 2 stages: the interleaved schedule runs them in groups of P = 2.
bool snippet() {
  return tessera::parallel::schedule<tessera::parallel::interleaved_1f1b<2>, 2, 3>::deadlock_free;
}
