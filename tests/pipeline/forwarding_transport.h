// A transport that passes everything to another: the base of the fault-injecting transports
// of the pipeline tests, which override only what they break.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "runtime/transport/transport.h"

namespace pipetrain::job {

class ForwardingTransport : public transport::Transport {
 public:
  explicit ForwardingTransport(std::unique_ptr<transport::Transport> inner)
      : inner_(std::move(inner)) {}
  int stage() const override { return inner_->stage(); }
  absl::Status SendMessage(int peer, transport::MessageKind kind, int64_t j,
                           const at::Tensor& t) override {
    return inner_->Send(peer, kind, j, t);
  }
  absl::StatusOr<at::Tensor> Recv(int peer, transport::MessageKind kind, int64_t j,
                                  absl::Time deadline) override {
    return inner_->Recv(peer, kind, j, deadline);
  }
  absl::Status AllReduceMean(std::vector<at::Tensor>& tensors, absl::Time deadline) override {
    return inner_->AllReduceMean(tensors, deadline);
  }
  absl::StatusOr<std::vector<at::Tensor>> AllGather(const transport::Group& group,
                                                    const at::Tensor& mine,
                                                    absl::Time deadline) override {
    return inner_->AllGather(group, mine, deadline);
  }
  c10::Device device() const override { return inner_->device(); }
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }

 protected:
  std::unique_ptr<transport::Transport> inner_;
};

}  // namespace pipetrain::job
