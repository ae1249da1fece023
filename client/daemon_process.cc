#include "client/daemon_process.h"

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "runtime/base/subprocess.h"

namespace pipetrain::client {
namespace {

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

pid_t SpawnDaemon(const std::vector<std::string>& argv, const std::string& log, int death_signal) {
  subprocess::Options options;
  options.output_file = log;
  options.death_signal = death_signal;
  absl::StatusOr<pid_t> pid = subprocess::Start(argv, options);
  return pid.ok() ? *pid : -1;
}

absl::StatusOr<std::string> WaitForPortFile(const std::string& port_file, pid_t pid,
                                            absl::Duration timeout, const std::string& log) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const std::string whole = ReadWhole(port_file);
    if (!whole.empty() && whole.back() == '\n') return whole.substr(0, whole.find('\n'));
    if (subprocess::Exited(pid)) {
      return absl::UnavailableError(
          absl::StrCat(log, ": it exited before serving:\n", LogTail(log)));
    }
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          log, ": it did not serve within ", absl::FormatDuration(timeout), ":\n", LogTail(log)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string MetricsAddress(const std::string& port_file) {
  const std::string whole = ReadWhole(port_file);
  const std::string key = "\nmetrics ";
  const size_t at = whole.find(key);
  if (at == std::string::npos) return "";
  const size_t end = whole.find('\n', at + key.size());
  return end == std::string::npos ? "" : whole.substr(at + key.size(), end - at - key.size());
}

std::string LogTail(const std::string& log, int n) {
  std::vector<std::string> lines = absl::StrSplit(ReadWhole(log), '\n', absl::SkipEmpty());
  const size_t from = lines.size() > static_cast<size_t>(n) ? lines.size() - n : 0;
  std::string out;
  for (size_t i = from; i < lines.size(); ++i) out += "    " + lines[i] + "\n";
  return out;
}

}  // namespace pipetrain::client
