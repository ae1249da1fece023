// Exclusive listening addresses. See listen.h.
#include "rpc/listen.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/host_port.h"

namespace pipetrain::rpc {
namespace {

// Why binding `address` fails now, as binding a socket there (exclusively, then closed at
// once) says; "" when it binds (the server failed for another reason).
std::string WhyNotBindable(const std::string& address) {
  const absl::StatusOr<HostPort> parsed = ParseHostPort(address);
  if (!parsed.ok()) return std::string(parsed.status().message());
  const std::string& host = parsed->host;
  const std::string port = std::to_string(parsed->port);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int resolved =
      getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
  if (resolved != 0) return absl::StrCat("its host does not resolve: ", gai_strerror(resolved));
  std::string why;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    // As gRPC binds: SO_REUSEADDR (a port in TIME_WAIT is free), never SO_REUSEPORT.
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const int bound = bind(fd, a->ai_addr, a->ai_addrlen);
    const int error = errno;
    close(fd);
    if (bound == 0) continue;
    switch (error) {
      case EADDRINUSE: why = "the port is in use: another process listens there"; break;
      case EADDRNOTAVAIL: why = "the host is not an address of this machine"; break;
      case EACCES: why = "a port below 1024 needs privileges"; break;
      default: why = std::strerror(error);
    }
    break;
  }
  freeaddrinfo(found);
  return why;
}

}  // namespace

void ListenExclusively(grpc::ServerBuilder& builder, const std::string& address,
                       const std::shared_ptr<grpc::ServerCredentials>& credentials, int* port) {
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(address, credentials, port);
}

absl::Status CannotListen(const std::string& flag, const std::string& address) {
  const std::string why = WhyNotBindable(address);
  return absl::UnavailableError(absl::StrCat(flag, " ", address, ": cannot listen there",
                                             why.empty() ? "" : absl::StrCat(" (", why, ")")));
}

}  // namespace pipetrain::rpc
