// What the coordinator committed of a job, read from its SQLite store as it is on disk: the
// daemon and multi-host tests check that every step is committed exactly once, by
// generations that only increase. Header-only; gtest assertions.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include <gtest/gtest.h>

namespace pipetrain::test {

// The steps the coordinator committed for `job_id`: step -> generation, read from its store.
inline std::map<int64_t, int> CommittedSteps(const std::filesystem::path& db,
                                             const std::string& job_id) {
  std::map<int64_t, int> steps;
  sqlite3* handle = nullptr;
  if (sqlite3_open_v2(db.c_str(), &handle, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    ADD_FAILURE() << "cannot open " << db;
    sqlite3_close(handle);
    return steps;
  }
  sqlite3_busy_timeout(handle, 5000);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(handle, "SELECT step, generation FROM steps WHERE job_id = ?1", -1, &st,
                     nullptr);
  sqlite3_bind_blob(st, 1, job_id.data(), static_cast<int>(job_id.size()), SQLITE_TRANSIENT);
  while (sqlite3_step(st) == SQLITE_ROW) {
    const auto [it, fresh] =
        steps.emplace(sqlite3_column_int64(st, 0), static_cast<int>(sqlite3_column_int64(st, 1)));
    EXPECT_TRUE(fresh) << "step " << it->first << " committed twice";
  }
  sqlite3_finalize(st);
  sqlite3_close(handle);
  return steps;
}

// Every step 0..steps-1 committed once, by generations that only increase with the step.
inline void ExpectEveryStepOnceInIncreasingGenerations(const std::map<int64_t, int>& steps,
                                                       int64_t count, int last_generation) {
  ASSERT_EQ(static_cast<int64_t>(steps.size()), count);
  EXPECT_EQ(steps.begin()->first, 0);
  EXPECT_EQ(steps.rbegin()->first, count - 1);
  int previous = 1;
  for (const auto& [step, generation] : steps) {
    EXPECT_GE(generation, previous) << "step " << step;
    previous = generation;
  }
  EXPECT_EQ(previous, last_generation);
}

}  // namespace pipetrain::test
