#include "cc/ffi/collectives/ring_schedule.h"

#include <algorithm>
#include <string>

namespace hetjax::collectives {
namespace {

int Mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace

Range Split(size_t count, int parts, int i) {
  size_t begin = count * i / parts, end = count * (i + 1) / parts;
  return {begin, end - begin};
}

Range AlignedSplit(size_t count, int parts, int i, size_t align) {
  const size_t units = (count + align - 1) / align;
  auto boundary = [&](int k) {
    return k == parts ? count : std::min(count, units * k / parts * align);
  };
  return {boundary(i), boundary(i + 1) - boundary(i)};
}

Status Pieces(Range r, size_t elem_bytes, uint64_t chunk_bytes,
              std::vector<Range>* out) {
  size_t per =
      std::max<size_t>(1, chunk_bytes / std::max<size_t>(1, elem_bytes));
  out->clear();
  for (size_t at = 0; at < r.count; at += per) {
    out->push_back({r.begin + at, std::min(per, r.count - at)});
  }
  if (out->size() > static_cast<size_t>(kMaxPieces)) {
    return Status(StatusCode::kInvalidArgument,
                  "a collective segment of " + std::to_string(r.count) +
                      " elements needs " + std::to_string(out->size()) +
                      " pieces; at most " + std::to_string(kMaxPieces) +
                      " (raise the bridge's chunk_bytes)");
  }
  return Status::Ok();
}

std::vector<RingStep> RingSteps(int n, int p) {
  std::vector<RingStep> steps;
  // Reduce-scatter: what arrives at step s is passed on at step s + 1.
  for (int s = 0; s < n - 1; ++s) {
    steps.push_back({kPhaseReduce, s, Mod(p - s, n), Mod(p - s - 1, n)});
  }
  // All-gather: the finished segment first, then each one as it arrives.
  for (int s = 0; s < n - 1; ++s) {
    steps.push_back({kPhaseDistribute, s, Mod(p + 1 - s, n), Mod(p - s, n)});
  }
  return steps;
}

int RingFinished(int n, int p) { return Mod(p + 1, n); }

int RoundRobinRounds(int n) { return n % 2 == 0 ? n - 1 : n; }

int RoundRobinPartner(int n, int round, int p) {
  // The circle method: member m - 1 stays put while the others turn; an odd
  // n gets a phantom member n, whose partner sits the round out.
  const int m = n % 2 == 0 ? n : n + 1;
  const int q = p == m - 1   ? round
                : p == round ? m - 1
                             : Mod(2 * round - p, m - 1);
  return q < n ? q : -1;
}

}  // namespace hetjax::collectives
