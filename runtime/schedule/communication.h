// The messages of a schedule whose ranks hold several chunks (chunked_schedule.h): compute
// lists lowered to lists with their sends and receives, and the check that ranks running
// them exchange every message and cannot deadlock.
//
// Messages name the stage of their side, as compute actions do:
//   <s>SEND_ACT<j>   stage s's output of micro-batch j, to the rank of stage s + 1
//   <s>RECV_ACT<j>   stage s's input of micro-batch j, from the rank of stage s − 1
//   <s>SEND_GRAD<j>  stage s's input gradient (of its B<j> or I<j>), to the rank of s − 1
//   <s>RECV_GRAD<j>  stage s's output gradient of micro-batch j, from the rank of s + 1
// Between two stages on one rank (the V's turn, or every stage when p = 1) there is no
// message: the tensor is handed over in place.
//
// Lowering: each compute action whose input crosses ranks gets its RECV right before it,
// and each whose output crosses ranks its SEND right after it. With sends that do not block,
// a rank then waits only for what its next action needs, which the peer sends as soon as it
// has made it: the lists run to the end exactly when the compute lists do (a simulation of
// them with free communication). For one stage a rank this is schedule.h's placement:
// RECV_ACT right before F, SEND_ACT right after it, RECV_GRAD before B, SEND_GRAD after.
//
// Pure functions; thread-safe.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/schedule/action.h"
#include "runtime/schedule/chunked_schedule.h"

namespace pipetrain::schedule {

// The lists of `compute` (CheckComputeLists holds for them) with their messages, checked by
// CheckCommunication: FailedPrecondition naming each rank's wait when the compute lists
// deadlock.
absl::StatusOr<std::vector<std::vector<Action>>> AddCommunication(
    const ChunkLayout& layout, int micro_batches, const std::vector<std::vector<Action>>& compute);

// Lists with messages: without them CheckComputeLists holds; every message crosses ranks
// and names a stage of its rank; every SEND has exactly one RECV on the peer's rank and
// back; a stage's input is received before its F (and its output gradient before its B or
// I), sent after the action that makes it; and running them (each rank in order, a RECV
// waiting for its SEND, sends never blocking) ends. InvalidArgument naming the rank and the
// action, or FailedPrecondition naming each rank's wait.
absl::Status CheckCommunication(const ChunkLayout& layout, int micro_batches,
                                const std::vector<std::vector<Action>>& lists);

}  // namespace pipetrain::schedule
