// The NCCL transport's making and ending: checking the options, creating the channels and
// their communicators (ids exchanged through the store), warming up every link, and on
// destruction finalizing (or aborting) the communicators before freeing what their work used.
// See nccl_transport.h for the contract, nccl_transport_impl.h for the class.
#include "runtime/transport/nccl/nccl_transport.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "runtime/transport/nccl/nccl_transport_impl.h"

namespace pipetrain::transport::nccl {

NcclTransport::~NcclTransport() {
  DeviceGuard device(options_.device);
  if (aborted().ok()) {
    CloseCommunicators(absl::Now() + kFinalizeTimeout);
  } else {
    AbortCommunicators();
  }
  for (auto& channel : channels_) {
    if (channel->stream != nullptr) cudaStreamSynchronize(channel->stream);
  }
  in_flight_.clear();
  graveyard_.clear();
  for (auto& channel : channels_) {
    channel->staged.clear();
    if (channel->stream != nullptr) cudaStreamDestroy(channel->stream);
  }
}

absl::Status NcclTransport::Connect() {
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  using Role = Channel::Role;
  if (options_.loopback) {
    loopback_forward_ = AddChannel(Role::kLoopback, "the loopback link for activations",
                                   "nccl/loopback/activations", 1, 0, 0);
    loopback_backward_ = AddChannel(Role::kLoopback, "the loopback link for gradients",
                                    "nccl/loopback/gradients", 1, 0, 0);
    replicas_ = AddChannel(Role::kCollective, "the loopback communicator for reductions",
                           "nccl/loopback/replicas", 1, 0, 0);
  } else {
    AddLinks();
    if (options_.stages > 1) {
      pipeline_ = AddChannel(Role::kCollective,
                             absl::StrCat("the communicator of the ", options_.stages,
                                          " stages of replica ", options_.replica),
                             absl::StrCat("nccl/replica", options_.replica, "/pipeline"),
                             options_.stages, options_.stage, 0);
    }
    if (options_.replicas > 1) {
      replicas_ = AddChannel(Role::kCollective,
                             absl::StrCat("the communicator of the ", options_.replicas,
                                          " replicas of stage ", options_.stage),
                             absl::StrCat("nccl/stage", options_.stage, "/replicas"),
                             options_.replicas, options_.replica, 0);
    }
  }
  for (auto& channel : channels_) {
    if (cudaError_t e = cudaStreamCreateWithFlags(&channel->stream, cudaStreamNonBlocking);
        e != cudaSuccess) {
      return CudaError(e, "creating the stream of " + channel->name);
    }
  }
  absl::StatusOr<std::vector<ncclUniqueId>> ids = ExchangeIds(deadline);
  if (!ids.ok()) return ids.status();
  for (size_t i = 0; i < channels_.size(); ++i) {
    Channel& channel = *channels_[i];
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t result;
    {
      std::lock_guard<std::mutex> lock(nccl_mu_);
      result =
          ncclCommInitRankConfig(&channel.comm, channel.ranks, (*ids)[i], channel.rank, &config);
    }
    if (result != ncclSuccess && result != ncclInProgress) {
      return Fail(absl::UnavailableError(absl::StrCat(Self(), ": NCCL failed creating ",
                                                      channel.name, ": ", NcclErrorText(result))));
    }
  }
  for (auto& channel : channels_) {
    if (absl::Status s = AwaitLaunch(*channel, deadline, "connecting " + channel->name); !s.ok()) {
      return s;
    }
  }
  return WarmUpLinks(deadline);
}

void NcclTransport::AddLinks() {
  links_ = PipelineLinks(options_, options_.evaluation_links);
  const int self = options_.stage;
  for (size_t i = 0; i < links_.size(); ++i) {
    const BoundaryLink& link = links_[i];
    if (link.from() != self && link.to() != self) continue;
    // In each 2-rank communicator the sender is rank 0.
    const bool sends = link.from() == self;
    link_channels_[static_cast<int>(i)] = AddChannel(
        sends ? Channel::Role::kSend : Channel::Role::kReceive, link.Name(options_, self),
        "nccl/" + link.Key(options_.replica), 2, sends ? 0 : 1, sends ? 1 : 0);
  }
}

Channel* NcclTransport::AddChannel(Channel::Role role, std::string name, std::string key, int ranks,
                                   int rank, int peer) {
  auto channel = std::make_unique<Channel>();
  channel->role = role;
  channel->name = std::move(name);
  channel->key = std::move(key);
  channel->ranks = ranks;
  channel->rank = rank;
  channel->peer = peer;
  channels_.push_back(std::move(channel));
  return channels_.back().get();
}

absl::StatusOr<std::vector<ncclUniqueId>> NcclTransport::ExchangeIds(absl::Time deadline) {
  std::vector<ncclUniqueId> ids(channels_.size());
  for (size_t i = 0; i < channels_.size(); ++i) {
    if (channels_[i]->rank != 0) continue;
    if (ncclResult_t r = ncclGetUniqueId(&ids[i]); r != ncclSuccess) {
      return absl::UnavailableError(absl::StrCat(Self(), ": NCCL failed making the id of ",
                                                 channels_[i]->name, ": ", NcclErrorText(r)));
    }
    const std::string id(ids[i].internal, NCCL_UNIQUE_ID_BYTES);
    if (absl::Status s = store_->Set(channels_[i]->key, id); !s.ok()) return s;
  }
  for (size_t i = 0; i < channels_.size(); ++i) {
    if (channels_[i]->rank == 0) continue;
    absl::StatusOr<std::string> id =
        store_->Get(channels_[i]->key, std::max(deadline - absl::Now(), absl::Milliseconds(1)));
    if (!id.ok()) {
      return absl::Status(id.status().code(),
                          absl::StrCat(Self(), " did not receive the NCCL id of ",
                                       channels_[i]->name, ": ", id.status().message()));
    }
    if (id->size() != NCCL_UNIQUE_ID_BYTES) {
      return absl::DataLossError(absl::StrCat(Self(), ": the NCCL id of ", channels_[i]->name,
                                              " has ", id->size(), " bytes"));
    }
    std::copy(id->begin(), id->end(), ids[i].internal);
  }
  return ids;
}

absl::Status NcclTransport::WarmUpLinks(absl::Time deadline) {
  const at::Tensor token = at::zeros({1}, CudaOptions(at::kLong));  // a default-stream fill
  std::vector<Channel*> links;
  std::vector<at::Tensor> received;
  const absl::Status warmed = [&]() -> absl::Status {
    for (auto& channel : channels_) {
      if (channel->role == Channel::Role::kCollective) continue;
      const std::string what = "connecting " + channel->name;
      links.push_back(channel.get());
      received.push_back(at::empty({1}, CudaOptions(at::kLong)));
      const bool sends = channel->role != Channel::Role::kReceive;
      const bool receives = channel->role != Channel::Role::kSend;
      if (absl::Status s = FollowCompute(*channel, what); !s.ok()) return s;
      if (absl::Status s = Issue(*channel, sends ? &token : nullptr,
                                 receives ? &received.back() : nullptr, what);
          !s.ok()) {
        return s;
      }
    }
    std::vector<Event> done;
    for (Channel* link : links) {
      const std::string what = "connecting " + link->name;
      if (absl::Status s = AwaitLaunch(*link, deadline, what); !s.ok()) return s;
      absl::StatusOr<Event> event = RecordEvent(*link, what);
      if (!event.ok()) return event.status();
      done.push_back(std::move(event).value());
    }
    for (size_t i = 0; i < links.size(); ++i) {
      if (absl::Status s =
              AwaitEvent(*links[i], done[i].get(), deadline, "connecting " + links[i]->name);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }();
  if (!warmed.ok()) {
    received.push_back(token);
    Bury(std::move(received));  // warm-up messages may still be in flight
  }
  return warmed;
}

void NcclTransport::CloseCommunicators(absl::Time deadline) {
  std::vector<ncclComm_t> finalizing;
  std::vector<ncclComm_t> failed;
  for (ncclComm_t comm : TakeCommunicators()) {
    const ncclResult_t r = ncclCommFinalize(comm);
    (r == ncclSuccess || r == ncclInProgress ? finalizing : failed).push_back(comm);
  }
  for (;;) {
    for (auto it = finalizing.begin(); it != finalizing.end();) {
      ncclResult_t state;
      if (ncclResult_t r = ncclCommGetAsyncError(*it, &state); r != ncclSuccess) state = r;
      if (state == ncclInProgress) {
        ++it;
        continue;
      }
      if (state == ncclSuccess) {
        ncclCommDestroy(*it);
      } else {
        failed.push_back(*it);
      }
      it = finalizing.erase(it);
    }
    if (finalizing.empty() || absl::Now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  failed.insert(failed.end(), finalizing.begin(), finalizing.end());
  AbortAll(failed);
}

}  // namespace pipetrain::transport::nccl

namespace pipetrain::transport {

using nccl::DeviceGuard;
using nccl::NcclTransport;

bool CudaDeviceAvailable() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

absl::StatusOr<std::unique_ptr<Transport>> MakeNcclTransport(
    std::shared_ptr<rendezvous::KeyValueStore> store, const NcclTransportOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  const int rank = options.rank();
  if (options.loopback && (options.stages != 1 || options.replicas != 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the NCCL loopback needs 1 stage and 1 replica, not ", options.stages, " and ",
                     options.replicas));
  }
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, ": no CUDA device: ", cudaGetErrorString(e)));
  }
  if (options.device < 0 || options.device >= devices) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, ": no CUDA device ",
                                                      options.device, " (", devices, " visible)"));
  }
  DeviceGuard device(options.device);
  auto transport = std::make_unique<NcclTransport>(std::move(store), options);
  if (absl::Status s = transport->Connect(); !s.ok()) {
    transport->Abort(s);  // so that destroying it aborts its communicators, not finalizes them
    return s;
  }
  return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace pipetrain::transport
