// The job spec has one definition: every field of pipetrain.v1.JobSpec, set to a
// non-default value through YAML and through its command-line flag, reaches the runtime's
// JobSpec unchanged, and changes nothing else. The fields are found by walking the
// spec's descriptor, so a field added to job.proto without a flag, a conversion or a value
// here fails this test. (tests/cli runs the same job through every launch mode and submit.)
#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "jobspec/spec_flags.h"
#include "jobspec/spec_text.h"
#include "jobspec/spec_yaml.h"
#include "runtime/job/job_limits.h"
#include "runtime/job/job_spec.h"

namespace pipetrain::jobspec {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using nlohmann::json;
using ::testing::HasSubstr;

// One non-default value of one field: as YAML writes it, as its flag takes it, and as
// JobToJson shows the runtime's field. Each is valid on its own over the defaults.
struct FieldValue {
  std::string path;  // the YAML key path
  std::string yaml;
  std::string flag_text;
  json expected;
};

const std::vector<FieldValue>& Values() {
  static const std::vector<FieldValue> values = {
      {"name", "\"nightly: run 7\"", "nightly: run 7", "nightly: run 7"},
      {"weights_dir", "/tmp/w eights", "/tmp/w eights", "/tmp/w eights"},
      {"checkpoint.dir", "/tmp/c kpt", "/tmp/c kpt", "/tmp/c kpt"},
      {"checkpoint.every", "50", "50", 50},
      {"checkpoint.keep", "5", "5", 5},
      {"resume_from", "/tmp/ckpt/step-00000010", "/tmp/ckpt/step-00000010",
       "/tmp/ckpt/step-00000010"},
      {"max_restarts", "4", "4", 4},
      {"nonfinite_limit", "7", "7", 7},
      {"planner", "hippie", "hippie", "hippie"},
      {"model.name", "mlp", "mlp", "mlp"},
      {"model.path", "/tmp/m.pt", "/tmp/m.pt", "/tmp/m.pt"},
      {"model.d_model", "48", "48", 48},
      {"model.n_heads", "2", "2", 2},
      {"model.n_layers", "5", "5", 5},
      {"model.dropout", "0.25", "0.25", 0.25},
      {"model.tie_embeddings", "true", "true", true},
      {"model.tie", "[\"0.weight=2.weight\", \"1.w=3.w=5.w\"]", "0.weight=2.weight,1.w=3.w=5.w",
       json::array({"0.weight=2.weight", "1.w=3.w=5.w"})},
      {"model.hidden", "40", "40", 40},
      {"model.hidden_layers", "6", "6", 6},
      {"model.input_dim", "12", "12", 12},
      {"model.image_shape", "[3, 16, 12]", "3,16,12", json::array({3, 16, 12})},
      {"model.num_classes", "7", "7", 7},
      {"data.kind", "synthetic", "synthetic", "synthetic"},
      {"data.path", "/tmp/d.bin", "/tmp/d.bin", "/tmp/d.bin"},
      {"data.seq_len", "24", "24", 24},
      {"data.vocab", "50", "50", 50},
      {"data.branching", "3", "3", 3},
      {"data.num_tokens", "50000", "50000", 50000},
      {"data.num_samples", "900", "900", 900},
      {"data.seed", "18446744073709551615", "18446744073709551615",
       json(uint64_t{18446744073709551615u})},
      {"schedule", "gpipe", "gpipe", "gpipe"},
      {"stages", "3", "3", 3},
      {"virtual_stages", "1", "1", 1},  // gpipe holds one stage a rank
      {"vertical_sync", "true", "true", true},
      {"replicas", "2", "2", 2},
      {"overlap_allreduce", "false", "false", false},
      {"bucket_kib", "64", "64", 64},
      {"microbatches", "6", "6", 6},
      {"microbatch_size", "3", "3", 3},
      {"steps", "17", "17", 17},
      {"optimizer.name", "sgd", "sgd", "sgd"},
      {"optimizer.lr", "0.03333333333333333", "0.03333333333333333", 0.1 / 3},
      {"optimizer.weight_decay", "0.01", "0.01", 0.01},
      {"optimizer.momentum", "0.5", "0.5", 0.5},
      {"optimizer.beta1", "0.8", "0.8", 0.8},
      {"optimizer.beta2", "0.95", "0.95", 0.95},
      {"optimizer.eps", "1e-6", "1e-6", 1e-6},
      {"optimizer.clip_grad_norm", "1.5", "1.5", 1.5},
      {"optimizer.no_decay", "[bias, norm]", "bias,norm", json::array({"bias", "norm"})},
      {"optimizer.schedule.warmup_steps", "100", "100", 100},
      {"optimizer.schedule.decay", "cosine", "cosine", "cosine"},
      {"optimizer.schedule.decay_steps", "900", "900", 900},
      {"optimizer.schedule.min_lr", "0.0001", "0.0001", 0.0001},
      {"eval.every", "10", "10", 10},
      {"eval.batches", "3", "3", 3},
      {"eval.split", "0.125", "0.125", 0.125},
      {"recompute", "layers:1,3", "layers:1,3", "layers:1,3"},
      {"seed", "987654321012345", "987654321012345", 987654321012345},
      {"dtype", "float64", "float64", "float64"},
      {"device", "cuda", "cuda", "cuda"},
      {"threads_per_stage", "2", "2", 2},
      {"timeout_s", "7.25", "7.25", 7.25},
  };
  return values;
}

// A field valid only with another set too (vertical_sync: pipedream's; eval.every: a
// held-out split): that one's value.
const FieldValue* CompanionOf(const std::string& path) {
  static const FieldValue pipedream = {"schedule", "pipedream", "pipedream", "pipedream"};
  static const FieldValue split = {"eval.split", "0.125", "0.125", 0.125};
  if (path == "vertical_sync") return &pipedream;
  return path == "eval.every" ? &split : nullptr;
}

const FieldValue* ValueOf(const std::string& path) {
  for (const FieldValue& v : Values()) {
    if (v.path == path) return &v;
  }
  return nullptr;
}

const SpecFlag* FlagOf(const std::string& path) {
  const SpecFlag* found = nullptr;
  for (const SpecFlag& f : SpecFlagTable()) {
    if (f.path == path) {
      EXPECT_EQ(found, nullptr) << "two flags set " << path;
      found = &f;
    }
  }
  return found;
}

// Every scalar or list-of-scalars field of the spec, by YAML key path. stage_ranges and
// auto_stages are written as `stages` (a count, ranges or auto) in YAML and on the command
// line.
void CollectLeaves(const Descriptor* d, const std::string& prefix, std::vector<std::string>* out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const std::string path = prefix.empty() ? f->name() : prefix + "." + f->name();
    if (path == "stage_ranges" || path == "auto_stages") continue;
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      CollectLeaves(f->message_type(), path, out);
    } else {
      out->push_back(path);
    }
  }
}

