// Process-wide signal dispositions the runtime needs. Thread-safe.
#pragma once

#include <signal.h>

#include <mutex>

namespace pipetrain {

// Makes the process ignore SIGPIPE, once, unless it already has a handler of its own: a
// write to a socket whose peer died is then an error of that write (EPIPE), not the end of
// the process. Gloo writes to its sockets without MSG_NOSIGNAL.
inline void IgnoreSigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
  });
}

}  // namespace pipetrain
