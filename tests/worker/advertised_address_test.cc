// The address a worker advertises: the host of --listen, --advertise-address, or --iface's
// address; a wildcard with nothing else is refused naming the flags; an unknown interface
// too. On this host's own interfaces (loopback is always there).
#include "worker/advertised_address.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pipetrain::worker {
namespace {

using ::testing::HasSubstr;

TEST(AdvertisedAddress, ListenHostElseAdvertiseAddressElseTheInterfacesAddress) {
  absl::StatusOr<AdvertisedAddress> a = ChooseAdvertisedAddress("127.0.0.1:0", "", "");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->iface, "lo");  // the interface that holds it

  a = ChooseAdvertisedAddress("0.0.0.0:7071", "10.9.8.7", "");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "10.9.8.7");
  EXPECT_EQ(a->iface, "");  // not an address of this host

  a = ChooseAdvertisedAddress("0.0.0.0:7071", "", "lo");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->iface, "lo");

  a = ChooseAdvertisedAddress("[::]:7071", "[fd00::2]", "");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "fd00::2");
  EXPECT_EQ(JoinHostPort(a->host, 7071), "[fd00::2]:7071");
  EXPECT_EQ(JoinHostPort("10.0.0.2", 7071), "10.0.0.2:7071");
}

TEST(AdvertisedAddress, AWildcardOrAnUnknownInterfaceIsRefusedNamingTheFlags) {
  for (const char* listen : {"0.0.0.0:7071", "[::]:0"}) {
    absl::StatusOr<AdvertisedAddress> a = ChooseAdvertisedAddress(listen, "", "");
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << listen;
    EXPECT_THAT(a.status().message(), HasSubstr("--advertise-address ADDR or --iface NAME"));
  }
  EXPECT_THAT(ChooseAdvertisedAddress("127.0.0.1:0", "0.0.0.0", "").status().message(),
              HasSubstr("is a wildcard"));
  EXPECT_THAT(ChooseAdvertisedAddress("0.0.0.0:0", "", "nosuch0").status().message(),
              HasSubstr("--iface: this host has no interface nosuch0"));
  EXPECT_TRUE(IsWildcardHost("0.0.0.0"));
  EXPECT_FALSE(IsWildcardHost("10.0.0.1"));
}

// --advertise-address is a host without a port: an address with a port in it (it was once
// taken, and the worker registered at "127.0.0.1:5:PORT"), a malformed name or address, and
// control characters are refused, the text shown escaped; addresses and names are taken.
TEST(AdvertisedAddress, AnAdvertisedAddressMustBeAHostWithoutAPort) {
  for (const char* bad : {"127.0.0.1:5", "[fd00::2]:7071", "node-3:80", "300.1.2.3", "a..b", "-",
                          "node_3", "10.0.0.2 ", "\x1b[31mevil"}) {
    absl::StatusOr<AdvertisedAddress> a = ChooseAdvertisedAddress("0.0.0.0:7071", bad, "");
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(a.status().message(), HasSubstr("is not a host")) << bad;
    EXPECT_THAT(a.status().message(), HasSubstr("the port is the one --listen binds"));
    EXPECT_THAT(std::string(a.status().message()), ::testing::Not(HasSubstr("\x1b"))) << bad;
  }
  EXPECT_THAT(ChooseAdvertisedAddress("0.0.0.0:0", "\x1b[31mevil", "").status().message(),
              HasSubstr("'\\x1b[31mevil'"));
  // Negative control: hosts are taken.
  for (const char* good :
       {"10.0.0.2", "fd00::2", "[fd00::2]", "node-3", "node-3.cluster.local", "::1"}) {
    EXPECT_TRUE(ChooseAdvertisedAddress("0.0.0.0:7071", good, "").ok()) << good;
  }
}

// The host a worker registers: Slurm's node name under Slurm (several nodes may share one
// hostname there), else the hostname.
TEST(AdvertisedAddress, TheHostIsSlurmsNodeNameElseTheHostname) {
  char hostname[256] = {0};
  ASSERT_EQ(gethostname(hostname, sizeof(hostname) - 1), 0);
  const char* before = std::getenv("SLURMD_NODENAME");
  const std::string saved = before ? before : "";
  setenv("SLURMD_NODENAME", "n3", 1);
  EXPECT_EQ(DefaultHostName(), "n3");
  unsetenv("SLURMD_NODENAME");
  EXPECT_EQ(DefaultHostName(), hostname);
  if (before) setenv("SLURMD_NODENAME", saved.c_str(), 1);
}

// A WorkerService on loopback is reached at no other address: with an address advertised
// elsewhere it listens there instead, on the port asked; everything else as given.
TEST(AdvertisedAddress, ALoopbackListenMovesToTheAdvertisedAddress) {
  EXPECT_EQ(ListenAddressFor("127.0.0.1:0", {"10.0.0.2", "eth0"}), "10.0.0.2:0");
  EXPECT_EQ(ListenAddressFor("localhost:7071", {"fd00::2", ""}), "[fd00::2]:7071");
  EXPECT_EQ(ListenAddressFor("127.0.0.1:7071", {"127.0.0.1", "lo"}), "127.0.0.1:7071");
  EXPECT_EQ(ListenAddressFor("0.0.0.0:7071", {"10.0.0.2", "eth0"}), "0.0.0.0:7071");
  EXPECT_EQ(ListenAddressFor("10.0.0.2:0", {"10.0.0.2", "eth0"}), "10.0.0.2:0");
}

}  // namespace
}  // namespace pipetrain::worker
