#include "cc/transport/verbs_endpoint.h"

#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace hetjax::verbs {
namespace {

constexpr char kVersion[] = "hv1";
constexpr int kFields = 8;
// More devices than any host has; bounds what a hostile text can make us do.
constexpr size_t kMaxEntries = 64;

Status Bad(const std::string& why, const std::string& text) {
  return Status(StatusCode::kInvalidArgument,
                "verbs endpoint \"" + text.substr(0, 200) + "\": " + why);
}

bool ParseHex(const std::string& field, uint64_t max, uint64_t* value) {
  if (field.empty() || field.size() > 16) return false;
  for (char c : field) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  char* end = nullptr;
  unsigned long long v = std::strtoull(field.c_str(), &end, 16);
  if (*end != '\0' || v > max) return false;
  *value = v;
  return true;
}

std::vector<std::string> Split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, sep)) parts.push_back(part);
  return parts;
}

}  // namespace

std::string EncodeEndpoints(const std::vector<Endpoint>& endpoints) {
  std::string out = kVersion;
  for (const Endpoint& e : endpoints) {
    char gid[33];
    for (int i = 0; i < 16; ++i)
      std::snprintf(gid + 2 * i, 3, "%02x", e.gid[i]);
    char entry[256];
    std::snprintf(entry, sizeof(entry),
                  ";%" PRIx32 ",%" PRIx32 ",%x,%s,%" PRIx32 ",%" PRIx64
                  ",%" PRIx32 ",%" PRIx64,
                  e.qp_num, e.psn, static_cast<unsigned>(e.lid), gid, e.mtu,
                  e.ring_addr, e.ring_rkey, e.ring_bytes);
    out += entry;
  }
  return out;
}

Status DecodeEndpoints(const std::string& text,
                       std::vector<Endpoint>* endpoints) {
  endpoints->clear();
  std::vector<std::string> entries = Split(text, ';');
  if (entries.empty() || entries[0] != kVersion) {
    return Bad(std::string("expected version ") + kVersion, text);
  }
  if (entries.size() < 2) return Bad("no queue pairs", text);
  if (entries.size() - 1 > kMaxEntries) return Bad("too many entries", text);
  for (size_t i = 1; i < entries.size(); ++i) {
    std::vector<std::string> f = Split(entries[i], ',');
    if (f.size() != kFields) {
      return Bad("entry " + std::to_string(i - 1) + " has " +
                     std::to_string(f.size()) + " fields, expected " +
                     std::to_string(kFields),
                 text);
    }
    Endpoint e;
    uint64_t v = 0;
    auto field = [&](int index, uint64_t max, const char* name) {
      if (!ParseHex(f[index], max, &v)) {
        return Bad(std::string("bad ") + name + " \"" + f[index] + "\"", text);
      }
      return Status::Ok();
    };
    Status s;
    if (!(s = field(0, 0xffffff, "qp number")).ok()) return s;
    e.qp_num = static_cast<uint32_t>(v);
    if (!(s = field(1, 0xffffff, "psn")).ok()) return s;
    e.psn = static_cast<uint32_t>(v);
    if (!(s = field(2, 0xffff, "lid")).ok()) return s;
    e.lid = static_cast<uint16_t>(v);
    if (f[3].size() != 32) return Bad("gid must be 32 hex digits", text);
    for (int b = 0; b < 16; ++b) {
      uint64_t byte = 0;
      if (!ParseHex(f[3].substr(2 * b, 2), 0xff, &byte)) {
        return Bad("bad gid \"" + f[3] + "\"", text);
      }
      e.gid[b] = static_cast<uint8_t>(byte);
    }
    if (!(s = field(4, 5, "mtu")).ok()) return s;
    e.mtu = static_cast<uint32_t>(v);
    if (e.mtu < 1) return Bad("bad mtu 0", text);
    if (!(s = field(5, UINT64_MAX, "ring address")).ok()) return s;
    e.ring_addr = v;
    if (!(s = field(6, UINT32_MAX, "ring key")).ok()) return s;
    e.ring_rkey = static_cast<uint32_t>(v);
    if (!(s = field(7, uint64_t{1} << 30, "ring size")).ok()) return s;
    e.ring_bytes = v;
    endpoints->push_back(e);
  }
  return Status::Ok();
}

}  // namespace hetjax::verbs
