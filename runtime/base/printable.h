// Text from elsewhere (a job's name, an error a worker reported, an event) made safe to print
// on a terminal: control characters and bytes that are not UTF-8 are shown escaped ("\x1b",
// "\n"), so no text can move the cursor, recolour the screen or hide what follows it. For
// human-readable output only; JSON output is exact (its encoder escapes what it must).
// Header-only, no dependencies.
#pragma once

#include <cstdio>
#include <string>

namespace pipetrain {

inline std::string Printable(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  auto escape = [&out](unsigned char c) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "\\x%02x", c);
    out += buf;
  };
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = text[i];
    if (c == '\n') {
      out += "\\n";
      ++i;
      continue;
    }
    if (c == '\t') {
      out += "\\t";
      ++i;
      continue;
    }
    if (c < 0x20 || c == 0x7f) {
      escape(c);
      ++i;
      continue;
    }
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    // A whole, well-formed UTF-8 sequence that is not a C1 control passes as it is.
    const int extra = (c & 0xe0) == 0xc0 && c >= 0xc2   ? 1
                      : (c & 0xf0) == 0xe0              ? 2
                      : (c & 0xf8) == 0xf0 && c <= 0xf4 ? 3
                                                        : -1;
    bool whole = extra > 0;
    for (int k = 1; whole && k <= extra; ++k) {
      whole = i + k < text.size() && (static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80;
    }
    if (whole && extra == 1 && c == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0) {
      whole = false;  // U+0080..U+009F
    }
    if (!whole) {
      escape(c);
      ++i;
      continue;
    }
    out.append(text, i, 1 + extra);
    i += 1 + extra;
  }
  return out;
}

}  // namespace pipetrain
