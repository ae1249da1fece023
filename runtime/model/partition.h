// Cutting a model into pipeline stages: explicit per-stage layer ranges.
//
// A partition is valid when the ranges are non-empty, contiguous, in order, start at layer
// 0 and end at the last layer: every layer belongs to exactly one stage. Anything else is a
// hard error naming the layers (a layer silently dropped or trained twice is the bug users
// of other systems keep hitting).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipetrain::model {

struct LayerRange {
  int begin = 0;  // first layer of the stage
  int end = 0;    // one past the last layer
  bool operator==(const LayerRange& o) const { return begin == o.begin && end == o.end; }
};

// All violations in one InvalidArgument ("; "-separated), naming layers by index and name:
// "stage 1 [4, 6) overlaps stage 0 [0, 5): layer 4 (block3) is in both", "layers 6..7
// (block5, final_norm) belong to no stage", "stage 2 [7, 9) runs past the last layer 7".
absl::Status ValidatePartition(const std::vector<LayerRange>& ranges,
                               const std::vector<std::string>& layer_names);

// Contiguous split into `stages` ranges minimizing the largest per-stage cost (exact
// dynamic program). InvalidArgument if stages < 1 or stages > number of layers.
absl::StatusOr<std::vector<LayerRange>> BalancedPartition(const std::vector<double>& layer_costs,
                                                          int stages);

// "0:2,2:5,5:7" <-> ranges. Parse errors name the offending item.
absl::StatusOr<std::vector<LayerRange>> ParseRanges(const std::string& text);
std::string FormatRanges(const std::vector<LayerRange>& ranges);

}  // namespace pipetrain::model
