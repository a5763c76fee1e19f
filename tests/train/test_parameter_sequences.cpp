// Parameter sequences of run-time length (train/detail/optimizer_state.hpp): a Hana tuple
// holding a std::vector of per-block tuples (what examples/char_gpt_model.hpp returns) is
// walked depth first in order, unscaled and checked for inf/NaN like a flat tuple, and an AdamW
// step on it is bit-identical to the step on the flat tuple of the same tensors. The parameters
// live in the default memory space and the steps run on the default execution space; values are
// set and read through host mirrors.
#include "support/exec_spaces.hpp"
#include "support/host_access.hpp"

#include <tessera/train.hpp>

#include <boost/hana/tuple.hpp>
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace {

namespace train = tessera::train;
using tessera::extents;
using tessera::index_t;
using tessera::testing::element;
using tessera::testing::set_element;
using a_type = train::parameter<extents<5>>;
using b_type = train::parameter<extents<31, 3>>;
using c_type = train::parameter<extents<4097>>;

/// Fills value and grad of p with a fixed pattern seeded by `salt`.
template <class P>
void fill(const P& p, int salt) {
  tessera::testing::fill_on_host(
      p.value, [&](index_t i) { return std::sin(0.1f * static_cast<float>(i + salt)); });
  tessera::testing::fill_on_host(p.grad, [&](index_t i) {
    return 0.01f * std::cos(0.37f * static_cast<float>(i * 3 + salt));
  });
}

template <class P>
std::vector<float> values(const P& p, bool grad) {
  const auto h = tessera::host_mirror_copy(grad ? p.grad : p.value);
  return std::vector<float>(h.data(), h.data() + h.size());
}

/// a, [(b0, c0), (b1, c1)], d: six parameters, the middle four in a std::vector.
struct nested {
  a_type a{"a", {}};
  b_type b0{"b0", {}}, b1{"b1", {}};
  c_type c0{"c0", {}}, c1{"c1", {}};
  a_type d{"d", {}};
  nested() {
    fill(a, 1);
    fill(b0, 2);
    fill(c0, 3);
    fill(b1, 4);
    fill(c1, 5);
    fill(d, 6);
  }
  auto sequence() const {
    using block = decltype(boost::hana::make_tuple(b0, c0));
    std::vector<block> blocks{boost::hana::make_tuple(b0, c0), boost::hana::make_tuple(b1, c1)};
    return boost::hana::make_tuple(a, std::move(blocks), d);
  }
  auto flat() const { return boost::hana::make_tuple(a, b0, c0, b1, c1, d); }
};

} // namespace

TEST_CASE("parameter sequences: nested ranges are walked depth first, in order",
          "[train][parameters]") {
  const nested n;
  std::vector<std::string> names;
  std::vector<std::size_t> ks;
  train::for_each_parameter(n.sequence(), [&](const auto& p, std::size_t k) {
    names.push_back(p.name);
    ks.push_back(k);
  });
  CHECK(names == std::vector<std::string>{"a", "b0", "c0", "b1", "c1", "d"});
  CHECK(ks == std::vector<std::size_t>{0, 1, 2, 3, 4, 5});
  CHECK(train::count_parameters(n.sequence()) == 6);
  // an empty range contributes nothing
  using block = decltype(boost::hana::make_tuple(n.b0, n.c0));
  CHECK(train::count_parameters(boost::hana::make_tuple(n.a, std::vector<block>{})) == 1);
}

TEST_CASE("parameter sequences: unscale_and_check over a run-time list", "[train][parameters]") {
  const auto exec = tessera::testing::exec_space(); // where the parameters live
  nested n;
  const std::vector<std::vector<float>> before{values(n.a, true),  values(n.b0, true),
                                               values(n.c0, true), values(n.b1, true),
                                               values(n.c1, true), values(n.d, true)};
  train::static_scaler s{1024.f};
  REQUIRE(s.unscale_and_check(exec, n.sequence()));
  const std::vector<std::vector<float>> after{values(n.a, true),  values(n.b0, true),
                                              values(n.c0, true), values(n.b1, true),
                                              values(n.c1, true), values(n.d, true)};
  for (std::size_t k = 0; k < before.size(); ++k)
    for (std::size_t i = 0; i < before[k].size(); ++i) {
      INFO("parameter " << k << " element " << i);
      REQUIRE(after[k][i] == before[k][i] / 1024.f);
    }
  // a NaN or inf in any element of any block is found, with scale 1 (check only) or not
  train::static_scaler one{};
  CHECK(one.unscale_and_check(exec, n.sequence()));
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    for (const index_t i : {index_t{0}, index_t{2048}, index_t{4096}}) {
      const float keep = element(n.c1.grad, i);
      set_element(n.c1.grad, i, bad);
      CHECK_FALSE(one.unscale_and_check(exec, n.sequence()));
      CHECK_FALSE(s.unscale_and_check(exec, n.sequence()));
      set_element(n.c1.grad, i, keep);
    }
    const float keep = element(n.b0.grad, 92);
    set_element(n.b0.grad, 92, bad);
    CHECK_FALSE(one.unscale_and_check(exec, n.sequence()));
    set_element(n.b0.grad, 92, keep);
  }
}

TEST_CASE("parameter sequences: AdamW on the nested list equals AdamW on the flat tuple",
          "[train][parameters]") {
  const auto exec = tessera::testing::exec_space(); // where the parameters live
  nested x, y;                                      // the same values
  train::adamw ox{.lr = 1e-2f, .weight_decay = 0.1f, .decay_on = train::decay_rule::matrices};
  train::adamw oy = ox;
  train::static_scaler sx{}, sy{};
  for (int step = 0; step < 3; ++step) {
    REQUIRE(train::step(exec, ox, sx, x.sequence()));
    REQUIRE(train::step(exec, oy, sy, y.flat()));
  }
  CHECK(values(x.a, false) == values(y.a, false));
  CHECK(values(x.b0, false) == values(y.b0, false));
  CHECK(values(x.c0, false) == values(y.c0, false));
  CHECK(values(x.b1, false) == values(y.b1, false));
  CHECK(values(x.c1, false) == values(y.c1, false));
  CHECK(values(x.d, false) == values(y.d, false));
  // and the step moved every parameter (b0 and b1 decay, the rest do not)
  const nested fresh;
  CHECK(values(x.b1, false) != values(fresh.b1, false));
  CHECK(values(x.c1, false) != values(fresh.c1, false));
}
