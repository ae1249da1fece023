// The control plane's security, with real processes on loopback: a coordinator and workers
// that share a token (and, in the last test, mutual TLS with certificates made by openssl
// at test time). A call without the right token is refused with UNAUTHENTICATED — exit 4
// and one clear line from the CLI — and changes nothing; with it, a job runs to the end.
#include <stdlib.h>
#include <sys/wait.h>

#include <chrono>
#include <string>
#include <thread>
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
#include "tests/daemons/local_cluster.h"

namespace pipetrain::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "pt-7d1f0c9a4e5b8326-secret";
constexpr char kRefused[] = "refused the call: missing or wrong token";

constexpr char kJob[] = R"(model: {name: gpt, d_model: 16, n_heads: 2, n_layers: 2}
schedule: 1f1b
stages: 2
microbatches: 2
microbatch_size: 2
steps: 3
)";

std::chrono::system_clock::time_point In(std::chrono::seconds s) {
  return std::chrono::system_clock::now() + s;
}

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
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          S::service_full_name());
  std::vector<std::string> paths;
  if (descriptor == nullptr) return paths;
  for (int i = 0; i < descriptor->method_count(); ++i) {
    paths.push_back("/" + descriptor->full_name() + "/" + descriptor->method(i)->name());
  }
  return paths;
}

// Waits up to `timeout` for the child `pid` to exit, leaving it to be reaped by its owner.
bool WaitForExit(pid_t pid, std::chrono::seconds timeout = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == pid) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

class AuthTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    unsetenv("PIPETRAIN_TOKEN");  // neither the daemons nor the CLI may find one by accident
    token_ = Write("token", std::string(kToken) + "\n").string();
    wrong_ = Write("wrong", "pt-0000000000000000-guess\n").string();
    job_ = Write("job.yaml", kJob).string();
  }

  // A coordinator asking for the token; the CLI helpers of the cluster give it.
  ClusterOptions WithToken() const {
    ClusterOptions o;
    o.coordinator_args = {"--token-file", token_};
    o.cli_args = {"--token-file", token_};
    return o;
  }

  // The CLI with exactly `args` (no cluster defaults), against `cluster`.
  static Result Bare(LocalCluster& cluster, const std::string& args) {
    return cluster.Shell(std::string(LocalCluster::cli_path()) + " " + args + " --coordinator " +
                         cluster.address());
  }

  std::string token_, wrong_, job_;
};

