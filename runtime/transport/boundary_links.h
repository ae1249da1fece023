// The one-way links a pipeline's messages travel on, one per pipeline boundary, direction and
// lane (training or evaluation): what a transport whose links deliver in send order (NCCL)
// needs so that no two streams of messages share one. A boundary joins model stages m and
// m + 1 held by different stages of the pipeline (TransportOptions::model_stage_holders);
// with chunks two stages may share several boundaries, told apart by the chunk of the
// message's number (transport.h: n x v + floor(m / p)). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/transport/transport.h"

namespace pipetrain::transport {

struct BoundaryLink {
  int boundary = 0;         // m, of model stages m -> m + 1
  int lower = 0;            // the pipeline stage holding model stage m
  int upper = 0;            // the pipeline stage holding model stage m + 1
  int chunk = 0;            // floor(m / p)
  bool forward = true;      // towards model stage m + 1 (activations); else back (gradients)
  bool evaluation = false;  // the evaluation's messages (IsEvaluation)

  int from() const { return forward ? lower : upper; }
  int to() const { return forward ? upper : lower; }
  // "the link for activations to stage 1 (rank 1) across boundary 2-3" as seen by `self`
  // (one of its ends).
  std::string Name(const TransportOptions& options, int self) const;
  // Where its rendezvous goes in the store, unique in the job.
  std::string Key(int replica) const;
};

// Every link of the pipeline, both directions of every boundary between two stages, and the
// evaluation's as well with `evaluation_links`.
std::vector<BoundaryLink> PipelineLinks(const TransportOptions& options, bool evaluation_links);

// The index in `links` of the link that carries message `number` of `kind` from stage `from`
// to stage `to`, or -1 if there is none.
int LinkOf(const std::vector<BoundaryLink>& links, int chunks_per_rank, int from, int to,
           MessageKind kind, int64_t number);

}  // namespace pipetrain::transport
