#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "runtime/rendezvous/key_value_store.h"

namespace pipetrain::rendezvous {

absl::Status Rendezvous(KeyValueStore& store, const std::string& prefix, int rank, int world,
                        absl::Duration timeout,
                        const std::function<std::string(int rank)>& describe) {
  auto key = [&](int r) { return absl::StrCat(prefix, "/arrived/", r); };
  if (absl::Status s = store.Set(key(rank), "1"); !s.ok()) return s;
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(key(r));
  while (true) {
    // One check of every key per round (one RPC for the coordinator's store); who is
    // missing is worked out only for the error.
    auto all = store.Check(keys);
    if (!all.ok()) return all.status();
    if (*all) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      std::vector<int> missing;
      for (int r = 0; r < world; ++r) {
        auto present = store.Check({key(r)});
        if (!present.ok()) return present.status();
        if (!*present) missing.push_back(r);
      }
      if (missing.empty()) return absl::OkStatus();  // the last one came just now
      std::vector<std::string> who;
      for (int r : missing) who.push_back(describe ? describe(r) : absl::StrCat("rank ", r));
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous '", prefix, "': ", missing.size(), " of ", world,
                       " ranks did not arrive within ", absl::FormatDuration(timeout), ": ",
                       absl::StrJoin(who, ", ")));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace pipetrain::rendezvous
