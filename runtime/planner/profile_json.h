// ModelProfile <-> JSON: the profile cache's files and `pipetrain profile -o json`.
//
// {"model": "...", "device": "cpu", "dtype": "float32", "threads": 1, "tokens_per_sample": 64,
//  "base_bytes": .., "p2p": {"latency_s": .., "bytes_per_s": ..}, "allreduce": {...},
//  "allreduce_cpu": {...}, "message_costs": [{"bytes": .., "send_s": .., "recv_s": ..,
//  "background_s": ..}], "slowdown": [..],
//  "sizes": [{"micro_batch_size": 8, "layers": [{"name": "block0", "forward_s": .., ...}]}],
//  "between_hosts": {"p2p": {...}, "allreduce": {...}}}   (the last only when measured)
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

// The machine's part alone (links, message costs, slowdown): what the profiler caches once
// per machine. FromJson replaces those fields of `profile`.
std::string MachineProfileToJson(const ModelProfile& profile);
absl::Status MachineProfileFromJson(const std::string& text, ModelProfile* profile);

// The links between two hosts alone ({"p2p": {...}, "allreduce": {...}}): what
// `pipetrain profile-link` prints and `--host-links FILE` reads.
std::string HostLinksToJson(const HostLinks& links);
absl::StatusOr<HostLinks> HostLinksFromJson(const std::string& text);

}  // namespace pipetrain::planner
