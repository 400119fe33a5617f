//===- NcclCommunicatorTest.cpp - what runs without a GPU -----------------===//
//
// The communicator needs a GPU to run collectives; these checks run anywhere
// NCCL is installed: the library loads, and misuse is a clear Status.
//
//===----------------------------------------------------------------------===//

#include "fsdp_rt/NcclCommunicator.h"

#include <gtest/gtest.h>

using namespace fsdp_rt::nccl;

namespace {

TEST(Nccl, ReportsItsVersion) {
  int version = 0;
  Status status = fsdp_rt::nccl::version(version);
  ASSERT_TRUE(status.ok) << status.message;
  EXPECT_EQ(version, NCCL_VERSION_CODE);
}

TEST(Nccl, MapsWireTypes) {
  EXPECT_EQ(dataType(Wire::BF16), ncclBfloat16);
  EXPECT_EQ(dataType(Wire::F32), ncclFloat32);
  EXPECT_EQ(dataType(Wire::I64), ncclInt64);
  EXPECT_EQ(reduceOp(Reduce::Sum), ncclSum);
  EXPECT_EQ(reduceOp(Reduce::Max), ncclMax);
}

TEST(Nccl, RejectsARankOutsideTheGroup) {
  ncclUniqueId id{};
  Communicator communicator;
  Status status = Communicator::create(4, 4, id, nullptr, communicator);
  EXPECT_FALSE(status.ok);
  EXPECT_EQ(status.message, "nccl: rank 4 is outside a group of 4");
}

} // namespace
