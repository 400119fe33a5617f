//===- AtenOpNameTest.cpp - ATen schema names -----------------------------===//

#include "fsdp/Support/AtenOpName.h"

#include <gtest/gtest.h>

using mlir::fsdp::AtenOpName;

namespace {

TEST(AtenOpName, SplitsNamespaceNameAndOverload) {
  auto name = AtenOpName::parse("aten::add.Tensor");
  ASSERT_TRUE(name);
  EXPECT_EQ(name->nameSpace, "aten");
  EXPECT_EQ(name->name, "add");
  EXPECT_EQ(name->overload, "Tensor");
}

TEST(AtenOpName, OverloadIsOptional) {
  auto name = AtenOpName::parse("aten::_to_copy");
  ASSERT_TRUE(name);
  EXPECT_EQ(name->name, "_to_copy");
  EXPECT_TRUE(name->overload.empty());
}

TEST(AtenOpName, AcceptsOtherNamespaces) {
  EXPECT_TRUE(AtenOpName::parse("prims::convert_element_type.default"));
  EXPECT_TRUE(AtenOpName::parse("mylib::fused_rope"));
}

TEST(AtenOpName, RejectsMalformedNames) {
  for (const char *bad : {"", "mm", "aten::", "::mm", "aten::mm.", "aten::mm.a.b",
                          "aten::1mm", "aten:mm", "aten::m m", "aten::mm::x",
                          "at-en::mm"})
    EXPECT_FALSE(AtenOpName::parse(bad)) << "'" << bad << "'";
}

TEST(AtenOpName, ClassifiesInPlaceOperators) {
  EXPECT_TRUE(AtenOpName::parse("aten::add_.Tensor")->isInPlace());
  EXPECT_TRUE(AtenOpName::parse("aten::__iand__.Tensor")->isInPlace());
  EXPECT_FALSE(AtenOpName::parse("aten::add.Tensor")->isInPlace());
  EXPECT_FALSE(AtenOpName::parse("aten::__and__.Tensor")->isInPlace());
  EXPECT_FALSE(AtenOpName::parse("aten::_softmax")->isInPlace());
}

} // namespace

namespace {

TEST(ViewOperators, ViewsShareStorage) {
  for (const char *view : {"aten::view", "aten::permute", "aten::t", "aten::expand",
                           "aten::slice.Tensor", "aten::split_with_sizes", "aten::alias"})
    EXPECT_TRUE(mlir::fsdp::isViewOperator(view)) << view;
}

TEST(ViewOperators, CopiesAndComputeDoNot) {
  for (const char *copy : {"aten::clone", "aten::mm", "aten::_to_copy", "aten::reshape_copy",
                           "aten::view_copy", "aten::permute_copy", "view"})
    EXPECT_FALSE(mlir::fsdp::isViewOperator(copy)) << copy;
}

} // namespace
