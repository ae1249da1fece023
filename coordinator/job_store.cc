#include "coordinator/job_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"

namespace pipetrain::coordinator {
namespace {

// A prepared statement, finalized on scope exit.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) {
    status_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
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
  SqliteJobStore(sqlite3* db, int lock_fd) : db_(db), lock_fd_(lock_fd) {}
  ~SqliteJobStore() override;
  absl::Status PutJob(const std::string& id, int64_t order, const std::string& job) override;
  absl::StatusOr<std::vector<StoredJob>> LoadJobs() override;
  absl::StatusOr<int64_t> AppendEvent(const std::string& job_id, int64_t unix_ms,
                                      const std::string& text) override;
  absl::StatusOr<std::vector<StoredEvent>> Events(const std::string& job_id, int64_t after_seq,
                                                  int64_t limit) override;
  absl::StatusOr<int64_t> Increment(const std::string& name, int64_t by) override;
  absl::Status PutSteps(const std::string& job_id, const std::vector<StoredStep>& steps) override;
  absl::StatusOr<std::vector<StoredStep>> Steps(const std::string& job_id, int64_t after_step,
                                                int64_t limit) override;
  absl::Status Exec(const char* sql);
  // The single value `sql` yields (a PRAGMA's), as text.
  absl::StatusOr<std::string> Value(const char* sql);
  // "name type notnull pk" of each column of `table`, in order; empty if there is no table.
  std::vector<std::string> Columns(const std::string& table);

 private:
  std::mutex mu_;
  sqlite3* db_;
  int lock_fd_;  // held (flock) while the store is open: one coordinator per database
};

// Marks a database as a pipetrain job store ("PTJS"), and its schema's version.
constexpr int64_t kApplicationId = 0x50544a53;
// 2: the steps table; 3: its grad_norm, eval_loss and eval_accuracy columns.
constexpr int64_t kSchemaVersion = 3;

struct Table {
  const char* name;
  const char* create;
  // As PRAGMA table_info describes the table `create` makes: "name type notnull pk".
  std::vector<std::string> columns;
};
const Table kTables[] = {
    {"jobs",
     "CREATE TABLE jobs (id TEXT PRIMARY KEY, ord INTEGER NOT NULL, job BLOB NOT NULL)",
     {"id TEXT 0 1", "ord INTEGER 1 0", "job BLOB 1 0"}},
    {"events",
     "CREATE TABLE events (job_id TEXT NOT NULL, seq INTEGER NOT NULL, "
     "unix_ms INTEGER NOT NULL, text TEXT NOT NULL, PRIMARY KEY (job_id, seq))",
     {"job_id TEXT 1 1", "seq INTEGER 1 2", "unix_ms INTEGER 1 0", "text TEXT 1 0"}},
    {"counters",
     "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
     {"name TEXT 0 1", "value INTEGER 1 0"}},
    {"steps",
     "CREATE TABLE steps (job_id TEXT NOT NULL, step INTEGER NOT NULL, "
     "generation INTEGER NOT NULL, loss REAL, unix_ms INTEGER NOT NULL, grad_norm REAL, "
     "eval_loss REAL, eval_accuracy REAL, PRIMARY KEY (job_id, step))",
     {"job_id TEXT 1 1", "step INTEGER 1 2", "generation INTEGER 1 0", "loss REAL 0 0",
      "unix_ms INTEGER 1 0", "grad_norm REAL 0 0", "eval_loss REAL 0 0", "eval_accuracy REAL 0 0"}},
};

// Takes `<path>.lock` (flock, released when the process ends however it ends) and writes
// who holds it; FailedPrecondition naming the holder if another process does.
absl::StatusOr<int> LockStore(const std::string& path) {
  const std::string lock_path = path + ".lock";
  const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open the lock file ", lock_path, ": ", std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char holder[256] = {0};
    const ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
    close(fd);
    std::string who = n > 0 ? std::string(holder, n) : "another process";
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    return absl::FailedPreconditionError(
        absl::StrCat("the job store ", path, " is in use by ", who, " (lock ", lock_path,
                     "): one coordinator per database; stop that one or give another --db"));
  }
  char host[128] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string me = absl::StrCat("pipetrain-coordinator pid ", getpid(), " on ", host, "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, me.data(), me.size(), 0) < 0) {
    // The lock holds anyway; only the holder's name for others is missing.
  }
  return fd;
}

