// The one place a stage process picks its transport, by where its tensors live: NCCL between
// GPUs (CUDA tensors), Gloo over TCP for the CPU. Stages that are threads of one process use
// the in-process transport whatever their device (in_process/).
#pragma once

#include <memory>
#include <string>

#include <c10/core/Device.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/rendezvous/key_value_store.h"
#include "runtime/transport/transport.h"

namespace pipetrain::transport {

struct StageTransportOptions : TransportOptions {
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  std::string host = "127.0.0.1";  // where this process listens for Gloo peers
  bool evaluates = false;          // the job evaluates on held-out data (NCCL: links of its own)
};

// Gloo for a CPU device, NCCL for a CUDA one. FailedPrecondition for a CUDA device in a
// build without the NCCL transport; what the transport's connection says otherwise.
absl::StatusOr<std::unique_ptr<Transport>> MakeStageTransport(
    std::shared_ptr<rendezvous::KeyValueStore> store, const StageTransportOptions& options);

}  // namespace pipetrain::transport
