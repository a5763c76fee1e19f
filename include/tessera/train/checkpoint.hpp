#pragma once
/// \file train/checkpoint.hpp
/// Saving and restoring the full training state: master weights, optimizer state, loss scaler
/// state, fp8 recipe states, and the run's position (step, epoch, data-order seed).
///
///   tessera::train::run_state run{.step = step, .epoch = epoch, .data_seed = seed,
///                                 .precision = "bf16"};  // checked on load
///   tessera::train::save_checkpoint("ckpt.tsr", model.parameters(), opt, scaler, run,
///                                   model_fp8_metas...);      // any number, or none
///   ...
///   tessera::train::load_checkpoint("ckpt.tsr", model.parameters(), opt, scaler, run,
///                                   model_fp8_metas...);
///
/// Resuming: a run that loads a checkpoint taken after k steps and continues gives, step for
/// step, the same bits as the uninterrupted run (same execution space and thread count), since
/// every piece of state that the next step reads is saved exactly.
///
/// ## Guarantees
/// - Save is atomic: the file is written under a temporary name in the same directory, fsynced,
///   renamed over `path`, and the directory is fsynced. A crash or error mid-write leaves the
///   previous checkpoint at `path` intact (and no temporary file after an error). POSIX only.
/// - Load validates everything before changing anything: magic, version, every record's
///   structure and checksum, the file checksum and length (a truncated file is refused), then
///   that the file holds exactly the records the caller's objects expect (names, element types,
///   shapes), and that scaler and fp8 states are valid for the caller's configurations. Only
///   then are the caller's parameters, optimizer, scaler, run state and fp8 states replaced. On
///   refusal it throws tessera::value_error (tessera::shape_error for a shape mismatch) naming
///   the file, the record and the rule, and the caller's state is untouched.
/// - Gradients are not saved (a step recomputes them); optimizer hyper-parameters (lr, ...) are
///   not saved either: they come from the code that resumes, which may change them on purpose.
///
/// - Load refuses a checkpoint of another precision (run_state::precision, record run/precision)
///   or another parameter layout (the set of param/ records: names, element types, shapes),
///   naming the field, the saved value and the expected one. A path that is a directory or
///   another non-regular file is refused with value_error naming it; lengths in the file are
///   checked against the file's size before anything is allocated.
/// - check_checkpoint_writable(path) checks before training that save_checkpoint can write.
///
/// ## File format, version 2 (all integers little-endian; version 1 files are refused)
///
///     header   8 bytes  magic "TSSRCKPT"
///              u32      format version (2)
///              u32      reserved, 0
///              u64      number of records
///     record   u32      name length L (1..4096)
///              L bytes  name (no terminator)
///              u8       element type: 1 fp32, 2 bf16, 3 fp8_e4m3, 4 fp8_e5m2, 16 int64,
///                       17 uint64, 18 bytes
///              u8       rank R (0..8; 0 is a scalar)
///              u16      reserved, 0
///              R x i64  extents
///              u64      payload length in bytes (= product of extents x element size)
///              payload  elements, row-major, little-endian
///              u64      FNV-1a 64 of the record's bytes from its name length to its payload end
///     trailer  8 bytes  "TSSR_END"
///              u64      FNV-1a 64 of every byte before this field
///
/// Record names (k = index of an fp8 state in the order passed, flattened):
///
///     param/<name>                            fp32, the parameter's shape   master weights
///     optim/<sgd|adamw>/step                  int64 scalar                  completed steps
///     optim/<sgd|adamw>/<slot>/<param name>   fp32, the parameter's shape   momentum_buffer;
///                                                                           exp_avg, exp_avg_sq
///     scaler/static/scale                     fp32 scalar
///     scaler/dynamic/scale                    fp32 scalar
///     scaler/dynamic/growth_tracker           int64 scalar
///     scaler/dynamic/policy/<policy name>     int64 scalar (the policy's state)
///     fp8/<k>/current/margin                  int64 scalar
///     fp8/<k>/current/scale_amax              fp32 scalar
///     fp8/<k>/delayed/recipe                  int64 (3): history_len, amax_algo, margin
///     fp8/<k>/delayed/scale_amax              fp32 scalar
///     fp8/<k>/delayed/history                 fp32 (n), n <= history_len, oldest first
///     run/step, run/epoch                     int64 scalar
///     run/data_seed                           uint64 scalar
///     run/precision                           bytes (n): the precision's name, as given
///     sched/warmup_cosine/lr, .../min_lr      fp32 scalar (an lr_scheduler, if passed)
///     sched/warmup_cosine/warmup_steps,
///       .../total_steps, sched/position       int64 scalar
///     accum/count                             int64 scalar (a grad_accumulator, if passed)
///     accum/sum/<param name>                  fp32, the parameter's shape (only if count > 0)
///
/// The trailing arguments after the run state may mix fp8 states, an lr_scheduler and a
/// grad_accumulator (at most one of each of the last two), in any order. A scheduler's schedule
/// (lr, min_lr, warm-up and total steps) is checked on load, not restored: the file's must equal
/// the caller's (lr and min_lr compared after rounding to float); its position is restored. An
/// accumulator's count and sums are restored; it must have been fed the caller's parameters.
///
/// The sched/ and accum/ records were added without changing the format version (2): records are
/// addressed by name, so a file written without them loads into a caller that passes no
/// scheduler and no accumulator, and is refused, naming the missing record, by one that does; a
/// reader older than these records refuses a file that has them (an entry the caller's state has
/// not).
///
/// Optimizer slots are written for all parameters or for none (none: not created yet — before
/// the first step, or SGD without momentum).

