#include "rpc/protobuf_logs.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>

#include <google/protobuf/stubs/logging.h>

namespace pipetrain::rpc {
namespace {

std::atomic<int64_t> last_printed_ms{-1};
std::atomic<int64_t> left_out{0};

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Handler(google::protobuf::LogLevel level, const char* filename, int line,
             const std::string& message) {
  const bool malformed = message.find("invalid UTF-8") != std::string::npos;
  if (malformed) {
    const int64_t now = NowMs(), last = last_printed_ms.load();
    if (last >= 0 && now - last < 10000) {
      ++left_out;
      return;
    }
    last_printed_ms = now;
  }
  static const char* const kLevels[] = {"INFO", "WARNING", "ERROR", "FATAL"};
  const int64_t skipped = malformed ? left_out.exchange(0) : 0;
  std::fprintf(
      stderr, "[libprotobuf %s %s:%d] %s%s\n", kLevels[level], filename, line, message.c_str(),
      skipped > 0 ? (" (" + std::to_string(skipped) + " more like it left out)").c_str() : "");
}

}  // namespace

void QuietMalformedRequestLogs() { google::protobuf::SetLogHandler(&Handler); }

}  // namespace pipetrain::rpc
