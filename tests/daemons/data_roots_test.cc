// Where a worker lets a job's files come from and go to (worker/data_roots.h), with real
// daemons: with --data-root, a job reads only regular files under the roots (a symlink
// leading out, a FIFO refused naming the field) and writes and resumes only there or under
// the worker's own checkpoints/; without it, under checkpoints/ alone.
#include <sys/stat.h>

#include <chrono>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/daemons/local_cluster.h"

namespace {

namespace fs = std::filesystem;
using ::pipetrain::test::LocalCluster;
using ::pipetrain::test::Result;
using ::testing::HasSubstr;
using ::testing::Not;

// A two-stage GPT job of two steps, with `extra` YAML lines.
std::string Job(const std::string& extra) {
  return "model: {name: gpt, d_model: 16, n_heads: 2, n_layers: 2}\nschedule: 1f1b\n"
         "stages: 2\nmicrobatches: 2\nmicrobatch_size: 2\nsteps: 2\n" +
         extra;
}

class DataRootsTest : public ::pipetrain::test::DaemonTest {};

}  // namespace

namespace {

// A worker reads a job's files only under its --data-root directories, symlinks resolved,
// regular files only: a file elsewhere, a symlink leading out, a FIFO (which would block the
// stage) fail the job naming the field; a file inside runs.
TEST_F(DataRootsTest, WorkersReadJobFilesOnlyUnderTheirDataRoots) {
  const fs::path root = dir_ / "data";
  fs::create_directories(root);
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  const fs::path inside = Write("data/corpus.txt", text);
  const fs::path outside = Write("corpus-outside.txt", text);
  fs::create_symlink(outside, root / "link-out.txt");
  const fs::path fifo = root / "fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  pipetrain::test::ClusterOptions options;
  options.workers = 2;
  options.worker_args = {"--data-root", root.string()};
  LocalCluster cluster(dir_, options);
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2));
  auto job = [&](const fs::path& data) {
    return Job("data: {kind: bytes, path: " + data.string() + ", seq_len: 8}\n");
  };
  const struct {
    fs::path data;
    std::string why;
  } refused[] = {
      {outside,
       "is outside the directories this worker reads jobs' files from (" + root.string() + ")"},
      {root / "link-out.txt", "is outside the directories"},
      {fifo, "is not a regular file"},
  };
  int n = 0;
  for (const auto& r : refused) {
    SCOPED_TRACE(r.data.string());
    Result result =
        cluster.Cli("submit " + Write("job" + std::to_string(n++) + ".yaml", job(r.data)).string() +
                    " --follow");
    EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
    EXPECT_THAT(result.out + result.err, HasSubstr("data.path: " + r.data.string()));
    EXPECT_THAT(result.out + result.err, HasSubstr(r.why));
    EXPECT_TRUE(cluster.WaitForIdleWorkers(2, std::chrono::seconds(10)));
  }
  Result ok = cluster.Cli("submit " + Write("ok.yaml", job(inside)).string() + " --follow");
  EXPECT_EQ(ok.exit_code, 0) << ok.out << ok.err;
  // With data roots, where a job writes and resumes from is confined too: under the roots
  // or the worker's own checkpoints/ (the coordinator's default checkpoint.dir).
  const fs::path outside_dir = dir_ / "elsewhere";
  const struct {
    std::string key, value, field;
  } confined[] = {
      {"checkpoint", "{dir: " + outside_dir.string() + ", every: 1}", "checkpoint.dir"},
      {"weights_dir", outside_dir.string(), "weights_dir"},
      {"resume_from", (dir_ / "ckpt-outside").string(), "resume_from"},
  };
  for (const auto& c : confined) {
    SCOPED_TRACE(c.field);
    std::string spec = job(inside) + c.key + ": " + c.value + "\n";
    Result result = cluster.Cli(
        "submit " + Write("confined" + std::to_string(n++) + ".yaml", spec).string() + " --follow");
    EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
    EXPECT_THAT(result.out + result.err,
                HasSubstr(c.field + ": " + c.value.substr(c.value.find('/')).substr(0, 20)));
    EXPECT_THAT(result.out + result.err, HasSubstr("is outside the directories this worker"));
    EXPECT_TRUE(cluster.WaitForIdleWorkers(2, std::chrono::seconds(10)));
  }
  EXPECT_FALSE(fs::exists(outside_dir));
  Result in_root = cluster.Cli("submit " +
                               Write("in-root.yaml", job(inside) + "checkpoint: {dir: " +
                                                         (root / "ckpt").string() + ", every: 1}\n")
                                   .string() +
                               " --follow");
  EXPECT_EQ(in_root.exit_code, 0) << in_root.out << in_root.err;
  EXPECT_TRUE(fs::exists(root / "ckpt" / "latest"));
}