// "model.d_model", "48" -> "model: {d_model: 48}"
std::string YamlOf(const std::string& path, const std::string& value) {
  std::vector<std::string> keys = absl::StrSplit(path, '.');
  std::string yaml = keys.back() + ": " + value;
  for (int i = static_cast<int>(keys.size()) - 2; i >= 0; --i) {
    yaml = keys[i] + ": {" + yaml + "}";
  }
  return yaml + "\n";
}

// The YAML of a field and its companion (CompanionOf; none: the field's alone), the two in one
// mapping where they share a parent (eval.every and eval.split: `eval: {every: .., split: ..}`).
std::string YamlOfBoth(const std::string& path, const std::string& value, const FieldValue* with) {
  if (with == nullptr) return YamlOf(path, value);
  const std::vector<std::string> a = absl::StrSplit(path, '.');
  const std::vector<std::string> b = absl::StrSplit(with->path, '.');
  if (a.size() == 2 && b.size() == 2 && a[0] == b[0]) {
    return a[0] + ": {" + a[1] + ": " + value + ", " + b[1] + ": " + with->yaml + "}\n";
  }
  return YamlOf(path, value) + YamlOf(with->path, with->yaml);
}

json::json_pointer PointerOf(const std::string& path) {
  return json::json_pointer("/" + absl::StrReplaceAll(path, {{".", "/"}}));
}

json ConfigJson(const v1::JobSpec& spec) {
  absl::StatusOr<job::JobSpec> config = job::Validated(spec);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? json::parse(job::JobToJson(*config)) : json();
}

// The runtime's defaults with the fields in `changes` set: what a spec that sets exactly
// those fields must convert to.
json Expected(const std::vector<std::pair<std::string, json>>& changes) {
  json j = ConfigJson(v1::JobSpec());
  for (const auto& [path, value] : changes) j[PointerOf(path)] = value;
  return j;
}

