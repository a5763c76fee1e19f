#pragma once
/// \file parallel/checkpoint.hpp
/// Checkpoints of a parallel run, in the format of train/checkpoint.hpp: each rank saves its
/// shard, a manifest describes the plan, and the shards of any plan merge into the checkpoint
/// of the single-process model.
///
///   tessera::parallel::save_plan_checkpoint("ck", stage, opt, scaler, run);  // every rank
///   tessera::parallel::load_plan_checkpoint("ck", stage, opt, scaler, run);  // the same plan
///   tessera::parallel::merge_plan_checkpoint("ck", "whole.tsr");             // one process
///   tessera::train::load_checkpoint("whole.tsr", model.parameters(), opt, scaler, run);
///
/// The directory holds
///   rank-<r>.tsr   train::save_checkpoint of rank r: its stage's parameter shards (named as in
///                  the single-process model), the optimizer state of those shards, the scaler,
///                  the run state, and the fp8 scaling states of its stage's layers (numbered
///                  from 0 in the stage, in parallel::for_each_fp8_state's order: chunk by
///                  chunk under the interleaved schedule; none without fp8 layers);
///   rank-<r>.txt   what rank r holds, one line per item:
///                    tessera-plan-shard 1
///                    rank <r> data <d> tensor <t> pipeline <p>
///                    chunk <g> fp8 <n>     (for each run of consecutive layers it holds: model
///                                           chunk g, p under 1F1B/GPipe, c P + p for its chunk
///                                           c under interleaved_1f1b<V>, with n fp8 states;
///                                           followed by that chunk's parameters:)
///                    param <name> split <0|1> dim <k>     (split: cut along dimension k)
///   manifest.txt   written last, by rank 0, once every rank's files are in place:
///                    tessera-plan-checkpoint 1
///                    plan data <D> tensor <T> pipeline <P>
///                    ranks <D * T * P>
///                    zero <Z>
///                    chunks <V>            (model chunks per rank: 1, or V of interleaved_1f1b)
///   rank-<r>.zero.tsr  (ZeRO stage >= 1 only) rank r's
///                  shard of the optimizer state: train::save_checkpoint of the pieces it
///                  updates ("3.weight[a:b]", a flat element range) with their optimizer slots;
///                  its rank-<r>.tsr then holds the whole parameters and no optimizer slots.
/// Every file is written atomically (train's write_file_atomically). The data replicas hold
/// identical state, so a merge reads the ranks of data coordinate 0: for each parameter, the T
/// shards of its stage's tensor group are put back together (as gather_parameters does), and
/// so are its optimizer slots (momentum, Adam moments); scalars come from rank 0. A ZeRO run's
/// optimizer slots are first put together per rank from the D pieces of its data group (in
/// element order), its step count taken from the pieces of data rank 0. A resume must use the
/// plan, ZeRO stage and schedule chunks it was saved with (others refused, naming both).
///
/// fp8: parallel/fp8_sync.hpp keeps every fp8 state equal on the ranks that share it (a data
/// group and a tensor group), so the merge takes each model chunk's states from its rank of
/// tensor (and data) coordinate 0, refuses the merge if another rank of the stage holds other
/// bits, and renumbers them after the earlier chunks' states: the single-process model's order
/// (model.fp8_states()). A resume under the same plan restores them bit for bit. After a merge
/// one difference from the single process's states remains under a data split of D: each rank's
/// loss is the mean over its share of the batch, so the output-gradient states hold amaxes D
/// times the single process's (fp8_sync.hpp); a single-process run resumed from the merge
/// starts with gradient scales 1/D of its own (a power of two for D = 2, 4, 8: payloads
/// unchanged unless they leave E5M2's range), which its history replaces within history_len
/// steps under delayed scaling and at once under current scaling.

#include <tessera/parallel/fp8_sync.hpp>
#include <tessera/parallel/runner.hpp>
#include <tessera/train/checkpoint.hpp>

#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace tessera::parallel {

