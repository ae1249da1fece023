// gRPC calls made directly, not through the CLI, to a cluster that asks for a token: every
// method of every pipetrain.v1 service (walked from the generated descriptors) refused
// without the token and answering nothing, health and reflection open; and the workers'
// join token, which cannot command a worker running a rank nor register at its address.
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "pipetrain/v1/coordinator_service.grpc.pb.h"
#include "pipetrain/v1/job_service.grpc.pb.h"
#include "pipetrain/v1/worker_service.grpc.pb.h"
#include "rpc/security.h"
#include "tests/daemons/auth_fixture.h"
#include "tests/daemons/local_cluster.h"

namespace pipetrain::test::auth_test {
namespace {

// What a call without a token got: its status and how many responses came first.
struct Call {
  grpc::Status status;
  int responses = 0;
};

// Calls `path` ("/package.Service/Method") on `channel` with no metadata (no token), an
// empty request and a 5 s deadline, whatever kind of method it is (unary or streaming: on
// the wire they are all a stream), reading its first response.
Call CallWithoutToken(const std::shared_ptr<grpc::Channel>& channel, const std::string& path) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(In(std::chrono::seconds(5)));
  // One operation at a time; whether it went through.
  const auto wait = [&cq] {
    void* tag = nullptr;
    bool ok = false;
    return cq.Next(&tag, &ok) && ok;
  };
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(&ctx, path, &cq);
  Call result;
  call->StartCall(nullptr);
  if (wait()) {
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1), response;
    call->Write(request, nullptr);
    if (wait()) {
      call->WritesDone(nullptr);
      wait();
    }
    call->Read(&response, nullptr);
    if (wait()) ++result.responses;
  }
  call->Finish(&result.status, nullptr);
  wait();
  cq.Shutdown();
  while (wait()) {
  }
  return result;
}

// The paths ("/pipetrain.v1.JobService/SubmitJob", ...) of every method of the generated
// service S, as its descriptor in the generated pool lists them. (S's server-side class is
// made once so that its generated code, which registers that descriptor, is linked in.)
template <typename S>
std::vector<std::string> MethodPaths() {
  [[maybe_unused]] typename S::Service linked;
  const google::protobuf::ServiceDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(S::service_full_name());
  std::vector<std::string> paths;
  if (descriptor == nullptr) return paths;
  for (int i = 0; i < descriptor->method_count(); ++i) {
    paths.push_back("/" + descriptor->full_name() + "/" + descriptor->method(i)->name());
  }
  return paths;
}

