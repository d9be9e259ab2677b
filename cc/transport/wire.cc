#include "cc/transport/wire.h"

#include <cstdio>
#include <string>

namespace hetjax::wire {
namespace {

// Byte-wise on purpose: the format is little-endian whatever the host is.
void PutU64(uint8_t* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU32(uint8_t* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetU64(const uint8_t* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(in[i]) << (8 * i);
  return v;
}
uint32_t GetU32(const uint8_t* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(in[i]) << (8 * i);
  return v;
}

Status Reject(const std::string& what) {
  return Status(StatusCode::kInvalidArgument, "bad frame header: " + what);
}

}  // namespace

void EncodeHeader(const FrameHeader& h, uint8_t* out) {
  PutU32(out + 0, kMagic);
  out[4] = static_cast<uint8_t>(kVersion);
  out[5] = static_cast<uint8_t>(kVersion >> 8);
  out[6] = static_cast<uint8_t>(h.spec.dtype);
  out[7] = static_cast<uint8_t>(h.spec.rank);
  PutU32(out + 8, static_cast<uint32_t>(h.source));
  PutU32(out + 12, h.flags);
  PutU64(out + 16, h.tag);
  PutU64(out + 24, h.sequence);
  PutU64(out + 32, h.payload_bytes);
  PutU64(out + 40, h.chunk_offset);
  PutU64(out + 48, h.chunk_length);
  for (int i = 0; i < kMaxRank; ++i) {
    int64_t dim = i < h.spec.rank ? h.spec.dims[i] : 0;
    PutU64(out + 56 + 8 * i, static_cast<uint64_t>(dim));
  }
  PutU64(out + 120, 0);
}

Status ParseHeader(const uint8_t* in, uint64_t max_message_bytes,
                   FrameHeader* h) {
  uint32_t magic = GetU32(in);
  if (magic != kMagic) {
    return Reject("bad magic 0x" + [&] {
      char buf[16];
      snprintf(buf, sizeof(buf), "%08x", magic);
      return std::string(buf);
    }() + " (not a hetjax peer, or the stream lost its framing)");
  }
  uint16_t version = static_cast<uint16_t>(in[4] | (in[5] << 8));
  if (version != kVersion) {
    return Reject("protocol version " + std::to_string(version) +
                  ", this build speaks " + std::to_string(kVersion));
  }
  DType dtype = static_cast<DType>(in[6]);
  if (dtype == DType::kInvalid || DTypeSize(dtype) == 0) {
    return Reject("unknown dtype code " + std::to_string(in[6]));
  }
  int rank = in[7];
  if (rank > kMaxRank) {
    return Reject("rank " + std::to_string(rank) + " exceeds the maximum " +
                  std::to_string(kMaxRank));
  }
  h->spec = TensorSpec();
  h->spec.dtype = dtype;
  h->spec.rank = rank;
  uint64_t elements = 1;
  bool overflow = false;
  for (int i = 0; i < rank; ++i) {
    int64_t dim = static_cast<int64_t>(GetU64(in + 56 + 8 * i));
    if (dim < 0) {
      return Reject("negative dimension " + std::to_string(dim) + " at axis " +
                    std::to_string(i));
    }
    h->spec.dims[i] = dim;
    overflow |=
        __builtin_mul_overflow(elements, static_cast<uint64_t>(dim), &elements);
  }
  uint64_t expected_bytes = 0;
  overflow |=
      __builtin_mul_overflow(elements, DTypeSize(dtype), &expected_bytes);
  h->source = static_cast<int32_t>(GetU32(in + 8));
  h->flags = GetU32(in + 12);
  h->tag = GetU64(in + 16);
  h->sequence = GetU64(in + 24);
  h->payload_bytes = GetU64(in + 32);
  h->chunk_offset = GetU64(in + 40);
  h->chunk_length = GetU64(in + 48);
  if (overflow || expected_bytes != h->payload_bytes) {
    return Reject("payload of " + std::to_string(h->payload_bytes) +
                  " bytes does not fit " + h->spec.ToString() +
                  (overflow
                       ? " (shape overflows)"
                       : " (" + std::to_string(expected_bytes) + " bytes)"));
  }
  if (h->payload_bytes > max_message_bytes) {
    return Reject("payload of " + std::to_string(h->payload_bytes) +
                  " bytes exceeds max_message_bytes " +
                  std::to_string(max_message_bytes));
  }
  if ((h->flags & ~(kFlagGoodbye | kFlagHeartbeat)) != 0 ||
      h->flags == (kFlagGoodbye | kFlagHeartbeat)) {
    return Reject("unknown flags 0x" + std::to_string(h->flags));
  }
  if (h->flags != 0 && h->payload_bytes != 0) {
    return Reject(
        std::string(h->flags == kFlagGoodbye ? "goodbye" : "heartbeat") +
        " frame with a payload of " + std::to_string(h->payload_bytes) +
        " bytes");
  }
  if (h->chunk_offset > h->payload_bytes ||
      h->chunk_length > h->payload_bytes - h->chunk_offset) {
    return Reject("chunk [" + std::to_string(h->chunk_offset) + ", +" +
                  std::to_string(h->chunk_length) + ") lies outside the " +
                  std::to_string(h->payload_bytes) + "-byte payload");
  }
  return Status::Ok();
}

Status CheckExpected(int peer, uint64_t tag, const TensorSpec& expected,
                     const TensorSpec& received) {
  if (expected == received) return Status::Ok();
  return Status(StatusCode::kMismatch,
                "recv from rank " + std::to_string(peer) + " tag " +
                    std::to_string(tag) + ": expected " + expected.ToString() +
                    ", received " + received.ToString());
}

}  // namespace hetjax::wire
