// Collectives split in two calls, start and done, so that a program can go
// on computing while the bytes move (the gradient buckets of data
// parallelism, docs/collectives.md "Overlap"). `start` launches the op and
// leaves here how to finish it; `done` takes that back by the op's base tag
// and the device, and finishes it: on the CPU, waits for the host worker
// that ran the algorithm; on a GPU, makes XLA's stream wait for the
// communication stream. XLA keeps the operand and the result alive between
// the two calls because `start` returns the operand aliased and `done` takes
// both.
#pragma once

#include <cstdint>
#include <functional>
#include <future>

#include "cc/transport/status.h"

namespace hetjax::collectives {

// How `done` completes an op; `stream` is the done call's XLA stream
// (nullptr on the CPU).
using FinishPending = std::function<Status(void* stream)>;

// Records an in-flight op of `device` (the CPU device index, or the GPU
// ordinal) that writes `result`. Fails when one with the same tag is already
// in flight there: two programs used one tag.
Status AddPending(uint64_t base_tag, int device, const void* result,
                  FinishPending finish);

// Finishes and forgets the op; fails naming the tag when none was started
// (a done without its start, or a start that failed before it launched), or
// when the done's `result` is not the buffer the start writes (a copy XLA
// took in between would hold what the buffer held before the op wrote it).
Status FinishPendingOp(uint64_t base_tag, int device, const void* result,
                       void* stream);

// Runs `work` on `device`'s host worker thread, after every op started there
// before it (the order of starts is program order, the same on every
// island); the future holds its status.
std::shared_future<Status> RunOnHostWorker(int device,
                                           std::function<Status()> work);

// RunOnHostWorker, recorded as in flight (writing `result`): `done` waits
// for it.
Status StartOnHostWorker(uint64_t base_tag, int device, const void* result,
                         std::function<Status()> work);

}  // namespace hetjax::collectives
