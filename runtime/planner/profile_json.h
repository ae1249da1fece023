// ModelProfile <-> JSON: the profile cache's files and `pipetrain profile -o json`.
//
// {"model": "...", "device": "cpu", "dtype": "float32", "threads": 1, "tokens_per_sample": 64,
//  "base_bytes": .., "p2p": {"latency_s": .., "bytes_per_s": ..}, "allreduce": {...},
//  "sizes": [{"micro_batch_size": 8, "layers": [{"name": "block0", "forward_s": .., ...}]}]}
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "runtime/planner/profile.h"

namespace pipetrain::planner {

std::string ModelProfileToJson(const ModelProfile& profile);
std::string MicroBatchProfileToJson(const MicroBatchProfile& size);

// InvalidArgument naming the first field that is missing, of the wrong type or out of range
// (negative times or bytes, a bandwidth that is not positive, no sizes, sizes whose layer
// counts differ).
absl::StatusOr<ModelProfile> ModelProfileFromJson(const std::string& text);
absl::StatusOr<MicroBatchProfile> MicroBatchProfileFromJson(const std::string& text);

}  // namespace pipetrain::planner
