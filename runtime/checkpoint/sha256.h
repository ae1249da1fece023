// SHA-256 of bytes, as 64 lowercase hex digits (OpenSSL's libcrypto).
#pragma once

#include <string>
#include <string_view>

namespace pipetrain::checkpoint {

std::string Sha256Hex(std::string_view bytes);

}  // namespace pipetrain::checkpoint
