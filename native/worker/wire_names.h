// The wire's constants as the worker's parts use them (flights, results, replies), and the
// generated header codec (hysync_wire.h).
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/bytes.h"
#include "hysync_wire.h"

namespace hysync::worker {

constexpr std::size_t H = wire::HEADER_BYTES;
constexpr uint32_t HALF32 = 1u << 31;
constexpr uint8_t SYNC = uint8_t(wire::Mode::SYNC), PARTIAL = uint8_t(wire::Mode::PARTIAL),
                  ASYNC = uint8_t(wire::Mode::ASYNC);

using wire::Header;

}  // namespace hysync::worker
