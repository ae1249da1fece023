// SHA-256 of bytes, as 64 lowercase hex digits (OpenSSL's libcrypto): of bytes at hand, or of
// bytes fed in pieces (a file hashed as it is read, never held whole for it).
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace pipetrain::checkpoint {

std::string Sha256Hex(std::string_view bytes);

// Sha256Hex of everything Add()ed, in order. Thread-compatible.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Add(std::string_view bytes);
  // The digest of what was added; the hasher is spent after it.
  std::string Hex();

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

}  // namespace pipetrain::checkpoint