// The spec of a command line: the job file `file` (none if empty), the flags `args`.
absl::StatusOr<v1::JobSpec> FromFlags(std::vector<std::string> args, const std::string& file = "") {
  CLI::App app;
  SpecFlags flags(&app);
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  app.parse(args);
  return BuildJobSpec(file, flags);
}

TEST(JobSpec, EveryFieldHasAFlagAndATestValue) {
  std::vector<std::string> leaves;
  CollectLeaves(v1::JobSpec::descriptor(), "", &leaves);
  for (const std::string& path : leaves) {
    EXPECT_NE(FlagOf(path), nullptr) << path << " has no flag in jobspec/spec_flags.cc";
    EXPECT_NE(ValueOf(path), nullptr) << path << " has no value in this test";
  }
  EXPECT_EQ(leaves.size(), Values().size());
  EXPECT_EQ(leaves.size(), SpecFlagTable().size());
}

TEST(JobSpec, EveryFieldThroughYamlReachesTheConfigAloneAndUnchanged) {
  for (const FieldValue& v : Values()) {
    SCOPED_TRACE(v.path);
    const FieldValue* with = CompanionOf(v.path);
    absl::StatusOr<v1::JobSpec> spec = JobSpecFromYaml(YamlOfBoth(v.path, v.yaml, with));
    ASSERT_TRUE(spec.ok()) << spec.status();
    std::vector<std::pair<std::string, json>> changes = {{v.path, v.expected}};
    if (with != nullptr) changes.push_back({with->path, with->expected});
    EXPECT_EQ(ConfigJson(*spec), Expected(changes));
  }
}

TEST(JobSpec, EveryFieldThroughItsFlagReachesTheConfigAloneAndUnchanged) {
  for (const FieldValue& v : Values()) {
    SCOPED_TRACE(v.path);
    const SpecFlag* flag = FlagOf(v.path);
    ASSERT_NE(flag, nullptr);
    std::vector<std::string> args = {flag->name, v.flag_text};
    std::vector<std::pair<std::string, json>> changes = {{v.path, v.expected}};
    if (const FieldValue* with = CompanionOf(v.path); with != nullptr) {
      args.insert(args.end(), {FlagOf(with->path)->name, with->flag_text});
      changes.push_back({with->path, with->expected});
    }
    absl::StatusOr<v1::JobSpec> spec = FromFlags(args);
    ASSERT_TRUE(spec.ok()) << spec.status();
    if (flag->also_path != nullptr) changes.push_back({flag->also_path, flag->also_value});
    EXPECT_EQ(ConfigJson(*spec), Expected(changes));
  }
}

TEST(JobSpec, LayerRangesThroughYamlAndFlagsAreTheSame) {
  const json ranges = json::array({json::array({0, 2}), json::array({2, 7})});
  const json expected = Expected({{"stages", 2}, {"stage_ranges", ranges}});
  for (const char* yaml : {"stages: [[0, 2], [2, 7]]\n", "stages: \"0:2,2:7\"\n"}) {
    absl::StatusOr<v1::JobSpec> spec = JobSpecFromYaml(yaml);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(ConfigJson(*spec), expected) << yaml;
  }
  absl::StatusOr<v1::JobSpec> spec = FromFlags({"--stages", "0:2,2:7"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(ConfigJson(*spec), expected);
}

// `stages: auto` asks for a planned layout; a count or ranges given later replace it, as they
// replace each other.
TEST(JobSpec, StagesAutoThroughYamlAndFlags) {
  const json expected = Expected({{"auto_stages", true}, {"planner", "hippie"}});
  absl::StatusOr<v1::JobSpec> yaml = JobSpecFromYaml("stages: auto\nplanner: hippie\n");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_EQ(ConfigJson(*yaml), expected);
  absl::StatusOr<v1::JobSpec> flags = FromFlags({"--stages", "auto", "--planner", "hippie"});
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(ConfigJson(*flags), expected);
  const std::string file = ::testing::TempDir() + "/jobspec_auto.yaml";
  {
    std::ofstream out(file);
    out << "stages: auto\n";
  }
  absl::StatusOr<v1::JobSpec> replaced = FromFlags({"--stages", "3"}, file);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_EQ(ConfigJson(*replaced), Expected({{"stages", 3}}));
  absl::StatusOr<v1::JobSpec> bad = FromFlags({"--planner", "gpipe"});
  ASSERT_TRUE(bad.ok());
  absl::StatusOr<job::JobSpec> config = job::Validated(*bad);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()),
              ::testing::HasSubstr("planner: unknown 'gpipe' (one of: 2bw, pipedream, hippie)"));
}

