#include "cc/ffi/collectives/pending_ops.h"

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace hetjax::collectives {
namespace {

using Key = std::pair<uint64_t, int>;

// An op in flight: how to finish it, and the result buffer it writes.
struct Entry {
  FinishPending finish;
  const void* result;
};

struct Table {
  std::mutex mu;
  std::map<Key, Entry> ops;
};

Table& Pending() {
  // Never destroyed: a worker may still finish an op while the process exits.
  static Table* table = new Table();
  return *table;
}

std::string Describe(uint64_t base_tag, int device) {
  return "collective tag " + std::to_string(base_tag) + " on device " +
         std::to_string(device);
}

// One thread per device, running that device's started ops one after
// another. One thread per device, not one per process: device j of every
// island forms a slot's group, so a device's op must not queue behind
// another device's op, whose peers may be waiting on this one.
class HostWorker {
 public:
  HostWorker() : thread_([this] { Loop(); }) { thread_.detach(); }

  void Post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(job));
    }
    ready_.notify_one();
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ready_.wait(lock, [this] { return !jobs_.empty(); });
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  std::thread thread_;
};

// Work for a host worker, and the future of its status.
struct Job {
  explicit Job(std::function<Status()> work) {
    auto task = std::make_shared<std::packaged_task<Status()>>(std::move(work));
    result = task->get_future().share();
    run = [task] { (*task)(); };
  }
  std::function<void()> run;
  std::shared_future<Status> result;
};

HostWorker& WorkerOf(int device) {
  static std::mutex* mu = new std::mutex();
  static auto* workers = new std::map<int, std::unique_ptr<HostWorker>>();
  std::lock_guard<std::mutex> lock(*mu);
  std::unique_ptr<HostWorker>& worker = (*workers)[device];
  if (worker == nullptr) worker = std::make_unique<HostWorker>();
  return *worker;
}

}  // namespace

Status AddPending(uint64_t base_tag, int device, const void* result,
                  FinishPending finish) {
  Table& table = Pending();
  std::lock_guard<std::mutex> lock(table.mu);
  if (!table.ops
           .emplace(Key{base_tag, device}, Entry{std::move(finish), result})
           .second) {
    return Status(StatusCode::kInvalidArgument,
                  Describe(base_tag, device) +
                      " was started twice without a done in between: give "
                      "every collective of a group its own tag");
  }
  return Status::Ok();
}

Status FinishPendingOp(uint64_t base_tag, int device, const void* result,
                       void* stream) {
  Entry entry;
  {
    Table& table = Pending();
    std::lock_guard<std::mutex> lock(table.mu);
    auto it = table.ops.find(Key{base_tag, device});
    if (it == table.ops.end()) {
      return Status(StatusCode::kInvalidArgument,
                    Describe(base_tag, device) +
                        ": done without a start in flight (expected the "
                        "pending op of a collective start with this tag)");
    }
    entry = std::move(it->second);
    table.ops.erase(it);
  }
  // Finished either way: the op may still be writing its own buffer.
  Status s = entry.finish(stream);
  if (s.ok() && entry.result != result) {
    s = Status(StatusCode::kInternal,
               Describe(base_tag, device) +
                   ": the done got another buffer than the one the start "
                   "writes its result into (XLA copied the result between "
                   "the two calls, before the op had written it)");
  }
  return s;
}

std::shared_future<Status> RunOnHostWorker(int device,
                                           std::function<Status()> work) {
  Job job(std::move(work));
  WorkerOf(device).Post(job.run);
  return job.result;
}

Status StartOnHostWorker(uint64_t base_tag, int device, const void* result,
                         std::function<Status()> work) {
  // Recorded before the work is posted, which it must not be for a tag
  // already in flight.
  Job job(std::move(work));
  std::shared_future<Status> ran = job.result;
  Status s =
      AddPending(base_tag, device, result, [ran](void*) { return ran.get(); });
  if (s.ok()) WorkerOf(device).Post(job.run);
  return s;
}

}  // namespace hetjax::collectives
