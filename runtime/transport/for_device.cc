#include "runtime/transport/for_device.h"

#include "runtime/transport/gloo/gloo_transport.h"
#if defined(PIPETRAIN_HAVE_NCCL)
#include "runtime/transport/nccl/nccl_transport.h"
#endif

namespace pipetrain::transport {

absl::StatusOr<std::unique_ptr<Transport>> MakeStageTransport(
    std::shared_ptr<rendezvous::KeyValueStore> store, const StageTransportOptions& options) {
  if (options.device.is_cuda()) {
#if defined(PIPETRAIN_HAVE_NCCL)
    NcclTransportOptions nccl;
    static_cast<TransportOptions&>(nccl) = options;
    nccl.device = options.device.index() < 0 ? 0 : options.device.index();
    nccl.evaluation_links = options.evaluates;
    return MakeNcclTransport(std::move(store), nccl);
#else
    return absl::FailedPreconditionError(
        "device: cuda needs the NCCL transport, which this build does not have (the CUDA "
        "toolkit and NCCL were not found when it was built: docs/gpu.md)");
#endif
  }
  GlooTransportOptions gloo;
  static_cast<TransportOptions&>(gloo) = options;
  gloo.host = options.host;
  return MakeGlooTransport(std::move(store), gloo);
}

}  // namespace pipetrain::transport
