// Several hosts on one machine, for the tests of what crosses a network: each host a Linux
// network namespace with its own loopback and, on the data network, an interface `eth0` with
// an address of its own (10.231.N.10 + host), joined to the others' by a bridge that lives in
// a namespace of its own. A second network (`eth1`, 10.232.N.10 + host) joins only the hosts
// given to AddManagementNetwork. Every process a test runs on a host is started inside its
// namespace (`ip netns exec`) and sees only that host's interfaces, so the daemons' traffic
// between hosts crosses the veth links, where it is counted (TxBytes).
//
// Needs root (CAP_NET_ADMIN) and iproute2; Create says why when it cannot (a test then
// skips). Namespaces are named pt<pid>-..., and those of a test process no longer alive are
// removed at Create, so a test killed by its timeout leaves nothing for long. Destruction
// kills every process started (SIGKILL), then removes every namespace (and with them their
// links and the bridges). Not thread-safe.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pipetrain::test {

class NamespaceHosts {
 public:
  // Hosts 0..hosts-1 on the data network.
  static absl::StatusOr<std::unique_ptr<NamespaceHosts>> Create(int hosts);
  ~NamespaceHosts();
  NamespaceHosts(const NamespaceHosts&) = delete;
  NamespaceHosts& operator=(const NamespaceHosts&) = delete;

  int hosts() const { return hosts_; }
  // Host `host`'s address on the data network (eth0), and on the management network (eth1).
  std::string DataAddress(int host) const;
  std::string ManagementAddress(int host) const;

  // A second network, `eth1` on each of `hosts`, on a bridge of its own.
  absl::Status AddManagementNetwork(const std::vector<int>& hosts);
  // Shapes what `host` sends on `iface` to `rate` (tc's units: "200mbit") with a token
  // bucket (tbf), as a slower link between hosts is: what it sends its own addresses stays
  // on its loopback, unshaped.
  absl::Status Shape(int host, const std::string& iface, const std::string& rate);
  // Takes `iface` of `host` down (cut off) or up again.
  absl::Status SetLink(int host, const std::string& iface, bool up);
  // Drops every packet between hosts `a` and `b` on the data network, both ways (a blackhole
  // route on each), the rest of their links untouched; Join undoes it.
  absl::Status Cut(int a, int b);
  absl::Status Join(int a, int b);
  // Kills (SIGKILL) every process started on `host`, as if it died, and reaps them.
  void KillHost(int host);

  // Starts `argv` (argv[0] a path) on `host` with its output in `log`; its pid. Killed with
  // the hosts, and when this process dies.
  absl::StatusOr<pid_t> Start(int host, const std::vector<std::string>& argv,
                              const std::filesystem::path& log);
  // Runs `argv` on `host` to its end: its exit code and stdout (stderr goes to `log` if
  // given).
  struct Ran {
    int exit_code = -1;
    std::string out;
  };
  Ran Run(int host, const std::vector<std::string>& argv);
  // Bytes `iface` of `host` has sent so far (its kernel counter).
  int64_t TxBytes(int host, const std::string& iface);

 private:
  NamespaceHosts(int hosts, std::string prefix, int subnet);
  std::string Namespace(int host) const;
  std::string Bridges() const;
  // `ip ARGS...`, its exit code 0 or why not.
  absl::Status Ip(const std::vector<std::string>& args);

  const int hosts_;
  const std::string prefix_;                    // pt<pid>
  const int subnet_;                            // N in 10.231.N.0/24 and 10.232.N.0/24
  std::vector<std::pair<pid_t, int>> started_;  // pid, host
};

}  // namespace pipetrain::test
