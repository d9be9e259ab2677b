// Fuzz driver for wire::ParseHeader, built with ASan + UBSan by
// tests/reliability/test_fuzz_header.py and fed by hypothesis.
//
// stdin: records of 136 bytes (a 128-byte header, then max_message_bytes as
// u64 LE). stdout: one line per record, "err <reason>" or
// "ok source flags tag sequence payload offset length dtype rank dims...".
// An accepted header must survive EncodeHeader -> ParseHeader unchanged;
// otherwise the driver aborts (a sanitizer finding aborts it too), and the
// test sees the crash.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cc/transport/wire.h"

using hetjax::wire::FrameHeader;

namespace {

bool SameHeader(const FrameHeader& a, const FrameHeader& b) {
  return a.source == b.source && a.flags == b.flags && a.tag == b.tag &&
         a.sequence == b.sequence && a.spec == b.spec &&
         a.payload_bytes == b.payload_bytes &&
         a.chunk_offset == b.chunk_offset && a.chunk_length == b.chunk_length;
}

}  // namespace

int main() {
  uint8_t record[hetjax::wire::kHeaderBytes + 8];
  while (fread(record, 1, sizeof(record), stdin) == sizeof(record)) {
    uint64_t max_bytes = 0;
    for (int i = 7; i >= 0; --i) max_bytes = (max_bytes << 8) | record[128 + i];
    // A heap copy of exactly the header's size: ASan flags any read past it.
    auto* header = static_cast<uint8_t*>(malloc(hetjax::wire::kHeaderBytes));
    memcpy(header, record, hetjax::wire::kHeaderBytes);
    FrameHeader h;
    hetjax::Status status = hetjax::wire::ParseHeader(header, max_bytes, &h);
    free(header);
    if (!status.ok()) {
      printf("err %s\n", status.message().c_str());
    } else {
      uint8_t again[hetjax::wire::kHeaderBytes];
      hetjax::wire::EncodeHeader(h, again);
      FrameHeader h2;
      if (!hetjax::wire::ParseHeader(again, max_bytes, &h2).ok() ||
          !SameHeader(h, h2)) {
        fprintf(stderr, "accepted header does not round-trip\n");
        abort();
      }
      printf("ok %d %u %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
             " %d %d",
             h.source, h.flags, h.tag, h.sequence, h.payload_bytes,
             h.chunk_offset, h.chunk_length, static_cast<int>(h.spec.dtype),
             h.spec.rank);
      for (int i = 0; i < h.spec.rank; ++i) printf(" %" PRId64, h.spec.dims[i]);
      printf("\n");
    }
    fflush(stdout);
  }
  return 0;
}
