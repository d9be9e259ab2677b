#include "cc/transport/verbs_stream.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

namespace hetjax::verbs {
namespace {

// Immediate data: a data write carries its length; the top bit marks control
// messages (credit: the low 31 bits are bytes consumed; all ones: close).
constexpr uint32_t kControlBit = 0x80000000u;
constexpr uint32_t kCloseImm = 0xffffffffu;
constexpr uint64_t kMaxCreditBytes = kControlBit - 2;
// Send work request ids: data writes carry the stream offset they end at
// (always > 0); credits and the close notice carry 0.
constexpr uint64_t kControlWrId = 0;
// How often the progress thread looks at the stop flag when idle.
constexpr int kProgressSliceMs = 20;
// Queue pair timers: 4.096 us * 2^17 ~ 0.5 s per try, 7 tries. Generous,
// because an emulated or loaded host can be slow to acknowledge; a dead peer
// is noticed first through the tcp liveness stream anyway.
constexpr uint8_t kAckTimeout = 17;
constexpr uint8_t kRetries = 7;
constexpr uint8_t kRnrRetryForever = 7;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

class ChannelImpl final : public Channel {
 public:
  ChannelImpl(std::shared_ptr<Device> device, const ChannelOptions& options)
      : device_(std::move(device)),
        options_(options),
        ring_bytes_(options.ring_bytes),
        recv_depth_(2 * options.max_writes_in_flight + 8) {}

  ~ChannelImpl() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      shut_ = true;
    }
    stop_progress_.store(true);
    cv_.notify_all();
    if (qp_ != nullptr) {
      ibv_qp_attr attr{};
      attr.qp_state = IBV_QPS_ERR;  // flushes what is outstanding
      ibv_modify_qp(qp_, &attr, IBV_QP_STATE);
    }
    if (progress_.joinable()) progress_.join();
    if (qp_ != nullptr) ibv_destroy_qp(qp_);
    if (cq_ != nullptr) ibv_destroy_cq(cq_);
    if (events_ != nullptr) ibv_destroy_comp_channel(events_);
    if (ring_mr_ != nullptr) ibv_dereg_mr(ring_mr_);
    if (staging_mr_ != nullptr) ibv_dereg_mr(staging_mr_);
    if (hook_ring_ != nullptr && options_.inbound_memory.free) {
      options_.inbound_memory.free(hook_ring_);
    }
  }

  Status Init() {
    if (ring_bytes_ < 4096 || ring_bytes_ > (uint64_t{1} << 30)) {
      return Status(StatusCode::kInvalidArgument,
                    "verbs ring_bytes " + std::to_string(ring_bytes_) +
                        " outside [4 KiB, 1 GiB]");
    }
    const size_t page = 4096;
    void* staging = nullptr;
    if (posix_memalign(&staging, page, ring_bytes_) != 0) {
      return Status(StatusCode::kResourceExhausted,
                    "verbs: cannot allocate a staging ring of " +
                        std::to_string(ring_bytes_) + " bytes");
    }
    staging_.reset(static_cast<uint8_t*>(staging));
    const std::string where = device_->name();
    Status ring_status = RegisterInboundRing(page);
    if (!ring_status.ok()) return ring_status;
    staging_mr_ = ibv_reg_mr(device_->pd(), staging_.get(), ring_bytes_,
                             IBV_ACCESS_LOCAL_WRITE);
    if (staging_mr_ == nullptr) {
      return Errno(where + ": ibv_reg_mr(staging)", errno);
    }
    events_ = ibv_create_comp_channel(device_->context());
    if (events_ == nullptr) {
      return Errno(where + ": ibv_create_comp_channel", errno);
    }
    int flags = fcntl(events_->fd, F_GETFL);
    fcntl(events_->fd, F_SETFL, flags | O_NONBLOCK);
    const int send_depth = static_cast<int>(options_.max_writes_in_flight) + 4;
    cq_ = ibv_create_cq(device_->context(), send_depth + recv_depth_, nullptr,
                        events_, 0);
    if (cq_ == nullptr) return Errno(where + ": ibv_create_cq", errno);
    ibv_qp_init_attr init{};
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = send_depth;
    init.cap.max_recv_wr = recv_depth_;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    qp_ = ibv_create_qp(device_->pd(), &init);
    if (qp_ == nullptr) return Errno(where + ": ibv_create_qp", errno);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = static_cast<uint8_t>(device_->port());
    attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    int rc = ibv_modify_qp(
        qp_, &attr,
        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc != 0) return Errno(Describe() + ": ibv_modify_qp(INIT)", rc);
    for (int i = 0; i < recv_depth_; ++i) {
      Status posted = PostRecv();
      if (!posted.ok()) return posted;
    }
    if ((rc = ibv_req_notify_cq(cq_, 0)) != 0) {
      return Errno(Describe() + ": ibv_req_notify_cq", rc);
    }
    std::random_device random;
    local_.qp_num = qp_->qp_num;
    local_.psn = random() & 0xffffff;
    local_.lid = device_->lid();
    std::memcpy(local_.gid, device_->gid().raw, sizeof(local_.gid));
    local_.mtu = static_cast<uint32_t>(device_->active_mtu());
    local_.ring_addr = reinterpret_cast<uintptr_t>(ring_base_);
    local_.ring_rkey = ring_mr_->rkey;
    local_.ring_bytes = ring_bytes_;
    progress_ = std::thread([this] { ProgressLoop(); });
    return Status::Ok();
  }