#include <tessera/train/adamw.hpp>
#include <tessera/train/detail/checkpoint_format.hpp>
#include <tessera/train/fp8_recipe.hpp>
#include <tessera/train/grad_accumulation.hpp>
#include <tessera/train/loss_scaler.hpp>
#include <tessera/train/lr_schedule.hpp>
#include <tessera/train/sgd.hpp>

#include <boost/hana/concept/foldable.hpp>
#include <boost/hana/for_each.hpp>

#include <filesystem>
#include <functional>
#include <iterator>
#include <ranges>
#include <string>
#include <type_traits>
#include <vector>

namespace tessera::train {

/// Where a run is: what a resumed run needs besides the model, optimizer, scaler and fp8 states.
struct run_state {
  std::int64_t step = 0;       ///< optimizer steps taken (or batches seen; the caller decides)
  std::int64_t epoch = 0;      ///< epochs completed
  std::uint64_t data_seed = 0; ///< the seed the data order (shuffling) derives from
  /// The compute precision the run trains in ("fp32", "bf16", "fp8", ...: the caller's name).
  /// Saved; on load it is not restored but checked: the file's must equal the caller's.
  std::string precision;
};

namespace detail::ckpt {

// ---- helpers ---------------------------------------------------------------------------------

template <class T>
record scalar_record(std::string name, dtype t, T v) {
  record r{std::move(name), t, {}, std::vector<unsigned char>(sizeof(T))};
  std::memcpy(r.payload.data(), &v, sizeof(T));
  return r;
}

inline record text_record(std::string name, const std::string& text) {
  return record{std::move(name),
                dtype::u8,
                {static_cast<std::int64_t>(text.size())},
                std::vector<unsigned char>(text.begin(), text.end())};
}

/// A record holding a copy of a float view (any memory space) with the given shape.
template <class View>
record view_record(std::string name, const View& v, std::vector<std::int64_t> shape) {
  record r{std::move(name), dtype::f32, std::move(shape),
           std::vector<unsigned char>(v.extent(0) * sizeof(float))};
  Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(
      reinterpret_cast<float*>(r.payload.data()), v.extent(0));
  Kokkos::deep_copy(h, v);
  return r;
}

/// A new Buffer (a rank-1 float view in any memory space) labelled `label`, holding `values`.
template <class Buffer>
Buffer buffer_from_host(const std::string& label, const std::vector<float>& values) {
  Buffer b(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), values.size());
  Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(
      values.data(), values.size());
  Kokkos::deep_copy(b, h);
  return b;
}

template <class P>
std::vector<std::int64_t> shape_of(const P& p) {
  const auto a = p.value.extents().to_array();
  return {a.begin(), a.end()};
}

/// Looks records up by name, checks their type and shape, and remembers which were used.
class reader {
public:
  reader(std::string who, std::string file, std::vector<parsed_record> records)
      : who_(std::move(who)), file_(std::move(file)), records_(std::move(records)) {}

  [[noreturn]] void refuse(const std::string& record, const std::string& rule) const {
    throw value_error(who_ + ": checkpoint '" + file_ + "' is refused: record '" + record +
                      "': " + rule);
  }

