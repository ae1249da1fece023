// Hosts as network namespaces. See namespace_hosts.h.
#include "tests/multihost/namespace_hosts.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "runtime/base/status_macros.h"
#include "runtime/base/subprocess.h"

namespace pipetrain::test {
namespace {

// iproute2's `ip`, wherever this system keeps it; "" if nowhere.
const std::string& IpPath() {
  static const std::string path = [] {
    for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
      if (access(p, X_OK) == 0) return std::string(p);
    }
    return std::string();
  }();
  return path;
}

// Every command run on a host ends within this (a hung client must not hang the test).
constexpr char kRunLimit[] = "120";

}  // namespace

NamespaceHosts::NamespaceHosts(int hosts, std::string prefix, int subnet)
    : hosts_(hosts), prefix_(std::move(prefix)), subnet_(subnet) {}

absl::Status NamespaceHosts::Ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {IpPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<subprocess::Captured> ran = subprocess::RunCapturingStdout(argv);
  if (!ran.ok()) return ran.status();
  if (ran->exit_code != 0) {
    return absl::UnavailableError(
        absl::StrCat("`ip ", absl::StrJoin(args, " "), "` exited ", ran->exit_code));
  }
  return absl::OkStatus();
}

absl::Status NamespaceHosts::Shape(int host, const std::string& iface, const std::string& rate) {
  // A burst of 256 KiB holds a timer tick's worth at a few Gbit/s; a queue of 400 ms keeps
  // bursts of large messages from being dropped.
  return Ip({"netns", "exec", Namespace(host), "tc", "qdisc", "replace", "dev", iface, "root",
             "tbf", "rate", rate, "burst", "256kb", "latency", "400ms"});
}

std::string NamespaceHosts::Namespace(int host) const { return absl::StrCat(prefix_, "-h", host); }
std::string NamespaceHosts::Bridges() const { return absl::StrCat(prefix_, "-net"); }

std::string NamespaceHosts::DataAddress(int host) const {
  return absl::StrCat("10.231.", subnet_, ".", 10 + host);
}
std::string NamespaceHosts::ManagementAddress(int host) const {
  return absl::StrCat("10.232.", subnet_, ".", 10 + host);
}

absl::StatusOr<std::unique_ptr<NamespaceHosts>> NamespaceHosts::Create(int hosts) {
  if (geteuid() != 0) {
    return absl::UnavailableError("network namespaces need root (CAP_NET_ADMIN); not root here");
  }
  if (IpPath().empty()) return absl::UnavailableError("iproute2's `ip` is not installed");
  // Namespaces of test processes that died without removing them.
  if (absl::StatusOr<subprocess::Captured> listed =
          subprocess::RunCapturingStdout({IpPath(), "netns", "list"});
      listed.ok()) {
    std::istringstream lines(listed->stdout_text);
    for (std::string line; std::getline(lines, line);) {
      const std::string name = line.substr(0, line.find(' '));
      absl::string_view rest = name;
      int pid = 0;
      if (!absl::ConsumePrefix(&rest, "pt")) continue;
      if (!absl::SimpleAtoi(rest.substr(0, rest.find('-')), &pid)) continue;
      if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
        (void)subprocess::RunCapturingStdout({IpPath(), "netns", "del", name});
      }
    }
  }
  const pid_t self = getpid();
  std::unique_ptr<NamespaceHosts> h(
      new NamespaceHosts(hosts, absl::StrCat("pt", self), 1 + self % 250));
  if (absl::Status s = h->Ip({"netns", "add", h->Bridges()}); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot make network namespaces on this machine: ", s.message()));
  }
  const std::string net = h->Bridges();
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"-n", net, "link", "add", "br0", "type", "bridge"},
        {"-n", net, "link", "set", "br0", "up"}}) {
    if (absl::Status s = h->Ip(args); !s.ok()) return s;
  }
  for (int host = 0; host < hosts; ++host) {
    const std::string ns = h->Namespace(host);
    const std::string link = absl::StrCat(h->prefix_, "-d", host);
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"netns", "add", ns},
          {"link", "add", link, "netns", net, "type", "veth", "peer", "name", "eth0", "netns", ns},
          {"-n", net, "link", "set", link, "master", "br0", "up"},
          {"-n", ns, "link", "set", "lo", "up"},
          {"-n", ns, "addr", "add", h->DataAddress(host) + "/24", "dev", "eth0"},
          {"-n", ns, "link", "set", "eth0", "up"}}) {
      if (absl::Status s = h->Ip(args); !s.ok()) return s;
    }
  }
  return h;
}

