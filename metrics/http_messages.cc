// The /metrics endpoint's HTTP messages. See http_messages.h.
#include "metrics/http_messages.h"

#include <zlib.h>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/base/printable.h"

namespace pipetrain::metrics::http {
namespace {

Verdict BadRequest(absl::string_view why) {
  return {400, false, TextResponse(400, "Bad Request", absl::StrCat(why, "\n"))};
}

}  // namespace

std::string Response(int status, absl::string_view reason, absl::string_view content_type,
                     absl::string_view body, absl::string_view extra_headers) {
  return absl::StrCat("HTTP/1.1 ", status, " ", reason, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n",
                      extra_headers, "\r\n", body);
}

std::string TextResponse(int status, absl::string_view reason, absl::string_view body,
                         absl::string_view extra_headers) {
  return Response(status, reason, "text/plain; charset=utf-8", body, extra_headers);
}

bool AcceptsGzip(absl::string_view accept_encoding) {
  for (absl::string_view item : absl::StrSplit(accept_encoding, ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(item, ';');
    const absl::string_view coding = absl::StripAsciiWhitespace(parts[0]);
    if (!absl::EqualsIgnoreCase(coding, "gzip") && !absl::EqualsIgnoreCase(coding, "x-gzip")) {
      continue;
    }
    bool refused = false;
    for (size_t i = 1; i < parts.size(); ++i) {
      const absl::string_view param = absl::StripAsciiWhitespace(parts[i]);
      double q = 1;
      if (absl::StartsWithIgnoreCase(param, "q=") && absl::SimpleAtod(param.substr(2), &q) &&
          q <= 0) {
        refused = true;
      }
    }
    if (!refused) return true;
  }
  return false;
}

bool Gzip(const std::string& text, std::string* out) {
  if (text.size() > std::numeric_limits<uInt>::max() / 2) return false;
  z_stream z{};
  // windowBits 15 + 16: a gzip header and trailer around the deflate stream.
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return false;
  }
  out->resize(deflateBound(&z, static_cast<uLong>(text.size())));
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out->data());
  z.avail_out = static_cast<uInt>(out->size());
  const int result = deflate(&z, Z_FINISH);
  out->resize(z.total_out);
  deflateEnd(&z);
  return result == Z_STREAM_END;
}

Verdict JudgeRequest(absl::string_view head) {
  std::vector<absl::string_view> lines = absl::StrSplit(head, '\n');
  for (absl::string_view& line : lines) absl::ConsumeSuffix(&line, "\r");
  const absl::string_view request_line = lines[0];
  const size_t first_space = request_line.find(' ');
  const size_t last_space = request_line.rfind(' ');
  if (first_space == absl::string_view::npos || first_space == 0 || last_space == first_space ||
      last_space + 1 == request_line.size()) {
    return BadRequest("expected METHOD TARGET HTTP/1.x");
  }
  const absl::string_view method = request_line.substr(0, first_space);
  absl::string_view target = request_line.substr(first_space + 1, last_space - first_space - 1);
  if (!absl::StartsWith(request_line.substr(last_space + 1), "HTTP/1.")) {
    return BadRequest("only HTTP/1.x is served");
  }
  // A refusal of HEAD has no body (its Content-Length still says how long it would be).
  const auto refuse = [head_request = method == "HEAD"](int status, absl::string_view reason,
                                                        absl::string_view body,
                                                        absl::string_view extra_headers = "") {
    std::string response = TextResponse(status, reason, body, extra_headers);
    if (head_request) response.resize(response.size() - body.size());
    return Verdict{status, false, std::move(response)};
  };
  bool announces_body = false, gzip = false;
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    if (line.empty()) break;  // the end of the head
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || colon == 0 || line[0] == ' ' || line[0] == '\t') {
      return BadRequest("malformed header line");
    }
    const absl::string_view name = line.substr(0, colon);
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (absl::EqualsIgnoreCase(name, "Content-Length")) {
      uint64_t length = 0;
      if (!absl::SimpleAtoi(value, &length)) return BadRequest("malformed Content-Length");
      announces_body = announces_body || length > 0;
    } else if (absl::EqualsIgnoreCase(name, "Transfer-Encoding")) {
      announces_body = true;
    } else if (absl::EqualsIgnoreCase(name, "Accept-Encoding")) {
      gzip = gzip || AcceptsGzip(value);
    }
  }
  // A body is refused first, whatever the method or path; its connection is closed unread.
  if (announces_body) {
    return refuse(413, "Content Too Large", "this endpoint reads no request body\n");
  }
  // The absolute form (a proxy's "http://host:port/metrics") names the same path.
  if (absl::StartsWithIgnoreCase(target, "http://")) {
    target.remove_prefix(7);
    const size_t slash = target.find('/');
    target = slash == absl::string_view::npos ? "/" : target.substr(slash);
  }
  const absl::string_view path = target.substr(0, target.find('?'));
  if (path != "/metrics") {
    return refuse(404, "Not Found",
                  absl::StrCat("no such path: ", Printable(std::string(path.substr(0, 200))),
                               " (metrics are at /metrics)\n"));
  }
  if (method != "GET") {
    return refuse(405, "Method Not Allowed", "only GET /metrics is served\n", "Allow: GET\r\n");
  }
  return {0, gzip, ""};
}

size_t HeadEnd(absl::string_view data, size_t from) {
  for (size_t i = data.find('\n', from); i != absl::string_view::npos; i = data.find('\n', i + 1)) {
    if (i + 1 < data.size() && data[i + 1] == '\n') return i + 2;
    if (i + 2 < data.size() && data[i + 1] == '\r' && data[i + 2] == '\n') return i + 3;
  }
  return absl::string_view::npos;
}

}  // namespace pipetrain::metrics::http
