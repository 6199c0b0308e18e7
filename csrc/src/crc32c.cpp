#include "dlstore/crc32c.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace dlstore {
namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // reflected Castagnoli polynomial

struct Tables {
  // Slicing-by-8 tables for the portable path.
  uint32_t t[8][256];
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};
const Tables& tables() {
  static const Tables tb;
  return tb;
}

uint32_t raw_software(uint32_t c, const uint8_t* p, size_t n) {
  const auto& t = tables().t;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= c;
    c = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^
        t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
// The crc32 instruction has a latency of 3 cycles and a throughput of 1 per cycle, so three
// independent streams over adjacent blocks keep the unit busy; the three partial CRCs are then
// joined by "shifting" the earlier ones over the later blocks (a linear map, tabulated below).
constexpr size_t kStripe = 4096;  // bytes per stream per round

__attribute__((target("sse4.2"))) uint32_t raw_hw_serial(uint32_t c, const uint8_t* p, size_t n) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}

// shift[k][b]: the register after feeding kStripe zero bytes into a register holding b << 8k.
struct ShiftTable {
  uint32_t t[4][256];
  ShiftTable() {
    static const uint8_t zeros[kStripe] = {};
    for (int k = 0; k < 4; ++k)
      for (uint32_t b = 0; b < 256; ++b) t[k][b] = raw_hw_serial(b << (8 * k), zeros, kStripe);
  }
  uint32_t shift(uint32_t c) const {
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
  }
};

__attribute__((target("sse4.2"))) uint32_t raw_hardware(uint32_t c, const uint8_t* p, size_t n) {
  if (n >= 3 * kStripe) {
    static const ShiftTable st;
    while (n >= 3 * kStripe) {
      uint64_t a = c, b = 0, d = 0;
      const uint8_t* pa = p;
      const uint8_t* pb = p + kStripe;
      const uint8_t* pd = p + 2 * kStripe;
      for (size_t i = 0; i < kStripe; i += 8) {
        uint64_t va, vb, vd;
        std::memcpy(&va, pa + i, 8);
        std::memcpy(&vb, pb + i, 8);
        std::memcpy(&vd, pd + i, 8);
        a = _mm_crc32_u64(a, va);
        b = _mm_crc32_u64(b, vb);
        d = _mm_crc32_u64(d, vd);
      }
      // Register after A|B|D = shift(shift(a) ^ b) ^ d, because the CRC register is linear.
      c = st.shift(st.shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^
          static_cast<uint32_t>(d);
      p += 3 * kStripe;
      n -= 3 * kStripe;
    }
  }
  return raw_hw_serial(c, p, n);
}

bool detect_hardware() { return __builtin_cpu_supports("sse4.2"); }
#else
bool detect_hardware() { return false; }
uint32_t raw_hardware(uint32_t c, const uint8_t* p, size_t n) { return raw_software(c, p, n); }
#endif

const bool kHardware = detect_hardware();

}  // namespace

bool crc32c_is_hardware() { return kHardware; }

uint32_t crc32c_extend(uint32_t crc, const uint8_t* data, size_t n) {
  uint32_t c = ~crc;
  c = kHardware ? raw_hardware(c, data, n) : raw_software(c, data, n);
  return ~c;
}

}  // namespace dlstore
