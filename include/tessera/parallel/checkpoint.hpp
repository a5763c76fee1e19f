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
///                  the single-process model), the optimizer state of those shards, the scaler
///                  and the run state;
///   rank-<r>.txt   what rank r holds, one line per item:
///                    tessera-plan-shard 1
///                    rank <r> data <d> tensor <t> pipeline <p>
///                    param <name> split <0|1> dim <k>     (split: cut along dimension k)
///   manifest.txt   written last, by rank 0, once every rank's files are in place:
///                    tessera-plan-checkpoint 1
///                    plan data <D> tensor <T> pipeline <P>
///                    ranks <D * T * P>
/// Every file is written atomically (train's write_file_atomically). The data replicas hold
/// identical state, so a merge reads the ranks of data coordinate 0: for each parameter, the T
/// shards of its stage's tensor group are put back together (as gather_parameters does), and
/// so are its optimizer slots (momentum, Adam moments); scalars come from rank 0.

#include <tessera/parallel/runner.hpp>
#include <tessera/train/checkpoint.hpp>

#include <cstring>
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
  return m;
}

struct shard_entry {
  std::string name;
  bool split = false;
  int dim = 0;
};
struct rank_fragment {
  int rank = 0, data = 0, tensor = 0, pipeline = 0;
  std::vector<shard_entry> params;
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

/// Saves this rank's part of a parallel run into `dir` (created if needed); a collective over
/// the plan's world. Throws value_error on every rank if any rank fails.
template <class Stage, class Optimizer, class Scaler>
void save_plan_checkpoint(const std::filesystem::path& dir, Stage& stage, const Optimizer& opt,
                          const Scaler& scaler, const train::run_state& run) {
  const std::string who = "tessera::parallel::save_plan_checkpoint";
  auto& m = stage.mesh();
  const int r = m.world.rank();
  detail::on_every_rank(m.world, who, [&] {
    if (r == 0) std::filesystem::create_directories(dir);
  });
  detail::on_every_rank(m.world, who, [&] {
    train::save_checkpoint(dir / ("rank-" + std::to_string(r) + ".tsr"), stage.parameters(), opt,
                           scaler, run);
    std::string text = "tessera-plan-shard 1\nrank " + std::to_string(r) + " data " +
                       std::to_string(m.at.data) + " tensor " + std::to_string(m.at.tensor) +
                       " pipeline " + std::to_string(m.at.pipeline) + "\n";
    for_each_layer(stage.stage(), [&](auto index, auto& layer) {
      using L = std::remove_cvref_t<decltype(layer)>;
      std::size_t k = 0;
      boost::hana::for_each(layer.parameters(), [&](const auto& p) {
        shard_spec s{};
        if constexpr (detail::TensorParallelLayer<L>) s = L::shards[k];
        ++k;
        text += "param " + std::to_string(decltype(index)::value) + "." + p.name + " split " +
                (s.split ? "1" : "0") + " dim " + std::to_string(s.dim) + "\n";
      });
    });
    train::detail::ckpt::write_file_atomically(who, dir / ("rank-" + std::to_string(r) + ".txt"),
                                               detail::text_bytes(text));
  });
  detail::on_every_rank(m.world, who, [&] {
    if (r == 0)
      train::detail::ckpt::write_file_atomically(
          who, dir / "manifest.txt",
          detail::text_bytes(
              "tessera-plan-checkpoint 1\nplan data " + std::to_string(m.shape.data) + " tensor " +
              std::to_string(m.shape.tensor) + " pipeline " + std::to_string(m.shape.pipeline) +
              "\nranks " + std::to_string(m.shape.world()) + "\n"));
  });
}

/// Restores a run saved by save_plan_checkpoint under the same plan: each rank loads its own
/// shard (train::load_checkpoint: validated first, nothing changed on refusal). A collective;
/// throws value_error on every rank if the plan differs or any rank's load fails.
template <class Stage, class Optimizer, class Scaler>
void load_plan_checkpoint(const std::filesystem::path& dir, Stage& stage, Optimizer& opt,
                          Scaler& scaler, train::run_state& run) {
  const std::string who = "tessera::parallel::load_plan_checkpoint";
  auto& m = stage.mesh();
  detail::on_every_rank(m.world, who, [&] {
    const auto man = detail::read_manifest(who, dir);
    if (man.data != m.shape.data || man.tensor != m.shape.tensor ||
        man.pipeline != m.shape.pipeline)
      throw value_error(
          who + ": '" + dir.string() + "' holds a run of plan(data=" + std::to_string(man.data) +
          ", tensor=" + std::to_string(man.tensor) + ", pipeline=" + std::to_string(man.pipeline) +
          "), not of " + m.shape.name() +
          "; merge_plan_checkpoint turns it into a single-process checkpoint");
  });
  train::run_state staged = run;
  detail::on_every_rank(m.world, who, [&] {
    train::load_checkpoint(dir / ("rank-" + std::to_string(m.world.rank()) + ".tsr"),
                           stage.parameters(), opt, scaler, staged);
  });
  run = staged;
}

/// Merges the plan checkpoint in `dir` into one single-process checkpoint at `out` (atomically),
/// which train::load_checkpoint loads into the whole model. One process; no MPI needed. Throws
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
  for (int r = 0; r < man.ranks; ++r) {
    detail::rank_fragment f = detail::read_fragment(who, dir, r);
    if (f.data != 0) continue;
    source s{std::move(f), ck::read_file(who, dir / ("rank-" + std::to_string(r) + ".tsr")), {}};
    s.records = ck::parse(who, (dir / ("rank-" + std::to_string(r) + ".tsr")).string(), s.bytes);
    sources.push_back(std::move(s));
  }
  // Per record name: the shards by tensor coordinate (those of one pipeline stage).
  std::map<std::string, std::map<int, const ck::parsed_record*>> shards;
  std::map<std::string, detail::shard_entry> spec;
  std::vector<ck::record> merged;
  for (const source& s : sources)
    for (const auto& e : s.fragment.params) spec[e.name] = e;
  for (const source& s : sources)
    for (const ck::parsed_record& rec : s.records) {
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
  ck::write_file_atomically(who, out, ck::serialize(merged));
}

} // namespace tessera::parallel
