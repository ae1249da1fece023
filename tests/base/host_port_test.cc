// The one host:port parser (runtime/base/host_port.h): IPv4, names, bracketed IPv6 and the
// empty host; every malformed form refused saying which rule it broke; the host of an
// address; joining back; the loopback test.
#include "runtime/base/host_port.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

TEST(HostPort, ParsesEveryFormAndJoinsBack) {
  struct Case {
    const char* text;
    const char* host;
    int port;
  };
  for (const Case& c : {Case{"10.0.0.2:7071", "10.0.0.2", 7071}, Case{"node-3:0", "node-3", 0},
                        Case{"[fd00::2]:7071", "fd00::2", 7071}, Case{":8080", "", 8080},
                        Case{"[::]:65535", "::", 65535}}) {
    SCOPED_TRACE(c.text);
    absl::StatusOr<HostPort> parsed = ParseHostPort(c.text);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->host, c.host);
    EXPECT_EQ(parsed->port, c.port);
    EXPECT_EQ(HostOf(c.text), c.host);
    if (parsed->host.empty()) continue;
    EXPECT_EQ(JoinHostPort(parsed->host, parsed->port), c.text);
  }
}

TEST(HostPort, RefusesWhatIsNoHostPortSayingWhy) {
  for (const char* text : {"no-port", "fd00::2", "::1", "[fd00::2"}) {
    SCOPED_TRACE(text);
    absl::StatusOr<HostPort> parsed = ParseHostPort(text);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("expected HOST:PORT"));
  }
  for (const char* text : {"h:99999", "h:-1", "h:", "h:80x"}) {
    SCOPED_TRACE(text);
    EXPECT_THAT(std::string(ParseHostPort(text).status().message()),
                HasSubstr("not a number from 0 to 65535"));
  }
  EXPECT_THAT(std::string(ParseHostPort("h:0", 1).status().message()),
              HasSubstr("not a number from 1 to 65535"));
  EXPECT_EQ(HostOf("fd00::2"), "fd00::2");  // a bare IPv6 address: no port to take off
}

TEST(HostPort, LoopbackIsLocalhostThe127NetworkAndV6One) {
  for (const char* host : {"localhost", "LocalHost", "127.0.0.1", "127.5.6.7", "::1", "[::1]"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
  for (const char* host : {"10.0.0.2", "0.0.0.0", "::", "fd00::1", "localhost.example", ""}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
}

}  // namespace
}  // namespace pipetrain
