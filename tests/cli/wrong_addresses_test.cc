// Every command of the CLI pointed at the wrong place or given garbage ends with a clear
// error and its exit code, in bounded time: never a hang, an abort (134) or an uncaught
// exception. The wrong places are real servers on loopback: a closed port, a server that
// accepts and says nothing, one that sends garbage, an HTTP server, and a gRPC server that
// is not a coordinator (health service only, as a worker's port answers health checks).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "pipetrain/v1/worker_service.grpc.pb.h"
#include "runtime/base/exit_codes.h"
#include "tests/cli/cli_fixture.h"

namespace pipetrain::cli_test {
namespace {

using ::testing::Not;

// A TCP server on 127.0.0.1 that answers every connection with `greeting` (nothing if empty)
// and then reads and drops what it is sent until the peer goes; or that closes at once.
class RawServer {
 public:
  explicit RawServer(std::string greeting, bool close_at_once = false)
      : greeting_(std::move(greeting)), close_at_once_(close_at_once) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(fd_, 64), 0);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    accepter_ = std::thread([this] { Accept(); });
  }
  ~RawServer() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    accepter_.join();
    for (std::thread& t : connections_) t.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  void Accept() {
    while (!stop_) {
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      connections_.emplace_back([this, c] {
        if (!greeting_.empty()) (void)!send(c, greeting_.data(), greeting_.size(), MSG_NOSIGNAL);
        if (!close_at_once_) {
          timeval tv{0, 200000};
          setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
          char buf[4096];
          while (!stop_) {
            const ssize_t n = recv(c, buf, sizeof(buf), 0);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) break;
          }
        }
        close(c);
      });
    }
  }

  std::string greeting_;
  bool close_at_once_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread accepter_;
  std::vector<std::thread> connections_;
};

// A port nothing listens on (bound, then closed).
std::string ClosedAddress() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
}

