#include "runtime/base/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace pipetrain::subprocess {
namespace {

// Starts argv[0]; the child's stdout goes to `stdout_fd` when >= 0 (after the options' file).
absl::StatusOr<pid_t> StartWith(const std::vector<std::string>& args, const Options& options,
                                int stdout_fd) {
  if (args.empty()) return absl::InvalidArgumentError("no program to start");
  // Everything the child needs is made here: between fork and exec only async-signal-safe
  // calls.
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  int out = -1, in = -1;
  if (!options.output_file.empty()) {
    out = open(options.output_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot open ", options.output_file, ": ", std::strerror(errno)));
    }
  }
  if (options.stdin_null) in = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    if (options.death_signal != 0 &&
        (prctl(PR_SET_PDEATHSIG, options.death_signal) != 0 || getppid() != parent)) {
      _exit(127);
    }
    if (in >= 0 && dup2(in, 0) < 0) _exit(127);
    if (out >= 0 && (dup2(out, 1) < 0 || dup2(out, 2) < 0)) _exit(127);
    if (stdout_fd >= 0 && dup2(stdout_fd, 1) < 0) _exit(127);
    execve(argv[0], argv.data(), environ);
    _exit(127);
  }
  const int fork_errno = errno;
  if (out >= 0) close(out);
  if (in >= 0) close(in);
  if (pid < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot start ", args[0], ": ", std::strerror(fork_errno)));
  }
  return pid;
}

}  // namespace

absl::StatusOr<pid_t> Start(const std::vector<std::string>& argv, const Options& options) {
  return StartWith(argv, options, -1);
}

absl::Status Exec(const std::vector<std::string>& args) {
  if (args.empty()) return absl::InvalidArgumentError("no program to run");
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  execve(argv[0], argv.data(), environ);
  return absl::UnavailableError(absl::StrCat("cannot start ", args[0], ": ", std::strerror(errno)));
}

int Wait(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return status;
}

bool Exited(pid_t pid) {
  if (pid <= 0) return true;
  int status = 0;
  pid_t reaped;
  while ((reaped = waitpid(pid, &status, WNOHANG)) < 0 && errno == EINTR) {
  }
  return reaped == pid || (reaped < 0 && errno == ECHILD);  // ECHILD: reaped before
}

int Stop(pid_t pid, int signal, absl::Duration grace) {
  if (pid <= 0) return -1;
  kill(pid, signal);
  const absl::Time deadline = absl::Now() + grace;
  int status = 0;
  while (absl::Now() < deadline) {
    const pid_t reaped = waitpid(pid, &status, WNOHANG);
    if (reaped == pid) return ExitCode(status);
    if (reaped < 0 && errno != EINTR) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  status = Wait(pid);
  return status < 0 ? -1 : ExitCode(status);
}

int ExitCode(int wait_status) { return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1; }

std::string DescribeExit(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) return absl::StrCat("was killed by signal ", WTERMSIG(wait_status));
  return "stopped";
}

absl::StatusOr<Captured> RunCapturingStdout(const std::vector<std::string>& argv) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  Options options;
  options.stdin_null = false;
  absl::StatusOr<pid_t> pid = StartWith(argv, options, pipe_fds[1]);
  close(pipe_fds[1]);
  if (!pid.ok()) {
    close(pipe_fds[0]);
    return pid.status();
  }
  Captured captured;
  char buffer[1 << 16];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof buffer)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    captured.stdout_text.append(buffer, static_cast<size_t>(n));
  }
  close(pipe_fds[0]);
  const int status = Wait(*pid);
  captured.exit_code = status < 0 ? -1 : ExitCode(status);
  return captured;
}

}  // namespace pipetrain::subprocess
