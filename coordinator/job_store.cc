#include "coordinator/job_store.h"

#include <sqlite3.h>

#include <mutex>

#include "absl/strings/str_cat.h"

namespace pipetrain::coordinator {
namespace {

// A prepared statement, finalized on scope exit.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) { status_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Statement() { sqlite3_finalize(stmt_); }
  bool ok() const { return status_ == SQLITE_OK; }
  sqlite3_stmt* get() { return stmt_; }
  void Bind(int i, const std::string& s) {
    sqlite3_bind_blob(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  std::string Blob(int col) {
    const void* p = sqlite3_column_blob(stmt_, col);
    return p ? std::string(static_cast<const char*>(p), sqlite3_column_bytes(stmt_, col))
             : std::string();
  }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int status_;
};

absl::Status Error(sqlite3* db, const std::string& what) {
  return absl::InternalError(absl::StrCat("job store: ", what, ": ", sqlite3_errmsg(db)));
}

class SqliteJobStore : public JobStore {
 public:
  explicit SqliteJobStore(sqlite3* db) : db_(db) {}
  ~SqliteJobStore() override;
  absl::Status PutJob(const std::string& id, int64_t order, const std::string& job) override;
  absl::StatusOr<std::vector<StoredJob>> LoadJobs() override;
  absl::StatusOr<int64_t> AppendEvent(const std::string& job_id, int64_t unix_ms,
                                      const std::string& text) override;
  absl::StatusOr<std::vector<StoredEvent>> Events(const std::string& job_id,
                                                  int64_t after_seq) override;
  absl::StatusOr<int64_t> Increment(const std::string& name) override;
  absl::Status Exec(const char* sql);

 private:
  std::mutex mu_;
  sqlite3* db_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteJobStore(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    std::string why = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("cannot open the job store ", path, ": ", why));
  }
  std::unique_ptr<SqliteJobStore> store(new SqliteJobStore(db));
  sqlite3_busy_timeout(db, 5000);
  for (const char* sql : {
           "PRAGMA journal_mode=WAL",
           "PRAGMA synchronous=FULL",
           "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, ord INTEGER NOT NULL, "
           "job BLOB NOT NULL)",
           "CREATE TABLE IF NOT EXISTS events (job_id TEXT NOT NULL, seq INTEGER NOT NULL, "
           "unix_ms INTEGER NOT NULL, text TEXT NOT NULL, PRIMARY KEY (job_id, seq))",
           "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
       }) {
    if (absl::Status s = store->Exec(sql); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("job store ", path, ": ", s.message()));
    }
  }
  return std::unique_ptr<JobStore>(std::move(store));
}

SqliteJobStore::~SqliteJobStore() { sqlite3_close(db_); }

absl::Status SqliteJobStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string why = err ? err : "unknown error";
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat(sql, ": ", why));
  }
  return absl::OkStatus();
}

absl::Status SqliteJobStore::PutJob(const std::string& id, int64_t order, const std::string& job) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement st(db_, "INSERT OR REPLACE INTO jobs (id, ord, job) VALUES (?1, ?2, ?3)");
  if (!st.ok()) return Error(db_, "preparing a job write");
  st.Bind(1, id);
  st.Bind(2, order);
  st.Bind(3, job);
  if (sqlite3_step(st.get()) != SQLITE_DONE) return Error(db_, absl::StrCat("writing job ", id));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StoredJob>> SqliteJobStore::LoadJobs() {
  std::lock_guard<std::mutex> lock(mu_);
  Statement st(db_, "SELECT id, job FROM jobs ORDER BY ord");
  if (!st.ok()) return Error(db_, "preparing the job list");
  std::vector<StoredJob> jobs;
  int rc;
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) jobs.push_back({st.Blob(0), st.Blob(1)});
  if (rc != SQLITE_DONE) return Error(db_, "reading jobs");
  return jobs;
}

absl::StatusOr<int64_t> SqliteJobStore::AppendEvent(const std::string& job_id, int64_t unix_ms,
                                              const std::string& text) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement st(db_,
               "INSERT INTO events (job_id, seq, unix_ms, text) VALUES (?1, "
               "(SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE job_id = ?1), ?2, ?3) "
               "RETURNING seq");
  if (!st.ok()) return Error(db_, "preparing an event write");
  st.Bind(1, job_id);
  st.Bind(2, unix_ms);
  st.Bind(3, text);
  if (sqlite3_step(st.get()) != SQLITE_ROW) return Error(db_, "writing an event");
  const int64_t seq = sqlite3_column_int64(st.get(), 0);
  if (sqlite3_step(st.get()) != SQLITE_DONE) return Error(db_, "writing an event");
  return seq;
}

absl::StatusOr<int64_t> SqliteJobStore::Increment(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement st(db_,
               "INSERT INTO counters (name, value) VALUES (?1, 1) "
               "ON CONFLICT (name) DO UPDATE SET value = value + 1 RETURNING value");
  if (!st.ok()) return Error(db_, "preparing a counter update");
  st.Bind(1, name);
  if (sqlite3_step(st.get()) != SQLITE_ROW) return Error(db_, "updating a counter");
  const int64_t value = sqlite3_column_int64(st.get(), 0);
  if (sqlite3_step(st.get()) != SQLITE_DONE) return Error(db_, "updating a counter");
  return value;
}

absl::StatusOr<std::vector<StoredEvent>> SqliteJobStore::Events(const std::string& job_id,
                                                          int64_t after_seq) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement st(db_,
               "SELECT seq, unix_ms, text FROM events WHERE job_id = ?1 AND seq > ?2 "
               "ORDER BY seq");
  if (!st.ok()) return Error(db_, "preparing the event list");
  st.Bind(1, job_id);
  st.Bind(2, after_seq);
  std::vector<StoredEvent> events;
  int rc;
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
    events.push_back({sqlite3_column_int64(st.get(), 0), sqlite3_column_int64(st.get(), 1),
                      st.Blob(2)});
  }
  if (rc != SQLITE_DONE) return Error(db_, "reading events");
  return events;
}

}  // namespace pipetrain::coordinator