namespace detail {

inline std::vector<unsigned char> text_bytes(const std::string& s) {
  return std::vector<unsigned char>(s.begin(), s.end());
}

inline std::string read_text(const std::string& who, const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    throw value_error(who + ": cannot read '" + path.string() + "': it is not a regular file");
  std::ifstream in(path);
  if (!in)
    throw value_error(who + ": cannot read '" + path.string() +
                      "' (not a complete plan checkpoint directory?)");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct plan_manifest {
  int data = 0, tensor = 0, pipeline = 0, ranks = 0;
  int zero = 0;   // the ZeRO stage (a "zero <Z>" line; absent: 0)
  int chunks = 1; // model chunks per rank (a "chunks <V>" line; absent: 1)
};

inline plan_manifest read_manifest(const std::string& who, const std::filesystem::path& dir) {
  std::istringstream in(read_text(who, dir / "manifest.txt"));
  std::string magic, key[4];
  int version = 0;
  plan_manifest m;
  in >> magic >> version >> key[0] >> key[1] >> m.data >> key[2] >> m.tensor >> key[3] >>
      m.pipeline;
  std::string ranks_key;
  in >> ranks_key >> m.ranks;
  if (!in || magic != "tessera-plan-checkpoint" || version != 1 || key[0] != "plan" ||
      key[1] != "data" || key[2] != "tensor" || key[3] != "pipeline" || ranks_key != "ranks" ||
      m.data < 1 || m.tensor < 1 || m.pipeline < 1 || m.ranks != m.data * m.tensor * m.pipeline)
    throw value_error(who + ": '" + (dir / "manifest.txt").string() +
                      "' is not a version-1 plan checkpoint manifest");
  std::string extra;
  while (in >> extra) {
    int* value = extra == "zero" ? &m.zero : extra == "chunks" ? &m.chunks : nullptr;
    if (value) in >> *value;
    if (!value || !in || m.zero < 0 || m.zero > 2 || m.chunks < 1)
      throw value_error(who + ": '" + (dir / "manifest.txt").string() + "' has a malformed line '" +
                        extra + "' after 'ranks' (expected 'zero 0|1|2' or 'chunks <V >= 1>')");
  }
  return m;
}

inline std::string plan_text(int data, int tensor, int pipeline) {
  return "plan(data=" + std::to_string(data) + ", tensor=" + std::to_string(tensor) +
         ", pipeline=" + std::to_string(pipeline) + ")";
}

/// "3.weight[10:20]" -> {"3.weight", 10}: a ZeRO shard piece's parameter and first element.
inline std::pair<std::string, std::int64_t> piece_of(const std::string& who,
                                                     const std::string& name) {
  const std::size_t open = name.rfind('['), colon = name.rfind(':');
  if (open == std::string::npos || colon == std::string::npos || colon < open || name.back() != ']')
    throw value_error(who + ": '" + name + "' is not a ZeRO shard piece (NAME[a:b])");
  return {name.substr(0, open), std::stoll(name.substr(open + 1, colon - open - 1))};
}

struct shard_entry {
  std::string name;
  bool split = false;
  int dim = 0;
};
/// A run of consecutive layers a rank holds: model chunk `index`, with `fp8` scaling states.
struct chunk_entry {
  int index = 0;
  long fp8 = 0;
};
struct rank_fragment {
  int rank = 0, data = 0, tensor = 0, pipeline = 0;
  std::vector<shard_entry> params;
  std::vector<chunk_entry> chunks; // in the order of the rank's fp8 records (may be absent)
};

inline rank_fragment read_fragment(const std::string& who, const std::filesystem::path& dir,
                                   int r) {
  const auto path = dir / ("rank-" + std::to_string(r) + ".txt");
  std::istringstream in(read_text(who, path));
  std::string magic, k[4];
  int version = 0;
  rank_fragment f;
  in >> magic >> version >> k[0] >> f.rank >> k[1] >> f.data >> k[2] >> f.tensor >> k[3] >>
      f.pipeline;
  if (!in || magic != "tessera-plan-shard" || version != 1 || k[0] != "rank" || k[1] != "data" ||
      k[2] != "tensor" || k[3] != "pipeline" || f.rank != r)
    throw value_error(who + ": '" + path.string() + "' is not rank " + std::to_string(r) +
                      "'s version-1 shard description");
  std::string word;
  while (in >> word) {
    if (word == "chunk") {
      chunk_entry c;
      std::string fp8_key;
      in >> c.index >> fp8_key >> c.fp8;
      if (fp8_key != "fp8" || !in || c.index < 0 || c.fp8 < 0)
        throw value_error(who + ": '" + path.string() + "': malformed line starting 'chunk'");
      f.chunks.push_back(c);
      continue;
    }
    shard_entry e;
    std::string split_key, dim_key;
    int split = 0;
    in >> e.name >> split_key >> split >> dim_key >> e.dim;
    if (word != "param" || split_key != "split" || dim_key != "dim" || !in)
      throw value_error(who + ": '" + path.string() + "': malformed line starting '" + word + "'");
    e.split = split != 0;
    f.params.push_back(e);
  }
  return f;
}

/// "optim/sgd/momentum_buffer/3.weight" -> "3.weight"; "param/3.weight" -> "3.weight"; "" for
/// records that do not belong to one parameter.
inline std::string parameter_of(const std::string& record) {
  if (record.rfind("param/", 0) == 0) return record.substr(6);
  if (record.rfind("optim/", 0) == 0) {
    std::size_t slash = 0;
    for (int k = 0; k < 3; ++k) {
      slash = record.find('/', slash + 1);
      if (slash == std::string::npos) return "";
    }
    return record.substr(slash + 1);
  }
  return "";
}

/// Agrees on success across the world: if any rank failed, every rank throws (the failing
/// ranks with their own message), so that no rank is left waiting in a later collective.
template <Communicator C, class F>
void on_every_rank(C& world, const std::string& who, F&& f) {
  std::string error;
  try {
    f();
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!world.all_of(error.empty()))
    throw value_error(error.empty() ? who + ": another rank failed (see its message)" : error);
}

} // namespace detail

/// Checks before training that save_plan_checkpoint can write `dir`: an existing directory in
/// which a file can be created, or a path not there yet whose parent directory exists and takes
/// a new entry (the probe of train::check_checkpoint_writable). Throws value_error naming the
/// path and the rule otherwise. Every rank may call it (each probes with a file of its own).
inline void check_plan_checkpoint_writable(const std::filesystem::path& dir) {
  const std::string who = "tessera::parallel::check_plan_checkpoint_writable";
  const std::filesystem::path d = dir.has_filename() ? dir : dir.parent_path(); // "ck/" is "ck"
  std::error_code ec;
  if (!std::filesystem::exists(d, ec)) {
    train::detail::ckpt::check_writable(who, d); // save_plan_checkpoint creates it
    return;
  }
  if (!std::filesystem::is_directory(d, ec))
    throw value_error(who + ": '" + d.string() +
                      "' exists and is not a directory (a plan checkpoint is a directory of "
                      "one shard per rank and a manifest)");
  train::detail::ckpt::check_writable(who, d / "manifest.txt");
}

/// Whether `dir` looks like a plan checkpoint (a directory holding manifest.txt).
inline bool is_plan_checkpoint(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::is_directory(dir, ec) &&
         std::filesystem::is_regular_file(dir / "manifest.txt", ec);
}

namespace detail {

/// "fp8/<k>/<rest>" -> k, or -1 for a record name of another kind.
inline long fp8_index_of(const std::string& record) {
  if (record.rfind("fp8/", 0) != 0) return -1;
  const std::size_t slash = record.find('/', 4);
  if (slash == std::string::npos || slash == 4) return -1;
  long k = 0;
  for (std::size_t i = 4; i < slash; ++i) {
    if (record[i] < '0' || record[i] > '9') return -1;
    k = 10 * k + (record[i] - '0');
  }
  return k;
}

inline std::filesystem::path rank_file(const std::filesystem::path& dir, int r,
                                       const char* ext = ".tsr") {
  return dir / ("rank-" + std::to_string(r) + ext);
}

/// f(g, chunk) for each run of consecutive layers of the plan stage `stage`: its pipeline stage
/// (g = p), or under interleaved_1f1b<V> its chunks c = 0, ..., V - 1 (model chunk g = c P + p).
template <class Stage, class F>
void for_each_model_chunk(Stage& stage, F&& f) {
  if constexpr (Stage::virtual_stages == 1) {
    f(Stage::stage_index, stage.stage());
  } else {
    [&]<int... c>(std::integer_sequence<int, c...>) {
      (f(c * Stage::stages + Stage::stage_index, stage.stage().template chunk<c>()), ...);
    }
    (std::make_integer_sequence<int, Stage::virtual_stages>{});
  }
}

/// save_plan_checkpoint's body: `save_rank(path)` writes the rank's .tsr, `save_zero(path)` its
/// shard of the sharded optimizer (a no-op without ZeRO).
template <class Stage, class SaveRank, class SaveZero>
void save_plan(const std::filesystem::path& dir, Stage& stage, int zero, SaveRank&& save_rank,
               SaveZero&& save_zero) {
  const std::string who = "tessera::parallel::save_plan_checkpoint";
  auto& m = stage.mesh();
  const int r = m.world.rank();
  on_every_rank(m.world, who, [&] {
    if (r == 0) std::filesystem::create_directories(dir);
  });
  on_every_rank(m.world, who, [&] {
    save_rank(rank_file(dir, r));
    save_zero(rank_file(dir, r, ".zero.tsr"));
    std::string text = "tessera-plan-shard 1\nrank " + std::to_string(r) + " data " +
                       std::to_string(m.at.data) + " tensor " + std::to_string(m.at.tensor) +
                       " pipeline " + std::to_string(m.at.pipeline) + "\n";
    for_each_model_chunk(stage, [&](int g, auto& chunk) {
      text +=
          "chunk " + std::to_string(g) + " fp8 " + std::to_string(count_fp8_states(chunk)) + "\n";
      for_each_layer(chunk, [&](auto index, auto& layer) {
        using L = std::remove_cvref_t<decltype(layer)>;
        std::size_t k = 0;
        boost::hana::for_each(layer.parameters(), [&](const auto& p) {
          shard_spec s{};
          if constexpr (TensorParallelLayer<L>) s = L::shards[k];
          ++k;
          text += "param " + std::to_string(decltype(index)::value) + "." + p.name + " split " +
                  (s.split ? "1" : "0") + " dim " + std::to_string(s.dim) + "\n";
        });
      });
    });
    train::detail::ckpt::write_file_atomically(who, rank_file(dir, r, ".txt"), text_bytes(text));
  });
  on_every_rank(m.world, who, [&] {
    if (r == 0)
      train::detail::ckpt::write_file_atomically(
          who, dir / "manifest.txt",
          text_bytes("tessera-plan-checkpoint 1\nplan data " + std::to_string(m.shape.data) +
                     " tensor " + std::to_string(m.shape.tensor) + " pipeline " +
                     std::to_string(m.shape.pipeline) + "\nranks " +
                     std::to_string(m.shape.world()) + "\nzero " + std::to_string(zero) +
                     "\nchunks " + std::to_string(Stage::virtual_stages) + "\n"));
  });
}

/// load_plan_checkpoint's body: the manifest must name this plan and ZeRO stage.
template <class Stage, class LoadRank>
void load_plan(const std::filesystem::path& dir, Stage& stage, int zero, LoadRank&& load_rank) {
  const std::string who = "tessera::parallel::load_plan_checkpoint";
  auto& m = stage.mesh();
  on_every_rank(m.world, who, [&] {
    const auto man = read_manifest(who, dir);
    if (man.data != m.shape.data || man.tensor != m.shape.tensor ||
        man.pipeline != m.shape.pipeline)
      throw value_error(who + ": '" + dir.string() + "' holds a run of " +
                        plan_text(man.data, man.tensor, man.pipeline) + ", not of " +
                        m.shape.name() +
                        "; merge_plan_checkpoint turns it into a single-process checkpoint");
    if (man.zero != zero)
      throw value_error(who + ": '" + dir.string() + "' holds a run of " +
                        plan_text(man.data, man.tensor, man.pipeline) + " at ZeRO stage " +
                        std::to_string(man.zero) + ", not at ZeRO stage " + std::to_string(zero) +
                        " (the optimizer state is sharded another way); "
                        "merge_plan_checkpoint turns it into a single-process checkpoint");
    if (man.chunks != Stage::virtual_stages)
      throw value_error(who + ": '" + dir.string() + "' holds a run of " +
                        plan_text(man.data, man.tensor, man.pipeline) + " with " +
                        std::to_string(man.chunks) + " model chunk(s) per rank, not " +
                        std::to_string(Stage::virtual_stages) +
                        " (interleaved_1f1b<V> holds V; its ranks hold other layers); "
                        "merge_plan_checkpoint turns it into a single-process checkpoint");
  });
  on_every_rank(m.world, who, [&] { load_rank(m.world.rank()); });
}

} // namespace detail

/// Saves this rank's part of a parallel run into `dir` (created if needed); a collective over
/// the plan's world. Throws value_error on every rank if any rank fails.
template <class Stage, class Optimizer, class Scaler>
void save_plan_checkpoint(const std::filesystem::path& dir, Stage& stage, const Optimizer& opt,
                          const Scaler& scaler, const train::run_state& run) {
  detail::save_plan(
      dir, stage, 0,
      [&](const std::filesystem::path& f) {
        train::save_checkpoint(f, stage.parameters(), opt, scaler, run,
                               parallel::fp8_states_in(stage.stage()));
      },
      [](const std::filesystem::path&) {});
}

/// The same for a run whose optimizer is sharded (ZeRO stage Z >= 1, parallel/zero.hpp): each
/// rank also writes rank-<r>.zero.tsr, its shard of the optimizer state (the pieces of the
/// parameters it updates, named "<parameter>[a:b]" by their flat element range), and
/// rank-<r>.tsr holds its whole parameter values with an empty optimizer; the manifest records
/// the stage ("zero <Z>").
template <class Stage, int Z, class Optimizer, Communicator C, class Scaler>
void save_plan_checkpoint(const std::filesystem::path& dir, Stage& stage,
                          const sharded_optimizer<Z, Optimizer, C>& opt, const Scaler& scaler,
                          const train::run_state& run) {
  Optimizer blank = opt.optimizer();
  blank.state = {};
  detail::save_plan(
      dir, stage, Z,
      [&](const std::filesystem::path& f) {
        train::save_checkpoint(f, stage.parameters(), blank, scaler, run,
                               parallel::fp8_states_in(stage.stage()));
      },
      [&](const std::filesystem::path& f) {
        train::save_checkpoint(f, opt.pieces(), opt.optimizer(), scaler, run);
      });
}

/// Restores a run saved by save_plan_checkpoint under the same plan: each rank loads its own
/// shard (train::load_checkpoint: validated first, nothing changed on refusal). A collective;
/// throws value_error on every rank if the plan differs (naming both), if the checkpoint was
/// saved with a sharded optimizer (ZeRO, naming the stage), or if any rank's load fails.
template <class Stage, class Optimizer, class Scaler>
void load_plan_checkpoint(const std::filesystem::path& dir, Stage& stage, Optimizer& opt,
                          Scaler& scaler, train::run_state& run) {
  train::run_state staged = run;
  detail::load_plan(dir, stage, 0, [&](int r) {
    train::load_checkpoint(detail::rank_file(dir, r), stage.parameters(), opt, scaler, staged,
                           parallel::fp8_states_in(stage.stage()));
  });
  run = staged;
}

/// The same for a sharded optimizer: the checkpoint must come from the same plan at the same
/// ZeRO stage Z (another is refused naming both); each rank loads its parameters and its shard
/// of the optimizer state.
template <class Stage, int Z, class Optimizer, Communicator C, class Scaler>
void load_plan_checkpoint(const std::filesystem::path& dir, Stage& stage,
                          sharded_optimizer<Z, Optimizer, C>& opt, Scaler& scaler,
                          train::run_state& run) {
  train::run_state staged = run;
  detail::load_plan(dir, stage, Z, [&](int r) {
    Optimizer blank = opt.optimizer();
    blank.state = {};
    Scaler scaler_copy = scaler;
    train::run_state zero_run = run;
    Optimizer sharded = opt.optimizer();
    // The pieces first (their values are the rank file's values), then the whole parameters;
    // the sharded optimizer state is applied only when both loaded.
    train::load_checkpoint(detail::rank_file(dir, r, ".zero.tsr"), opt.pieces(), sharded,
                           scaler_copy, zero_run);
    train::load_checkpoint(detail::rank_file(dir, r), stage.parameters(), blank, scaler, staged,
                           parallel::fp8_states_in(stage.stage()));
    opt.optimizer() = std::move(sharded);
  });
  run = staged;
}

/// Merges the plan checkpoint in `dir` into one single-process checkpoint at `out` (atomically),
/// which train::load_checkpoint loads into the whole model (a ZeRO run's optimizer shards
/// gathered first: see the file comment). One process; no MPI needed. Throws
/// value_error if a file is missing or malformed or the shards do not fit together.
inline void merge_plan_checkpoint(const std::filesystem::path& dir,
                                  const std::filesystem::path& out) {
  namespace ck = train::detail::ckpt;
  const std::string who = "tessera::parallel::merge_plan_checkpoint";
  const auto man = detail::read_manifest(who, dir);
  struct source {
    detail::rank_fragment fragment;
    std::vector<unsigned char> bytes;
    std::vector<ck::parsed_record> records;
  };
  std::vector<source> sources; // the ranks of data coordinate 0
  std::vector<detail::rank_fragment> fragments;
  for (int r = 0; r < man.ranks; ++r) fragments.push_back(detail::read_fragment(who, dir, r));
  for (int r = 0; r < man.ranks; ++r) {
    if (fragments[std::size_t(r)].data != 0) continue;
    source s{fragments[std::size_t(r)], ck::read_file(who, detail::rank_file(dir, r)), {}};
    s.records = ck::parse(who, detail::rank_file(dir, r).string(), s.bytes);
    sources.push_back(std::move(s));
  }
  // ZeRO: each source's optimizer records (empty in its .tsr) put back together from the
  // shard pieces of the ranks that share its tensor and pipeline coordinates (one per data
  // coordinate), in element order; the step count from the data-0 rank's piece file.
  std::vector<source> zero_files(std::size_t(man.zero > 0 ? man.ranks : 0));
  std::deque<std::vector<unsigned char>> owned; // payloads of the records put together
  for (int r = 0; r < int(zero_files.size()); ++r) {
    zero_files[std::size_t(r)].fragment = fragments[std::size_t(r)];
    zero_files[std::size_t(r)].bytes = ck::read_file(who, detail::rank_file(dir, r, ".zero.tsr"));
    zero_files[std::size_t(r)].records = ck::parse(
        who, detail::rank_file(dir, r, ".zero.tsr").string(), zero_files[std::size_t(r)].bytes);
  }
  for (source& s : sources) {
    if (man.zero == 0) break;
    std::map<std::string, const ck::parsed_record*> params; // "3.weight" -> its param record
    std::vector<ck::parsed_record> kept;
    for (const ck::parsed_record& rec : s.records) {
      if (rec.name.rfind("param/", 0) == 0) params[rec.name.substr(6)] = &rec;
      if (rec.name.rfind("optim/", 0) != 0) kept.push_back(rec);
    }
    // Per optimizer record ("optim/sgd/momentum_buffer/3.weight"): its pieces by first element.
    std::map<std::string, std::map<std::int64_t, const ck::parsed_record*>> pieces;
    for (const source& z : zero_files) {
      if (z.fragment.tensor != s.fragment.tensor || z.fragment.pipeline != s.fragment.pipeline)
        continue;
      for (const ck::parsed_record& rec : z.records) {
        if (rec.name.rfind("optim/", 0) != 0) continue;
        const std::string param = detail::parameter_of(rec.name);
        if (param.empty()) { // the step count: the same on every rank
          if (z.fragment.data == 0) kept.push_back(rec);
          continue;
        }
        const auto [whole, first] = detail::piece_of(who, param);
        const std::string name = rec.name.substr(0, rec.name.size() - param.size()) + whole;
        if (!pieces[name].emplace(first, &rec).second)
          throw value_error(who + ": the piece '" + rec.name + "' appears twice");
      }
    }
    for (const auto& [name, by_first] : pieces) {
      const std::string param = detail::parameter_of(name);
      const auto it = params.find(param);
      if (it == params.end())
        throw value_error(who + ": the optimizer record '" + name + "' of rank " +
                          std::to_string(s.fragment.rank) + "'s shard belongs to no parameter");
      std::vector<unsigned char> payload;
      for (const auto& [first, rec] : by_first) {
        if (std::int64_t(payload.size() / sizeof(float)) != first || rec->type != ck::dtype::f32)
          throw value_error(who + ": the fp32 pieces of '" + name +
                            "' do not cover it contiguously (a data rank's file missing?)");
        payload.insert(payload.end(), rec->data, rec->data + rec->bytes);
      }
      if (payload.size() != it->second->bytes)
        throw value_error(who + ": the pieces of '" + name + "' hold " +
                          std::to_string(payload.size() / sizeof(float)) +
                          " values, the parameter " +
                          std::to_string(it->second->bytes / sizeof(float)));
      owned.push_back(std::move(payload));
      ck::parsed_record whole;
      whole.name = name;
      whole.type = ck::dtype::f32;
      whole.shape = it->second->shape;
      whole.data = owned.back().data();
      whole.bytes = owned.back().size();
      kept.push_back(std::move(whole));
    }
    s.records = std::move(kept);
  }
  // Per record name: the shards by tensor coordinate (those of one pipeline stage).
  std::map<std::string, std::map<int, const ck::parsed_record*>> shards;
  std::map<std::string, detail::shard_entry> spec;
  std::vector<ck::record> merged;
  for (const source& s : sources)
    for (const auto& e : s.fragment.params) spec[e.name] = e;
  // fp8 states: per model chunk, by tensor coordinate, the records of that rank with their
  // index in the chunk. A rank's states are numbered through its chunks in order (a
  // description without chunk lines: one chunk, its pipeline stage).
  struct fp8_part {
    int stage = 0;
    long count = -1; // states in the chunk (-1: not described, the records tell)
    std::map<int, std::vector<std::pair<long, const ck::parsed_record*>>> by_tensor;
  };
  std::map<int, fp8_part> fp8_records;
  for (const source& s : sources)
    for (const ck::parsed_record& rec : s.records) {
      if (const long k = detail::fp8_index_of(rec.name); k >= 0) {
        int g = s.fragment.pipeline;
        long first = 0, count = -1; // the chunk's first state among the rank's, its states
        for (const detail::chunk_entry& c : s.fragment.chunks) {
          if (k < first + c.fp8) {
            g = c.index;
            count = c.fp8;
            break;
          }
          first += c.fp8;
        }
        if (!s.fragment.chunks.empty() && count < 0)
          throw value_error(who + ": record '" + rec.name + "' of rank " +
                            std::to_string(s.fragment.rank) + " lies past the " +
                            std::to_string(first) + " fp8 states its description lists");
        fp8_part& part = fp8_records[g];
        part.stage = s.fragment.pipeline;
        part.count = count;
        part.by_tensor[s.fragment.tensor].push_back({k - first, &rec});
        continue;
      }
      const std::string param = detail::parameter_of(rec.name);
      if (param.empty()) {
        if (s.fragment.rank == 0)
          merged.push_back({rec.name, rec.type, rec.shape,
                            std::vector<unsigned char>(rec.data, rec.data + rec.bytes)});
        continue;
      }
      if (!spec.count(param))
        throw value_error(who + ": record '" + rec.name + "' of rank " +
                          std::to_string(s.fragment.rank) +
                          " belongs to no parameter its description lists");
      if (!shards[rec.name].emplace(s.fragment.tensor, &rec).second)
        throw value_error(who + ": record '" + rec.name + "' appears twice for tensor rank " +
                          std::to_string(s.fragment.tensor));
    }
  for (const auto& [name, by_rank] : shards) {
    const detail::shard_entry& e = spec.at(detail::parameter_of(name));
    const ck::parsed_record& first = *by_rank.begin()->second;
    if (!e.split) {
      merged.push_back({name, first.type, first.shape,
                        std::vector<unsigned char>(first.data, first.data + first.bytes)});
      continue;
    }
    if (int(by_rank.size()) != man.tensor || first.type != ck::dtype::f32 || e.dim < 0 ||
        std::size_t(e.dim) >= first.shape.size())
      throw value_error(who + ": '" + name + "' is split but " + std::to_string(by_rank.size()) +
                        " of its " + std::to_string(man.tensor) + " fp32 shards were found");
    std::vector<float> gathered;
    for (const auto& [t, rec] : by_rank) {
      if (rec->shape != first.shape)
        throw value_error(who + ": the shards of '" + name + "' differ in shape");
      const std::size_t at = gathered.size();
      gathered.resize(at + rec->bytes / sizeof(float));
      std::memcpy(gathered.data() + at, rec->data, rec->bytes); // payloads may be unaligned
    }
    shard_spec s{true, 1, 1, e.dim};
    for (int d = 0; d < e.dim; ++d) s.outer *= first.shape[std::size_t(d)];
    for (std::size_t d = std::size_t(e.dim); d < first.shape.size(); ++d) s.inner *= first.shape[d];
    std::vector<std::int64_t> shape = first.shape;
    shape[std::size_t(e.dim)] *= man.tensor;
    std::vector<float> values(gathered.size());
    detail::assemble_shards(gathered.data(), values.data(), s, man.tensor);
    ck::record whole{name, ck::dtype::f32, shape, std::vector<unsigned char>(values.size() * 4)};
    std::memcpy(whole.payload.data(), values.data(), whole.payload.size());
    merged.push_back(std::move(whole));
  }
  // Each model chunk's fp8 states: equal on its tensor ranks (fp8_sync.hpp), renumbered after
  // the states of the chunks before it.
  long offset = 0;
  for (const auto& [g, part] : fp8_records) {
    const auto& mine = part.by_tensor.begin()->second;
    for (const auto& [t, recs] : part.by_tensor) {
      bool same = recs.size() == mine.size();
      for (std::size_t i = 0; same && i < recs.size(); ++i) {
        const ck::parsed_record &a = *recs[i].second, &b = *mine[i].second;
        same = recs[i].first == mine[i].first && a.name == b.name && a.type == b.type &&
               a.shape == b.shape && a.bytes == b.bytes &&
               std::memcmp(a.data, b.data, a.bytes) == 0;
      }
      if (!same)
        throw value_error(
            who + ": the fp8 scaling states of pipeline stage " + std::to_string(part.stage) +
            (g != part.stage ? " (model chunk " + std::to_string(g) + ")" : std::string()) +
            " differ between tensor ranks " + std::to_string(part.by_tensor.begin()->first) +
            " and " + std::to_string(t) +
            " (every rank that shares a tensor holds its state: a corrupt or mixed "
            "checkpoint directory?)");
    }
    long count = part.count;
    for (const auto& [k, rec] : mine) {
      if (part.count < 0) count = std::max(count, k + 1);
      const std::string rest = rec->name.substr(rec->name.find('/', 4));
      merged.push_back({"fp8/" + std::to_string(offset + k) + rest, rec->type, rec->shape,
                        std::vector<unsigned char>(rec->data, rec->data + rec->bytes)});
    }
    offset += count;
  }
  ck::write_file_atomically(who, out, ck::serialize(merged));
}

} // namespace tessera::parallel
