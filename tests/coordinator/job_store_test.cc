// The SQLite job store on real files: it holds its database alone (a second opener is refused
// naming the holder), refuses a damaged or foreign database with a clear message instead of
// losing or hiding what it holds, and keeps every acknowledged write across a reopen.
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/job_store.h"

namespace pipetrain::coordinator {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class JobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("pipetrain_job_store_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    db_ = (dir_ / "jobs.db").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs `sql` on the file at `path` with SQLite itself (not the store).
  static void Sqlite(const std::string& path, const std::string& sql) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << err;
    sqlite3_free(err);
    sqlite3_close(db);
  }

  fs::path dir_;
  std::string db_;
};

TEST_F(JobStoreTest, ASecondOpenerIsRefusedNamingTheHolderUntilTheFirstCloses) {
  absl::StatusOr<std::unique_ptr<JobStore>> first = OpenSqliteJobStore(db_);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<JobStore>> second = OpenSqliteJobStore(db_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(),
              HasSubstr("is in use by pipetrain-coordinator pid " + std::to_string(getpid())));
  first->reset();
  EXPECT_TRUE(OpenSqliteJobStore(db_).ok());  // released with the first
}

TEST_F(JobStoreTest, AcknowledgedWritesSurviveAReopen) {
  {
    auto store = OpenSqliteJobStore(db_);
    ASSERT_TRUE(store.ok()) << store.status();
    for (int i = 0; i < 50; ++i) {
      ASSERT_TRUE((*store)->PutJob("job-" + std::to_string(i), i, std::string(500, 'j')).ok());
      ASSERT_TRUE((*store)->AppendEvent("job-" + std::to_string(i), i, "submitted").ok());
    }
  }
  auto store = OpenSqliteJobStore(db_);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), 50u);
  auto events = (*store)->Events("job-7", 0, 10);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].text, "submitted");
}

TEST_F(JobStoreTest, ADamagedDatabaseIsRefusedNotEmptied) {
  {
    auto store = OpenSqliteJobStore(db_);
    ASSERT_TRUE(store.ok()) << store.status();
    for (int i = 0; i < 200; ++i) {
      ASSERT_TRUE((*store)->PutJob("job-" + std::to_string(i), i, std::string(2000, 'j')).ok());
    }
  }
  Sqlite(db_, "PRAGMA wal_checkpoint(TRUNCATE)");  // every page in the main file
  // One page in the middle of the table, overwritten.
  const auto size = fs::file_size(db_);
  ASSERT_GT(size, 16u * 4096u);
  {
    std::fstream f(db_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2 / 4096 * 4096));
    const std::string garbage(4096, '\x5a');
    f.write(garbage.data(), garbage.size());
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store = OpenSqliteJobStore(db_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(store.status().message(), HasSubstr("is damaged"));
  EXPECT_THAT(store.status().message(), HasSubstr("will not run on it"));
}

TEST_F(JobStoreTest, AForeignDatabaseOrATableOfAnotherShapeIsRefused) {
  Sqlite(db_, "CREATE TABLE events (job_id TEXT, what TEXT)");
  absl::StatusOr<std::unique_ptr<JobStore>> store = OpenSqliteJobStore(db_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("table 'jobs' is missing"));

  const std::string other = (dir_ / "other.db").string();
  Sqlite(other, "PRAGMA application_id = 1234; CREATE TABLE t (x)");
  store = OpenSqliteJobStore(other);
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(store.status().message(),
              HasSubstr("is not a pipetrain job store (application_id 1234)"));

  const std::string newer = (dir_ / "newer.db").string();
  { ASSERT_TRUE(OpenSqliteJobStore(newer).ok()); }
  Sqlite(newer, "PRAGMA user_version = 9");
  store = OpenSqliteJobStore(newer);
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(store.status().message(), HasSubstr("has schema version 9"));

  const std::string shape = (dir_ / "shape.db").string();
  { ASSERT_TRUE(OpenSqliteJobStore(shape).ok()); }
  Sqlite(shape, "DROP TABLE events; CREATE TABLE events (job_id TEXT, seq INTEGER, text TEXT)");
  store = OpenSqliteJobStore(shape);
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(store.status().message(), HasSubstr("table 'events' has other columns"));
}

// A store written before the schema was marked (same tables, no application id) is taken
// and marked.
TEST_F(JobStoreTest, AnUnmarkedStoreOfTheSameShapeIsAdopted) {
  Sqlite(db_,
         "CREATE TABLE jobs (id TEXT PRIMARY KEY, ord INTEGER NOT NULL, job BLOB NOT NULL);"
         "CREATE TABLE events (job_id TEXT NOT NULL, seq INTEGER NOT NULL, unix_ms INTEGER NOT "
         "NULL, text TEXT NOT NULL, PRIMARY KEY (job_id, seq));"
         "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);"
         "INSERT INTO jobs VALUES ('job-0001', 1, x'00')");
  auto store = OpenSqliteJobStore(db_);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), 1u);
}

// A store of schema version 2 (a steps table without grad_norm) takes the column and keeps
// its rows; their gradient norm is absent, a new row's is kept. (The store writes a job id as
// a blob.)
TEST_F(JobStoreTest, AVersionTwoStoreGainsTheGradNormColumnAndKeepsItsSteps) {
  Sqlite(db_,
         "CREATE TABLE jobs (id TEXT PRIMARY KEY, ord INTEGER NOT NULL, job BLOB NOT NULL);"
         "CREATE TABLE events (job_id TEXT NOT NULL, seq INTEGER NOT NULL, unix_ms INTEGER NOT "
         "NULL, text TEXT NOT NULL, PRIMARY KEY (job_id, seq));"
         "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);"
         "CREATE TABLE steps (job_id TEXT NOT NULL, step INTEGER NOT NULL, generation INTEGER "
         "NOT NULL, loss REAL, unix_ms INTEGER NOT NULL, PRIMARY KEY (job_id, step));"
         "INSERT INTO steps VALUES (CAST('job-0001' AS BLOB), 0, 1, 2.5, 1000);"
         "PRAGMA application_id = 1347701331; PRAGMA user_version = 2");
  auto store = OpenSqliteJobStore(db_);
  ASSERT_TRUE(store.ok()) << store.status();
  StoredStep next;
  next.step = 1;
  next.generation = 1;
  next.has_loss = true;
  next.loss = 2.25;
  next.has_grad_norm = true;
  next.grad_norm = 0.75;
  ASSERT_TRUE((*store)->PutSteps("job-0001", {next}).ok());
  auto steps = (*store)->Steps("job-0001", -1, 10);
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 2u);
  EXPECT_EQ((*steps)[0].loss, 2.5);
  EXPECT_FALSE((*steps)[0].has_grad_norm);
  EXPECT_TRUE((*steps)[1].has_grad_norm);
  EXPECT_EQ((*steps)[1].grad_norm, 0.75);
  store->reset();  // marked version 3: opened again as it is
  auto again = OpenSqliteJobStore(db_);
  ASSERT_TRUE(again.ok()) << again.status();
  auto kept = (*again)->Steps("job-0001", -1, 10);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->size(), 2u);
}

}  // namespace
}  // namespace pipetrain::coordinator
