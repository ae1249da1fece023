// `promtool check metrics` (Debian's prometheus package) on a text exposition, for the
// metrics tests.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include <unistd.h>

namespace pipetrain::metrics {

// Runs `promtool check metrics` on `text`; returns its output and exit status.
inline std::pair<int, std::string> Promtool(const std::string& text) {
  char path[] = "/tmp/pipetrain-metrics-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return {-1, "mkstemp"};
  FILE* f = fdopen(fd, "w");
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  FILE* p = popen((std::string("promtool check metrics < ") + path + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  std::remove(path);
  return {status, out};
}

}  // namespace pipetrain::metrics
