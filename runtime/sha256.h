// SHA-256 (FIPS 180-4) of a byte string, as 64 lowercase hex digits: the checksum kernel
// packages (io/kernel_package.h) keep for each binary, so that a corrupted or swapped file is
// refused before the driver sees it. Host code, no dependencies.
//
//   Sha256Hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
#pragma once

#include <string>
#include <string_view>

namespace kiln {

std::string Sha256Hex(std::string_view data);

}  // namespace kiln