  bool has(const std::string& name) const { return find(name) != nullptr; }
  /// The shape of record `name`, or nullptr if there is none.
  const std::vector<std::int64_t>* shape_of(const std::string& name) const {
    const parsed_record* r = find(name);
    return r ? &r->shape : nullptr;
  }

  /// The record `name`, which must exist with this type and shape.
  const parsed_record& take(const std::string& name, dtype t,
                            const std::vector<std::int64_t>& shape) {
    parsed_record* r = find(name);
    if (!r)
      throw value_error(who_ + ": checkpoint '" + file_ + "' is refused: it has no record '" +
                        name + "' (" + dtype_name(t) + ", shape " + shape_text(shape) +
                        "), which the caller's state needs");
    if (r->type != t)
      refuse(name,
             std::string("element type ") + dtype_name(r->type) + ", expected " + dtype_name(t));
    if (r->shape != shape)
      throw shape_error(who_ + ": checkpoint '" + file_ + "' is refused: record '" + name +
                        "' has shape " + shape_text(r->shape) + ", the caller's state has " +
                        shape_text(shape));
    r->taken = true;
    return *r;
  }

  template <class T>
  T scalar(const std::string& name, dtype t) {
    const auto& r = take(name, t, {});
    T v;
    std::memcpy(&v, r.data, sizeof(T));
    return v;
  }

  /// The text record `name` (u8, rank 1), which must exist.
  std::string text(const std::string& name) {
    parsed_record* r = find(name);
    if (!r || r->type != dtype::u8 || r->shape.size() != 1)
      throw value_error(who_ + ": checkpoint '" + file_ + "' is refused: it has no text record '" +
                        name + "'");
    r->taken = true;
    return std::string(reinterpret_cast<const char*>(r->data), r->bytes);
  }

  /// The parameter layout: the file's "param/" records (name, element type, shape) must be the
  /// caller's, as a set. Throws shape_error when only shapes differ, value_error otherwise,
  /// naming the record, the saved value and the expected one.
  void check_layout(const std::vector<parsed_record>& expected) const {
    const auto text = [](const auto& r) {
      return std::string(dtype_name(r.type)) + " " + shape_text(r.shape);
    };
    std::string problem;
    bool only_shapes = true;
    for (const auto& e : expected) {
      const parsed_record* r = find(e.name);
      if (!r) {
        problem += "; '" + e.name + "': saved none, expected " + text(e);
        only_shapes = false;
      } else if (r->type != e.type || r->shape != e.shape) {
        problem += "; '" + e.name + "': saved " + text(*r) + ", expected " + text(e);
        only_shapes = only_shapes && r->type == e.type;
      }
    }
    for (const auto& r : records_) {
      if (r.name.rfind("param/", 0) != 0) continue;
      bool wanted = false;
      for (const auto& e : expected) wanted = wanted || e.name == r.name;
      if (!wanted) {
        problem += "; '" + r.name + "': saved " + text(r) + ", expected none";
        only_shapes = false;
      }
    }
    if (problem.empty()) return;
    const std::string msg = who_ + ": checkpoint '" + file_ +
                            "' is refused: its parameter layout is not the caller's model's" +
                            problem;
    if (only_shapes) throw shape_error(msg);
    throw value_error(msg);
  }

  std::vector<float> floats(const std::string& name, const std::vector<std::int64_t>& shape) {
    const auto& r = take(name, dtype::f32, shape);
    std::vector<float> v(r.bytes / sizeof(float));
    if (r.bytes) std::memcpy(v.data(), r.data, r.bytes);
    return v;
  }