const std::string kSetIds = absl::StrCat("PRAGMA application_id = ", kApplicationId,
                                         "; PRAGMA user_version = ", kSchemaVersion);

// Creates the tables of a new database, or checks that an existing one is this store, of
// this schema, and undamaged.
absl::Status CheckOrCreateSchema(SqliteJobStore& store, const std::string& path) {
  PT_ASSIGN_OR_RETURN(std::string check, store.Value("PRAGMA quick_check"));
  if (check != "ok") {
    return absl::DataLossError(absl::StrCat(
        "the job store ", path, " is damaged (", check.substr(0, 200),
        "): the coordinator will not run on it; restore it from a backup or move it away"));
  }
  PT_ASSIGN_OR_RETURN(std::string app, store.Value("PRAGMA application_id"));
  PT_ASSIGN_OR_RETURN(std::string version, store.Value("PRAGMA user_version"));
  PT_ASSIGN_OR_RETURN(std::string tables,
                      store.Value("SELECT count(*) FROM sqlite_master WHERE type = 'table'"));
  if (tables == "0") {  // new: created whole, in one transaction
    PT_RETURN_IF_ERROR(store.Exec("BEGIN IMMEDIATE"));
    for (const Table& t : kTables) PT_RETURN_IF_ERROR(store.Exec(t.create));
    PT_RETURN_IF_ERROR(store.Exec(kSetIds.c_str()));
    return store.Exec("COMMIT");
  }
  const bool ours = app == absl::StrCat(kApplicationId);
  if (!ours && app != "0") {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job store ", path, " is not a pipetrain job store (application_id ", app, ")"));
  }
  // Version 1 (and a store from before the ids were set) had no steps table: it is added,
  // nothing else changes.
  if ((ours && version == "1") || (!ours && store.Columns("steps").empty())) {
    PT_RETURN_IF_ERROR(store.Exec("BEGIN IMMEDIATE"));
    PT_RETURN_IF_ERROR(store.Exec(kTables[3].create));
    if (ours) PT_RETURN_IF_ERROR(store.Exec(kSetIds.c_str()));
    PT_RETURN_IF_ERROR(store.Exec("COMMIT"));
    if (ours) version = absl::StrCat(kSchemaVersion);
  }
  // Version 2 had no grad_norm, eval_loss and eval_accuracy columns: they are added (NULL in
  // the rows before), nothing else changes.
  if (ours && version == "2") {
    PT_RETURN_IF_ERROR(store.Exec("BEGIN IMMEDIATE"));
    for (const char* column : {"grad_norm", "eval_loss", "eval_accuracy"}) {
      PT_RETURN_IF_ERROR(
          store.Exec(absl::StrCat("ALTER TABLE steps ADD COLUMN ", column, " REAL").c_str()));
    }
    PT_RETURN_IF_ERROR(store.Exec(kSetIds.c_str()));
    PT_RETURN_IF_ERROR(store.Exec("COMMIT"));
    version = absl::StrCat(kSchemaVersion);
  }
  if (ours && version != absl::StrCat(kSchemaVersion)) {
    return absl::FailedPreconditionError(absl::StrCat("the job store ", path,
                                                      " has schema version ", version,
                                                      "; this coordinator "
                                                      "knows version ",
                                                      kSchemaVersion));
  }
  // Every table as this version makes it (also for a store from before the id was set).
  for (const Table& t : kTables) {
    const std::vector<std::string> have = store.Columns(t.name);
    if (have != t.columns) {
      return absl::FailedPreconditionError(
          absl::StrCat("the job store ", path, " is not a pipetrain job store of schema version ",
                       kSchemaVersion, ": table '", t.name, "' ",
                       have.empty() ? "is missing" : "has other columns"));
    }
  }
  return ours ? absl::OkStatus() : store.Exec(kSetIds.c_str());
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteJobStore(const std::string& path) {
  PT_ASSIGN_OR_RETURN(const int lock_fd, LockStore(path));
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    std::string why = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    close(lock_fd);
    return absl::UnavailableError(absl::StrCat("cannot open the job store ", path, ": ", why));
  }
  std::unique_ptr<SqliteJobStore> store(new SqliteJobStore(db, lock_fd));
  sqlite3_busy_timeout(db, 5000);
  for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL"}) {
    if (absl::Status s = store->Exec(sql); !s.ok()) {
      if (absl::StrContains(s.message(), "malformed") ||
          absl::StrContains(s.message(), "not a database")) {
        return absl::DataLossError(absl::StrCat("the job store ", path, " is damaged (",
                                                s.message(),
                                                "): the coordinator will not run "
                                                "on it; restore it from a backup or move it away"));
      }
      return absl::UnavailableError(absl::StrCat("job store ", path, ": ", s.message()));
    }
  }
  if (absl::Status s = CheckOrCreateSchema(*store, path); !s.ok()) {
    if (s.code() == absl::StatusCode::kInternal) {  // an SQLite error while checking
      return absl::DataLossError(absl::StrCat("the job store ", path, " cannot be read (",
                                              s.message(),
                                              "): the coordinator will not run on "
                                              "it; restore it from a backup or move it away"));
    }
    return s;
  }
  return std::unique_ptr<JobStore>(std::move(store));
}

