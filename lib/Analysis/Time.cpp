//===- Time.cpp - the predicted time of a step on a GPU -------------------===//

#include "fsdp/Analysis/Time.h"

#include "fsdp/Analysis/Memory.h"
#include "fsdp/Support/AtenOpName.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/StringSwitch.h"

#include <algorithm>
#include <cmath>

using namespace mlir;
using namespace mlir::fsdp;

namespace {

constexpr int64_t kMiB = 1 << 20;

// Memory totals are nvidia-smi's (H100 SXM 80GB 81,559 MiB and A100 80GB
// 81,920 MiB as seen in modal-labs/modal-client#2797 and NVIDIA/nccl#1264;
// H200 143,771 MiB; 96 GB HBM modules 97,871 MiB, as GH200 96GB reports).
// Peaks and bandwidths are NVIDIA's datasheet figures; bus bandwidths are
// what nccl-tests reaches: ~370 GB/s for all-gather and reduce-scatter over
// 8 NVLink-4 H100s, ~230 GB/s over 8 NVLink-3 A100s, and about 90% of the
// per-GPU network link across nodes (400 Gb/s on H100/H200 clusters, 200 Gb/s
// on A100 ones). Host links: PCIe 5 (4 on A100) x16, pinned copies.
const std::pair<StringRef, GpuKind> kGpuKinds[] = {
    {"h100-sxm", {"H100 SXM 80GB", 81559 * kMiB, 989e12, 67e12, 3.35e12, 370e9, 45e9, 50e9}},
    {"h100-96gb", {"H100 96GB HBM2e (500 W)", 97871 * kMiB, 989e12, 67e12, 2.4e12, 370e9, 45e9, 50e9}},
    {"h200", {"H200 141GB", 143771 * kMiB, 989e12, 67e12, 4.8e12, 370e9, 45e9, 50e9}},
    {"a100-80gb", {"A100 SXM 80GB", 81920 * kMiB, 312e12, 19.5e12, 2.039e12, 230e9, 22.5e9, 25e9}},
};

} // namespace

const GpuKind *mlir::fsdp::lookupGpuKind(StringRef key) {
  for (const auto &[name, kind] : kGpuKinds)
    if (name == key)
      return &kind;
  return nullptr;
}

std::string mlir::fsdp::gpuKindList() {
  std::string list;
  for (const auto &[name, kind] : kGpuKinds)
    list += (list.empty() ? "" : ", ") + name.str();
  return list;
}

LogicalResult mlir::fsdp::checkMachine(const Machine &machine, Operation *anchor) {
  const GpuKind &m = machine.gpu;
  // Values are checked in SI units and reported in the option's.
  auto positive = [&](double value, StringRef what, double scale = 1) -> LogicalResult {
    if (std::isfinite(value) && value > 0)
      return success();
    return anchor->emitError() << "time model: " << what << " must be > 0, got " << value / scale;
  };
  auto fraction = [&](double value, StringRef what) -> LogicalResult {
    if (std::isfinite(value) && value > 0 && value <= 1)
      return success();
    return anchor->emitError() << "time model: " << what << " must be in (0, 1], got " << value;
  };
  auto nonNegative = [&](double value, StringRef what) -> LogicalResult {
    if (std::isfinite(value) && value >= 0)
      return success();
    return anchor->emitError() << "time model: " << what << " must be >= 0, got " << value;
  };
  if (failed(positive(double(m.memory), "memory-gib", double(1 << 30))) ||
      failed(positive(m.tensorFlops, "tensor-tflops", 1e12)) ||
      failed(positive(m.fp32Flops, "fp32-tflops", 1e12)) ||
      failed(positive(m.memoryBandwidth, "memory-gbps", 1e9)) ||
      failed(positive(m.intraNodeBandwidth, "intra-node-gbps", 1e9)) ||
      failed(positive(m.interNodeBandwidth, "inter-node-gbps", 1e9)) ||
      failed(positive(m.hostLinkBandwidth, "host-link-gbps", 1e9)) ||
      failed(positive(machine.hostOptimizerBandwidth, "host-optimizer-gbps", 1e9)) ||
      failed(fraction(machine.matmulEfficiency, "matmul-efficiency")) ||
      failed(fraction(machine.attentionEfficiency, "attention-efficiency")) ||
      failed(fraction(machine.memoryEfficiency, "memory-efficiency")) ||
      failed(nonNegative(machine.collectiveLatency, "collective-latency-us")) ||
      failed(nonNegative(machine.intraNodeHopLatency, "intra-node-hop-us")) ||
      failed(nonNegative(machine.interNodeHopLatency, "inter-node-hop-us")) ||
      failed(nonNegative(machine.shortestKernel, "shortest-kernel-us")) ||
      failed(nonNegative(machine.issueTime, "issue-us")))
    return failure();
  if (machine.gpusPerNode < 1)
    return anchor->emitError() << "time model: gpus-per-node must be >= 1, got " << machine.gpusPerNode;
  return success();
}

