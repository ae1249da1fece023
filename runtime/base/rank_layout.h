// Where each rank of a pipeline-parallel job sits: `stages` pipeline stages times `replicas`
// data-parallel replicas, rank = replica * stages + stage (a replica's stages are
// consecutive ranks). The one definition of that arithmetic and of how a rank is named in
// messages. A value type; thread-compatible.
#pragma once

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace pipetrain {

struct RankLayout {
  int stages = 1;
  int replicas = 1;

  int ranks() const { return stages * replicas; }
  int StageOf(int rank) const { return rank % std::max(1, stages); }
  int ReplicaOf(int rank) const { return rank / std::max(1, stages); }
  int RankOf(int stage, int replica) const { return replica * stages + stage; }
  // The first rank of `rank`'s replica.
  int ReplicaFirstRank(int rank) const { return RankOf(0, ReplicaOf(rank)); }
  // "stage 1" with one replica, else "stage 1 replica 0".
  std::string Describe(int rank) const {
    return replicas > 1 ? absl::StrCat("stage ", StageOf(rank), " replica ", ReplicaOf(rank))
                        : absl::StrCat("stage ", StageOf(rank));
  }
};

}  // namespace pipetrain