  /// Every record must have been taken: a record the caller's state does not have means the
  /// file belongs to another model or configuration.
  void require_all_taken() const {
    for (const auto& r : records_)
      if (!r.taken)
        refuse(r.name, "the caller's state has no such entry (the checkpoint is of another "
                       "model, optimizer, scaler or fp8 configuration)");
  }

private:
  parsed_record* find(const std::string& name) const {
    for (auto& r : records_)
      if (r.name == name) return &r;
    return nullptr;
  }
  std::string who_, file_;
  mutable std::vector<parsed_record> records_;
};

using commit_list = std::vector<std::function<void()>>;

// ---- parameters --------------------------------------------------------------------------------

template <class Params>
void save_params(std::vector<record>& out, const Params& params) {
  for_each_parameter(params, [&](const auto& p, std::size_t) {
    out.push_back(view_record("param/" + p.name, p.value.kokkos_view(), shape_of(p)));
  });
}

template <class Params>
void stage_params(reader& in, const Params& params, commit_list& commits) {
  std::vector<parsed_record> layout;
  for_each_parameter(params, [&](const auto& p, std::size_t) {
    parsed_record r;
    r.name = "param/" + p.name;
    r.type = dtype::f32;
    r.shape = shape_of(p);
    layout.push_back(std::move(r));
  });
  in.check_layout(layout);
  for_each_parameter(params, [&](const auto& p, std::size_t) {
    auto values = in.floats("param/" + p.name, shape_of(p));
    commits.push_back([p, values = std::move(values)] {
      Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(
          values.data(), values.size());
      Kokkos::deep_copy(p.value.kokkos_view(), h);
    });
  });
}

// ---- optimizers --------------------------------------------------------------------------------

template <class Opt>
concept CheckpointableOptimizer = requires(Opt o) {
  { Opt::kind } -> std::convertible_to<const char*>;
  Opt::slot_names;
  o.state.step;
  o.state.slots;
};

template <class Opt, class Params>
void save_optimizer(std::vector<record>& out, const Opt& opt, const Params& params,
                    const std::string& who) {
  const std::string base = std::string("optim/") + Opt::kind + "/";
  out.push_back(scalar_record(base + "step", dtype::i64, opt.state.step));
  // The state must belong to these parameters.
  if (opt.state.created) opt.state.check_same(who.c_str(), params);
  for (std::size_t s = 0; s < Opt::slot_names.size(); ++s) {
    if (opt.state.slots[s].empty()) continue;
    for_each_parameter(params, [&](const auto& p, std::size_t k) {
      out.push_back(view_record(base + Opt::slot_names[s] + "/" + p.name, opt.state.slots[s][k],
                                shape_of(p)));
    });
  }
}

template <class Opt, class Params>
void stage_optimizer(reader& in, Opt& opt, const Params& params, commit_list& commits) {
  const std::string base = std::string("optim/") + Opt::kind + "/";
  const auto step = in.scalar<std::int64_t>(base + "step", dtype::i64);
  if (step < 0) in.refuse(base + "step", "a negative step count " + std::to_string(step));
  // The new state, staged on the host.
  std::vector<std::string> names;
  std::vector<index_t> sizes;
  for_each_parameter(params, [&](const auto& p, std::size_t) {
    names.push_back(p.name);
    sizes.push_back(p.size());
  });
  std::array<std::vector<std::vector<float>>, Opt::slot_names.size()> slots;
  for (std::size_t s = 0; s < Opt::slot_names.size(); ++s) {
    // Present for all parameters or for none: the first parameter decides, the rest must
    // follow (a missing one is refused by take, a stray one by require_all_taken).
    bool present = false;
    for_each_parameter(params, [&](const auto& p, std::size_t k) {
      if (k == 0) present = in.has(base + Opt::slot_names[s] + "/" + p.name);
    });
    if (!present) continue;
    for_each_parameter(params, [&](const auto& p, std::size_t) {
      slots[s].push_back(in.floats(base + Opt::slot_names[s] + "/" + p.name, shape_of(p)));
    });
  }
  commits.push_back(
      [&opt, step, names = std::move(names), sizes = std::move(sizes), slots = std::move(slots)] {
        using state_t = std::remove_cvref_t<decltype(opt.state)>;
        state_t st;
        st.step = step;
        st.created = true;
        st.names = names;
        st.sizes = sizes;
        for (std::size_t s = 0; s < slots.size(); ++s)
          for (std::size_t k = 0; k < slots[s].size(); ++k)
            st.slots[s].push_back(buffer_from_host<typename state_t::buffer_type>(
                names[k] + "." + Opt::slot_names[s], slots[s][k]));
        opt.state = std::move(st);
      });
}

// ---- loss scalers ------------------------------------------------------------------------------

inline void save_scaler(std::vector<record>& out, const static_scaler& s) {
  out.push_back(scalar_record("scaler/static/scale", dtype::f32, s.scale()));
}
template <class Policy>
void save_scaler(std::vector<record>& out, const dynamic_scaler<Policy>& s) {
  out.push_back(scalar_record("scaler/dynamic/scale", dtype::f32, s.scale()));
  out.push_back(scalar_record("scaler/dynamic/growth_tracker", dtype::i64, s.growth_tracker()));
  out.push_back(scalar_record(std::string("scaler/dynamic/policy/") + Policy::name, dtype::i64,
                              s.policy().state()));
}

inline void stage_scaler(reader& in, static_scaler& s, commit_list& commits) {
  const auto v = in.scalar<float>("scaler/static/scale", dtype::f32);
  if (!(v > 0.f) || !std::isfinite(v))
    in.refuse("scaler/static/scale",
              "the scale " + std::to_string(v) + " is not positive and finite");
  commits.push_back([&s, v] { s.restore(v); });
}
template <class Policy>
void stage_scaler(reader& in, dynamic_scaler<Policy>& s, commit_list& commits) {
  const auto scale = in.scalar<float>("scaler/dynamic/scale", dtype::f32);
  const auto tracker = in.scalar<std::int64_t>("scaler/dynamic/growth_tracker", dtype::i64);
  const std::string pname = std::string("scaler/dynamic/policy/") + Policy::name;
  const auto pstate = in.scalar<std::int64_t>(pname, dtype::i64);
  const std::string why = s.check_state(scale, tracker, pstate);
  if (!why.empty()) in.refuse("scaler/dynamic/*", why + " (for the caller's scaler configuration)");
  commits.push_back([&s, scale, tracker, pstate] { s.restore(scale, tracker, pstate); });
}

// ---- fp8 states --------------------------------------------------------------------------------

template <class R>
void save_fp8(std::vector<record>& out, std::size_t k, const fp8_meta<R>& m) {
  const std::string base = "fp8/" + std::to_string(k) + "/";
  if constexpr (std::is_same_v<R, current_scaling>) {
    out.push_back(scalar_record(base + "current/margin", dtype::i64,
                                static_cast<std::int64_t>(m.recipe().margin)));
    out.push_back(scalar_record(base + "current/scale_amax", dtype::f32, m.scale_amax()));
  } else {
    record rec{base + "delayed/recipe", dtype::i64, {3}, std::vector<unsigned char>(24)};
    const std::int64_t v[3] = {m.recipe().history_len,
                               static_cast<std::int64_t>(m.recipe().amax_algo), m.recipe().margin};
    std::memcpy(rec.payload.data(), v, 24);
    out.push_back(std::move(rec));
    out.push_back(scalar_record(base + "delayed/scale_amax", dtype::f32, m.scale_amax()));
    const auto h = m.history();
    record hr{base + "delayed/history",
              dtype::f32,
              {static_cast<std::int64_t>(h.size())},
              std::vector<unsigned char>(h.size() * sizeof(float))};
    if (!h.empty()) std::memcpy(hr.payload.data(), h.data(), hr.payload.size());
    out.push_back(std::move(hr));
  }
}

template <class R>
void stage_fp8(reader& in, std::size_t k, fp8_meta<R>& m, commit_list& commits) {
  const std::string base = "fp8/" + std::to_string(k) + "/";
  fp8_meta<R> staged = m;
  std::vector<float> history;
  float scale_amax = 0.f;
  if constexpr (std::is_same_v<R, current_scaling>) {
    const auto margin = in.scalar<std::int64_t>(base + "current/margin", dtype::i64);
    if (margin != m.recipe().margin)
      in.refuse(base + "current/margin", "margin " + std::to_string(margin) +
                                             ", the caller's recipe has " +
                                             std::to_string(m.recipe().margin));
    scale_amax = in.scalar<float>(base + "current/scale_amax", dtype::f32);
  } else {
    const auto& rr = in.take(base + "delayed/recipe", dtype::i64, {3});
    std::int64_t v[3];
    std::memcpy(v, rr.data, 24);
    const std::int64_t want[3] = {
        m.recipe().history_len, static_cast<std::int64_t>(m.recipe().amax_algo), m.recipe().margin};
    if (v[0] != want[0] || v[1] != want[1] || v[2] != want[2])
      in.refuse(base + "delayed/recipe",
                "recipe (history_len " + std::to_string(v[0]) + ", amax_algo " +
                    std::to_string(v[1]) + ", margin " + std::to_string(v[2]) +
                    ") differs from the caller's (" + std::to_string(want[0]) + ", " +
                    std::to_string(want[1]) + ", " + std::to_string(want[2]) + ")");
    scale_amax = in.scalar<float>(base + "delayed/scale_amax", dtype::f32);
    const std::string hname = base + "delayed/history";
    // The history's length is data (how many amaxes were recorded): take the length the record
    // has; a missing record or one of another rank is then refused by floats().
    const auto* hs = in.shape_of(hname);
    const std::int64_t n = hs && hs->size() == 1 ? (*hs)[0] : 0;
    if (n > m.recipe().history_len)
      in.refuse(hname, std::to_string(n) + " entries, the caller's recipe keeps " +
                           std::to_string(m.recipe().history_len));
    history = in.floats(hname, {n});
  }
  try {
    staged.restore(history, scale_amax);
  } catch (const value_error& e) {
    in.refuse(base + "*", e.what());
  }
  commits.push_back([&m, staged = std::move(staged)] { m = staged; });
}

// ---- learning-rate schedule and gradient accumulation ------------------------------------------

inline void save_scheduler(std::vector<record>& out, const lr_scheduler& s) {
  out.push_back(
      scalar_record("sched/warmup_cosine/lr", dtype::f32, static_cast<float>(s.schedule.lr)));
  out.push_back(scalar_record("sched/warmup_cosine/min_lr", dtype::f32,
                              static_cast<float>(s.schedule.min_lr)));
  out.push_back(
      scalar_record("sched/warmup_cosine/warmup_steps", dtype::i64, s.schedule.warmup_steps));
  out.push_back(
      scalar_record("sched/warmup_cosine/total_steps", dtype::i64, s.schedule.total_steps));
  out.push_back(scalar_record("sched/position", dtype::i64, s.position));
}

inline void stage_scheduler(reader& in, lr_scheduler& s, commit_list& commits) {
  const auto lr = in.scalar<float>("sched/warmup_cosine/lr", dtype::f32);
  const auto min_lr = in.scalar<float>("sched/warmup_cosine/min_lr", dtype::f32);
  const auto warm = in.scalar<std::int64_t>("sched/warmup_cosine/warmup_steps", dtype::i64);
  const auto total = in.scalar<std::int64_t>("sched/warmup_cosine/total_steps", dtype::i64);
  const auto pos = in.scalar<std::int64_t>("sched/position", dtype::i64);
  const auto& c = s.schedule;
  if (lr != static_cast<float>(c.lr) || min_lr != static_cast<float>(c.min_lr) ||
      warm != c.warmup_steps || total != c.total_steps)
    in.refuse("sched/warmup_cosine/*",
              "schedule (lr " + std::to_string(lr) + ", min_lr " + std::to_string(min_lr) +
                  ", warmup_steps " + std::to_string(warm) + ", total_steps " +
                  std::to_string(total) + ") differs from the caller's (" +
                  std::to_string(static_cast<float>(c.lr)) + ", " +
                  std::to_string(static_cast<float>(c.min_lr)) + ", " +
                  std::to_string(c.warmup_steps) + ", " + std::to_string(c.total_steps) + ")");
  if (pos < 0) in.refuse("sched/position", "a negative position " + std::to_string(pos));
  commits.push_back([&s, pos] { s.position = pos; });
}

template <class M, class Params>
void save_accumulator(std::vector<record>& out, const basic_grad_accumulator<M>& a,
                      const Params& params, const std::string& who) {
  out.push_back(scalar_record("accum/count", dtype::i64, a.count()));
  if (a.count() == 0) return;
  a.state().check_same(who.c_str(), params);
  for_each_parameter(params, [&](const auto& p, std::size_t k) {
    out.push_back(view_record("accum/sum/" + p.name, a.state().slots[0][k], shape_of(p)));
  });
}

template <class M, class Params>
void stage_accumulator(reader& in, basic_grad_accumulator<M>& a, const Params& params,
                       commit_list& commits) {
  const auto count = in.scalar<std::int64_t>("accum/count", dtype::i64);
  if (count < 0) in.refuse("accum/count", "a negative count " + std::to_string(count));
  using state_t = typename basic_grad_accumulator<M>::state_type;
  state_t st;
  st.created = true;
  std::vector<std::vector<float>> sums;
  for_each_parameter(params, [&](const auto& p, std::size_t) {
    st.names.push_back(p.name);
    st.sizes.push_back(p.size());
    if (count > 0) sums.push_back(in.floats("accum/sum/" + p.name, shape_of(p)));
  });
  commits.push_back([&a, count, st = std::move(st), sums = std::move(sums)]() mutable {
    for (std::size_t k = 0; k < sums.size(); ++k)
      st.slots[0].push_back(
          buffer_from_host<typename state_t::buffer_type>(st.names[k] + ".grad_sum", sums[k]));
    a.restore(std::move(st), count);
  });
}

/// Counts, at compile time, the schedulers and accumulators among the trailing arguments.
template <class... T>
inline constexpr int
    scheduler_count = (0 + ... + (std::is_same_v<std::remove_cvref_t<T>, lr_scheduler> ? 1 : 0));
template <class... T>
inline constexpr int
    accumulator_count = (0 + ... + (is_grad_accumulator<std::remove_cvref_t<T>>::value ? 1 : 0));

/// Calls f(meta) for every fp8_meta in a flattened argument: an fp8_meta, a pointer or
/// reference_wrapper to one, a range of those, or a Hana sequence of those.
template <class T, class F>
void for_each_fp8(T&& x, F&& f) {
  using U = std::remove_cvref_t<T>;
  if constexpr (is_fp8_meta<U>::value) {
    f(x);
  } else if constexpr (std::is_pointer_v<U>) {
    for_each_fp8(*x, f);
  } else if constexpr (requires { x.get(); } && !std::ranges::range<U>) {
    for_each_fp8(x.get(), f);
  } else if constexpr (std::ranges::range<U>) {
    for (auto&& e : x) for_each_fp8(e, f);
  } else {
    static_assert(boost::hana::Foldable<U>::value,
                  "tessera::train checkpoints: an fp8 state argument must be a "
                  "tessera::train::fp8_meta, a pointer or std::reference_wrapper to one, a range "
                  "of them or a boost::hana sequence of them.");
    boost::hana::for_each(x, [&](auto&& e) { for_each_fp8(e, f); });
  }
}

} // namespace detail::ckpt