SqliteJobStore::~SqliteJobStore() {
  sqlite3_close(db_);
  if (lock_fd_ >= 0) close(lock_fd_);
}

absl::StatusOr<std::string> SqliteJobStore::Value(const char* sql) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement st(db_, sql);
  if (!st.ok()) return Error(db_, sql);
  const int rc = sqlite3_step(st.get());
  if (rc != SQLITE_ROW) return Error(db_, sql);
  const unsigned char* text = sqlite3_column_text(st.get(), 0);
  return text ? std::string(reinterpret_cast<const char*>(text)) : std::string();
}

std::vector<std::string> SqliteJobStore::Columns(const std::string& table) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> columns;
  Statement st(db_, absl::StrCat("PRAGMA table_info(", table, ")").c_str());
  if (!st.ok()) return columns;
  while (sqlite3_step(st.get()) == SQLITE_ROW) {
    auto text = [&](int col) {
      const unsigned char* t = sqlite3_column_text(st.get(), col);
      return t ? std::string(reinterpret_cast<const char*>(t)) : std::string();
    };
    columns.push_back(absl::StrCat(text(1), " ", text(2), " ", text(3), " ", text(5)));
  }
  return columns;
}

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

absl::Status SqliteJobStore::PutSteps(const std::string& job_id,
                                      const std::vector<StoredStep>& steps) {
  if (steps.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  if (sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return Error(db_, "starting a step write");
  }
  auto rollback = [this](absl::Status s) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return s;
  };
  Statement st(db_,
               "INSERT OR REPLACE INTO steps (job_id, step, generation, loss, unix_ms, "
               "grad_norm, eval_loss, eval_accuracy) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
  if (!st.ok()) return rollback(Error(db_, "preparing a step write"));
  for (const StoredStep& s : steps) {
    sqlite3_reset(st.get());
    st.Bind(1, job_id);
    st.Bind(2, s.step);
    st.Bind(3, int64_t{s.generation});
    if (s.has_loss) {
      sqlite3_bind_double(st.get(), 4, s.loss);
    } else {
      sqlite3_bind_null(st.get(), 4);
    }
    st.Bind(5, s.unix_ms);
    const auto bind_optional = [&](int i, bool has, double v) {
      if (has) {
        sqlite3_bind_double(st.get(), i, v);
      } else {
        sqlite3_bind_null(st.get(), i);
      }
    };
    bind_optional(6, s.has_grad_norm, s.grad_norm);
    bind_optional(7, s.has_eval, s.eval_loss);
    bind_optional(8, s.has_eval, s.eval_accuracy);
    if (sqlite3_step(st.get()) != SQLITE_DONE) {
      return rollback(Error(db_, absl::StrCat("writing step ", s.step, " of ", job_id)));
    }
  }
  if (sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return rollback(Error(db_, "committing a step write"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StoredStep>> SqliteJobStore::Steps(const std::string& job_id,
                                                              int64_t after_step, int64_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement st(db_,
               "SELECT step, generation, loss, unix_ms, grad_norm, eval_loss, eval_accuracy "
               "FROM steps WHERE job_id = ?1 AND step > ?2 ORDER BY step LIMIT ?3");
  if (!st.ok()) return Error(db_, "preparing the step list");
  st.Bind(1, job_id);
  st.Bind(2, after_step);
  st.Bind(3, limit);
  std::vector<StoredStep> steps;
  int rc;
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
    StoredStep s;
    s.step = sqlite3_column_int64(st.get(), 0);
    s.generation = static_cast<int32_t>(sqlite3_column_int64(st.get(), 1));
    s.has_loss = sqlite3_column_type(st.get(), 2) != SQLITE_NULL;
    if (s.has_loss) s.loss = sqlite3_column_double(st.get(), 2);
    s.unix_ms = sqlite3_column_int64(st.get(), 3);
    s.has_grad_norm = sqlite3_column_type(st.get(), 4) != SQLITE_NULL;
    if (s.has_grad_norm) s.grad_norm = sqlite3_column_double(st.get(), 4);
    s.has_eval = sqlite3_column_type(st.get(), 5) != SQLITE_NULL;
    if (s.has_eval) {
      s.eval_loss = sqlite3_column_double(st.get(), 5);
      s.eval_accuracy = sqlite3_column_double(st.get(), 6);
    }
    steps.push_back(s);
  }
  if (rc != SQLITE_DONE) return Error(db_, "reading steps");
  return steps;
}

absl::StatusOr<int64_t> SqliteJobStore::Increment(const std::string& name, int64_t by) {
  if (by < 1) return absl::InvalidArgumentError("a counter is increased by 1 at least");
  std::lock_guard<std::mutex> lock(mu_);
  Statement st(db_,
               "INSERT INTO counters (name, value) VALUES (?1, ?2) "
               "ON CONFLICT (name) DO UPDATE SET value = value + ?2 RETURNING value");
  if (!st.ok()) return Error(db_, "preparing a counter update");
  st.Bind(1, name);
  st.Bind(2, by);
  if (sqlite3_step(st.get()) != SQLITE_ROW) return Error(db_, "updating a counter");
  const int64_t value = sqlite3_column_int64(st.get(), 0);
  if (sqlite3_step(st.get()) != SQLITE_DONE) return Error(db_, "updating a counter");
  return value;
}

absl::StatusOr<std::vector<StoredEvent>> SqliteJobStore::Events(const std::string& job_id,
                                                                int64_t after_seq, int64_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement st(db_,
               "SELECT seq, unix_ms, text FROM events WHERE job_id = ?1 AND seq > ?2 "
               "ORDER BY seq LIMIT ?3");
  if (!st.ok()) return Error(db_, "preparing the event list");
  st.Bind(1, job_id);
  st.Bind(2, after_seq);
  st.Bind(3, limit);
  std::vector<StoredEvent> events;
  int rc;
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
    events.push_back(
        {sqlite3_column_int64(st.get(), 0), sqlite3_column_int64(st.get(), 1), st.Blob(2)});
  }
  if (rc != SQLITE_DONE) return Error(db_, "reading events");
  return events;
}

}  // namespace pipetrain::coordinator
