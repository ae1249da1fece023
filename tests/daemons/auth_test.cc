// The control plane's security, with real processes on loopback: a coordinator and workers
// that share a token (and, in the last test, mutual TLS with certificates made by openssl
// at test time). A call without the right token is refused with UNAUTHENTICATED — exit 4
// and one clear line from the CLI — and changes nothing; with it, a job runs to the end.
// Direct gRPC calls (every method of every service, a worker's commands with the join
// token) are tested in auth_direct_calls_test.cc; the fixture is in auth_fixture.h.
#include <stdlib.h>

#include <chrono>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "rpc/security.h"
#include "tests/daemons/auth_fixture.h"
#include "tests/daemons/local_cluster.h"

namespace pipetrain::test::auth_test {
namespace {

TEST_F(AuthTest, CallsWithoutTheTokenExit4AndChangeNothingThenTheRightTokenRunsAJob) {
  LocalCluster cluster(dir_, WithToken());
  ASSERT_FALSE(cluster.address().empty());
  EXPECT_THAT(ReadFile(cluster.coordinator_log()), HasSubstr("token required"));
  EXPECT_THAT(ReadFile(cluster.coordinator_log()), Not(HasSubstr(kToken)));  // never printed
  cluster.StartWorker({"--token-file", token_});
  cluster.StartWorker({"--token-file", token_});
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2)) << ReadFile(cluster.worker_log(0));

  const std::vector<std::string> commands = {"submit " + job_,  "cancel job-0001", "list",
                                             "status job-0001", "logs job-0001",   "workers",
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
  ASSERT_EQ(submitted.exit_code, 0)
      << submitted.out << submitted.err << ReadFile(cluster.coordinator_log());
  EXPECT_THAT(submitted.out, HasSubstr("job-0001 succeeded"));
  // The token from the environment works as well as from a file.
  Result by_env =
      cluster.Shell(std::string("env PIPETRAIN_TOKEN=") + kToken + " " + LocalCluster::cli_path() +
                    " list -o json --coordinator " + cluster.address());
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
  for (const std::string& command :
       {std::string("list"), "submit " + job_, std::string("workers")}) {
    Result r = Bare(cluster, command + " --token-file " + join);
    EXPECT_EQ(r.exit_code, 4) << command << ": " << r.err;
  }
  Result list = cluster.Cli("list -o json");
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(list.out, "");  // nothing was submitted with the workers' token
  Result submitted = cluster.Cli("submit " + job_ + " --stages 1 --follow");
  ASSERT_EQ(submitted.exit_code, 0)
      << submitted.out << submitted.err << ReadFile(cluster.coordinator_log());
  EXPECT_THAT(submitted.out, HasSubstr("job-0001 succeeded"));
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

TEST_F(AuthTest, MutualTlsRunsAJobAndRefusesClientsWithoutAValidCertificate) {
  if (std::system("command -v openssl >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "openssl is not installed; it makes the test's certificates";
  }
  // A CA, one certificate for every process (server and client use, named 127.0.0.1), and a
  // certificate from another CA that must not be accepted.
  const std::string d = dir_.string();
  const std::string make_certs =
      "set -e; cd " + d +
      "; "
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
  const std::vector<std::string> tls = {"--tls-cert",    d + "/node.pem", "--tls-key",
                                        d + "/node.key", "--tls-ca",      d + "/ca.pem"};
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
  Result no_token =
      Bare(cluster, "list" + ca + " --tls-cert " + d + "/node.pem --tls-key " + d + "/node.key");
  EXPECT_EQ(no_token.exit_code, 4) << no_token.err;
  EXPECT_THAT(no_token.err, HasSubstr(kRefused));

  Result list = cluster.Cli("list -o json");
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(list.out, "");  // nothing got through
  Result submitted = cluster.Cli("submit " + job_ + " --follow");
  ASSERT_EQ(submitted.exit_code, 0)
      << submitted.out << submitted.err << ReadFile(cluster.coordinator_log());
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
}  // namespace pipetrain::test::auth_test