TEST_F(AuthTest, CallsWithoutTheTokenExit4AndChangeNothingThenTheRightTokenRunsAJob) {
  LocalCluster cluster(dir_, WithToken());
  ASSERT_FALSE(cluster.address().empty());
  EXPECT_THAT(ReadFile(cluster.coordinator_log()), HasSubstr("token required"));
  EXPECT_THAT(ReadFile(cluster.coordinator_log()), Not(HasSubstr(kToken)));  // never printed
  cluster.StartWorker({"--token-file", token_});
  cluster.StartWorker({"--token-file", token_});
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2)) << ReadFile(cluster.worker_log(0));

  const std::vector<std::string> commands = {"submit " + job_,  "cancel job-0001",
                                             "list",            "status job-0001",
                                             "logs job-0001",   "workers",
                                             "stop job-0001"};
  const std::vector<std::pair<std::string, std::string>> wrong_ways = {
      {"no token", ""},
      {"wrong token file", "--token-file " + wrong_},
      {"wrong $PIPETRAIN_TOKEN", "env PIPETRAIN_TOKEN=pt-guess "}};
  for (const auto& [how, extra] : wrong_ways) {
    for (const std::string& command : commands) {
      const bool env = extra.rfind("env ", 0) == 0;
      Result r = env ? cluster.Shell(extra + LocalCluster::cli_path() + " " + command +
                                     " --coordinator " + cluster.address())
                     : Bare(cluster, command + " " + extra);
      EXPECT_EQ(r.exit_code, 4) << how << ": " << command << "\n" << r.out << r.err;
      EXPECT_THAT(r.err, HasSubstr("the coordinator at " + cluster.address() + " " + kRefused))
          << how << ": " << command;
      EXPECT_THAT(r.err, HasSubstr("--token-file or PIPETRAIN_TOKEN")) << how << ": " << command;
      EXPECT_EQ(r.out, "") << how << ": " << command;
    }
  }
  // Health stays open for probes that cannot carry a token.
  EXPECT_EQ(Bare(cluster, "health").exit_code, 0);

  // Nothing changed: no job, both workers idle and never asked to run anything.
  Result list = cluster.Cli("list -o json");
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(list.out, "");
  const auto workers = cluster.Workers();
  ASSERT_EQ(workers.size(), 2u);
  for (const auto& w : workers) {
    EXPECT_EQ(w.value("state", ""), "WORKER_STATE_IDLE") << w.dump();
    EXPECT_EQ(w.value("job_id", ""), "") << w.dump();
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_THAT(ReadFile(cluster.worker_log(i)), Not(HasSubstr("running rank")));
  }

  // With the token a job runs to the end, on workers that present the same token.
  Result submitted = cluster.Cli("submit " + job_ + " --follow");
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out << submitted.err
                                    << ReadFile(cluster.coordinator_log());
  EXPECT_THAT(submitted.out, HasSubstr("job-0001 succeeded"));
  // The token from the environment works as well as from a file.
  Result by_env = cluster.Shell(std::string("env PIPETRAIN_TOKEN=") + kToken + " " +
                                LocalCluster::cli_path() + " list -o json --coordinator " +
                                cluster.address());
  ASSERT_EQ(by_env.exit_code, 0) << by_env.err;
  const auto jobs = JsonLines(by_env.out);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(StateOf(jobs[0]), "JOB_STATE_SUCCEEDED");
  // A finished job cannot be cancelled by a caller without the token either: still 4.
  EXPECT_EQ(Bare(cluster, "cancel job-0001").exit_code, 4);
  EXPECT_EQ(StateOf(cluster.JobStatus("job-0001")), "JOB_STATE_SUCCEEDED");
}

// With a separate join token for workers, the people's token cannot register a worker and
// the workers' token cannot reach the job service; each in its place runs a job.
TEST_F(AuthTest, PeopleAndWorkersHaveSeparateTokens) {
  const std::string join = Write("join", "pt-join-0123456789abcdef\n").string();
  ClusterOptions o = WithToken();
  o.coordinator_args = {"--token-file", token_, "--worker-token-file", join};
  LocalCluster cluster(dir_, o);
  ASSERT_FALSE(cluster.address().empty());
  EXPECT_THAT(ReadFile(cluster.coordinator_log()), HasSubstr("user and worker tokens required"));
  const int with_user_token = cluster.StartWorker({"--token-file", token_});
  EXPECT_TRUE(WaitForExit(cluster.worker_pid(with_user_token)));
  EXPECT_EQ(cluster.StopWorker(with_user_token), 4) << ReadFile(cluster.worker_log(0));
  cluster.StartWorker({"--token-file", join});
  ASSERT_TRUE(cluster.WaitForIdleWorkers(1)) << ReadFile(cluster.worker_log(1));
  for (const std::string& command : {std::string("list"), "submit " + job_, std::string("workers")}) {
    Result r = Bare(cluster, command + " --token-file " + join);
    EXPECT_EQ(r.exit_code, 4) << command << ": " << r.err;
  }
  Result list = cluster.Cli("list -o json");
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(list.out, "");  // nothing was submitted with the workers' token
  Result submitted = cluster.Cli("submit " + job_ + " --stages 1 --follow");
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out << submitted.err
                                    << ReadFile(cluster.coordinator_log());
  EXPECT_THAT(submitted.out, HasSubstr("job-0001 succeeded"));
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
  ASSERT_FALSE(cluster.WaitForJob("job-0001", [](const nlohmann::json& j) {
                        return Int64Of(j, "step", -1) >= 2;
                      }).is_null());
  rpc::SecurityOptions security;
  security.token = kToken;
  const auto workers = cluster.Workers();
  ASSERT_EQ(workers.size(), 2u);
  std::vector<std::string> paths = MethodPaths<v1::WorkerService>();
  EXPECT_EQ(paths.size(), 4u) << "a WorkerService method was added: call it below too";
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
      "job-0001", [](const nlohmann::json& j) {
        const std::string s = StateOf(j);
        return s == "JOB_STATE_SUCCEEDED" || s == "JOB_STATE_FAILED";
      },
      std::chrono::seconds(120));
  EXPECT_EQ(StateOf(done), "JOB_STATE_SUCCEEDED") << done.dump();
  EXPECT_EQ(Int64Of(done, "restarts", 0), 0);
  EXPECT_EQ(cluster.Workers().size(), 2u);
}