namespace {

RankedTensorType tensorOf(Value value) { return dyn_cast<RankedTensorType>(value.getType()); }

bool onTensorCores(Type type) {
  // Null where a kernel leaves an output out (convolution_backward's input gradient).
  auto tensor = dyn_cast_or_null<RankedTensorType>(type);
  return tensor && (tensor.getElementType().isBF16() || tensor.getElementType().isF16());
}

/// Scaled-dot-product attention kernels: the schema positions of the query,
/// the key and `is_causal`. The backward kernels take the output gradient
/// first. Positions follow ATen's native_functions.yaml.
struct AttentionKernel {
  unsigned query, key, isCausal;
  bool backward;
};

std::optional<AttentionKernel> attentionKernel(StringRef callee) {
  return llvm::StringSwitch<std::optional<AttentionKernel>>(callee)
      .Case("aten::_scaled_dot_product_flash_attention", AttentionKernel{0, 1, 4, false})
      .Case("aten::_scaled_dot_product_efficient_attention", AttentionKernel{0, 1, 6, false})
      .Case("aten::_scaled_dot_product_cudnn_attention", AttentionKernel{0, 1, 6, false})
      .Case("aten::_scaled_dot_product_flash_attention_for_cpu", AttentionKernel{0, 1, 4, false})
      .Case("aten::_scaled_dot_product_flash_attention_backward", AttentionKernel{1, 2, 11, true})
      .Case("aten::_scaled_dot_product_efficient_attention_backward", AttentionKernel{1, 2, 11, true})
      .Case("aten::_scaled_dot_product_cudnn_attention_backward", AttentionKernel{1, 2, 14, true})
      .Case("aten::_scaled_dot_product_flash_attention_for_cpu_backward", AttentionKernel{1, 2, 7, true})
      .Default(std::nullopt);
}

/// The tensor operand at schema position `position` of an fsdp.aten op
/// (its `args` name operands by index), or null.
Value operandAt(AtenOp op, unsigned position) {
  ArrayAttr args = op.getArgsAttr();
  if (!args) // no literals: the operands are the schema's arguments in order
    return position < op.getInputs().size() ? op.getInputs()[position] : Value();
  if (position >= args.size())
    return {};
  auto index = dyn_cast<IntegerAttr>(args[position]);
  if (!index || !index.getType().isIndex())
    return {};
  return op.getInputs()[index.getInt()];
}

double elements(RankedTensorType type) { return type ? double(type.getNumElements()) : 0; }

OpWork atenWork(AtenOp op) {
  OpWork work;
  StringRef callee = op.getCallee();
  if (isViewOperator(callee)) {
    work.kind = OpWork::View;
    return work;
  }
  for (Value input : op.getInputs())
    work.bytes += tensorBytes(input.getType());
  for (Type result : op->getResultTypes())
    work.bytes += tensorBytes(result);
  RankedTensorType result = op->getNumResults() ? dyn_cast<RankedTensorType>(op->getResultTypes()[0])
                                                : RankedTensorType();
  work.tensorCores = onTensorCores(result);
  // Matrix products: 2 x result elements x the contracted size.
  unsigned matrix = llvm::StringSwitch<unsigned>(callee)
                        .Cases({"aten::mm", "aten::bmm"}, 0)
                        .Cases({"aten::addmm", "aten::baddbmm"}, 1)
                        .Default(~0u);
  if (matrix != ~0u) {
    RankedTensorType lhs = tensorOf(operandAt(op, matrix));
    if (lhs && result && lhs.getRank() >= 2) {
      work.kind = OpWork::Matmul;
      work.flops = 2 * elements(result) * double(lhs.getShape().back());
      if (matrix == 1 && operandAt(op, 0) && operandAt(op, 0).getType() == result)
        work.copyBytes = 2 * tensorBytes(result);
    }
    return work;
  }
  if (callee == "aten::convolution" || callee == "aten::convolution_backward") {
    bool backward = callee == "aten::convolution_backward";
    RankedTensorType weight = tensorOf(operandAt(op, backward ? 2 : 1));
    RankedTensorType output = backward ? tensorOf(operandAt(op, 0)) : result;
    if (weight && output && weight.getRank() >= 1 && weight.getShape()[0] > 0) {
      work.kind = OpWork::Matmul;
      work.tensorCores = onTensorCores(weight);
      double perOutput = elements(weight) / double(weight.getShape()[0]);
      // Backward computes the input's and the weight's gradients, each as
      // much as forward, where they are asked for (not `none`).
      int products = backward ? int(isa<RankedTensorType>(op->getResult(0).getType())) +
                                    int(isa<RankedTensorType>(op->getResult(1).getType()))
                              : 1;
      work.flops = 2 * products * elements(output) * perOutput;
    }
    return work;
  }
  if (std::optional<AttentionKernel> kernel = attentionKernel(callee)) {
    RankedTensorType query = tensorOf(operandAt(op, kernel->query));
    RankedTensorType key = tensorOf(operandAt(op, kernel->key));
    if (query && key && query.getRank() == 4 && key.getRank() == 4) {
      work.kind = OpWork::Attention;
      work.tensorCores = onTensorCores(query);
      // Q K^T and P V: 4 x batch x heads x queries x keys x head size;
      // causal masking skips half; backward recomputes P and makes three
      // gradients, 2.5 times forward (FlashAttention's count).
      double forward = 4 * elements(query) * double(key.getShape()[2]);
      if (boolLiteral(op, kernel->isCausal).value_or(false))
        forward /= 2;
      work.flops = kernel->backward ? 2.5 * forward : forward;
    }
    return work;
  }
  // A lookup reads the indices and the rows it returns, not the table.
  if (callee == "aten::embedding" && result)
    work.bytes = tensorBytes(op.getInputs().back().getType()) + 2 * tensorBytes(result);
  return work;
}

/// A kernel's time at the full peak (matrix products, attention) or memory
/// bandwidth (everything else): its class's share of `StepTime`'s ideal.
double idealSeconds(const OpWork &work, const GpuKind &gpu) {
  if (work.kind == OpWork::Memory)
    return work.bytes / gpu.memoryBandwidth;
  return work.flops / (work.tensorCores ? gpu.tensorFlops : gpu.fp32Flops);
}

double kernelSeconds(const OpWork &work, const Machine &machine) {
  OpWork streamed = work; // every kernel streams its bytes, whatever bounds it
  streamed.kind = OpWork::Memory;
  double memory = idealSeconds(streamed, machine.gpu) / machine.memoryEfficiency;
  double math = 0;
  if (work.kind == OpWork::Matmul)
    math = idealSeconds(work, machine.gpu) / machine.matmulEfficiency;
  else if (work.kind == OpWork::Attention)
    math = idealSeconds(work, machine.gpu) / machine.attentionEfficiency;
  double copy = work.copyBytes / (machine.gpu.memoryBandwidth * machine.memoryEfficiency);
  return std::max({memory, math, machine.shortestKernel}) + copy;
}

/// Whether the group of `start` (taken at rank 0: every group of the same
/// axes has its shape) spans more than one node, ranks numbered row-major
/// over the grid and `gpusPerNode` consecutive ranks to a node.
bool crossesNodes(shard::GridOp grid, ArrayRef<int16_t> axes, int64_t gpusPerNode) {
  ArrayRef<int64_t> shape = grid.getShape();
  SmallVector<int64_t> strides(shape.size(), 1);
  for (int64_t axis = int64_t(shape.size()) - 2; axis >= 0; --axis)
    strides[axis] = strides[axis + 1] * shape[axis + 1];
  int64_t farthest = 0;
  for (int16_t axis : axes)
    farthest += (shape[axis] - 1) * strides[axis];
  return farthest >= gpusPerNode;
}

double collectiveSeconds(Operation *start, int64_t ranks, int64_t payload, bool acrossNodes,
                         const Machine &machine) {
  if (ranks == 1) // NCCL copies the buffer on the device
    return payload / (machine.gpu.memoryBandwidth * machine.memoryEfficiency);
  double bandwidth = acrossNodes ? machine.gpu.interNodeBandwidth : machine.gpu.intraNodeBandwidth;
  double hop = acrossNodes ? machine.interNodeHopLatency : machine.intraNodeHopLatency;
  double passes = isa<AllReduceStartOp>(start) ? 2 : 1; // reduce-scatter then all-gather
  return machine.collectiveLatency + passes * (ranks - 1) * hop +
         passes * double(ranks - 1) / double(ranks) * double(payload) / bandwidth;
}

std::string intervalName(Operation *op) {
  if (auto aten = dyn_cast<AtenOp>(op))
    return aten.getCallee().str();
  if (auto kernel = dyn_cast<PointwiseOp>(op)) {
    std::string name = "pointwise(";
    for (Operation &inner : kernel.getBody().front().without_terminator())
      name += (name.back() == '(' ? "" : ", ") + cast<AtenOp>(inner).getCallee().str();
    return name + ")";
  }
  std::string name = op->getName().getStringRef().str();
  if (auto unit = op->getAttrOfType<FlatSymbolRefAttr>("unit"))
    name += " @" + unit.getValue().str();
  return name;
}

} // namespace

