#include "client/daemon_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

extern char** environ;

namespace pipetrain::client {
namespace {

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int ExitCodeOf(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

}  // namespace

pid_t SpawnDaemon(const std::vector<std::string>& args, const std::string& log,
                  int death_signal) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = getpid();
  const pid_t pid = out >= 0 && in >= 0 && !args.empty() ? fork() : -1;
  if (pid == 0) {  // only async-signal-safe calls from here to exec
    if (prctl(PR_SET_PDEATHSIG, death_signal) != 0 || getppid() != parent) _exit(127);
    if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0) _exit(127);
    execve(argv[0], argv.data(), environ);
    _exit(127);
  }
  if (out >= 0) close(out);
  if (in >= 0) close(in);
  return pid > 0 ? pid : -1;
}

absl::StatusOr<std::string> WaitForPortFile(const std::string& port_file, pid_t pid,
                                            absl::Duration timeout, const std::string& log) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const std::string whole = ReadWhole(port_file);
    if (!whole.empty() && whole.back() == '\n') return whole.substr(0, whole.find('\n'));
    if (DaemonExited(pid)) {
      return absl::UnavailableError(absl::StrCat(log, ": it exited before serving:\n",
                                                 LogTail(log)));
    }
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(log, ": it did not serve within ",
                                                 absl::FormatDuration(timeout), ":\n",
                                                 LogTail(log)));
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

int StopDaemon(pid_t pid, int signal, absl::Duration grace) {
  if (pid <= 0) return -1;
  kill(pid, signal);
  const absl::Time deadline = absl::Now() + grace;
  int status = 0;
  while (absl::Now() < deadline) {
    const pid_t reaped = waitpid(pid, &status, WNOHANG);
    if (reaped == pid) return ExitCodeOf(status);
    if (reaped < 0) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  return waitpid(pid, &status, 0) == pid ? ExitCodeOf(status) : -1;
}

bool DaemonExited(pid_t pid) {
  int status = 0;
  return pid <= 0 || waitpid(pid, &status, WNOHANG) == pid;
}

std::string LogTail(const std::string& log, int n) {
  std::vector<std::string> lines = absl::StrSplit(ReadWhole(log), '\n', absl::SkipEmpty());
  const size_t from = lines.size() > static_cast<size_t>(n) ? lines.size() - n : 0;
  std::string out;
  for (size_t i = from; i < lines.size(); ++i) out += "    " + lines[i] + "\n";
  return out;
}

}  // namespace pipetrain::client
