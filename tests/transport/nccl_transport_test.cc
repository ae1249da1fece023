// The NCCL data plane on one GPU. NCCL refuses two ranks of a communicator on one device, so
// these tests run the transport in loopback (a 1-stage job whose stage is its own neighbour),
// which goes through the same headers, checks, streams, events, deadlines and aborts as a
// multi-GPU job. Every test skips where no CUDA device is visible.
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/rendezvous/key_value_store.h"
#include "runtime/transport/nccl/nccl_transport.h"

namespace pipetrain::transport {
namespace {

using ::testing::HasSubstr;

const at::Device kGpu(at::kCUDA, 0);

// A failure to set up is returned, for the test to ASSERT on, not a crash of the binary.
absl::StatusOr<std::unique_ptr<Transport>> MakeLoopback() {
  absl::StatusOr<std::unique_ptr<rendezvous::KeyValueStore>> store =
      rendezvous::ServeTcpStore("127.0.0.1", 0);
  if (!store.ok()) return store.status();
  NcclTransportOptions options;
  options.loopback = true;
  options.connect_timeout = absl::Seconds(30);
  return MakeNcclTransport(std::move(store).value(), options);
}

absl::Time In(absl::Duration d) { return absl::Now() + d; }

TEST(NcclTransport, MovesCudaTensorsWithTheirShapeAndDtype) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  auto made = MakeLoopback();
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<Transport>& transport = *made;
  const at::Tensor act = torch::randn({4, 8, 16});
  const at::Tensor grad = torch::randn({3, 5}, torch::kDouble);
  const at::Tensor ids = torch::arange(12, torch::kLong).reshape({3, 4}).t();  // not contiguous
  ASSERT_TRUE(transport->Send(0, MessageKind::kActivation, 7, act.to(kGpu)).ok());
  ASSERT_TRUE(transport->Send(0, MessageKind::kActivation, 8, (act * 2).to(kGpu)).ok());
  ASSERT_TRUE(transport->Send(0, MessageKind::kGradient, 7, grad.to(kGpu)).ok());
  ASSERT_TRUE(transport->Send(0, MessageKind::kActivation, 9, ids.to(kGpu)).ok());
  // A link delivers in send order; the two kinds travel over separate links.
  auto got_grad = transport->Recv(0, MessageKind::kGradient, 7, In(absl::Seconds(10)));
  auto got7 = transport->Recv(0, MessageKind::kActivation, 7, In(absl::Seconds(10)));
  auto got8 = transport->Recv(0, MessageKind::kActivation, 8, In(absl::Seconds(10)));
  auto got_ids = transport->Recv(0, MessageKind::kActivation, 9, In(absl::Seconds(10)));
  ASSERT_TRUE(got7.ok()) << got7.status();
  ASSERT_TRUE(got8.ok()) << got8.status();
  ASSERT_TRUE(got_grad.ok()) << got_grad.status();
  ASSERT_TRUE(got_ids.ok()) << got_ids.status();
  EXPECT_EQ(got7->device(), kGpu);
  EXPECT_EQ(SpecOf(*got7).ToString(), "float32[4, 8, 16]");
  EXPECT_EQ(SpecOf(*got_grad).ToString(), "float64[3, 5]");
  EXPECT_EQ(SpecOf(*got_ids).ToString(), "int64[4, 3]");
  EXPECT_TRUE(at::equal(got7->cpu(), act));
  EXPECT_TRUE(at::equal(got8->cpu(), act * 2));
  EXPECT_TRUE(at::equal(got_grad->cpu(), grad));
  EXPECT_TRUE(at::equal(got_ids->cpu(), ids));
  // No Flush check: in loopback a send is only staged until its Recv, so Flush has nothing to
  // wait for and cannot fail here.
}

TEST(NcclTransport, SendsOnlyCudaTensorsToANeighbour) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  auto made = MakeLoopback();
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<Transport>& transport = *made;
  absl::Status cpu = transport->Send(0, MessageKind::kActivation, 0, torch::ones({2, 3}));
  EXPECT_EQ(cpu.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cpu.message(), HasSubstr("moves tensors on cuda:0, not float32[2, 3] on cpu"));
  absl::Status far = transport->Send(2, MessageKind::kActivation, 0, torch::ones({1}).to(kGpu));
  EXPECT_EQ(far.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(far.message(), HasSubstr("has no link to send the activation of micro-batch 0 to "
                                       "stage 2"));
}

TEST(NcclTransport, ReceivingOutOfSendOrderIsAClearError) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  auto made = MakeLoopback();
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<Transport>& transport = *made;
  ASSERT_TRUE(transport->Send(0, MessageKind::kActivation, 4, torch::ones({2}).to(kGpu)).ok());
  ASSERT_TRUE(transport->Send(0, MessageKind::kActivation, 3, torch::ones({2}).to(kGpu)).ok());
  auto got = transport->Recv(0, MessageKind::kActivation, 3, In(absl::Seconds(10)));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
  EXPECT_THAT(got.status().message(),
              HasSubstr("stage 0 (rank 0) expected the activation of micro-batch 3 from stage 0 "
                        "(rank 0) but the next message from stage 0 (rank 0) is the activation "
                        "of micro-batch 4"));
  // The link is out of step: the transport stays failed with that error.
  EXPECT_EQ(transport->Send(0, MessageKind::kGradient, 0, torch::ones({1}).to(kGpu)), got.status());
}