absl::Status NamespaceHosts::AddManagementNetwork(const std::vector<int>& hosts) {
  const std::string net = Bridges();
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"-n", net, "link", "add", "br1", "type", "bridge"},
        {"-n", net, "link", "set", "br1", "up"}}) {
    if (absl::Status s = Ip(args); !s.ok()) return s;
  }
  for (int host : hosts) {
    const std::string ns = Namespace(host);
    const std::string link = absl::StrCat(prefix_, "-m", host);
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"link", "add", link, "netns", net, "type", "veth", "peer",
                                   "name", "eth1", "netns", ns},
          {"-n", net, "link", "set", link, "master", "br1", "up"},
          {"-n", ns, "addr", "add", ManagementAddress(host) + "/24", "dev", "eth1"},
          {"-n", ns, "link", "set", "eth1", "up"}}) {
      if (absl::Status s = Ip(args); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status NamespaceHosts::SetLink(int host, const std::string& iface, bool up) {
  return Ip({"-n", Namespace(host), "link", "set", iface, up ? "up" : "down"});
}

absl::StatusOr<pid_t> NamespaceHosts::Start(int host, const std::vector<std::string>& argv,
                                            const std::filesystem::path& log) {
  std::vector<std::string> in_host = {IpPath(), "netns", "exec", Namespace(host)};
  in_host.insert(in_host.end(), argv.begin(), argv.end());
  subprocess::Options options;
  options.output_file = log.string();
  options.death_signal = SIGKILL;
  absl::StatusOr<pid_t> pid = subprocess::Start(in_host, options);
  if (pid.ok()) started_.push_back({*pid, host});
  return pid;
}

absl::Status NamespaceHosts::Cut(int a, int b) {
  for (const auto& [from, to] : {std::pair<int, int>{a, b}, {b, a}}) {
    PT_RETURN_IF_ERROR(
        Ip({"-n", Namespace(from), "route", "add", "blackhole", DataAddress(to) + "/32"}));
  }
  return absl::OkStatus();
}

absl::Status NamespaceHosts::Join(int a, int b) {
  for (const auto& [from, to] : {std::pair<int, int>{a, b}, {b, a}}) {
    PT_RETURN_IF_ERROR(
        Ip({"-n", Namespace(from), "route", "del", "blackhole", DataAddress(to) + "/32"}));
  }
  return absl::OkStatus();
}

void NamespaceHosts::KillHost(int host) {
  std::vector<std::pair<pid_t, int>> others;
  for (const auto& [pid, on] : started_) {
    if (on == host) {
      subprocess::Stop(pid, SIGKILL, absl::Seconds(5));
    } else {
      others.push_back({pid, on});
    }
  }
  started_.swap(others);
}

NamespaceHosts::Ran NamespaceHosts::Run(int host, const std::vector<std::string>& argv) {
  std::vector<std::string> in_host = {"/usr/bin/timeout", kRunLimit, IpPath(), "netns", "exec",
                                      Namespace(host)};
  in_host.insert(in_host.end(), argv.begin(), argv.end());
  absl::StatusOr<subprocess::Captured> ran = subprocess::RunCapturingStdout(in_host);
  if (!ran.ok()) return {};
  return {ran->exit_code, ran->stdout_text};
}

int64_t NamespaceHosts::TxBytes(int host, const std::string& iface) {
  const Ran ran = Run(host, {"/bin/cat", "/sys/class/net/" + iface + "/statistics/tx_bytes"});
  int64_t bytes = -1;
  if (ran.exit_code != 0 || !absl::SimpleAtoi(absl::StripAsciiWhitespace(ran.out), &bytes)) {
    return -1;
  }
  return bytes;
}

NamespaceHosts::~NamespaceHosts() {
  for (const auto& [pid, host] : started_) subprocess::Stop(pid, SIGKILL, absl::Seconds(5));
  for (int host = 0; host < hosts_; ++host) (void)Ip({"netns", "del", Namespace(host)});
  (void)Ip({"netns", "del", Bridges()});
}

}  // namespace pipetrain::test