OpWork mlir::fsdp::workOf(Operation *op) {
  if (auto aten = dyn_cast<AtenOp>(op))
    return atenWork(aten);
  OpWork work;
  for (Value input : op->getOperands())
    work.bytes += tensorBytes(input.getType());
  for (Type result : op->getResultTypes())
    work.bytes += tensorBytes(result);
  return work;
}

static const char *kindName(OpWork::Kind kind) {
  switch (kind) {
  case OpWork::Matmul: return "matmul";
  case OpWork::Attention: return "attention";
  case OpWork::View: return "view";
  case OpWork::Memory: return "memory";
  }
  return "memory";
}

llvm::StringMap<std::string> mlir::fsdp::kernelClasses(Step &step) {
  llvm::StringMap<std::string> classes;
  for (Operation &op : step.body()) {
    auto aten = dyn_cast<AtenOp>(op);
    std::optional<AtenOpName> name = aten ? AtenOpName::parse(aten.getCallee()) : std::nullopt;
    if (!name)
      continue;
    classes.try_emplace((name->nameSpace + "::" + name->name).str(), kindName(workOf(&op).kind));
  }
  return classes;
}

namespace {

/// The streams of offloaded units' copies, one each way across the host link.
constexpr StringLiteral kToDeviceTrack = "host to device", kToHostTrack = "device to host";

/// Host optimizer work that a step inherits from the one before: offloaded
/// units' updates still to run when it begins, in the order the thread runs
/// them, each with the seconds it has left.
using HostCarry = SmallVector<std::pair<std::string, double>>;

/// What the optimizer streams in a step: it reads the shard, the gradient
/// and each state tensor and writes the shard and the states, on the device
/// or, for offloaded units, on the host; those units in the order the step
/// gathers them.
struct OptimizerTraffic {
  double deviceBytes = 0, hostBytes = 0;
  llvm::StringMap<double> hostBytesOf;
  SmallVector<std::string> hostGatherOrder;

