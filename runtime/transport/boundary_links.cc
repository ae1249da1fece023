#include "runtime/transport/boundary_links.h"

#include "absl/strings/str_cat.h"

namespace pipetrain::transport {

std::string BoundaryLink::Name(const TransportOptions& options, int self) const {
  const bool sends = from() == self;
  return absl::StrCat("the link for ", evaluation ? "evaluation's " : "",
                      forward ? "activations " : "gradients ", sends ? "to " : "from ",
                      options.Describe(sends ? to() : from()), " across boundary ", boundary, "-",
                      boundary + 1);
}

std::string BoundaryLink::Key(int replica) const {
  return absl::StrCat("links/replica", replica, evaluation ? "/evaluation" : "",
                      forward ? "/forward" : "/backward", "/boundary", boundary);
}

std::vector<BoundaryLink> PipelineLinks(const TransportOptions& options, bool evaluation_links) {
  std::vector<int> holders = options.model_stage_holders;
  if (holders.empty()) {
    for (int s = 0; s < options.stages; ++s) holders.push_back(s);
  }
  std::vector<BoundaryLink> links;
  for (const bool evaluation : {false, true}) {
    if (evaluation && !evaluation_links) continue;
    for (size_t m = 0; m + 1 < holders.size(); ++m) {
      if (holders[m] == holders[m + 1]) continue;  // handed over within the stage
      for (const bool forward : {true, false}) {
        BoundaryLink link;
        link.boundary = static_cast<int>(m);
        link.lower = holders[m];
        link.upper = holders[m + 1];
        link.chunk = static_cast<int>(m) / std::max(1, options.stages);
        link.forward = forward;
        link.evaluation = evaluation;
        links.push_back(link);
      }
    }
  }
  return links;
}

int LinkOf(const std::vector<BoundaryLink>& links, int chunks_per_rank, int from, int to,
           MessageKind kind, int64_t number) {
  const int chunk = static_cast<int>(number % std::max(1, chunks_per_rank));
  for (size_t i = 0; i < links.size(); ++i) {
    const BoundaryLink& l = links[i];
    if (l.from() == from && l.to() == to && l.chunk == chunk && l.forward == FlowsForward(kind) &&
        l.evaluation == IsEvaluation(kind)) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

}  // namespace pipetrain::transport