// A worker started without --data-root lets a job name no file but under its own
// checkpoints/ (what its help says): a resume_from, weights_dir or checkpoint.dir elsewhere,
// and any data file, fail the job naming the field, before anything is opened (a job could
// once learn the size of /etc/shadow through resume_from); a checkpoint policy with the
// coordinator's default directory (checkpoints/JOB-ID) runs. The negative control: the same
// resume_from on a worker with `--data-root /` gets past the check and fails on what it
// finds there instead.
TEST_F(DataRootsTest, AWorkerWithoutDataRootsLetsAJobNameNoFileButUnderItsCheckpoints) {
  pipetrain::test::ClusterOptions options;
  options.workers = 2;
  options.workers_read_anywhere = false;
  LocalCluster cluster(dir_, options);
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2));
  const fs::path elsewhere = dir_ / "elsewhere";
  const struct {
    std::string line, says;
  } refused[] = {
      {"resume_from: /etc",
       "resume_from: /etc is outside the directories this worker lets "
       "jobs write to and resume from ("},
      {"weights_dir: " + elsewhere.string(), "weights_dir: " + elsewhere.string()},
      {"checkpoint: {dir: " + elsewhere.string() + ", every: 1}",
       "checkpoint.dir: " + elsewhere.string()},
      {"data: {kind: bytes, path: /etc/hostname, seq_len: 8}",
       "data.path: /etc/hostname is outside the directories this worker reads jobs' files "
       "from (none: it was started without --data-root)"},
  };
  int n = 0;
  for (const auto& r : refused) {
    SCOPED_TRACE(r.line);
    Result result = cluster.Cli(
        "submit " + Write("refused" + std::to_string(n++) + ".yaml", Job(r.line + "\n")).string() +
        " --follow");
    EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
    EXPECT_THAT(result.out + result.err, HasSubstr(r.says));
    EXPECT_TRUE(cluster.WaitForIdleWorkers(2, std::chrono::seconds(10)));
  }
  EXPECT_FALSE(fs::exists(elsewhere));
  Result own = cluster.Cli("submit " + Write("own.yaml", Job("checkpoint: {every: 1}\n")).string() +
                           " --follow");
  EXPECT_EQ(own.exit_code, 0) << own.out << own.err;
  // Negative control: a worker reading anywhere takes /etc as a checkpoint to resume from.
  pipetrain::test::ClusterOptions anywhere;
  anywhere.workers = 2;
  fs::create_directories(dir_ / "anywhere");
  LocalCluster open_cluster(dir_ / "anywhere", anywhere);
  ASSERT_TRUE(open_cluster.WaitForIdleWorkers(2));
  Result opened = open_cluster.Cli(
      "submit " + Write("opened.yaml", Job("resume_from: /etc\n")).string() + " --follow");
  EXPECT_EQ(opened.exit_code, 1) << opened.out << opened.err;
  EXPECT_THAT(opened.out + opened.err, Not(HasSubstr("is outside the directories")));
}

}  // namespace
