// The two record framings on disk: header and footer sizes, and reading their little-endian fields.
// Shared by record_scan (records found by scanning) and record_frame (records an index located).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace dlstore {

constexpr size_t kTFHeader = 12;  // TFRecord: uint64 length, uint32 masked crc of the length
constexpr size_t kTFFooter = 4;   // TFRecord: uint32 masked crc of the data
constexpr size_t kRIOHeader = 8;  // RecordIO: uint32 magic, uint32 cflag << 29 | length
constexpr uint32_t kRecordIOMagic = 0xced7230a;

// Both formats are little-endian on disk, as x86 and Arm Linux are; memcpy keeps reads unaligned-safe.
inline uint64_t le64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t le32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// A CRC or magic word as messages show it: 0x0123abcd.
inline std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}

}  // namespace dlstore