TEST(JobSpec, FlagsOverrideTheFileFieldByField) {
  const std::string file = ::testing::TempDir() + "/jobspec_override.yaml";
  {
    std::ofstream out(file);
    out << "steps: 5\nstages: [[0, 2], [2, 6]]\noptimizer: {name: sgd, lr: 0.5}\n";
  }
  absl::StatusOr<v1::JobSpec> spec = FromFlags({"--lr", "0.25", "--stages", "3"}, file);
  ASSERT_TRUE(spec.ok()) << spec.status();
  // The flags win; what they do not name stays as the file says.
  EXPECT_EQ(
      ConfigJson(*spec),
      Expected({{"steps", 5}, {"stages", 3}, {"optimizer.name", "sgd"}, {"optimizer.lr", 0.25}}));
}

TEST(JobSpec, BadFlagValuesAreAllListedWithFlagAndField) {
  absl::StatusOr<v1::JobSpec> spec =
      FromFlags({"--steps", "many", "--lr", "fast", "--image-shape", "1,x", "--stages", "0-2"});
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(spec.status().message());
  EXPECT_THAT(message, HasSubstr("--steps (steps): expected an integer, got 'many'"));
  EXPECT_THAT(message, HasSubstr("--lr (optimizer.lr): expected a number, got 'fast'"));
  EXPECT_THAT(message, HasSubstr("--image-shape (model.image_shape[1]): expected an integer"));
  EXPECT_THAT(message, HasSubstr("--stages (stages): expected a count"));
}

TEST(JobSpec, AMissingJobFileIsNotFoundAndNamed) {
  absl::StatusOr<v1::JobSpec> spec = FromFlags({}, "/nonexistent/job.yaml");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(spec.status().message(), HasSubstr("/nonexistent/job.yaml"));
}

TEST(JobSpec, TextFormatRoundTripsEveryFieldExactly) {
  std::vector<std::string> flags;
  for (const FieldValue& v : Values()) {
    flags.push_back(FlagOf(v.path)->name);
    flags.push_back(v.flag_text);
  }
  absl::StatusOr<v1::JobSpec> spec = FromFlags(flags);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string text = JobSpecToText(*spec);
  EXPECT_EQ(text.find('\n'), std::string::npos) << text;
  absl::StatusOr<v1::JobSpec> back = JobSpecFromText(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*back, *spec)) << text;
  EXPECT_FALSE(JobSpecFromText("steps: \"x\"").ok());
}

TEST(JobSpec, HelpShowsTheRuntimeDefaultAndTheField) {
  CLI::App app;
  SpecFlags flags(&app);
  const std::string help = app.help();
  EXPECT_THAT(help, HasSubstr("--steps steps=300 "));
  EXPECT_THAT(help, HasSubstr("--lr optimizer.lr=0.003 "));
  EXPECT_THAT(help, HasSubstr("coupled for sgd"));
}

}  // namespace
}  // namespace pipetrain::jobspec

namespace pipetrain::jobspec {
namespace {

// Every numeric field of the spec, by YAML key path.
void CollectNumericLeaves(const Descriptor* d, const std::string& prefix,
                          std::vector<std::string>* out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const std::string path = prefix.empty() ? f->name() : prefix + "." + f->name();
    if (path == "stage_ranges") continue;  // checked against the model's layers
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (!f->is_repeated()) CollectNumericLeaves(f->message_type(), path, out);
    } else if (f->cpp_type() != FieldDescriptor::CPPTYPE_STRING &&
               f->cpp_type() != FieldDescriptor::CPPTYPE_BOOL) {
      out->push_back(path);
    }
  }
}

