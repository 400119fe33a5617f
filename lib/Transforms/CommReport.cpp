//===- CommReport.cpp - per-rank communication volume per step ------------===//
//
// Before: a scheduled step. After: the same IR with its volume attached, and
// a report written:
//
//   func.func @train_step(...) attributes {fsdp.comm = {all_gather_bytes = 4608 : i64,
//       all_gather_count = 4 : i64, reduce_scatter_bytes = 2304 : i64, ...}}
//
// Per rank and collective over n ranks of S bytes (the full, padded tensors
// in the dtype on the wire): all-gather and reduce-scatter send (n-1)/n S,
// all-reduce 2(n-1)/n S (ring algorithms, nccl-tests' bus-bandwidth model).
// On Gloo (backend=gloo, the default) every collective is an all-reduce of
// S, because that is how the runtime runs them there (Executor.cpp).
//
// Test: test/Transforms/comm-report.mlir.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Analysis/Step.h"
#include "fsdp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/JSON.h"

namespace mlir::fsdp {
#define GEN_PASS_DEF_COMMREPORTPASS
#include "fsdp/Passes.h.inc"
} // namespace mlir::fsdp

using namespace mlir;
using namespace mlir::fsdp;

namespace {

struct Volume {
  int64_t count = 0;
  int64_t bytesOnWire = 0; // per rank
  int64_t payloadBytes = 0; // full tensors in the wire dtype, before the (n-1)/n factor
};

struct CommReportPass : public fsdp::impl::CommReportPassBase<CommReportPass> {
  using CommReportPassBase::CommReportPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (failed(checkReportFormat(module, format)))
      return signalPassFailure();
    if (failed(checkBackend(module, backend)))
      return signalPassFailure();
    // Gloo: the runtime reduces every bucket in place with an all-reduce.
    bool everyCollectiveAllReduces = backend == "gloo";
    SymbolTableCollection tables;
    Builder builder(module.getContext());
    llvm::json::Array reports;
    std::string table;
    llvm::raw_string_ostream out(table);
    for (Step &step : collectSteps(module)) {
      llvm::StringMap<Volume> volumes;
      for (Operation &op : step.body()) {
        if (!isCollectiveStart(&op))
          continue;
        auto gridRef = op.getAttrOfType<FlatSymbolRefAttr>("grid");
        auto grid = tables.lookupNearestSymbolFrom<shard::GridOp>(&op, gridRef);
        auto axes = op.getAttrOfType<DenseI16ArrayAttr>("grid_axes").asArrayRef();
        int64_t ranks = groupSize(grid, axes);
        int64_t full = collectivePayloadBytes(&op, ranks);
        int64_t factor = everyCollectiveAllReduces || isa<AllReduceStartOp>(op) ? 2 : 1;
        StringRef kind = op.getName().stripDialect().drop_back(strlen("_start"));
        Volume &volume = volumes[kind];
        volume.count += 1;
        volume.payloadBytes += full;
        volume.bytesOnWire += factor * full * (ranks - 1) / ranks;
      }
      SmallVector<NamedAttribute> fields;
      llvm::json::Object byKind;
      int64_t total = 0;
      out << "communication per rank and step: @" << step.func.getSymName() << "\n";
      for (StringRef kind : {"all_gather", "reduce_scatter", "all_reduce"}) {
        Volume volume = volumes.lookup(kind);
        total += volume.bytesOnWire;
        fields.push_back(builder.getNamedAttr((kind + "_count").str(),
                                              builder.getI64IntegerAttr(volume.count)));
        fields.push_back(builder.getNamedAttr((kind + "_bytes").str(),
                                              builder.getI64IntegerAttr(volume.bytesOnWire)));
        byKind[kind] = llvm::json::Object{{"count", volume.count},
                                          {"bytes", volume.bytesOnWire},
                                          {"payload_bytes", volume.payloadBytes}};
        out << llvm::format("  %-15s %5lld collectives %16lld B sent (%lld B gathered or reduced)\n",
                            kind.str().c_str(), (long long)volume.count,
                            (long long)volume.bytesOnWire, (long long)volume.payloadBytes);
      }
      out << llvm::format("  %-15s %5s             %16lld B\n", "total", "", (long long)total);
      fields.push_back(builder.getNamedAttr("total_bytes", builder.getI64IntegerAttr(total)));
      step.func->setAttr("fsdp.comm", builder.getDictionaryAttr(fields));
      reports.push_back(llvm::json::Object{{"function", step.func.getSymName()},
                                           {"collectives", std::move(byKind)},
                                           {"total_bytes", total}});
    }
    if (failed(writeReport(module, output, format, std::move(reports), table)))
      return signalPassFailure();
    markAllAnalysesPreserved();
  }
};

} // namespace