// The join token does not make its holder the coordinator: with it, every WorkerService
// method called on a worker running a rank is refused (no command key) and changes nothing,
// and registering at a busy worker's address is refused while that worker answers there.
// The job runs on undisturbed. (Both once failed the job: workers took the join token as the
// coordinator's credential, and a registration took over any address.)
TEST_F(AuthTest, TheJoinTokenCannotCommandAWorkerNorTakeItsAddress) {
  LocalCluster cluster(dir_, WithToken());
  ASSERT_FALSE(cluster.address().empty());
  cluster.StartWorker({"--token-file", token_});
  cluster.StartWorker({"--token-file", token_});
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2));
  Result submitted = cluster.Cli("submit " + job_ + " --steps 400");
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  ASSERT_FALSE(cluster
                   .WaitForJob("job-0001",
                               [](const nlohmann::json& j) { return Int64Of(j, "step", -1) >= 2; })
                   .is_null());
  rpc::SecurityOptions security;
  security.token = kToken;
  const auto workers = cluster.Workers();
  ASSERT_EQ(workers.size(), 2u);
  std::vector<std::string> paths = MethodPaths<v1::WorkerService>();
  EXPECT_EQ(paths.size(), 5u) << "a WorkerService method was added: call it below too";
  const auto refused = [](const grpc::Status& s) {
    return s.error_code() == grpc::StatusCode::UNAUTHENTICATED &&
           s.error_message().find("command key") != std::string::npos;
  };
  for (const nlohmann::json& w : workers) {
    const std::string address = w.value("address", "");
    auto stub = v1::WorkerService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    const auto context = [&](grpc::ClientContext& ctx, bool with_wrong_key) {
      ctx.set_deadline(In(std::chrono::seconds(5)));
      rpc::Authorize(ctx, security);
      if (with_wrong_key) rpc::AddCommandKey(ctx, rpc::RandomKey());
    };
    for (bool wrong_key : {false, true}) {
      SCOPED_TRACE(address + (wrong_key ? " with a guessed key" : " without a key"));
      {
        grpc::ClientContext ctx;
        context(ctx, wrong_key);
        v1::StopStageRequest stop;
        stop.set_job_id("job-0001");
        stop.set_reason("a hostile stop");
        v1::AssignResponse out;
        EXPECT_TRUE(refused(stub->StopStage(&ctx, stop, &out)));
      }
      {
        grpc::ClientContext ctx;
        context(ctx, wrong_key);
        v1::StageAssignment assign;
        assign.set_job_id("job-9999");
        v1::AssignResponse out;
        EXPECT_TRUE(refused(stub->AssignStage(&ctx, assign, &out)));
      }
      {
        grpc::ClientContext ctx;
        context(ctx, wrong_key);
        v1::SendCommandRequest command;
        command.set_job_id("job-0001");
        command.set_command(v1::STEP_COMMAND_STOP);
        v1::SendCommandResponse out;
        EXPECT_TRUE(refused(stub->ScheduleCommand(&ctx, command, &out)));
      }
      {
        grpc::ClientContext ctx;
        context(ctx, wrong_key);
        v1::PingResponse out;
        EXPECT_TRUE(refused(stub->Ping(&ctx, v1::PingRequest(), &out)));
      }
      {
        // The survivors' state is served only with its hold's key (and nothing is held
        // while the job runs): no chunk, whatever key is guessed.
        grpc::ClientContext ctx;
        context(ctx, wrong_key);
        v1::FetchLayerStateRequest fetch;
        fetch.set_job_id("job-0001");
        fetch.set_layer(0);
        fetch.set_state_key(rpc::RandomKey());
        auto reader = stub->FetchLayerState(&ctx, fetch);
        v1::LayerStateChunk chunk;
        EXPECT_FALSE(reader->Read(&chunk));
        const grpc::Status s = reader->Finish();
        // The same answer whether or not anything is held: the key is checked first.
        EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
      }
    }
    // Registering at this busy worker's address with the join token.
    auto coordinator = v1::CoordinatorService::NewStub(
        grpc::CreateChannel(cluster.address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(In(std::chrono::seconds(5)));
    rpc::Authorize(ctx, security);
    v1::RegisterWorkerRequest r;
    r.set_address(address);
    r.set_command_key(rpc::RandomKey());
    v1::RegisterWorkerResponse out;
    const grpc::Status taken = coordinator->RegisterWorker(&ctx, r, &out);
    EXPECT_EQ(taken.error_code(), grpc::StatusCode::ALREADY_EXISTS) << taken.error_message();
  }
  const nlohmann::json done = cluster.WaitForJob(
      "job-0001",
      [](const nlohmann::json& j) {
        const std::string s = StateOf(j);
        return s == "JOB_STATE_SUCCEEDED" || s == "JOB_STATE_FAILED";
      },
      std::chrono::seconds(120));
  EXPECT_EQ(StateOf(done), "JOB_STATE_SUCCEEDED") << done.dump();
  EXPECT_EQ(Int64Of(done, "restarts", 0), 0);
  EXPECT_EQ(cluster.Workers().size(), 2u);
}

TEST_F(AuthTest, DirectCallsWithoutTheTokenGetUnauthenticatedOnEveryService) {
  LocalCluster cluster(dir_, WithToken());
  ASSERT_FALSE(cluster.address().empty());
  cluster.StartWorker({"--token-file", token_});
  ASSERT_TRUE(cluster.WaitForIdleWorkers(1));
  const auto unauthenticated = [](const grpc::Status& s) {
    return s.error_code() == grpc::StatusCode::UNAUTHENTICATED &&
           s.error_message() == "missing or wrong token";
  };

  // A wrong token, and the same header twice, are refused too; the right one passes.
  auto jobs = cluster.JobStub();
  const auto list_with = [&](const std::vector<std::string>& headers) {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(std::chrono::seconds(5)));
    for (const std::string& h : headers) ctx.AddMetadata("authorization", h);
    v1::ListWorkersResponse response;
    grpc::Status s = jobs->ListWorkers(&ctx, v1::ListWorkersRequest(), &response);
    return std::make_pair(s, response);
  };
  EXPECT_TRUE(unauthenticated(list_with({"Bearer pt-guess"}).first));
  EXPECT_TRUE(unauthenticated(list_with({kToken}).first));  // without the scheme
  EXPECT_TRUE(
      unauthenticated(list_with({std::string("Bearer ") + kToken, "Bearer pt-guess"}).first));
  EXPECT_TRUE(unauthenticated(list_with({std::string("Bearer ") + kToken + "x"}).first));
  auto [ok, listed] = list_with({std::string("Bearer ") + kToken});
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  ASSERT_EQ(listed.workers_size(), 1);
  const std::string worker = listed.workers(0).address();

  // Every method of every pipetrain.v1 service, walked from the service descriptors (a
  // method added later is called too), without the token: UNAUTHENTICATED, no response.
  const std::vector<std::pair<std::vector<std::string>, std::string>> services = {
      {MethodPaths<v1::JobService>(), cluster.address()},
      {MethodPaths<v1::CoordinatorService>(), cluster.address()},
      {MethodPaths<v1::WorkerService>(), worker}};
  size_t called = 0;
  for (const auto& [paths, address] : services) {
    EXPECT_FALSE(paths.empty()) << "a service is not in the descriptor pool";
    const auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    for (const std::string& path : paths) {
      const Call call = CallWithoutToken(channel, path);
      EXPECT_TRUE(unauthenticated(call.status))
          << path << ": " << call.status.error_code() << " " << call.status.error_message();
      EXPECT_EQ(call.responses, 0) << path;
      ++called;
    }
    // Health checking and reflection stay open on the same server.
    const Call health = CallWithoutToken(channel, "/grpc.health.v1.Health/Check");
    EXPECT_TRUE(health.status.ok()) << address << ": " << health.status.error_message();
    EXPECT_EQ(health.responses, 1) << address;
    const Call reflection =
        CallWithoutToken(channel, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo");
    EXPECT_FALSE(unauthenticated(reflection.status)) << address;
    EXPECT_EQ(reflection.responses, 1) << address;
  }
  EXPECT_GE(called, 8u + 10u + 3u);  // at least the methods there were when this was written

  // Nothing changed: no job (SubmitJob was called), the worker idle and never asked to run
  // anything (AssignStage was called).
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(std::chrono::seconds(5)));
    rpc::SecurityOptions security;
    security.token = kToken;
    rpc::Authorize(ctx, security);
    v1::ListJobsResponse response;
    grpc::Status s = jobs->ListJobs(&ctx, v1::ListJobsRequest(), &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(response.jobs_size(), 0);
  }
  EXPECT_THAT(ReadFile(cluster.worker_log(0)), Not(HasSubstr("running rank")));
  const auto after = cluster.Workers();
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].value("state", ""), "WORKER_STATE_IDLE");
}

}  // namespace
}  // namespace pipetrain::test::auth_test