// A gRPC server of another service than the coordinator's (WorkerService, every method
// unimplemented, and gRPC health): the kind of port a worker serves.
class OtherGrpcServer {
 public:
  OtherGrpcServer() {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.RegisterService(&service_);
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    server_ = builder.BuildAndStart();
  }
  ~OtherGrpcServer() { server_->Shutdown(); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  v1::WorkerService::Service service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// How a command that failed must end: an exit code of the table (never a signal's 128+N),
// one "pipetrain: " line naming `address` (escaped if need be) when there is one, no trace
// of an uncaught exception, within `seconds`.
::testing::AssertionResult EndsClearly(const Result& r, const std::vector<int>& codes,
                                       const std::string& address, double seconds) {
  if (std::find(codes.begin(), codes.end(), r.exit_code) == codes.end()) {
    return ::testing::AssertionFailure() << "exit code " << r.exit_code << "\n" << r.err;
  }
  if (r.err.rfind("pipetrain: ", 0) != 0) {
    return ::testing::AssertionFailure() << "no 'pipetrain: ' error line: " << r.err;
  }
  if (!address.empty() && r.err.find(address) == std::string::npos) {
    return ::testing::AssertionFailure() << "the error does not name " << address << ": " << r.err;
  }
  for (const char* trace : {"terminate called", "internal error", "Aborted", "core dumped"}) {
    if (r.err.find(trace) != std::string::npos) {
      return ::testing::AssertionFailure() << "'" << trace << "' in: " << r.err;
    }
  }
  if (r.seconds > seconds) {
    return ::testing::AssertionFailure()
           << "took " << r.seconds << " s (at most " << seconds << "): " << r.err;
  }
  return ::testing::AssertionSuccess();
}

TEST_F(CliTest, EveryJobCommandAtAWrongAddressEndsWithACleanErrorNamingIt) {
  const fs::path job = Write("job.yaml", "steps: 2\nschedule: 1f1b\n");
  RawServer silent(""), garbage(std::string("\x17\x03\x03\x00\x10garbage-not-http2", 22)),
      http("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", /*close_at_once=*/true);
  OtherGrpcServer grpc_not_coordinator;
  const std::vector<std::pair<std::string, std::string>> places = {
      {"closed port", ClosedAddress()},
      {"silent server", silent.address()},
      {"garbage server", garbage.address()},
      {"HTTP server", http.address()},
      {"gRPC server that is not a coordinator", grpc_not_coordinator.address()},
  };
  const std::vector<std::string> commands = {
      "submit " + job.string(),
      "status job-0001",
      "metrics job-0001",
      "list",
      "cancel job-0001",
      "flush job-0001",
      "switch job-0001",
      "checkpoint job-0001",
      "stop job-0001",
      "logs job-0001",
      "logs -f job-0001",
      "workers",
      "health",
  };
  for (const auto& [what, address] : places) {
    for (const std::string& command : commands) {
      SCOPED_TRACE(what + ": " + command);
      const Result r = Run(command + " --coordinator " + address + " --timeout 1");
      // 5: nothing (that speaks the coordinator's service) answered there.
      EXPECT_TRUE(EndsClearly(r, {exit_code::kUnavailable}, address, 8));
    }
  }
}

TEST_F(CliTest, ProfileLinkAtAPortThatIsNoLinkListenerSaysWhatAnsweredAtOnce) {
  RawServer silent(""), http("HTTP/1.1 400 Bad Request\r\n\r\n", /*close_at_once=*/true);
  OtherGrpcServer grpc_server;  // e.g. the coordinator's port, as an operator may mistype
  struct Case {
    std::string address, says;
    int exit_code;
  };
  const std::vector<Case> cases = {
      {grpc_server.address(), "speaks HTTP/2 (a gRPC server", exit_code::kUsage},
      {http.address(), "speaks HTTP", exit_code::kUsage},
      {silent.address(), "answered no store's query within 5 s", exit_code::kUsage},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.address);
    const Result r = Run("profile-link --connect " + c.address + " --address 127.0.0.1");
    EXPECT_TRUE(EndsClearly(r, {c.exit_code}, c.address, 15));
    EXPECT_THAT(r.err, HasSubstr("is not a store of pipetrain's"));
    EXPECT_THAT(r.err, HasSubstr(c.says));
    EXPECT_THAT(r.err, HasSubstr("--connect takes what `pipetrain profile-link --listen"));
  }
}

TEST_F(CliTest, GarbageArgumentsAreRefusedWithTheirExitCode) {
  const fs::path binary = Write("binary.yaml", std::string("\x00\xff\xfe\x1b[31m\x01", 8));
  const std::string escape = "'\x1b[31mred:1'";
  struct Case {
    std::string args;
    int exit_code;
  };
  const std::vector<Case> cases = {
      {"status", exit_code::kUsage},  // no job id
      {"status job-0001 --timeout abc", exit_code::kUsage},
      {"metrics job-0001 -o xml", exit_code::kUsage},
      {"flush job-0001 --at-step -3", exit_code::kUsage},
      {"submit /nonexistent/job.yaml", exit_code::kNotFound},
      {"submit " + binary.string(), exit_code::kUsage},
      {"status job-0001 --timeout 1 --coordinator " + escape, exit_code::kUnavailable},
      {"status job-0001 --timeout 1 --coordinator no-port-here", exit_code::kUnavailable},
      {"profile-link", exit_code::kUsage},
      {"profile-link --connect garbage --address 127.0.0.1", exit_code::kUsage},
      {"profile-link --connect 127.0.0.1:99999 --address 127.0.0.1", exit_code::kUsage},
      {"profile-link --connect 127.0.0.1:5000", exit_code::kUsage},  // no --address
      {"no-such-command", exit_code::kUsage},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const Result r = Run(c.args);
    EXPECT_TRUE(EndsClearly(r, {c.exit_code}, "", 10));
    // Whatever came from the command line is shown escaped, never raw.
    EXPECT_THAT(r.err, Not(HasSubstr("\x1b[31m")));
  }
}

// The check above fails a command that aborts or runs over its time, and one whose error
// does not name the address: it can tell.
TEST(EndsClearlyTest, FailsAnAbortASlowCommandAndAnErrorThatNamesNothing) {
  Result aborted{134, "", "terminate called after throwing an instance of 'std::system_error'\n",
                 1.0};
  EXPECT_FALSE(EndsClearly(aborted, {exit_code::kUnavailable}, "", 10));
  Result slow{5, "", "pipetrain: status: no coordinator answered at 127.0.0.1:1 (...)\n", 121};
  EXPECT_FALSE(EndsClearly(slow, {exit_code::kUnavailable}, "127.0.0.1:1", 10));
  Result unnamed{5, "", "pipetrain: status: unavailable\n", 1};
  EXPECT_FALSE(EndsClearly(unnamed, {exit_code::kUnavailable}, "127.0.0.1:1", 10));
  Result fine{5, "", "pipetrain: status: no coordinator answered at 127.0.0.1:1 (...)\n", 1};
  EXPECT_TRUE(EndsClearly(fine, {exit_code::kUnavailable}, "127.0.0.1:1", 10));
}

}  // namespace
}  // namespace pipetrain::cli_test
