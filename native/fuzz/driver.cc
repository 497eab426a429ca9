// A stand-in for libFuzzer's main() where clang's libFuzzer is not installed (g++ builds):
// feeds LLVMFuzzerTestOneInput random datagrams and mutated well-formed HySync datagrams under
// ASan/UBSan. Usage: fuzz_<name> [iterations=200000] [seed=1]. Deterministic for a seed.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "common/bytes.h"
#include "hysync_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace w = hysync::wire;

int main(int argc, char** argv) {
  const long iterations = argc > 1 ? std::atol(argv[1]) : 200000;
  std::mt19937_64 rng(argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1);
  std::vector<uint8_t> buf;
  for (long i = 0; i < iterations; ++i) {
    const unsigned kind = rng() % 4;
    if (kind == 0) {  // arbitrary bytes, arbitrary length
      buf.resize(rng() % (2 * w::PACKET_BYTES + 64));
      for (auto& b : buf) b = uint8_t(rng());
    } else {  // a HySync datagram with plausible fields, then a few flipped bytes / a cut
      buf.assign(rng() % 3 == 0 ? w::HEADER_BYTES : w::PACKET_BYTES, 0);
      for (auto& b : buf) b = uint8_t(rng());
      buf[w::OFF_VERSION] = rng() % 8 ? w::VERSION : uint8_t(rng());
      buf[w::OFF_OP] = uint8_t(rng() % 6);
      buf[w::OFF_MODE] = uint8_t(rng() % 4);
      hysync::store_be16(&buf[w::OFF_JOB_ID], uint16_t(rng() % 4));
      buf[w::OFF_WORKER_ID] = uint8_t(rng() % 6);
      hysync::store_be16(&buf[w::OFF_SLOT], uint16_t(rng() % 16));
      hysync::store_be32(&buf[w::OFF_ROUND], uint32_t(rng() % 8));
      hysync::store_be32(&buf[w::OFF_CHUNK], uint32_t(rng() % 16));
      for (unsigned flips = rng() % 3; flips > 0; --flips) buf[rng() % buf.size()] = uint8_t(rng());
      if (kind == 3) buf.resize(rng() % (buf.size() + 1));
    }
    LLVMFuzzerTestOneInput(buf.data(), buf.size());
  }
  std::printf("%ld inputs, no sanitizer report\n", iterations);
  return 0;
}