/// Writes the training state to `path` atomically (see the file comment for the format and
/// the guarantees). `fp8_states` are any number of fp8_meta objects, pointers or
/// reference_wrappers to them, ranges of them or Hana sequences of them; they are numbered in
/// the order given. Throws value_error (duplicate parameter names, I/O failure: the previous
/// file at `path` is then untouched) or shape_error (optimizer state of other parameters).
template <class Params, class Optimizer, class Scaler, class... Fp8States>
void save_checkpoint(const std::filesystem::path& path, const Params& params, const Optimizer& opt,
                     const Scaler& scaler, const run_state& run, const Fp8States&... fp8_states) {
  static_assert(detail::ckpt::CheckpointableOptimizer<Optimizer>,
                "tessera::train::save_checkpoint: the optimizer must be tessera::train::sgd or "
                "adamw (a type with kind, slot_names and an optimizer state).");
  static_assert(is_loss_scaler<Scaler>::value,
                "tessera::train::save_checkpoint: the scaler must be "
                "tessera::train::static_scaler or dynamic_scaler<Policy>.");
  static_assert(detail::ckpt::scheduler_count<Fp8States...> <= 1 &&
                    detail::ckpt::accumulator_count<Fp8States...> <= 1,
                "tessera::train::save_checkpoint: pass at most one lr_scheduler and one "
                "grad_accumulator.");
  const std::string who = "tessera::train::save_checkpoint";
  detail::require_unique_names(who.c_str(), params);
  std::vector<detail::ckpt::record> records;
  detail::ckpt::save_params(records, params);
  detail::ckpt::save_optimizer(records, opt, params, who);
  detail::ckpt::save_scaler(records, scaler);
  [[maybe_unused]] std::size_t k = 0; // unused without fp8 states
  [[maybe_unused]] const auto save_extra = [&](const auto& x) {
    using X = std::remove_cvref_t<decltype(x)>;
    if constexpr (std::is_same_v<X, lr_scheduler>)
      detail::ckpt::save_scheduler(records, x);
    else if constexpr (is_grad_accumulator<X>::value)
      detail::ckpt::save_accumulator(records, x, params, who);
    else
      detail::ckpt::for_each_fp8(x,
                                 [&](const auto& m) { detail::ckpt::save_fp8(records, k++, m); });
  };
  (save_extra(fp8_states), ...);
  using detail::ckpt::dtype;
  records.push_back(detail::ckpt::scalar_record("run/step", dtype::i64, run.step));
  records.push_back(detail::ckpt::scalar_record("run/epoch", dtype::i64, run.epoch));
  records.push_back(detail::ckpt::scalar_record("run/data_seed", dtype::u64, run.data_seed));
  records.push_back(detail::ckpt::text_record("run/precision", run.precision));
  detail::ckpt::write_file_atomically(who, path, detail::ckpt::serialize(records));
}

