// Every job file in examples/ is accepted by the coordinator as `pipetrain submit` sends it:
// the CLI's YAML reading (client/spec_yaml) and the coordinator's complete validation
// (proto/job_spec: every field, and the partition against the model's layers). The
// coordinator has no workers, so each job is only queued; nothing trains. That
// `pipetrain run` takes every example too is cli_test's EveryExampleJobRuns.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/daemons/local_cluster.h"

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
  const fs::path bad = Write("bad.yaml", "model: {name: gpt, n_layers: 4}\nstages: [[0, 3], [3, 9]]\n");
  Result r = cluster.Cli("submit " + bad.string() + " -o json");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("stages"));
}

}  // namespace
}  // namespace pipetrain::test