// With one replica the mean, the sum and doing nothing all give the same values, so this cannot
// tell whether ncclAvg was used (that needs two GPUs). It checks that the loopback's real
// 1-rank ncclAllReduce path (blocking and pending) runs, leaves the values unchanged, and
// rejects CPU and non-contiguous tensors.
TEST(NcclTransport, AllReduceMeanOverOneReplicaLeavesValuesUnchanged) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  auto made = MakeLoopback();
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<Transport>& transport = *made;
  const at::Tensor a = torch::randn({5, 7});
  const at::Tensor b = torch::randn({11}, torch::kDouble);
  std::vector<at::Tensor> tensors = {a.to(kGpu), b.to(kGpu)};
  ASSERT_TRUE(transport->AllReduceMean(tensors, In(absl::Seconds(10))).ok());
  EXPECT_TRUE(at::equal(tensors[0].cpu(), a));
  EXPECT_TRUE(at::equal(tensors[1].cpu(), b));
  auto pending = transport->StartAllReduceMean(tensors, In(absl::Seconds(10)));
  ASSERT_TRUE(pending->Wait(In(absl::Seconds(10))).ok());
  EXPECT_TRUE(at::equal(tensors[0].cpu(), a));
  EXPECT_TRUE(at::equal(tensors[1].cpu(), b));
  std::vector<at::Tensor> on_cpu = {a};
  EXPECT_EQ(transport->AllReduceMean(on_cpu, In(absl::Seconds(10))).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<at::Tensor> strided = {a.to(kGpu).t()};
  EXPECT_EQ(transport->AllReduceMean(strided, In(absl::Seconds(10))).code(),
            absl::StatusCode::kInvalidArgument);
}

// The collectives over the loopback's 1-rank replicas' communicator (a real ncclAllGather)
// and over a one-stage pipeline (nothing to gather): every value comes back as it went,
// AllReduce of the one member is the member's own, a barrier passes; a CPU tensor is refused.
TEST(NcclTransport, CollectivesOverOneMemberGiveTheMembersOwn) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  auto made = MakeLoopback();
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<Transport>& transport = *made;
  EXPECT_EQ(transport->device(), kGpu);
  const at::Tensor a = torch::randn({3, 4}, torch::kDouble);
  for (const Group& group : {Group::Replicas(), Group::Pipeline(), Group::PipelineStages({0})}) {
    SCOPED_TRACE(group.ToString());
    auto gathered = transport->AllGather(group, a.to(kGpu), In(absl::Seconds(10)));
    ASSERT_TRUE(gathered.ok()) << gathered.status();
    ASSERT_EQ(gathered->size(), 1u);
    EXPECT_EQ((*gathered)[0].device(), kGpu);
    EXPECT_TRUE(at::equal((*gathered)[0].cpu(), a));
    std::vector<at::Tensor> v = {a.to(kGpu)};
    ASSERT_TRUE(transport->AllReduce(group, v, ReduceOp::kSum, In(absl::Seconds(10))).ok());
    EXPECT_TRUE(at::equal(v[0].cpu(), a));
    EXPECT_TRUE(transport->Barrier(group, In(absl::Seconds(10))).ok());
  }
  EXPECT_EQ(transport->AllGather(Group::Replicas(), a, In(absl::Seconds(10))).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclTransport, ReceiveHasADeadlineNamingWhatAndWhom) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  auto made = MakeLoopback();
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<Transport>& transport = *made;
  const absl::Time start = absl::Now();
  auto got = transport->Recv(0, MessageKind::kActivation, 3, In(absl::Seconds(1)));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_THAT(got.status().message(),
              HasSubstr("stage 0 (rank 0) timed out waiting for the activation of micro-batch 3 "
                        "from stage 0 (rank 0)"));
  EXPECT_GE(absl::Now() - start, absl::Seconds(1));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(NcclTransport, AbortFailsAPendingReceiveWithTheReason) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  auto made = MakeLoopback();
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<Transport>& transport = *made;
  const absl::Status reason = absl::CancelledError("stage 3 failed: out of memory");
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    transport->Abort(reason);
  });
  const absl::Time start = absl::Now();
  auto got = transport->Recv(0, MessageKind::kGradient, 0, In(absl::Seconds(30)));
  aborter.join();
  EXPECT_EQ(got.status(), reason);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(transport->Send(0, MessageKind::kGradient, 0, torch::ones({1}).to(kGpu)), reason);
  transport->Abort(absl::InternalError("a later reason"));
  EXPECT_EQ(transport->Flush(In(absl::Seconds(1))), reason);
}

TEST(NcclTransport, ConnectingWaitsForAMissingPeerOnlyUntilTheTimeout) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  NcclTransportOptions options;
  options.stage = 1;
  options.stages = 2;
  options.connect_timeout = absl::Seconds(1);
  auto store = rendezvous::ServeTcpStore("127.0.0.1", 0);
  ASSERT_TRUE(store.ok()) << store.status();
  const absl::Time start = absl::Now();
  auto transport = MakeNcclTransport(std::move(store).value(), options);
  ASSERT_FALSE(transport.ok());
  EXPECT_EQ(transport.status().code(), absl::StatusCode::kDeadlineExceeded) << transport.status();
  EXPECT_THAT(transport.status().message(),
              HasSubstr("stage 1 (rank 1) did not receive the NCCL id of the link for "
                        "activations from stage 0 (rank 0)"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace pipetrain::transport