  /// How long the host optimizer takes over offloaded `unit`.
  double hostSeconds(StringRef unit, const Machine &machine) const {
    return hostBytesOf.lookup(unit) / machine.hostOptimizerBandwidth;
  }
};

OptimizerTraffic optimizerTraffic(ModuleOp module, Step &step, int64_t statesPerElement) {
  OptimizerTraffic traffic;
  SymbolTableCollection tables;
  for (ParamOp param : module.getOps<ParamOp>()) {
    ParamState state = paramState(param, tables, statesPerElement);
    if (!state.grad)
      continue;
    double bytes = 2 * state.shard + state.grad + 2 * state.optimizer;
    if (param.isOffloaded()) {
      traffic.hostBytesOf[param.getUnit()] += bytes;
      traffic.hostBytes += bytes;
    } else {
      traffic.deviceBytes += bytes;
    }
  }
  for (Operation &op : step.body())
    if (auto gather = dyn_cast<AllGatherStartOp>(op); gather && gather.getHost() && gather.getUnitAttr()) {
      std::string unit = gather.getUnitAttr().getValue().str();
      if (traffic.hostBytesOf.count(unit) && !llvm::is_contained(traffic.hostGatherOrder, unit))
        traffic.hostGatherOrder.push_back(unit);
    }
  return traffic;
}

/// The host thread's schedule in backward: each unit from when its
/// gradients land (`landed`, seconds into the step), whenever the thread
/// is free from `free` on, the landed unit the next forward gathers first
/// (`gatherOrder`); a unit takes `seconds(unit)`. Returns each unit's
/// [begin, end).
SmallVector<std::tuple<std::string, double, double>>
stepAsLanded(const llvm::StringMap<double> &landed, ArrayRef<std::string> gatherOrder,
             llvm::function_ref<double(StringRef)> seconds, double free) {
  SmallVector<std::tuple<std::string, double, double>> schedule;
  SmallVector<std::string> order(gatherOrder.begin(), gatherOrder.end());
  for (const auto &unit : landed) // a unit no gather reads goes last
    if (!llvm::is_contained(order, unit.getKey().str()))
      order.push_back(unit.getKey().str());
  llvm::StringSet<> done;
  while (done.size() < landed.size()) {
    const std::string *pick = nullptr;
    double earliest = std::numeric_limits<double>::infinity();
    for (const std::string &unit : order) {
      auto it = landed.find(unit);
      if (it == landed.end() || done.contains(unit))
        continue;
      if (it->second <= free) {
        pick = &unit;
        break;
      }
      earliest = std::min(earliest, it->second);
    }
    if (!pick) {
      free = earliest;
      continue;
    }
    double took = seconds(*pick);
    schedule.emplace_back(*pick, free, free + took);
    free += took;
    done.insert(*pick);
  }
  return schedule;
}

/// One step from its start: `carry` is what the host thread still has to
/// do then (stepped before each unit's gather); with `inBackward` the
/// thread also steps each unit from when its gradients land, and `next`
/// receives what is left when the step ends.
StepTime walkStep(Step &step, const Machine &machine, const OptimizerTraffic &traffic,
                  HostOptimizerTiming timing, const HostCarry &carry, HostCarry *next) {
  StepTime time;
  SymbolTableCollection tables;
  time.tracks.push_back("compute");
  constexpr int kCompute = 0;
  llvm::StringMap<int> trackOf;
  SmallVector<double> trackFree(1, 0.0);
  auto track = [&](StringRef name) {
    auto [it, added] = trackOf.try_emplace(name, int(time.tracks.size()));
    if (added) {
      time.tracks.push_back(name.str());
      trackFree.push_back(0);
    }
    return it->second;
  };
  // When the host has issued everything so far. A step replayed as a CUDA
  // graph costs the host its launch and the batch's copies (three issues)
  // and nothing per instruction.
  bool replayed = step.func->hasAttr(kCudaGraphAttr);
  double host = replayed ? 3 * machine.issueTime : 0;
  double issue = replayed ? 0 : machine.issueTime;
  auto record = [&](Operation *op, std::string name, int onTrack, double begin, double duration,
                    double flops = 0, int64_t bytes = 0) {
    time.intervals.push_back({std::move(name), onTrack, begin, begin + duration, op, flops, bytes});
    trackFree[onTrack] = begin + duration;
  };
  // Runs `duration` on the compute stream once the host has issued it.
  auto onCompute = [&](Operation *op, std::string name, double duration, double flops, int64_t bytes) {
    if (host > trackFree[kCompute])
      time.hostBound += host - trackFree[kCompute];
    record(op, std::move(name), kCompute, std::max(host, trackFree[kCompute]), duration, flops, bytes);
    time.compute += duration;
  };
  DenseMap<Operation *, double> collectiveEnd;
  auto memorySeconds = [&](double bytes) {
    return bytes / (machine.gpu.memoryBandwidth * machine.memoryEfficiency);
  };

  // Overlapped, the host thread steps what it carries from the step's
  // start, in order, and the runtime waits at each unit's gather for its
  // update.
  llvm::StringMap<double> updated; // unit -> when its carried update ends
  double carriedUntil = 0;
  for (const auto &[unit, seconds] : carry) {
    int thread = track("host optimizer");
    record(nullptr, "host optimizer step @" + unit, thread, carriedUntil, seconds);
    carriedUntil += seconds;
    updated[unit] = carriedUntil;
  }
  llvm::StringMap<double> landed; // in backward: unit -> when its gradients are in host memory

  for (Operation &op : step.body()) {
    if (isa<AtenOp, PointwiseOp, CastOp, AllSliceOp>(op)) {
      host += issue;
      ++time.instructions;
      OpWork work = workOf(&op);
      if (work.kind == OpWork::View)
        continue;
      onCompute(&op, intervalName(&op), kernelSeconds(work, machine), work.flops, int64_t(work.bytes));
      double &ideal = work.kind == OpWork::Matmul      ? time.idealMatmul
                      : work.kind == OpWork::Attention ? time.idealAttention
                                                       : time.idealMemory;
      ideal += idealSeconds(work, machine.gpu);
      time.idealMemory += work.copyBytes / machine.gpu.memoryBandwidth;
      time.flops += work.flops;
      if (!op.hasAttr(kRecomputedAttr))
        time.modelFlops += work.flops;
      continue;
    }
    if (isCollectiveStart(&op)) {
      host += issue;
      ++time.instructions;
      auto gridRef = op.getAttrOfType<FlatSymbolRefAttr>("grid");
      auto grid = tables.lookupNearestSymbolFrom<shard::GridOp>(&op, gridRef);
      auto axes = op.getAttrOfType<DenseI16ArrayAttr>("grid_axes").asArrayRef();
      int64_t ranks = groupSize(grid, axes);
      int64_t payload = collectivePayloadBytes(&op, ranks);
      int64_t inputBytes = 0;
      for (Value input : op.getOperands())
        inputBytes += tensorBytes(input.getType());
      // Copy-in: every input read once, the bucket written in the wire dtype.
      double packBytes = double(inputBytes) +
                         (isa<AllGatherStartOp>(op) ? double(payload) / double(ranks) : double(payload));
      double ready;
      if (op.hasAttr("host") && isa<AllGatherStartOp>(op)) {
        auto unit = op.getAttrOfType<FlatSymbolRefAttr>("unit");
        if (unit)
          if (auto it = updated.find(unit.getValue()); it != updated.end())
            host = std::max(host, it->second);
        // The shards cross the host link on the host-to-device stream,
        // after the compute stream's work so far, and are packed there.
        int transfer = track(kToDeviceTrack);
        double begin = std::max({host, trackFree[kCompute], trackFree[transfer]});
        double copy = inputBytes / machine.gpu.hostLinkBandwidth + memorySeconds(packBytes);
        record(&op, "host to device " + intervalName(&op), transfer, begin, copy, 0, inputBytes);
        time.transfer += copy;
        ready = trackFree[transfer];
      } else {
        onCompute(&op, "copy-in " + intervalName(&op), memorySeconds(packBytes), 0, int64_t(packBytes));
        time.idealMemory += packBytes / machine.gpu.memoryBandwidth;
        ready = trackFree[kCompute];
      }
      std::string groupName = "collectives @" + gridRef.getValue().str() + " axes [";
      llvm::raw_string_ostream groupStream(groupName);
      llvm::interleaveComma(axes, groupStream);
      groupStream << "]";
      int onGroup = track(groupName);
      double duration =
          collectiveSeconds(&op, ranks, payload, crossesNodes(grid, axes, machine.gpusPerNode), machine);
      record(&op, intervalName(&op), onGroup, std::max(ready, trackFree[onGroup]), duration, 0, payload);
      time.communication += duration;
      collectiveEnd[&op] = trackFree[onGroup];
      continue;
    }
    if (auto wait = dyn_cast<WaitOp>(op)) {
      Operation *start = wait.getFuture().getDefiningOp();
      double end = collectiveEnd.lookup(start);
      double computeFree = std::max(host, trackFree[kCompute]);
      if (end > computeFree) {
        time.exposedCommunication += end - computeFree;
        record(&op, "wait " + intervalName(start), kCompute, computeFree, end - computeFree);
      }
      int64_t bytes = 0; // the collective's results
      if (start)
        for (Type result : futureTypes(start))
          bytes += tensorBytes(result);
      auto gather = dyn_cast_or_null<AllGatherStartOp>(start);
      if (gather && !gather.getIntoResults()) {
        // Copy-out: the gathered buffer split into the parameters, read and
        // written once (one kernel), after the collective.
        onCompute(&op, "copy-out " + intervalName(start), memorySeconds(2.0 * bytes), 0, 2 * bytes);
        time.idealMemory += 2.0 * bytes / machine.gpu.memoryBandwidth;
      }
      if (start && start->hasAttr("host") && !gather) {
        // The link is full duplex: gradients go out on a stream of their own
        // while the next shards come in.
        int transfer = track(kToHostTrack);
        double copy = bytes / machine.gpu.hostLinkBandwidth;
        record(start, "device to host " + intervalName(start), transfer,
               std::max(end, trackFree[transfer]), copy, 0, bytes);
        time.transfer += copy;
        if (auto unit = start->getAttrOfType<FlatSymbolRefAttr>("unit"))
          landed[unit.getValue()] = std::max(landed.lookup(unit.getValue()), trackFree[transfer]);
      }
    }
  }

  // The optimizer steps each parameter where its state is: fused kernels
  // on the device after the step's kernels, the host's after the transfers
  // (or, overlapped, during the next step, above).
  double deviceEnd = *std::max_element(trackFree.begin(), trackFree.end());
  double transferEnd = 0;
  for (StringRef transferTrack : {kToDeviceTrack, kToHostTrack})
    if (trackOf.count(transferTrack))
      transferEnd = std::max(transferEnd, trackFree[trackOf.lookup(transferTrack)]);
  double deviceOptimizer = traffic.deviceBytes ? memorySeconds(traffic.deviceBytes) : 0;
  time.hostOptimizer = traffic.hostBytes / machine.hostOptimizerBandwidth;
  time.optimizer = deviceOptimizer + time.hostOptimizer;
  if (deviceOptimizer)
    record(nullptr, "optimizer step", kCompute, std::max(host, deviceEnd), deviceOptimizer);
  if (time.hostOptimizer && timing == HostOptimizerTiming::AfterStep) // once the transfer streams are done
    record(nullptr, "host optimizer step", track("host optimizer"), std::max(host, transferEnd),
           time.hostOptimizer);
  int thread = trackOf.count("host optimizer") ? int(trackOf.lookup("host optimizer")) : -1;
  double deviceDone = host;
  for (int onTrack = 0; onTrack < int(trackFree.size()); ++onTrack)
    if (onTrack != thread || timing == HostOptimizerTiming::AfterStep)
      deviceDone = std::max(deviceDone, trackFree[onTrack]);
  time.step = deviceDone;
  if (timing != HostOptimizerTiming::InBackward || !next)
    return time;
  // In backward the thread goes on past the step's end: what it has not
  // done by then is the next step's carry, the unit it is in first, then
  // the others in gather order (all have landed by then).
  auto seconds = [&](StringRef unit) { return traffic.hostSeconds(unit, machine); };
  next->clear();
  HostCarry later;
  for (auto &[unit, begin, end] : stepAsLanded(landed, traffic.hostGatherOrder, seconds, carriedUntil)) {
    if (begin < time.step)
      record(nullptr, "host optimizer step @" + unit + " (in backward)", track("host optimizer"), begin,
             std::min(end, time.step) - begin);
    if (end > time.step)
      (begin < time.step ? *next : later).emplace_back(unit, end - std::max(begin, time.step));
  }
  for (const std::string &unit : traffic.hostGatherOrder)
    for (auto &[name, left] : later)
      if (name == unit)
        next->emplace_back(name, left);
  return time;
}

} // namespace

StepTime mlir::fsdp::predictStep(ModuleOp module, Step &step, const Machine &machine,
                                 int64_t statesPerElement, HostOptimizerTiming timing) {
  // The host thread's carry in the steady state: beside the next forward,
  // every offloaded unit in gather order; in backward, what the previous
  // step left, found by repeating the step until that settles.
  OptimizerTraffic traffic = optimizerTraffic(module, step, statesPerElement);
  HostCarry carry;
  if (timing != HostOptimizerTiming::AfterStep)
    for (const std::string &unit : traffic.hostGatherOrder)
      carry.emplace_back(unit, traffic.hostSeconds(unit, machine));
  if (timing != HostOptimizerTiming::InBackward)
    return walkStep(step, machine, traffic, timing, carry, nullptr);
  StepTime time;
  for (int pass = 0; pass < 16; ++pass) {
    HostCarry next;
    StepTime now = walkStep(step, machine, traffic, timing, carry, &next);
    bool settled = pass > 0 && std::abs(now.step - time.step) <= 1e-9 * std::max(1.0, now.step);
    time = std::move(now);
    carry = std::move(next);
    if (settled)
      break;
  }
  return time;
}
