#include "runtime/model/partition.h"

#include <algorithm>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/base/errors.h"

namespace pipetrain::model {
namespace {

std::string NameLayers(const std::vector<std::string>& names, int begin, int end) {
  std::vector<std::string> parts;
  for (int i = begin; i < end && i < static_cast<int>(names.size()); ++i) {
    if (parts.size() == 4 && end - i > 1) {
      parts.push_back("...");
      i = end - 1;
    }
    parts.push_back(names[i]);
  }
  return absl::StrJoin(parts, ", ");
}

std::string Span(int begin, int end) {
  return end - begin == 1 ? absl::StrCat("layer ", begin)
                          : absl::StrCat("layers ", begin, "..", end - 1);
}

}  // namespace

absl::Status ValidatePartition(const std::vector<LayerRange>& ranges,
                               const std::vector<std::string>& layer_names) {
  const int n = static_cast<int>(layer_names.size());
  std::vector<std::string> errors;
  if (ranges.empty()) errors.push_back("the partition has no stages");
  std::vector<int> owner(n, -1);
  for (size_t s = 0; s < ranges.size(); ++s) {
    const LayerRange& r = ranges[s];
    const std::string label = absl::StrCat("stage ", s, " [", r.begin, ", ", r.end, ")");
    if (r.begin < 0 || r.end <= r.begin) {
      errors.push_back(absl::StrCat(label, " is empty or reversed"));
      continue;
    }
    if (r.end > n) {
      errors.push_back(absl::StrCat(label, " runs past the last layer ", n - 1, " (the model has ",
                                    n, " layers)"));
    }
    for (int i = r.begin; i < std::min(r.end, n); ++i) {
      if (owner[i] >= 0) {
        int j = i;
        while (j < std::min(r.end, n) && owner[j] == owner[i]) ++j;
        errors.push_back(absl::StrCat(label, " overlaps stage ", owner[i], ": ", Span(i, j), " (",
                                      NameLayers(layer_names, i, j), ") would be in both"));
        for (int k = i; k < j; ++k) owner[k] = static_cast<int>(s);
        i = j - 1;
      } else {
        owner[i] = static_cast<int>(s);
      }
    }
    if (s > 0 && r.begin < ranges[s - 1].begin) {
      errors.push_back(
          absl::StrCat(label, " starts before stage ", s - 1, ": stages must be in layer order"));
    }
  }
  for (int i = 0; i < n; ++i) {
    if (owner[i] >= 0) continue;
    int j = i;
    while (j < n && owner[j] < 0) ++j;
    errors.push_back(
        absl::StrCat(Span(i, j), " (", NameLayers(layer_names, i, j), ") belong to no stage"));
    i = j;
  }
  return InvalidArgumentList(absl::StrCat("invalid partition ", FormatRanges(ranges)), errors);
}

absl::StatusOr<std::vector<LayerRange>> BalancedPartition(const std::vector<double>& costs,
                                                          int stages) {
  const int n = static_cast<int>(costs.size());
  if (stages < 1 || stages > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot split ", n, " layers into ", stages, " non-empty stages"));
  }
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][i]: minimal max-stage cost splitting layers [0, i) into k stages.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k) {
    for (int i = k; i <= n; ++i) {
      for (int j = k - 1; j < i; ++j) {
        const double c = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (c < best[k][i]) {
          best[k][i] = c;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<LayerRange> ranges(stages);
  int end = n;
  for (int k = stages; k >= 1; --k) {
    ranges[k - 1] = {cut[k][end], end};
    end = cut[k][end];
  }
  return ranges;
}

absl::StatusOr<std::vector<LayerRange>> ParseRanges(const std::string& text) {
  std::vector<LayerRange> ranges;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    std::vector<absl::string_view> parts = absl::StrSplit(item, ':');
    LayerRange r;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &r.begin) ||
        !absl::SimpleAtoi(parts[1], &r.end)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad stage range '", item, "': expected BEGIN:END (layers BEGIN..END-1), e.g. 0:3,3:7"));
    }
    ranges.push_back(r);
  }
  if (ranges.empty()) return absl::InvalidArgumentError("empty stage list");
  return ranges;
}

std::string FormatRanges(const std::vector<LayerRange>& ranges) {
  return absl::StrJoin(ranges, ",", [](std::string* out, const LayerRange& r) {
    absl::StrAppend(out, r.begin, ":", r.end);
  });
}

}  // namespace pipetrain::model
