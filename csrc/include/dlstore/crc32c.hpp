// CRC-32C (Castagnoli) as TFRecord uses it: SSE4.2 instruction when the CPU has it, tables otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dlstore {

// Continues a CRC: crc32c_extend(0, data, n) is the CRC of data.
uint32_t crc32c_extend(uint32_t crc, const uint8_t* data, size_t n);
inline uint32_t crc32c(const uint8_t* data, size_t n) { return crc32c_extend(0, data, n); }

// TFRecord stores CRCs "masked" so that CRCs of data that embeds CRCs stay well distributed.
inline uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline uint32_t masked_crc32c(const uint8_t* data, size_t n) { return mask_crc(crc32c(data, n)); }

bool crc32c_is_hardware();

}  // namespace dlstore