TEST(JobLimits, EveryNumericFieldHasABoundAndDocsLimitsIsTheTable) {
  std::vector<std::string> numeric;
  CollectNumericLeaves(v1::JobSpec::descriptor(), "", &numeric);
  std::set<std::string> limited;
  for (const job::FieldLimit& l : job::JobFieldLimits()) limited.insert(l.path);
  for (const std::string& path : numeric) EXPECT_TRUE(limited.count(path)) << path;
  std::ifstream in(std::string(PIPETRAIN_SOURCE_DIR) + "/docs/limits.md");
  std::stringstream doc;
  doc << in.rdbuf();
  EXPECT_THAT(doc.str(), HasSubstr(job::LimitsMarkdown()))
      << "docs/limits.md is out of date; its table is:\n"
      << job::LimitsMarkdown();
}

// Past each bound, and not finite: refused naming the field and the reason; the bound itself
// is still a job the checks take (where the job stays valid otherwise).
TEST(JobLimits, EveryBoundIsEnforcedWithItsReason) {
  for (const job::FieldLimit& l : job::JobFieldLimits()) {
    SCOPED_TRACE(l.path);
    const bool unsigned_field = std::string(l.path).find("seed") != std::string::npos;
    if (unsigned_field) continue;  // the whole 64-bit range: nothing lies beyond
    const bool list = std::string(l.path) == "model.image_shape";
    const std::string above = json(l.max * 2 + 1).dump();
    absl::StatusOr<v1::JobSpec> spec =
        JobSpecFromYaml(YamlOf(l.path, list ? "[" + above + ", 8, 8]" : above));
    if (!spec.ok()) {  // beyond the field's type: the reader refuses it
      EXPECT_THAT(spec.status().message(), HasSubstr(l.path));
      continue;
    }
    absl::StatusOr<job::JobSpec> config = job::Validated(*spec);
    ASSERT_FALSE(config.ok());
    EXPECT_THAT(config.status().message(), HasSubstr(l.path));
  }
  for (const char* yaml :
       {"optimizer: {lr: .inf}\n", "optimizer: {eps: .nan}\n", "timeout_s: -.inf\n"}) {
    absl::StatusOr<v1::JobSpec> spec = JobSpecFromYaml(yaml);
    EXPECT_FALSE(spec.ok()) << yaml;  // the reader refuses them first
    if (!spec.ok()) {
      EXPECT_THAT(spec.status().message(), HasSubstr("finite")) << yaml;
    }
  }
  // A field no other check bounds above: the table's reason is given.
  absl::StatusOr<job::JobSpec> wide = job::Validated(*JobSpecFromYaml("model: {d_model: 70000}\n"));
  ASSERT_FALSE(wide.ok());
  EXPECT_THAT(wide.status().message(),
              HasSubstr("model.d_model: must be in [1, 65,536] (wider than any published "
                        "transformer), got 70000"));
  // A stage's memory does not grow with its steps: the largest counts are legitimate.
  absl::StatusOr<v1::JobSpec> spec =
      JobSpecFromYaml("steps: 2147483647\nmicrobatches: 65536\nschedule: 2bw\n");
  ASSERT_TRUE(spec.ok());
  EXPECT_TRUE(job::Validated(*spec).ok()) << job::Validated(*spec).status();
  // One more does not fit the field (a 32-bit count): the reader names it.
  absl::StatusOr<v1::JobSpec> too_many = JobSpecFromYaml("steps: 2147483648\n");
  ASSERT_FALSE(too_many.ok());
  EXPECT_THAT(too_many.status().message(), HasSubstr("steps: 2147483648 is out of range"));
}

TEST(JobLimits, NamesArePrintableUtf8OfAtMost256Bytes) {
  for (const std::string& name : {std::string(257, 'a'), std::string("red\x1b[31m"),
                                  std::string("bad \xff utf8"), std::string("c1 \xc2\x9b")}) {
    v1::JobSpec spec;
    spec.set_name(name);
    absl::StatusOr<job::JobSpec> config = job::Validated(spec);
    ASSERT_FALSE(config.ok()) << name;
    EXPECT_THAT(config.status().message(), HasSubstr("name: must be at most 256 bytes"));
  }
  for (const std::string& name :
       {std::string(256, 'a'), std::string("nightly \xc3\xa9t\xc3\xa9 \xe2\x9c\x93")}) {
    v1::JobSpec spec;
    spec.set_name(name);
    EXPECT_TRUE(job::Validated(spec).ok()) << name;
  }
}

