// Where a worker is reached: the one address it advertises, to the coordinator for its
// WorkerService and to its peers for its data plane (its Gloo device binds there; NCCL is
// told the interface that holds it), so that a worker on a host with several interfaces is
// reached on the one its peers share.
//
// Chosen from, in order: --advertise-address; the first IPv4 address of --iface; the host
// of --listen when that is an address of its own. A wildcard --listen (0.0.0.0, [::]) with
// neither is an error that names the flags: a wildcard is not an address anyone can reach.
// Pure but for reading the host's interfaces (getifaddrs). Thread-compatible.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "runtime/base/host_port.h"

namespace pipetrain::worker {

struct AdvertisedAddress {
  std::string host;   // an address or a name, no port ("10.0.0.2", "fd00::2", "node-3")
  std::string iface;  // the interface that holds it; "" when not one of this host's addresses
};

// `listen`: --listen (host:port); `advertise`: --advertise-address, a host without a port
// ("" if not given);
// `iface`: --iface ("" if not given). InvalidArgument naming the flag for an interface
// without an IPv4 address, an unknown interface, or a wildcard with nothing else to go on.
absl::StatusOr<AdvertisedAddress> ChooseAdvertisedAddress(const std::string& listen,
                                                          const std::string& advertise,
                                                          const std::string& iface);

// Where the WorkerService listens: `listen` (--listen, host:port), except a loopback host
// when the advertised host is not one: a socket on loopback is reached at no other address,
// so it listens on the advertised host instead, on --listen's port ("127.0.0.1:0" advertised
// as 10.0.0.2 -> "10.0.0.2:0").
std::string ListenAddressFor(const std::string& listen, const AdvertisedAddress& advertised);

// The first IPv4 address of interface `name` (NotFound when it has none or does not exist).
absl::StatusOr<std::string> AddressOfInterface(const std::string& name);
// The interface of this host that holds address `host`; "" if none does (or `host` is a
// name, not an address).
std::string InterfaceHolding(const std::string& host);
// "0.0.0.0", "::", "[::]", "": a wildcard (or no) host.
bool IsWildcardHost(const std::string& host);
// (Addresses are parsed and joined by runtime/base/host_port.h.)

// The name of the machine a worker runs on, as it registers it (--host-name's default):
// Slurm's node name ($SLURMD_NODENAME) under Slurm, where several nodes may share one
// hostname, else the hostname.
std::string DefaultHostName();

}  // namespace pipetrain::worker