  const Endpoint& local() const override { return local_; }
  const GpuRegistrationReport& ring_registration() const override {
    return ring_report_;
  }

  Status Connect(const Endpoint& remote) override {
    if (remote.ring_bytes != ring_bytes_) {
      return Status(StatusCode::kInvalidArgument,
                    Describe() + ": ring sizes differ (ours " +
                        std::to_string(ring_bytes_) + " bytes, the peer's " +
                        std::to_string(remote.ring_bytes) + ")");
    }
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = static_cast<ibv_mtu>(std::min<uint32_t>(
        remote.mtu, static_cast<uint32_t>(device_->active_mtu())));
    attr.dest_qp_num = remote.qp_num;
    attr.rq_psn = remote.psn;
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = 12;
    attr.ah_attr.port_num = static_cast<uint8_t>(device_->port());
    attr.ah_attr.dlid = remote.lid;
    if (device_->is_ethernet()) {
      attr.ah_attr.is_global = 1;
      std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid, 16);
      attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(device_->gid_index());
      attr.ah_attr.grh.hop_limit = 64;
    }
    int rc = ibv_modify_qp(
        qp_, &attr,
        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc != 0) {
      return Errno(Describe() + ": ibv_modify_qp(RTR) to qp " +
                       std::to_string(remote.qp_num),
                   rc);
    }
    attr = ibv_qp_attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.timeout = kAckTimeout;
    attr.retry_cnt = kRetries;
    attr.rnr_retry = kRnrRetryForever;
    attr.sq_psn = local_.psn;
    attr.max_rd_atomic = 1;
    rc = ibv_modify_qp(qp_, &attr,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                           IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc != 0) return Errno(Describe() + ": ibv_modify_qp(RTS)", rc);
    std::lock_guard<std::mutex> lock(mu_);
    remote_ = remote;
    connected_ = true;
    return Status::Ok();
  }

  Status ReadSome(void* dst, size_t max, int wait_ms, size_t* got) override {
    *got = 0;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] {
      return arrived_ > consumed_ || shut_ || !error_.ok() || peer_closed_;
    });
    if (shut_) return Aborted();
    if (arrived_ > consumed_ && max > 0) {
      const uint64_t offset = consumed_ % ring_bytes_;
      const uint64_t n =
          std::min<uint64_t>({max, arrived_ - consumed_, ring_bytes_ - offset});
      lock.unlock();
      // Only this (reader) thread moves consumed_, and the writer cannot
      // reuse these bytes before we credit them: safe to copy unlocked.
      Status copied = CopyOut(dst, offset, n);
      lock.lock();
      if (!copied.ok()) {
        if (error_.ok()) error_ = copied;
        cv_.notify_all();
        return copied;
      }
      consumed_ += n;
      *got = n;
      MaybeCredit();
      return Status::Ok();
    }
    if (!error_.ok()) return error_;
    if (peer_closed_) {
      return Status(StatusCode::kPeerLost,
                    Describe() + ": the peer closed its queue pair");
    }
    return Status::Ok();
  }

  Status WriteSome(const void* src, size_t len, int wait_ms,
                   size_t* put) override {
    *put = 0;
    if (len == 0) return Status::Ok();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] {
      return shut_ || !error_.ok() ||
             (inflight_ < options_.max_writes_in_flight && Room() > 0);
    });
    if (shut_) return Aborted();
    if (!error_.ok()) return error_;
    if (!connected_) {
      return Status(StatusCode::kInternal, Describe() + ": not connected");
    }
    if (inflight_ >= options_.max_writes_in_flight || Room() == 0) {
      return Status::Ok();  // no room in time
    }
    const uint64_t offset = tail_ % ring_bytes_;
    const uint64_t n = std::min<uint64_t>(
        {len, Room(), ring_bytes_ - offset, options_.max_write_bytes});
    lock.unlock();
    // Only this (writer) thread moves tail_; these staging bytes are free
    // (completed and credited), so the copy needs no lock.
    std::memcpy(staging_.get() + offset, src, n);
    lock.lock();
    if (shut_) return Aborted();
    if (!error_.ok()) return error_;
    Status posted = PostWrite(offset, static_cast<uint32_t>(n),
                              static_cast<uint32_t>(n), tail_ + n);
    if (!posted.ok()) {
      error_ = posted;
      cv_.notify_all();
      return posted;
    }
    tail_ += n;
    ++inflight_;
    *put = n;
    return Status::Ok();
  }

  void Shutdown() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!shut_ && connected_ && error_.ok()) {
      // Best effort: tells the peer's reader we are gone, behind our data.
      PostWrite(0, 0, kCloseImm, kControlWrId, /*signaled=*/false);
    }
    shut_ = true;
    cv_.notify_all();
  }

  std::string Describe() const override {
    return "verbs " + device_->name() + " qp " +
           std::to_string(qp_ != nullptr ? qp_->qp_num : 0);
  }

 private:
  // The inbound ring: in the caller's memory when it gives some and a path
  // registers it (dmabuf, then ibv_reg_mr on the pointer), else host memory.
  Status RegisterInboundRing(size_t page) {
    const GpuMemoryHooks& memory = options_.inbound_memory;
    if (memory.alloc) {
      void* ptr = nullptr;
      Status allocated = memory.alloc(ring_bytes_, &ptr);
      void* mr = nullptr;
      ring_report_ = RegisterByPreference(RegistrationSteps(device_, memory),
                                          allocated.ok() ? ptr : nullptr,
                                          ring_bytes_, &mr);
      if (!allocated.ok()) {
        for (auto& [path, why] : ring_report_.rejected) {
          why = "cannot allocate the ring there: " + allocated.message();
        }
      }
      if (mr != nullptr) {
        hook_ring_ = static_cast<uint8_t*>(ptr);
        ring_mr_ = static_cast<ibv_mr*>(mr);
        ring_base_ = hook_ring_;
        return Status::Ok();
      }
      if (allocated.ok() && ptr != nullptr && memory.free) memory.free(ptr);
    } else {
      const std::string why =
          "no device memory was given for the ring (no GPU, or not asked for)";
      ring_report_.rejected = {{kGpuPathDmabuf, why},
                               {kGpuPathPeerMemory, why}};
    }
    ring_report_.path = kGpuPathHostStaging;
    void* ring = nullptr;
    if (posix_memalign(&ring, page, ring_bytes_) != 0) {
      return Status(StatusCode::kResourceExhausted,
                    "verbs: cannot allocate an inbound ring of " +
                        std::to_string(ring_bytes_) + " bytes");
    }
    ring_.reset(static_cast<uint8_t*>(ring));
    std::memset(ring_.get(), 0, ring_bytes_);
    ring_base_ = ring_.get();
    ring_mr_ = ibv_reg_mr(device_->pd(), ring_.get(), ring_bytes_,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (ring_mr_ == nullptr) {
      return Errno(device_->name() + ": ibv_reg_mr(ring)", errno);
    }
    return Status::Ok();
  }

  // Copies landed bytes out of the ring, with the hooks' copy when the ring
  // lives in their memory.
  Status CopyOut(void* dst, uint64_t offset, size_t n) {
    const GpuMemoryHooks& memory = options_.inbound_memory;
    if (hook_ring_ != nullptr && memory.copy_to_host) {
      Status copied = memory.copy_to_host(dst, ring_base_ + offset, n);
      if (!copied.ok()) {
        return Status(copied.code(), Describe() +
                                         ": copying out of the "
                                         "inbound ring: " +
                                         copied.message());
      }
      return copied;
    }
    std::memcpy(dst, ring_base_ + offset, n);
    return Status::Ok();
  }

  Status Aborted() const {
    return Status(StatusCode::kAborted, Describe() + " was shut down");
  }

  // Bytes the writer may put in flight: the peer's ring must have room
  // (credited) and our staging copy of them must be done (completed).
  uint64_t Room() const {
    return ring_bytes_ - (tail_ - std::min(credited_, completed_));
  }

  Status PostRecv() {
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    int rc = ibv_post_recv(qp_, &wr, &bad);
    return rc == 0 ? Status::Ok() : Errno(Describe() + ": ibv_post_recv", rc);
  }

  Status PostWrite(uint64_t offset, uint32_t length, uint32_t imm,
                   uint64_t wr_id, bool signaled = true) {
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(staging_.get() + offset);
    sge.length = length;
    sge.lkey = staging_mr_->lkey;
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    wr.imm_data = htonl(imm);
    wr.sg_list = length > 0 ? &sge : nullptr;
    wr.num_sge = length > 0 ? 1 : 0;
    wr.wr.rdma.remote_addr = remote_.ring_addr + offset;
    wr.wr.rdma.rkey = remote_.ring_rkey;
    ibv_send_wr* bad = nullptr;
    int rc = ibv_post_send(qp_, &wr, &bad);
    return rc == 0 ? Status::Ok() : Errno(Describe() + ": ibv_post_send", rc);
  }

  // Returns consumed bytes to the writer: at once when the reader has caught
  // up (so a waiting writer never stalls on a partial credit), else in
  // quarters of the ring. Called under mu_; when the send queue is full the
  // progress thread retries after completions.
  void MaybeCredit() {
    if (!connected_ || shut_ || !error_.ok()) return;
    uint64_t pending = consumed_ - credited_out_;
    if (pending == 0) return;
    if (pending < ring_bytes_ / 4 && consumed_ != arrived_) return;
    if (inflight_ >= options_.max_writes_in_flight) return;
    pending = std::min(pending, kMaxCreditBytes);
    Status posted = PostWrite(
        0, 0, kControlBit | static_cast<uint32_t>(pending), kControlWrId);
    if (!posted.ok()) {
      error_ = posted;
      return;
    }
    credited_out_ += pending;
    ++inflight_;
  }

  void Fail(const std::string& why) {
    if (error_.ok() && !shut_) {
      error_ = Status(StatusCode::kPeerLost, Describe() + ": " + why);
    }
  }

  // Under mu_.
  void Handle(const ibv_wc& wc) {
    const bool is_recv = (wc.opcode & IBV_WC_RECV) != 0;
    if (wc.status != IBV_WC_SUCCESS) {
      Fail(std::string("work completion failed: ") +
           ibv_wc_status_str(wc.status) + " (vendor error " +
           std::to_string(wc.vendor_err) + ")");
      return;
    }
    if (!is_recv) {
      if (inflight_ > 0) --inflight_;
      if (wc.wr_id != kControlWrId) completed_ = std::max(completed_, wc.wr_id);
      return;
    }
    Status reposted = PostRecv();
    if (!reposted.ok() && error_.ok()) error_ = reposted;
    if ((wc.wc_flags & IBV_WC_WITH_IMM) == 0) {
      Fail("a receive without immediate data");
      return;
    }
    const uint32_t imm = ntohl(wc.imm_data);
    if (imm == kCloseImm) {
      peer_closed_ = true;
    } else if ((imm & kControlBit) != 0) {
      credited_ += imm & ~kControlBit;
      if (credited_ > tail_) Fail("the peer credited bytes never sent");
    } else if (arrived_ + imm - consumed_ > ring_bytes_) {
      Fail("the peer overran our ring (" + std::to_string(imm) + " bytes)");
    } else {
      arrived_ += imm;
    }
  }

  void ProgressLoop() {
    pollfd pfd{events_->fd, POLLIN, 0};
    ibv_wc wcs[16];
    while (!stop_progress_.load()) {
      if (::poll(&pfd, 1, kProgressSliceMs) > 0) {
        ibv_cq* cq = nullptr;
        void* context = nullptr;
        if (ibv_get_cq_event(events_, &cq, &context) == 0) {
          ibv_ack_cq_events(cq, 1);
        }
      }
      // Re-arm before polling: a completion between the two then raises an
      // event instead of being missed until the next slice.
      ibv_req_notify_cq(cq_, 0);
      int n;
      while ((n = ibv_poll_cq(cq_, 16, wcs)) > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        for (int i = 0; i < n; ++i) Handle(wcs[i]);
        MaybeCredit();
        cv_.notify_all();
      }
      if (n < 0) {
        std::lock_guard<std::mutex> lock(mu_);
        Fail("ibv_poll_cq failed");
        cv_.notify_all();
      }
    }
  }

  const std::shared_ptr<Device> device_;
  const ChannelOptions options_;
  const uint64_t ring_bytes_;
  const int recv_depth_;
  std::unique_ptr<uint8_t, FreeDeleter> ring_, staging_;
  uint8_t* hook_ring_ = nullptr;  // the ring, when in inbound_memory's memory
  uint8_t* ring_base_ = nullptr;  // ring_ or hook_ring_
  GpuRegistrationReport ring_report_;
  ibv_mr* ring_mr_ = nullptr;
  ibv_mr* staging_mr_ = nullptr;
  ibv_comp_channel* events_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  Endpoint local_, remote_;
  std::thread progress_;
  std::atomic<bool> stop_progress_{false};

  std::mutex mu_;
  std::condition_variable cv_;
  bool connected_ = false, shut_ = false, peer_closed_ = false;
  Status error_;
  // Writer side, in bytes since connection: handed to the HCA (tail_),
  // confirmed sent (completed_), consumed by the peer's reader (credited_).
  uint64_t tail_ = 0, completed_ = 0, credited_ = 0;
  uint32_t inflight_ = 0;  // signalled sends not yet completed
  // Reader side: landed in our ring (arrived_), copied out (consumed_),
  // reported to the peer (credited_out_).
  uint64_t arrived_ = 0, consumed_ = 0, credited_out_ = 0;
};

}  // namespace

Status Channel::Create(std::shared_ptr<Device> device,
                       const ChannelOptions& options,
                       std::unique_ptr<Channel>* channel) {
  auto made = std::make_unique<ChannelImpl>(std::move(device), options);
  Status status = made->Init();
  if (!status.ok()) return status;
  *channel = std::move(made);
  return Status::Ok();
}

}  // namespace hetjax::verbs