TEST_F(AuthTest, WorkerWithoutTheRightTokenCannotRegister) {
  LocalCluster cluster(dir_, WithToken());
  ASSERT_FALSE(cluster.address().empty());
  const auto start = std::chrono::steady_clock::now();
  const int wrong = cluster.StartWorker({"--token-file", wrong_, "--register-timeout", "60"});
  const int none = cluster.StartWorker({"--register-timeout", "60"});
  // Refused at once (retrying cannot help): each exits by itself with 4, and its log says
  // why. (StopWorker then only reaps it.)
  EXPECT_TRUE(WaitForExit(cluster.worker_pid(wrong))) << ReadFile(cluster.worker_log(wrong));
  EXPECT_TRUE(WaitForExit(cluster.worker_pid(none))) << ReadFile(cluster.worker_log(none));
  EXPECT_EQ(cluster.StopWorker(wrong), 4) << ReadFile(cluster.worker_log(wrong));
  EXPECT_EQ(cluster.StopWorker(none), 4) << ReadFile(cluster.worker_log(none));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  for (int i : {wrong, none}) {
    const std::string log = ReadFile(cluster.worker_log(i));
    EXPECT_THAT(log, HasSubstr("UNAUTHENTICATED"));
    EXPECT_THAT(log, HasSubstr("missing or wrong token"));
    EXPECT_THAT(log, Not(HasSubstr("registered as")));
  }
  Result workers = cluster.Cli("workers -o json");
  ASSERT_EQ(workers.exit_code, 0) << workers.err;
  EXPECT_EQ(workers.out, "");
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
    const Call reflection = CallWithoutToken(
        channel, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo");
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

TEST_F(AuthTest, MutualTlsRunsAJobAndRefusesClientsWithoutAValidCertificate) {
  if (std::system("command -v openssl >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "openssl is not installed; it makes the test's certificates";
  }
  // A CA, one certificate for every process (server and client use, named 127.0.0.1), and a
  // certificate from another CA that must not be accepted.
  const std::string d = dir_.string();
  const std::string make_certs =
      "set -e; cd " + d + "; "
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n"
      "extendedKeyUsage=serverAuth,clientAuth\\n' > ext.cnf; "
      "for ca in ca rogue; do "
      "  openssl req -x509 -newkey rsa:2048 -nodes -keyout $ca.key -out $ca.pem -days 2 "
      "    -subj /CN=pipetrain-test-$ca; "
      "done; "
      "for pair in node:ca stranger:rogue; do n=${pair%:*}; ca=${pair#*:}; "
      "  openssl req -newkey rsa:2048 -nodes -keyout $n.key -out $n.csr -subj /CN=127.0.0.1; "
      "  openssl x509 -req -in $n.csr -CA $ca.pem -CAkey $ca.key -CAcreateserial -out $n.pem "
      "    -days 2 -extfile ext.cnf; "
      "done";
  ASSERT_EQ(std::system(("(" + make_certs + ") >" + d + "/openssl.log 2>&1").c_str()), 0)
      << ReadFile(dir_ / "openssl.log");
  const std::vector<std::string> tls = {"--tls-cert", d + "/node.pem", "--tls-key",
                                        d + "/node.key", "--tls-ca", d + "/ca.pem"};
  ClusterOptions o = WithToken();
  o.coordinator_args.insert(o.coordinator_args.end(), tls.begin(), tls.end());
  o.worker_args = {"--token-file", token_};
  o.worker_args.insert(o.worker_args.end(), tls.begin(), tls.end());
  o.cli_args.insert(o.cli_args.end(), tls.begin(), tls.end());
  o.workers = 2;
  LocalCluster cluster(dir_, o);
  ASSERT_FALSE(cluster.address().empty());
  EXPECT_THAT(ReadFile(cluster.coordinator_log()), HasSubstr("mutual TLS"));
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2)) << ReadFile(cluster.worker_log(0));

  // Refused: plaintext; TLS without a client certificate; a certificate from another CA.
  // The handshake fails, so the CLI sees the coordinator as unavailable (exit 5).
  const std::string ca = " --tls-ca " + d + "/ca.pem";
  for (const std::string& how :
       {std::string(""), ca,
        ca + " --tls-cert " + d + "/stranger.pem --tls-key " + d + "/stranger.key"}) {
    Result r = Bare(cluster, "submit " + job_ + " --timeout 5 --token-file " + token_ + how);
    EXPECT_EQ(r.exit_code, 5) << how << "\n" << r.err;
    EXPECT_EQ(r.out, "") << how;
  }
  // A good certificate without the token: still refused by the token check.
  Result no_token = Bare(cluster, "list" + ca + " --tls-cert " + d + "/node.pem --tls-key " + d +
                                      "/node.key");
  EXPECT_EQ(no_token.exit_code, 4) << no_token.err;
  EXPECT_THAT(no_token.err, HasSubstr(kRefused));

  Result list = cluster.Cli("list -o json");
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(list.out, "");  // nothing got through
  Result submitted = cluster.Cli("submit " + job_ + " --follow");
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out << submitted.err
                                    << ReadFile(cluster.coordinator_log());
  EXPECT_THAT(submitted.out, HasSubstr("job-0001 succeeded"));
}

TEST(RpcSecurity, LoopbackAddresses) {
  for (const char* a : {"127.0.0.1:7070", "127.1.2.3:0", "localhost:7070", "LOCALHOST:1",
                        "[::1]:7070", "unix:/tmp/pipetrain.sock"}) {
    EXPECT_TRUE(rpc::IsLoopback(a)) << a;
    EXPECT_EQ(rpc::ListenWarning(a, {}), "") << a;
  }
  for (const char* a : {"0.0.0.0:7070", "[::]:7070", "10.0.0.5:7070", "node1:7070", ":7070"}) {
    EXPECT_FALSE(rpc::IsLoopback(a)) << a;
    EXPECT_THAT(rpc::ListenWarning(a, {}), HasSubstr("neither a token nor mutual TLS")) << a;
  }
  rpc::SecurityOptions token_only;
  token_only.token = "t";
  EXPECT_THAT(rpc::ListenWarning("0.0.0.0:7070", token_only), HasSubstr("plaintext"));
  rpc::SecurityOptions mtls;
  mtls.token = "t";
  mtls.tls_cert = "cert.pem";
  mtls.tls_key = "key.pem";
  mtls.tls_ca = "ca.pem";
  EXPECT_EQ(rpc::ListenWarning("0.0.0.0:7070", mtls), "");
}

TEST_F(AuthTest, TokenFromFileOrEnvironment) {
  auto from_file = rpc::LoadToken(token_);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ(*from_file, kToken);  // the newline dropped
  auto none = rpc::LoadToken("");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, "");
  setenv("PIPETRAIN_TOKEN", " from-env\n", 1);
  auto from_env = rpc::LoadToken("");
  unsetenv("PIPETRAIN_TOKEN");
  ASSERT_TRUE(from_env.ok());
  EXPECT_EQ(*from_env, "from-env");
  auto missing = rpc::LoadToken((dir_ / "absent").string());
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("absent"));
  auto empty = rpc::LoadToken(Write("empty", " \n").string());
  EXPECT_FALSE(empty.ok());
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("empty"));
  auto two_lines = rpc::LoadToken(Write("two", "abc\ndef\n").string());
  EXPECT_FALSE(two_lines.ok());
  EXPECT_THAT(std::string(two_lines.status().message()), Not(HasSubstr("abc")));
  // The daemons and the CLI refuse an unreadable token file as bad usage (exit 2).
  Result cli = Result{};
  {
    LocalCluster cluster(dir_, ClusterOptions{});
    ASSERT_FALSE(cluster.address().empty());
    cli = Bare(cluster, "list --token-file " + (dir_ / "absent").string());
  }
  EXPECT_EQ(cli.exit_code, 2) << cli.err;
  EXPECT_THAT(cli.err, HasSubstr("--token-file"));
}

}  // namespace
}  // namespace pipetrain::test
