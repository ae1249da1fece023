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
#include "absl/strings/str_split.h"
#include "runtime/base/printable.h"

namespace pipetrain::worker {
namespace {

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

// Whether `host` (brackets removed) is an IPv4 or IPv6 address or a DNS name: labels of 1 to
// 63 letters, digits and '-' (not first or last) joined by dots, at most 253 bytes. A name of
// digits and dots only must be an IPv4 address ("300.1.2.3" is neither).
bool IsHost(const std::string& host) {
  in6_addr v6;
  in_addr v4;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return true;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return true;
  if (host.empty() || host.size() > 253) return false;
  bool all_digits = true;
  for (absl::string_view label : absl::StrSplit(host, '.')) {
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return false;
    }
    for (const char c : label) {
      const bool digit = c >= '0' && c <= '9';
      const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      if (!digit && !letter && c != '-') return false;
      all_digits = all_digits && digit;
    }
  }
  return !all_digits;
}

}  // namespace

bool IsWildcardHost(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

std::string ListenAddressFor(const std::string& listen, const AdvertisedAddress& advertised) {
  if (!IsLoopbackHost(HostOf(listen)) || IsLoopbackHost(advertised.host)) return listen;
  const absl::StatusOr<HostPort> parsed = ParseHostPort(listen);
  if (!parsed.ok()) return listen;
  return JoinHostPort(advertised.host, parsed->port);
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
    if (!IsHost(chosen.host)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--advertise-address '", Printable(advertise),
          "' is not a host: give an address or "
          "a name without a port (10.0.0.2, fd00::2, node-3); the port is the one --listen "
          "binds"));
    }
    if (IsWildcardHost(chosen.host)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--advertise-address ", advertise,
                       " is a wildcard: give the address its peers and "
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
      return absl::InvalidArgumentError(
          absl::StrCat("--listen ", listen,
                       " listens on every address, which is not one its peers can "
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
