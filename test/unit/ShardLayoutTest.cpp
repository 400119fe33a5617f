//===- ShardLayoutTest.cpp - dim-0 shard arithmetic -----------------------===//

#include "fsdp_rt/ShardLayout.h"

#include <gtest/gtest.h>

#include <vector>

using fsdp_rt::Dim0ShardLayout;

namespace {

TEST(ShardLayout, EvenSplitHasNoPadding) {
  auto layout = Dim0ShardLayout::create(8, 4);
  ASSERT_TRUE(layout);
  EXPECT_EQ(layout->shardRows(), 2);
  EXPECT_EQ(layout->paddedRows(), 8);
  EXPECT_EQ(layout->paddingRows(), 0);
  for (int64_t rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(layout->rowBegin(rank), 2 * rank);
    EXPECT_EQ(layout->realRows(rank), 2);
  }
}

TEST(ShardLayout, UnevenSplitPadsTrailingRanksLikeTorchChunk) {
  // torch.chunk(torch.arange(10), 4) -> sizes 3, 3, 3, 1.
  auto layout = Dim0ShardLayout::create(10, 4);
  ASSERT_TRUE(layout);
  EXPECT_EQ(layout->shardRows(), 3);
  EXPECT_EQ(layout->paddingRows(), 2);
  EXPECT_EQ(layout->rowBegin(3), 9);
  EXPECT_EQ(layout->realRows(3), 1);
}

TEST(ShardLayout, RanksPastTheEndHoldZeroRows) {
  // torch.chunk(torch.arange(5), 4) -> only 3 chunks (2, 2, 1); rank 3 is empty.
  auto layout = Dim0ShardLayout::create(5, 4);
  ASSERT_TRUE(layout);
  EXPECT_EQ(layout->shardRows(), 2);
  EXPECT_EQ(layout->paddingRows(), 3);
  EXPECT_EQ(layout->realRows(2), 1);
  EXPECT_EQ(layout->rowBegin(3), 5);
  EXPECT_EQ(layout->realRows(3), 0);
}

TEST(ShardLayout, RealRowsCoverEveryRowExactlyOnce) {
  for (int64_t rows = 0; rows <= 40; ++rows) {
    for (int64_t ranks = 1; ranks <= 9; ++ranks) {
      auto layout = Dim0ShardLayout::create(rows, ranks);
      ASSERT_TRUE(layout);
      int64_t next = 0;
      for (int64_t rank = 0; rank < ranks; ++rank) {
        EXPECT_EQ(layout->rowBegin(rank), next) << rows << " rows, rank " << rank;
        EXPECT_GE(layout->realRows(rank), 0);
        EXPECT_LE(layout->realRows(rank), layout->shardRows());
        next += layout->realRows(rank);
      }
      EXPECT_EQ(next, rows);
      EXPECT_EQ(layout->paddedRows(), rows + layout->paddingRows());
      EXPECT_LT(layout->paddingRows(), ranks);
    }
  }
}

TEST(ShardLayout, SingleRankKeepsEverything) {
  auto layout = Dim0ShardLayout::create(7, 1);
  ASSERT_TRUE(layout);
  EXPECT_EQ(layout->shardRows(), 7);
  EXPECT_EQ(layout->paddingRows(), 0);
}

TEST(ShardLayout, ZeroRowsShardToZeroRows) {
  auto layout = Dim0ShardLayout::create(0, 3);
  ASSERT_TRUE(layout);
  EXPECT_EQ(layout->shardRows(), 0);
  EXPECT_EQ(layout->realRows(0), 0);
}

TEST(ShardLayout, RejectsImpossibleLayouts) {
  EXPECT_FALSE(Dim0ShardLayout::create(-1, 2));
  EXPECT_FALSE(Dim0ShardLayout::create(4, 0));
  EXPECT_FALSE(Dim0ShardLayout::create(4, -2));
  EXPECT_FALSE(Dim0ShardLayout::create(INT64_MAX, 2)) << "padded size overflows";
  EXPECT_TRUE(Dim0ShardLayout::create(INT64_MAX - 1, 2));
}

TEST(GroupSize, MultipliesAxes) {
  std::vector<int64_t> dims = {2, 4, 8};
  EXPECT_EQ(fsdp_rt::groupSizeOf(dims.data(), dims.size()), 64);
  EXPECT_EQ(fsdp_rt::groupSizeOf(dims.data(), 0), 1);
}

TEST(GroupSize, RejectsNonPositiveAndOverflow) {
  std::vector<int64_t> zero = {2, 0};
  EXPECT_FALSE(fsdp_rt::groupSizeOf(zero.data(), zero.size()));
  std::vector<int64_t> dynamic = {-1};
  EXPECT_FALSE(fsdp_rt::groupSizeOf(dynamic.data(), dynamic.size()));
  std::vector<int64_t> huge = {INT64_MAX / 2, 3};
  EXPECT_FALSE(fsdp_rt::groupSizeOf(huge.data(), huge.size()));
}

} // namespace
