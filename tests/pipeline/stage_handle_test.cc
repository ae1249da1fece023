// job::StageHandle: a stop reaches the rank's transport whenever it comes (before the
// transport is attached: at attach; while attached: at once; once detached: not at all), the
// first reason is kept, and there is no activity without an executor.
#include "runtime/job/launch/stage_handle.h"

#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "tests/pipeline/forwarding_transport.h"

namespace pipetrain::job {
namespace {

// Records every Abort; nothing else is called on it.
class AbortRecorder : public ForwardingTransport {
 public:
  AbortRecorder() : ForwardingTransport(nullptr) {}
  void Abort(const absl::Status& reason) override { aborts.push_back(reason); }
  std::vector<absl::Status> aborts;
};

TEST(StageHandle, AStopBeforeTheTransportReachesItAsItIsAttached) {
  StageHandle handle;
  AbortRecorder transport;
  handle.Stop(absl::UnavailableError("the coordinator ended the job"));
  EXPECT_TRUE(transport.aborts.empty());
  handle.AttachTransport(&transport);
  ASSERT_EQ(transport.aborts.size(), 1u);
  EXPECT_EQ(transport.aborts[0].message(), "the coordinator ended the job");
  EXPECT_FALSE(handle.Activity().has_value());
}

TEST(StageHandle, AStopReachesTheAttachedTransportOnlyAndKeepsTheFirstReason) {
  StageHandle handle;
  AbortRecorder transport;
  handle.AttachTransport(&transport);
  EXPECT_TRUE(transport.aborts.empty());  // negative control: attaching alone stops nothing
  EXPECT_TRUE(handle.stop_reason().ok());
  handle.Stop(absl::UnavailableError("first"));
  handle.Stop(absl::UnavailableError("second"));
  ASSERT_EQ(transport.aborts.size(), 2u);
  EXPECT_EQ(transport.aborts[1].message(), "first");
  EXPECT_EQ(handle.stop_reason().message(), "first");
  handle.AttachTransport(nullptr);
  handle.Stop(absl::UnavailableError("third"));
  EXPECT_EQ(transport.aborts.size(), 2u);  // detached: the transport may be gone
}

}  // namespace
}  // namespace pipetrain::job
