// The HTTP/1.1 messages of the /metrics endpoint (endpoint.h), apart from any socket: what a
// complete request head asks for, where a head ends, the responses, gzip. Pure functions;
// thread-safe.
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace pipetrain::metrics::http {

// A whole response: status line, the headers every response has (Content-Type,
// Content-Length, Connection: close), `extra_headers` (each ending in CRLF), the body.
std::string Response(int status, absl::string_view reason, absl::string_view content_type,
                     absl::string_view body, absl::string_view extra_headers = "");
// The same as text/plain in UTF-8.
std::string TextResponse(int status, absl::string_view reason, absl::string_view body,
                         absl::string_view extra_headers = "");

// What a complete request head (request line and headers) asks for: a scrape (status 0),
// or the whole response refusing it.
struct Verdict {
  int status = 0;
  bool gzip = false;  // a scrape's: the scraper accepts gzip
  std::string response;
};

// What `head` asks for: the request line and headers, lines ending in CRLF (or LF), up to the
// empty line. A scrape is GET /metrics (a query string, or the absolute form a proxy sends,
// allowed). Refused: a request that announces a body (413, whatever its method or path), a
// malformed one (400), another path (404, the path shown truncated to 200 bytes and escaped:
// Printable), another method (405, Allow: GET); a refusal of HEAD has no body.
Verdict JudgeRequest(absl::string_view head);

// The end of the request head in `data` (the offset after its empty line), looked for from
// `from` on; npos while it has not come.
size_t HeadEnd(absl::string_view data, size_t from);

// Whether an Accept-Encoding value accepts gzip: a coding "gzip" (or "x-gzip") whose q-value
// is not 0.
bool AcceptsGzip(absl::string_view accept_encoding);

// `text` in the gzip format into `out`; false if zlib failed (send it uncompressed then).
bool Gzip(const std::string& text, std::string* out);

}  // namespace pipetrain::metrics::http
