// The states of pipetrain.v1 (JobState, StageState, WorkerState) in the words users read and
// metrics label: the value's name after its enum's "..._STATE_" prefix, in lower case
// ("succeeded", "done", "idle"). One definition for the CLI, the coordinator and its metrics.
// Thread-safe (protobuf's descriptors are immutable).
#pragma once

#include <cctype>
#include <string>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/generated_enum_reflection.h>

#include "pipetrain/v1/job.pb.h"

namespace pipetrain {

template <typename State>
std::string StateName(State state) {
  const google::protobuf::EnumValueDescriptor* value =
      google::protobuf::GetEnumDescriptor<State>()->FindValueByNumber(static_cast<int>(state));
  if (value == nullptr) return "unknown";
  std::string name = value->name();
  const size_t prefix = name.find("STATE_");
  if (prefix != std::string::npos) name = name.substr(prefix + 6);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

// Succeeded, failed or cancelled: nothing changes it any more.
inline bool JobEnded(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

}  // namespace pipetrain
