// Every job file in examples/ is accepted by the coordinator as `pipetrain submit` sends it:
// the one YAML reader (jobspec/spec_yaml) and the coordinator's complete validation
// (job::ValidateJob: every field, and the partition against the model's layers).
// And one job submitted from a file and from flags is stored as exactly that job. The
// coordinator has no workers, so each job is only queued; nothing trains. That
// `pipetrain run` takes every example too is cli_test's EveryExampleJobRuns.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <google/protobuf/util/json_util.h>

#include "jobspec/spec_yaml.h"
#include "runtime/job/job_spec.h"
#include "tests/daemons/local_cluster.h"
#include "tests/jobspec/one_job.h"

namespace pipetrain::test {
namespace {

using ::testing::HasSubstr;

class ExamplesSubmitTest : public DaemonTest {};

TEST_F(ExamplesSubmitTest, EveryExampleIsAcceptedByTheCoordinator) {
  LocalCluster cluster(dir_, 0);
  ASSERT_FALSE(cluster.address().empty());
  std::vector<fs::path> examples;
  for (const auto& entry : fs::directory_iterator(fs::path(PIPETRAIN_SOURCE_DIR) / "examples")) {
    if (entry.path().extension() == ".yaml") examples.push_back(entry.path());
  }
  std::sort(examples.begin(), examples.end());
  ASSERT_GE(examples.size(), 6u);
  for (const fs::path& example : examples) {
    SCOPED_TRACE(example.string());
    Result r = cluster.Cli("submit " + example.string() + " -o json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto job = nlohmann::json::parse(r.out);
    EXPECT_EQ(job.at("state"), "JOB_STATE_QUEUED");  // no workers: validated, then queued
    EXPECT_GE(job.at("stages").get<int>(), 1);
    EXPECT_GE(job.value("replicas", 0), 1);
    EXPECT_GE(job.value("steps", 0), 1);
  }
  // Each waits for workers; `list` has them all.
  Result list = cluster.Cli("list -o json");
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(JsonLines(list.out).size(), examples.size());
  EXPECT_THAT(list.out, HasSubstr("JOB_STATE_QUEUED"));
}

// The check above is a real one: a spec the coordinator refuses fails the same command.
TEST_F(ExamplesSubmitTest, AnInvalidJobFileIsRefused) {
  LocalCluster cluster(dir_, 0);
  ASSERT_FALSE(cluster.address().empty());
  const fs::path bad =
      Write("bad.yaml", "model: {name: gpt, n_layers: 4}\nstages: [[0, 3], [3, 9]]\n");
  Result r = cluster.Cli("submit " + bad.string() + " -o json");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("stages"));
}

// `submit` takes the job as `run` does, from a file or from flags: the spec the coordinator
// stores (and assigns to workers) converts to the job the file describes, every field, but
// for the checkpoint directory of its own a job without one is given.
TEST_F(ExamplesSubmitTest, OneJobFromAFileOrFromFlagsIsStoredAsThatJob) {
  LocalCluster cluster(dir_, 0);
  ASSERT_FALSE(cluster.address().empty());
  const std::string weights = " --weights-dir /tmp/one-job-weights";
  absl::StatusOr<v1::JobSpec> spec =
      jobspec::JobSpecFromYaml(std::string(kOneJobYaml) + "weights_dir: /tmp/one-job-weights\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<job::JobSpec> expected = job::Validated(*spec);
  ASSERT_TRUE(expected.ok()) << expected.status();
  const fs::path file = Write("one.yaml", kOneJobYaml);
  for (const std::string& submitted :
       {file.string() + weights, std::string(kOneJobFlags) + weights}) {
    SCOPED_TRACE(submitted);
    Result r = cluster.Cli("submit -o json " + submitted);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string id = nlohmann::json::parse(r.out).at("id");
    Result status = cluster.Cli("status -o json " + id);
    ASSERT_EQ(status.exit_code, 0) << status.err;
    v1::Job stored;
    const std::string spec_json = nlohmann::json::parse(status.out).at("spec").dump();
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(spec_json, stored.mutable_spec()).ok());
    absl::StatusOr<job::JobSpec> config = job::Validated(stored.spec());
    ASSERT_TRUE(config.ok()) << config.status();
    job::JobSpec with_own_dir = *expected;
    with_own_dir.mutable_checkpoint()->set_dir("checkpoints/" + id);
    EXPECT_EQ(job::JobToJson(*config), job::JobToJson(with_own_dir));
  }
  // A bad flag value is refused by the CLI, naming the flag and the field; nothing is sent.
  Result bad = cluster.Cli("submit --steps many");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--steps (steps): expected an integer, got 'many'"));
}

}  // namespace
}  // namespace pipetrain::test
