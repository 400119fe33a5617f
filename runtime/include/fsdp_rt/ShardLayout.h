//===- ShardLayout.h - dim-0 shard and padding arithmetic -------*- C++ -*-===//
//
// The one definition of how a tensor is split over the ranks of a group. The
// compiler's verifiers and the runtime's copy kernels both use it, so the two
// can never disagree about where a rank's rows live.
//
// Layout (PyTorch FSDP2 compatible): every rank stores `shardRows()` =
// ceil(dim0 / groupSize) rows. torch.chunk gives the remainder to the earlier
// ranks, so trailing ranks hold fewer real rows (possibly none); the rest of
// their shard is zero padding that no user-visible tensor ever contains.
//
// Header-only, C++17, no dependencies: it must build with nvcc and the torch
// wheel alone on machines that have no MLIR.
//
//===----------------------------------------------------------------------===//

#ifndef FSDP_RT_SHARDLAYOUT_H
#define FSDP_RT_SHARDLAYOUT_H

#include <cstdint>
#include <limits>
#include <optional>

namespace fsdp_rt {

/// Product of group dimensions, or nullopt if a dimension is not positive or
/// the product overflows int64.
inline std::optional<int64_t> groupSizeOf(const int64_t *dims, size_t count) {
  int64_t product = 1;
  for (size_t i = 0; i < count; ++i) {
    if (dims[i] < 1 || __builtin_mul_overflow(product, dims[i], &product))
      return std::nullopt;
  }
  return product;
}

class Dim0ShardLayout {
public:
  /// The layout of `dim0` rows over `groupSize` ranks, or nullopt when the
  /// arguments make no layout (negative rows, an empty group, or a padded size
  /// that does not fit in int64).
  static std::optional<Dim0ShardLayout> create(int64_t dim0, int64_t groupSize) {
    if (dim0 < 0 || groupSize < 1 ||
        dim0 > std::numeric_limits<int64_t>::max() - (groupSize - 1))
      return std::nullopt;
    return Dim0ShardLayout(dim0, groupSize);
  }

  int64_t dim0() const { return dim0_; }
  int64_t groupSize() const { return groupSize_; }
  /// Rows every rank stores, real and padding together.
  int64_t shardRows() const { return (dim0_ + groupSize_ - 1) / groupSize_; }
  /// Rows of the padded full tensor: groupSize * shardRows.
  int64_t paddedRows() const { return shardRows() * groupSize_; }
  /// Zero rows appended across the group.
  int64_t paddingRows() const { return paddedRows() - dim0_; }
  /// First logical row that `rank` holds (dim0 when it holds none).
  int64_t rowBegin(int64_t rank) const { return clampToDim0(rank * shardRows()); }
  /// Real (non-padding) rows that `rank` holds.
  int64_t realRows(int64_t rank) const {
    return clampToDim0((rank + 1) * shardRows()) - rowBegin(rank);
  }

private:
  Dim0ShardLayout(int64_t dim0, int64_t groupSize)
      : dim0_(dim0), groupSize_(groupSize) {}
  int64_t clampToDim0(int64_t row) const { return row < dim0_ ? row : dim0_; }

  int64_t dim0_;
  int64_t groupSize_;
};

} // namespace fsdp_rt

#endif // FSDP_RT_SHARDLAYOUT_H
