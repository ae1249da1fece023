// A rank's state from the survivors' workers. See replica_state_fetch.h.
#include "worker/replica_state_fetch.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "pipetrain/v1/worker_service.grpc.pb.h"
#include "rpc/status.h"
#include "runtime/base/byte_size.h"

namespace pipetrain::worker {
namespace {

// One layer's bytes from the worker at `address`, by `deadline`.
absl::StatusOr<std::string> FetchLayer(v1::WorkerService::Stub& stub,
                                       const v1::FetchLayerStateRequest& request,
                                       absl::Time deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  std::unique_ptr<grpc::ClientReader<v1::LayerStateChunk>> reader =
      stub.FetchLayerState(&ctx, request);
  std::string bytes;
  int64_t total = -1;
  v1::LayerStateChunk chunk;
  while (reader->Read(&chunk)) {
    total = chunk.total_bytes();
    bytes += chunk.data();
  }
  if (absl::Status s = rpc::ToAbslStatus(reader->Finish()); !s.ok()) return s;
  if (total < 0 || static_cast<int64_t>(bytes.size()) != total) {
    return absl::DataLossError(absl::StrCat("got ", bytes.size(), " bytes of ", total));
  }
  return bytes;
}

}  // namespace

std::string ReplicaStateFetch::Describe() const {
  std::string out = absl::StrCat(held_here, held_here == 1 ? " layer" : " layers", " held here");
  if (fetched > 0) {
    absl::StrAppend(&out, ", ", fetched, " fetched from ", absl::StrJoin(sources, ", "), " (",
                    ByteSize(bytes_fetched), ")");
  }
  absl::StrAppend(&out, " in ", absl::ToInt64Milliseconds(took), " ms");
  return out;
}

absl::StatusOr<std::vector<checkpoint::LayerState>> FetchReplicaState(
    const v1::ReplicaState& state, const std::vector<model::LayerRange>& layers,
    const ReplicaStateSource& source, ReplicaStateFetch* report) {
  const absl::Time begun = absl::Now();
  const absl::Time deadline = begun + source.timeout;
  std::map<int, const v1::ReplicaState::LayerHolders*> holders;
  for (const v1::ReplicaState::LayerHolders& h : state.layers()) holders[h.layer()] = &h;
  std::map<std::string, std::unique_ptr<v1::WorkerService::Stub>> stubs;  // by address
  // Layer `layer`'s bytes from one of its holders other than this worker, asked in turn from
  // the one `source.spread` names; its address, or each holder's answer.
  const auto fetch = [&](int layer) -> absl::StatusOr<std::pair<std::string, std::string>> {
    auto it = holders.find(layer);
    if (it == holders.end() || it->second->addresses().empty()) {
      return absl::NotFoundError(absl::StrCat("no worker holds layer ", layer));
    }
    const auto& addresses = it->second->addresses();
    std::vector<std::string> answers;
    // A holder busy with other fetches (RESOURCE_EXHAUSTED: it serves a few at once) makes
    // the round of holders start again after a growing pause, until the deadline.
    for (absl::Duration pause = absl::Milliseconds(20);;
         pause = std::min(pause * 2, absl::Milliseconds(500))) {
      answers.clear();
      bool busy = false;
      for (int k = 0; k < addresses.size(); ++k) {
        const std::string& address = addresses[(source.spread + k) % addresses.size()];
        if (address == source.own_address) continue;  // its own hold was asked first
        std::unique_ptr<v1::WorkerService::Stub>& stub = stubs[address];
        if (!stub) {
          absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
              rpc::MakeChannel(address, source.security);
          if (!channel.ok()) {
            answers.push_back(absl::StrCat(address, ": ", channel.status().message()));
            continue;
          }
          stub = v1::WorkerService::NewStub(*channel);
        }
        v1::FetchLayerStateRequest request;
        request.set_job_id(source.job_id);
        request.set_step(state.step());
        request.set_layer(layer);
        request.set_state_key(state.state_key());
        absl::StatusOr<std::string> bytes = FetchLayer(*stub, request, deadline);
        if (bytes.ok()) return std::make_pair(address, *std::move(bytes));
        answers.push_back(absl::StrCat(address, ": ", bytes.status().ToString()));
        busy = busy || absl::IsResourceExhausted(bytes.status());
      }
      if (!busy || absl::Now() + pause >= deadline) break;
      absl::SleepFor(pause);
    }
    return absl::UnavailableError(absl::StrCat(
        "layer ", layer, ": ", answers.empty() ? "no other holder" : absl::StrJoin(answers, "; ")));
  };
  ReplicaStateFetch done;
  std::vector<checkpoint::LayerState> out;
  for (const model::LayerRange& range : layers) {
    for (int layer = range.begin; layer < range.end; ++layer) {
      std::shared_ptr<const std::string> bytes;  // this worker's hold's, shared, or fetched
      if (source.local != nullptr) {
        absl::StatusOr<std::shared_ptr<const std::string>> here =
            source.local->Layer(source.job_id, state.step(), layer, state.state_key());
        if (here.ok()) {
          bytes = *std::move(here);
          ++done.held_here;
        }
      }
      if (bytes == nullptr) {
        absl::StatusOr<std::pair<std::string, std::string>> fetched = fetch(layer);
        if (!fetched.ok()) return fetched.status();
        const std::string& address = fetched->first;
        ++done.fetched;
        done.bytes_fetched += static_cast<int64_t>(fetched->second.size());
        if (std::find(done.sources.begin(), done.sources.end(), address) == done.sources.end()) {
          done.sources.push_back(address);
        }
        bytes = std::make_shared<const std::string>(std::move(fetched->second));
      }
      absl::StatusOr<checkpoint::LayerState> parsed = checkpoint::ParseLayerState(*bytes);
      if (!parsed.ok()) {
        return absl::DataLossError(absl::StrCat("layer ", layer, ": ", parsed.status().message()));
      }
      out.push_back(*std::move(parsed));
    }
  }
  done.took = absl::Now() - begun;
  if (report != nullptr) *report = std::move(done);
  return out;
}

}  // namespace pipetrain::worker
