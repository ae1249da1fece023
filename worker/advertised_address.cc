// The address a worker advertises. See advertised_address.h.
#include "worker/advertised_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pipetrain::worker {
namespace {

// "[v6]" -> "v6"; anything else as it is.
std::string WithoutBrackets(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

// The host of "host:port" or "[v6]:port", brackets removed.
std::string HostOf(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  return WithoutBrackets(colon == std::string::npos ? listen : listen.substr(0, colon));
}

// "localhost", 127.0.0.0/8, "::1".
bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// Every address of this host's interfaces, with the interface's name.
template <typename Visit>
void ForEachInterfaceAddress(Visit visit) {
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return;
  for (struct ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    char text[INET6_ADDRSTRLEN] = {0};
    const int family = a->ifa_addr->sa_family;
    if (family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text,
                sizeof(text));
    } else if (family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, text,
                sizeof(text));
    } else {
      continue;
    }
    if (visit(std::string(a->ifa_name), family, std::string(text))) break;
  }
  freeifaddrs(list);
}

}  // namespace

bool IsWildcardHost(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

std::string JoinHostPort(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return v6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

std::string ListenAddressFor(const std::string& listen, const AdvertisedAddress& advertised) {
  if (!IsLoopbackHost(HostOf(listen)) || IsLoopbackHost(advertised.host)) return listen;
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port)) {
    return listen;
  }
  return JoinHostPort(advertised.host, port);
}

absl::StatusOr<std::string> AddressOfInterface(const std::string& name) {
  bool exists = false;
  std::string found;
  ForEachInterfaceAddress([&](const std::string& iface, int family, const std::string& text) {
    if (iface != name) return false;
    exists = true;
    if (family != AF_INET) return false;
    found = text;
    return true;
  });
  if (!found.empty()) return found;
  return absl::NotFoundError(exists ? absl::StrCat("interface ", name, " has no IPv4 address")
                                    : absl::StrCat("this host has no interface ", name));
}

std::string InterfaceHolding(const std::string& host) {
  std::string found;
  ForEachInterfaceAddress([&](const std::string& iface, int, const std::string& text) {
    if (text != host) return false;
    found = iface;
    return true;
  });
  return found;
}

absl::StatusOr<AdvertisedAddress> ChooseAdvertisedAddress(const std::string& listen,
                                                          const std::string& advertise,
                                                          const std::string& iface) {
  AdvertisedAddress chosen;
  if (!advertise.empty()) {
    chosen.host = WithoutBrackets(advertise);
    if (IsWildcardHost(chosen.host)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--advertise-address ", advertise, " is a wildcard: give the address its peers and "
          "the coordinator reach this worker at"));
    }
  } else if (!iface.empty()) {
    absl::StatusOr<std::string> address = AddressOfInterface(iface);
    if (!address.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--iface: ", address.status().message()));
    }
    chosen.host = *address;
  } else {
    chosen.host = HostOf(listen);
    if (IsWildcardHost(chosen.host)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--listen ", listen, " listens on every address, which is not one its peers can "
          "reach: say which with --advertise-address ADDR or --iface NAME"));
    }
  }
  chosen.iface = !iface.empty() ? iface : InterfaceHolding(chosen.host);
  return chosen;
}

std::string DefaultHostName() {
  if (const char* node = std::getenv("SLURMD_NODENAME"); node != nullptr && *node != '\0') {
    return node;
  }
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) return "";
  return host;
}

}  // namespace pipetrain::worker
