// The profiler's cache of measurements: under a directory, one JSON file per key, named by the
// key's hash and holding {"key": KEY, "value": VALUE}. A key is the text of everything a
// measurement depends on, the measuring build included, so a new build measures again.
// A missing, unreadable or foreign file is a miss, never an error; a write that fails costs a
// measurement next time, nothing more. An empty directory name disables the cache. Files are
// replaced atomically, so concurrent readers see a whole entry or none.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "runtime/job/job_spec.h"
#include "runtime/job/plan.h"
#include "runtime/planner/profile.h"

namespace pipetrain::profiler {

// Bumped when what is measured or how changes: older cache files are then ignored.
inline constexpr int kProfileFormat = 2;

// The key of one micro-batch size's layer profile: the model, dtype, optimizer, micro-batch
// size `b`, intra-op `threads`, device, the profiling `windows` and the measuring build (the
// size and modification time of this executable, and $PIPETRAIN_GEMM).
std::string CacheKey(const job::JobPlan& plan, const job::JobSpec& config, int b, int threads,
                     const std::vector<std::pair<int, int>>& windows);

// The JSON value stored under `key` in `dir`; "" when there is none (or `dir` is "").
std::string CachedValue(const std::string& dir, const std::string& key);

// Stores `value_json` (valid JSON) under `key` in `dir`, creating `dir`; nothing if `dir` is "".
void StoreValue(const std::string& dir, const std::string& key, const std::string& value_json);

// Reads the machine's part of a profile (links, cores) from the cache's text into `profile`:
// false (and `profile` as it was) when there is none or it does not parse.
bool MachineProfileFromOrNot(const std::string& cached, planner::ModelProfile& profile);

}  // namespace pipetrain::profiler
