// "host:port" and "[v6]:port", as every daemon flag, channel target and command line takes
// them: the one parser, the one joiner and the one loopback test. Header-only (absl only);
// pure functions, thread-safe.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

struct HostPort {
  std::string host;  // without brackets; empty for ":PORT" (every interface)
  int port = 0;
};

// "[v6]" -> "v6"; anything else as it is.
inline std::string WithoutBrackets(absl::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return std::string(host.substr(1, host.size() - 2));
  }
  return std::string(host);
}

// HOST:PORT, [V6]:PORT or :PORT, with a port from `min_port` to 65535. InvalidArgument
// saying "expected HOST:PORT" (no colon, or a bare IPv6 address) or "the port is not a
// number from MIN to 65535".
inline absl::StatusOr<HostPort> ParseHostPort(absl::string_view text, int min_port = 0) {
  const size_t colon = text.rfind(':');
  const absl::string_view host = colon == absl::string_view::npos ? text : text.substr(0, colon);
  const bool bracketed = !host.empty() && host.front() == '[';
  if (colon == absl::string_view::npos ||
      (bracketed ? host.back() != ']' : host.find(':') != absl::string_view::npos)) {
    return absl::InvalidArgumentError(absl::StrCat("expected HOST:PORT, got '", text, "'"));
  }
  HostPort out;
  if (!absl::SimpleAtoi(text.substr(colon + 1), &out.port) || out.port < min_port ||
      out.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("the port is not a number from ", min_port, " to 65535 in '", text, "'"));
  }
  out.host = WithoutBrackets(host);
  return out;
}

// The host of "host:port" or "[v6]:port" without brackets; the text itself when it has no
// port.
inline std::string HostOf(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return WithoutBrackets(address);
  const absl::string_view host = address.substr(0, colon);
  if (!host.empty() && host.front() != '[' && host.find(':') != absl::string_view::npos) {
    return std::string(address);  // a bare IPv6 address: no port
  }
  return WithoutBrackets(host);
}

// "host:port", an IPv6 host in brackets.
inline std::string JoinHostPort(absl::string_view host, int port) {
  const bool v6 = host.find(':') != absl::string_view::npos && host.front() != '[';
  return v6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

// "localhost", 127.0.0.0/8 and ::1 (any case), brackets or not.
inline bool IsLoopbackHost(absl::string_view host) {
  const std::string h = absl::AsciiStrToLower(WithoutBrackets(host));
  return h == "localhost" || h == "::1" || absl::StartsWith(h, "127.");
}

}  // namespace pipetrain
