#include "cc/ffi/collectives/transfers.h"

namespace hetjax::collectives {

TensorSpec FlatSpec(DType dtype, uint64_t elements) {
  TensorSpec spec;
  spec.dtype = dtype;
  spec.rank = 1;
  spec.dims[0] = static_cast<int64_t>(elements);
  return spec;
}

Transfers::~Transfers() { WaitAll(); }

size_t Transfers::Recv(int peer, uint64_t tag, const TensorSpec& spec,
                       void* dst) {
  size_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = recvs_.size();
    recvs_.emplace_back();
  }
  // Not under the lock: an already-buffered message completes inside PostRecv.
  bridge_->PostRecv(peer, tag, spec, dst,
                    [this, id](uint64_t, bool done, const Status& status) {
                      if (!done) return;
                      std::lock_guard<std::mutex> lock(mu_);
                      recvs_[id].done = true;
                      recvs_[id].status = status;
                      cv_.notify_all();
                    });
  return id;
}

void Transfers::Send(int peer, uint64_t tag, const TensorSpec& spec,
                     const void* src) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++sends_in_flight_;
  }
  bridge_->SendAsync(peer, tag, spec, src, nullptr,
                     [this](const Status& status) {
                       std::lock_guard<std::mutex> lock(mu_);
                       if (!status.ok() && first_send_error_.ok()) {
                         first_send_error_ = status;
                       }
                       --sends_in_flight_;
                       cv_.notify_all();
                     });
}

Status Transfers::Wait(size_t id) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return recvs_[id].done; });
  return recvs_[id].status;
}

Status Transfers::WaitAll() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] {
    if (sends_in_flight_ > 0) return false;
    for (const RecvState& r : recvs_) {
      if (!r.done) return false;
    }
    return true;
  });
  if (!first_send_error_.ok()) return first_send_error_;
  for (const RecvState& r : recvs_) {
    if (!r.status.ok()) return r.status;
  }
  return Status::Ok();
}

}  // namespace hetjax::collectives