// Duplicate keys, an empty document and numbers that are not finite are refused with the
// line they are on.
TEST(JobSpecYaml, DuplicateKeysEmptyDocumentsAndNonFiniteNumbersNameTheLine) {
  absl::StatusOr<v1::JobSpec> dup = JobSpecFromYaml("steps: 3\nmodel: {name: gpt}\nsteps: 4\n");
  ASSERT_FALSE(dup.ok());
  EXPECT_THAT(dup.status().message(), HasSubstr("steps (line 3): duplicate key"));
  absl::StatusOr<v1::JobSpec> nested = JobSpecFromYaml("model:\n  d_model: 8\n  d_model: 16\n");
  ASSERT_FALSE(nested.ok());
  EXPECT_THAT(nested.status().message(), HasSubstr("model.d_model (line 3): duplicate key"));
  // A key that is a list or a mapping (found by the fuzzer: the reader once threw).
  for (const char* odd : {"steps: 3\n? [a, b]\n: 1\n", "model:\n  {x: 1}: 2\n"}) {
    absl::StatusOr<v1::JobSpec> spec = JobSpecFromYaml(odd);
    ASSERT_FALSE(spec.ok()) << odd;
    EXPECT_THAT(spec.status().message(), HasSubstr("a key must be a plain name")) << odd;
  }
  for (const char* empty : {"", "\n# only a comment\n", "---\n"}) {
    absl::StatusOr<v1::JobSpec> spec = JobSpecFromYaml(empty);
    ASSERT_FALSE(spec.ok()) << "'" << empty << "'";
    EXPECT_THAT(spec.status().message(), HasSubstr("the job file is empty"));
  }
  absl::StatusOr<v1::JobSpec> inf = JobSpecFromYaml("steps: 3\noptimizer:\n  lr: .inf\n");
  ASSERT_FALSE(inf.ok());
  EXPECT_THAT(inf.status().message(), HasSubstr("optimizer.lr (line 3): expected a finite number"));
}

}  // namespace
}  // namespace pipetrain::jobspec

namespace pipetrain::jobspec {
namespace {

// On GPUs (device: cuda) a pipeline runs what it runs on CPUs: clipping, tied embeddings
// across ranks, the schedules with chunks, evaluation under 2BW and PipeDream and the step
// commit all go over the transport's group collectives and per-boundary links, so none is
// refused (the refusal texts named the NCCL transport's links). The negative control: the
// same checks still refuse what is wrong on cuda as on cpu.
TEST(JobSpec, DeviceCudaRefusesNothingThePipelineRunsOnCpus) {
  const std::vector<std::string> cases = {
      "stages: 4\noptimizer: {clip_grad_norm: 1}\n",
      "stages: 4\nmodel: {tie_embeddings: true}\n",
      "stages: 4\nreplicas: 2\n",  // with the step commit (below)
      "stages: 2\nschedule: interleaved\nvirtual_stages: 2\nmicrobatches: 4\n",
      "stages: 2\nschedule: zbv\nmicrobatches: 4\n",
      "stages: 2\nschedule: dualpipev\nmicrobatches: 4\n",
      "stages: 4\nschedule: 2bw\neval: {every: 2, split: 0.1}\n",
      "stages: 4\nschedule: pipedream\neval: {every: 2, split: 0.1}\n",
  };
  for (const std::string& yaml : cases) {
    for (const char* device : {"cpu", "cuda"}) {
      SCOPED_TRACE(yaml + "device: " + device);
      absl::StatusOr<v1::JobSpec> spec = JobSpecFromYaml(yaml + "device: " + device + "\n");
      ASSERT_TRUE(spec.ok()) << spec.status();
      absl::StatusOr<job::JobSpec> c = job::Validated(*spec);
      ASSERT_TRUE(c.ok()) << c.status();
      const absl::Status valid = job::ValidateJob(*c);
      EXPECT_TRUE(valid.ok()) << valid;
      if (c->replicas() > 1) {
        EXPECT_EQ(job::CommitStepsRefusal(*c), "");
      }
    }
  }
  absl::StatusOr<v1::JobSpec> wrong =
      JobSpecFromYaml("stages: 4\nschedule: 1f1b\nvertical_sync: true\ndevice: cuda\n");
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  absl::StatusOr<job::JobSpec> c = job::Validated(*wrong);  // validated on the way
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("vertical_sync"));
}

}  // namespace
}  // namespace pipetrain::jobspec
