//===- FutureTypeTest.cpp - rules only C++ builders can break -------------===//
//
// The parser cannot produce an empty !fsdp.future (`!fsdp.future<>` is a parse
// error), but code that builds types can; the type verifier must refuse it.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Dialect/FsdpDialect.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <string>

using namespace mlir;

namespace {

class FutureTypeTest : public ::testing::Test {
protected:
  FutureTypeTest() { context.loadDialect<fsdp::FsdpDialect>(); }

  /// Builds a future through the verifying builder; returns the diagnostic.
  std::string diagnosticFor(ArrayRef<Type> results) {
    std::string message;
    ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
      message = diag.str();
      return success();
    });
    fsdp::FutureType type = fsdp::FutureType::getChecked(
        [&] { return emitError(UnknownLoc::get(&context)); }, &context, results);
    EXPECT_EQ(static_cast<bool>(type), message.empty());
    return message;
  }

  MLIRContext context;
};

TEST_F(FutureTypeTest, RejectsAnEmptyResultList) {
  EXPECT_EQ(diagnosticFor({}), "!fsdp.future needs at least one result type");
}

TEST_F(FutureTypeTest, RejectsDynamicShapes) {
  Type dynamic = RankedTensorType::get({ShapedType::kDynamic}, Float32Type::get(&context));
  EXPECT_EQ(diagnosticFor({dynamic}),
            "!fsdp.future result 0 must be a statically shaped tensor, got 'tensor<?xf32>'");
}

TEST_F(FutureTypeTest, AcceptsStaticTensors) {
  Type tensor = RankedTensorType::get({4, 2}, BFloat16Type::get(&context));
  EXPECT_EQ(diagnosticFor({tensor, tensor}), "");
}

} // namespace