/// Checks now that save_checkpoint(path, ...) will be able to write its file: `path` is not a
/// directory and a file can be created in its directory (a temporary probe file, removed at
/// once). Call it before training so that a bad path fails at once rather than after the first
/// epoch. Throws value_error naming the file and the reason.
inline void check_checkpoint_writable(const std::filesystem::path& path) {
  detail::ckpt::check_writable("tessera::train::check_checkpoint_writable", path);
}

/// Restores the training state saved by save_checkpoint into the caller's objects: parameter
/// values, optimizer state (step counter and buffers), scaler state, run, and fp8 states (the
/// same number and recipes, in the same order, as saved). Validates the whole file against the
/// caller's objects first; on any problem throws value_error / shape_error naming the file,
/// the record and the rule, and changes nothing. Gradients are left as they are.
template <class Params, class Optimizer, class Scaler, class... Fp8States>
void load_checkpoint(const std::filesystem::path& path, const Params& params, Optimizer& opt,
                     Scaler& scaler, run_state& run, Fp8States&&... fp8_states) {
  static_assert(detail::ckpt::CheckpointableOptimizer<Optimizer>,
                "tessera::train::load_checkpoint: the optimizer must be tessera::train::sgd or "
                "adamw (a type with kind, slot_names and an optimizer state).");
  static_assert(is_loss_scaler<Scaler>::value,
                "tessera::train::load_checkpoint: the scaler must be "
                "tessera::train::static_scaler or dynamic_scaler<Policy>.");
  static_assert(detail::ckpt::scheduler_count<Fp8States...> <= 1 &&
                    detail::ckpt::accumulator_count<Fp8States...> <= 1,
                "tessera::train::load_checkpoint: pass at most one lr_scheduler and one "
                "grad_accumulator.");
  const std::string who = "tessera::train::load_checkpoint";
  detail::require_unique_names(who.c_str(), params);
  const auto bytes = detail::ckpt::read_file(who, path);
  detail::ckpt::reader in(who, path.string(), detail::ckpt::parse(who, path.string(), bytes));
  // The precision first: a run in another precision must not continue from these weights.
  const std::string precision = in.text("run/precision");
  if (precision != run.precision)
    in.refuse("run/precision", "precision: saved '" + precision + "', expected '" + run.precision +
                                   "' (the run was trained in another precision)");
  detail::ckpt::commit_list commits;
  detail::ckpt::stage_params(in, params, commits);
  detail::ckpt::stage_optimizer(in, opt, params, commits);
  detail::ckpt::stage_scaler(in, scaler, commits);
  [[maybe_unused]] std::size_t k = 0; // unused without fp8 states
  [[maybe_unused]] const auto stage_extra = [&](auto& x) {
    using X = std::remove_cvref_t<decltype(x)>;
    if constexpr (std::is_same_v<X, lr_scheduler>)
      detail::ckpt::stage_scheduler(in, x, commits);
    else if constexpr (is_grad_accumulator<X>::value)
      detail::ckpt::stage_accumulator(in, x, params, commits);
    else
      detail::ckpt::for_each_fp8(x, [&](auto& m) { detail::ckpt::stage_fp8(in, k++, m, commits); });
  };
  (stage_extra(fp8_states), ...);
  using detail::ckpt::dtype;
  run_state staged_run;
  staged_run.step = in.scalar<std::int64_t>("run/step", dtype::i64);
  staged_run.epoch = in.scalar<std::int64_t>("run/epoch", dtype::i64);
  staged_run.data_seed = in.scalar<std::uint64_t>("run/data_seed", dtype::u64);
  staged_run.precision = precision;
  in.require_all_taken();
  // Everything is valid: apply.
  for (auto& c : commits) c();
  run = staged_run;
}

} // namespace tessera::train
