// Servers of the control plane take their address exclusively (rpc/listen.h): a second
// server on a port a live one serves is refused, and the error says the port is in use. The
// negative control shows what gRPC does by default: with SO_REUSEPORT a second server binds
// the same port too (and would take a share of the first one's connections).
#include "rpc/listen.h"

#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "pipetrain/v1/worker_service.grpc.pb.h"

namespace pipetrain::rpc {
namespace {

using ::testing::HasSubstr;

// A server of a service whose methods are all unimplemented (a server needs one to start).
std::unique_ptr<grpc::Server> Serve(const std::string& address, bool exclusive, int* port) {
  static v1::WorkerService::Service unimplemented;
  grpc::ServerBuilder builder;
  builder.RegisterService(&unimplemented);
  if (exclusive) {
    ListenExclusively(builder, address, grpc::InsecureServerCredentials(), port);
  } else {
    builder.AddListeningPort(address, grpc::InsecureServerCredentials(), port);
  }
  return builder.BuildAndStart();
}

TEST(ListenTest, ASecondServerOnALivePortIsRefusedNamingWhy) {
  int first_port = 0;
  std::unique_ptr<grpc::Server> first = Serve("127.0.0.1:0", /*exclusive=*/true, &first_port);
  ASSERT_NE(first, nullptr);
  ASSERT_GT(first_port, 0);
  const std::string taken = "127.0.0.1:" + std::to_string(first_port);
  // Exclusive or not, a second server cannot share it.
  for (const bool exclusive : {true, false}) {
    int port = 0;
    std::unique_ptr<grpc::Server> second = Serve(taken, exclusive, &port);
    EXPECT_TRUE(second == nullptr || port == 0) << "exclusive " << exclusive;
  }
  const absl::Status why = CannotListen("--listen", taken);
  EXPECT_TRUE(absl::IsUnavailable(why));
  EXPECT_THAT(std::string(why.message()), HasSubstr("--listen " + taken +
                                                    ": cannot listen there (the port is in use: "
                                                    "another process listens there)"));
  // Once the first is gone the address is free again (SO_REUSEADDR, as before).
  first->Shutdown();
  first.reset();
  int again = 0;
  std::unique_ptr<grpc::Server> next = Serve(taken, /*exclusive=*/true, &again);
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(again, first_port);
}

// The negative control: gRPC's default, SO_REUSEPORT, lets two servers share a port; an
// exclusive one is refused next to a server that allows sharing too.
TEST(ListenTest, WithoutExclusiveBindingTwoServersShareAPort) {
  int first_port = 0;
  std::unique_ptr<grpc::Server> first = Serve("127.0.0.1:0", /*exclusive=*/false, &first_port);
  ASSERT_NE(first, nullptr);
  const std::string shared = "127.0.0.1:" + std::to_string(first_port);
  int second_port = 0;
  std::unique_ptr<grpc::Server> second = Serve(shared, /*exclusive=*/false, &second_port);
  EXPECT_NE(second, nullptr);
  EXPECT_EQ(second_port, first_port) << "gRPC's default no longer shares ports";
  int exclusive_port = 0;
  std::unique_ptr<grpc::Server> exclusive = Serve(shared, /*exclusive=*/true, &exclusive_port);
  EXPECT_TRUE(exclusive == nullptr || exclusive_port == 0);
}

TEST(ListenTest, CannotListenSaysWhyForOtherFailures) {
  EXPECT_THAT(std::string(CannotListen("--listen", "10.255.255.1:0").message()),
              HasSubstr("not an address of this machine"));
  EXPECT_THAT(std::string(CannotListen("--listen", "127.0.0.1:99999").message()),
              HasSubstr("not a number from 0 to 65535"));
  EXPECT_THAT(std::string(CannotListen("--listen", "no-port").message()),
              HasSubstr("expected HOST:PORT"));
}

}  // namespace
}  // namespace pipetrain::rpc
