// What the worker engine's sources (engine.cc, flights.cc, results.cc) share: wire constants
// and a datagram's decoded header.
// Internal to the engine: bind.cc and the rest of the core include worker/engine.h only.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "common/bytes.h"
#include "worker/call.h"
#include "worker/engine.h"

namespace hysync::worker {

constexpr std::size_t H = wire::HEADER_BYTES;
constexpr uint32_t HALF32 = 1u << 31;
constexpr uint8_t SYNC = uint8_t(wire::Mode::SYNC), PARTIAL = uint8_t(wire::Mode::PARTIAL),
                  ASYNC = uint8_t(wire::Mode::ASYNC);

using wire::Header;  // the generated codec (hysync_wire.h)

// Decoding a datagram (io.cc).
const char* op_name(uint8_t op);
std::string decode_error(const uint8_t* d, std::size_t size);

}  // namespace hysync::worker
