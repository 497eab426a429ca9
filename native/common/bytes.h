// Network-order loads and stores on raw packet bytes (no alignment assumed).
#pragma once
#include <cstdint>
#include <cstring>

namespace hysync {

// Network order from or to the host's (GCC and Clang builtins).
inline uint32_t host_be32(uint32_t v) {
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return v;
#else
  return __builtin_bswap32(v);
#endif
}

inline uint16_t load_be16(const uint8_t* p) { return uint16_t(p[0] << 8 | p[1]); }
// 32-bit ones as one unaligned access and a byte swap: the lanes of every packet pass here, and
// the compiler kept the four single-byte stores of the shift form.
inline uint32_t load_be32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return host_be32(v);
}
inline void store_be16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v >> 8);
  p[1] = uint8_t(v);
}
inline void store_be32(uint8_t* p, uint32_t v) {
  v = host_be32(v);
  std::memcpy(p, &v, 4);
}

}  // namespace hysync
