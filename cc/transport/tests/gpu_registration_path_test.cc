// The start-up choice of how GPU memory reaches the NIC, with fake steps
// that record what was called: the order, the fallbacks, the reasons, and
// that every successful probe registration and exported fd is released.
#include "cc/transport/gpu_registration_path.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hetjax {
namespace {

Status Fail(const std::string& why) {
  return Status(StatusCode::kInvalidArgument, why);
}

// Fake steps; each outcome is set per test, each call is logged.
struct FakeSteps {
  Status export_result = Status::Ok();
  Status dmabuf_result = Status::Ok();
  Status pointer_result = Status::Ok();
  std::vector<std::string> calls;
  int registrations_live = 0;
  int fds_open = 0;
  int seen_fd = -1;

  GpuRegistrationSteps Steps() {
    GpuRegistrationSteps steps;
    steps.export_dmabuf = [this](void*, size_t, int* fd) {
      calls.push_back("export");
      if (!export_result.ok()) return export_result;
      *fd = 42;
      ++fds_open;
      return Status::Ok();
    };
    steps.register_dmabuf = [this](int fd, void*, size_t, void** reg) {
      calls.push_back("reg_dmabuf");
      seen_fd = fd;
      if (!dmabuf_result.ok()) return dmabuf_result;
      ++registrations_live;
      *reg = this;
      return Status::Ok();
    };
    steps.register_pointer = [this](void*, size_t, void** reg) {
      calls.push_back("reg_pointer");
      if (!pointer_result.ok()) return pointer_result;
      ++registrations_live;
      *reg = this;
      return Status::Ok();
    };
    steps.deregister = [this](void* reg) {
      EXPECT_EQ(reg, this);
      calls.push_back("dereg");
      --registrations_live;
    };
    steps.close_fd = [this](int fd) {
      EXPECT_EQ(fd, 42);
      calls.push_back("close");
      --fds_open;
    };
    return steps;
  }
};

alignas(4096) char probe_memory[4096];

TEST(GpuRegistrationPath, DmabufWinsAndReleasesItsProbe) {
  FakeSteps fake;
  GpuRegistrationReport report =
      ChooseGpuRegistrationPath(fake.Steps(), probe_memory, 4096);
  EXPECT_EQ(report.path, kGpuPathDmabuf);
  EXPECT_TRUE(report.rejected.empty());
  EXPECT_EQ(fake.seen_fd, 42);
  // The fd goes first: the registration holds its own dma-buf reference.
  EXPECT_EQ(fake.calls, (std::vector<std::string>{"export", "reg_dmabuf",
                                                  "close", "dereg"}));
  EXPECT_EQ(fake.registrations_live, 0);
  EXPECT_EQ(fake.fds_open, 0);
}

TEST(GpuRegistrationPath, ExportFailureFallsBackToPeerMemory) {
  FakeSteps fake;
  fake.export_result = Fail("CUDA_ERROR_NOT_SUPPORTED");
  GpuRegistrationReport report =
      ChooseGpuRegistrationPath(fake.Steps(), probe_memory, 4096);
  EXPECT_EQ(report.path, kGpuPathPeerMemory);
  ASSERT_EQ(report.rejected.size(), 1u);
  EXPECT_EQ(report.rejected[0].first, kGpuPathDmabuf);
  EXPECT_NE(report.rejected[0].second.find("CUDA_ERROR_NOT_SUPPORTED"),
            std::string::npos);
  EXPECT_EQ(fake.calls,
            (std::vector<std::string>{"export", "reg_pointer", "dereg"}));
  EXPECT_EQ(fake.registrations_live, 0);
}

TEST(GpuRegistrationPath, RejectedDmabufRegistrationStillClosesTheFd) {
  FakeSteps fake;
  fake.dmabuf_result = Fail("Operation not supported (errno 95)");
  GpuRegistrationReport report =
      ChooseGpuRegistrationPath(fake.Steps(), probe_memory, 4096);
  EXPECT_EQ(report.path, kGpuPathPeerMemory);
  ASSERT_EQ(report.rejected.size(), 1u);
  EXPECT_NE(report.rejected[0].second.find("ibv_reg_dmabuf_mr"),
            std::string::npos);
  EXPECT_NE(report.rejected[0].second.find("errno 95"), std::string::npos);
  EXPECT_EQ(fake.fds_open, 0);
  EXPECT_EQ(fake.calls,
            (std::vector<std::string>{"export", "reg_dmabuf", "close",
                                      "reg_pointer", "dereg"}));
}

TEST(GpuRegistrationPath, BothFailingMeansHostStagingWithTwoReasons) {
  FakeSteps fake;
  fake.export_result = Fail("export says no");
  fake.pointer_result = Fail("Bad address (errno 14)");
  GpuRegistrationReport report =
      ChooseGpuRegistrationPath(fake.Steps(), probe_memory, 4096);
  EXPECT_EQ(report.path, kGpuPathHostStaging);
  ASSERT_EQ(report.rejected.size(), 2u);
  EXPECT_EQ(report.rejected[0].first, kGpuPathDmabuf);
  EXPECT_NE(report.rejected[0].second.find("export says no"),
            std::string::npos);
  EXPECT_EQ(report.rejected[1].first, kGpuPathPeerMemory);
  EXPECT_NE(report.rejected[1].second.find("errno 14"), std::string::npos);
  EXPECT_EQ(fake.registrations_live, 0);
}

TEST(GpuRegistrationPath, MissingStepsAreReasonsNotCrashes) {
  GpuRegistrationSteps none;
  GpuRegistrationReport report =
      ChooseGpuRegistrationPath(none, probe_memory, 4096);
  EXPECT_EQ(report.path, kGpuPathHostStaging);
  ASSERT_EQ(report.rejected.size(), 2u);
  EXPECT_NE(report.rejected[0].second.find("no dma-buf exporter"),
            std::string::npos);
  EXPECT_NE(report.rejected[1].second.find("no RDMA device"),
            std::string::npos);
}

TEST(GpuRegistrationPath, NoProbeMemoryTriesNothing) {
  FakeSteps fake;
  GpuRegistrationReport report =
      ChooseGpuRegistrationPath(fake.Steps(), nullptr, 0);
  EXPECT_EQ(report.path, kGpuPathHostStaging);
  EXPECT_EQ(report.rejected.size(), 2u);
  EXPECT_TRUE(fake.calls.empty());
}

// The transport's rings keep what registered them (verbs_stream.cc).
TEST(RegisterByPreference, KeepsTheDmabufRegistrationAndClosesTheFd) {
  FakeSteps fake;
  void* kept = nullptr;
  GpuRegistrationReport report =
      RegisterByPreference(fake.Steps(), probe_memory, 4096, &kept);
  EXPECT_EQ(report.path, kGpuPathDmabuf);
  EXPECT_EQ(kept, &fake);
  EXPECT_EQ(fake.registrations_live, 1);
  EXPECT_EQ(fake.fds_open, 0);
  EXPECT_EQ(fake.calls,
            (std::vector<std::string>{"export", "reg_dmabuf", "close"}));
}

TEST(RegisterByPreference, KeepsThePointerRegistrationWhenDmabufFails) {
  FakeSteps fake;
  fake.dmabuf_result = Fail("Operation not supported (errno 95)");
  void* kept = nullptr;
  GpuRegistrationReport report =
      RegisterByPreference(fake.Steps(), probe_memory, 4096, &kept);
  EXPECT_EQ(report.path, kGpuPathPeerMemory);
  EXPECT_EQ(kept, &fake);
  EXPECT_EQ(fake.registrations_live, 1);
  ASSERT_EQ(report.rejected.size(), 1u);
  EXPECT_NE(report.rejected[0].second.find("errno 95"), std::string::npos);
}

TEST(RegisterByPreference, HostStagingLeavesNothingRegistered) {
  FakeSteps fake;
  fake.export_result = Fail("no /dev/udmabuf");
  fake.pointer_result = Fail("Bad address (errno 14)");
  void* kept = &fake;  // must be cleared
  GpuRegistrationReport report =
      RegisterByPreference(fake.Steps(), probe_memory, 4096, &kept);
  EXPECT_EQ(report.path, kGpuPathHostStaging);
  EXPECT_EQ(kept, nullptr);
  EXPECT_EQ(fake.registrations_live, 0);
  EXPECT_EQ(fake.fds_open, 0);
}

}  // namespace
}  // namespace hetjax
