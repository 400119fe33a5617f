//===- Bindings.cpp - fsdpc's Python face of the runtime ------------------===//
//
// The `_fsdp_rt` extension, built once by CMake next to libfsdp_rt: load a
// program, run one of its functions. The only translation unit that includes
// Python headers; runtime errors arrive in Python as RuntimeError.
//
//===----------------------------------------------------------------------===//

#include "fsdp_rt/ElementTypes.h"
#include "fsdp_rt/Executor.h"
#include "fsdp_rt/Kernels.h"
#include "fsdp_rt/Program.h"
#include "fsdp_rt/Replay.h"

#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>

namespace py = pybind11;

namespace {

using TensorMap = std::map<std::string, at::Tensor>;
using GroupMap = std::map<std::string, c10::intrusive_ptr<c10d::ProcessGroup>>;
using HostUpdateMap = std::map<std::string, std::shared_ptr<fsdp_rt::HostUpdate>>;

py::dict run(const fsdp_rt::Program &program, const std::string &name, TensorMap params,
             TensorMap buffers, TensorMap accumulated, std::vector<at::Tensor> batch, GroupMap groups,
             double timeoutSeconds, bool trace, bool checkReshardFrees, const HostUpdateMap &hostUpdates,
             std::shared_ptr<fsdp_rt::DeviceWaits> deviceWaits,
             std::shared_ptr<fsdp_rt::GradientLandings> landings, bool pinHostResults) {
  if (!(timeoutSeconds > 0))
    throw std::invalid_argument("timeout must be positive, got " + std::to_string(timeoutSeconds) + " s");
  fsdp_rt::StepInputs inputs;
  inputs.params = std::move(params);
  inputs.buffers = std::move(buffers);
  inputs.accumulated = std::move(accumulated);
  inputs.batch = std::move(batch);
  inputs.groups = std::move(groups);
  inputs.hostUpdates.insert(hostUpdates.begin(), hostUpdates.end());
  // Rounded up: c10d reads a zero timeout as "no timeout".
  inputs.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(timeoutSeconds * 1000)));
  inputs.trace = trace;
  inputs.checkReshardFrees = checkReshardFrees;
  inputs.deviceWaits = deviceWaits;
  inputs.landings = landings;
  inputs.pinHostResults = pinHostResults;
  const fsdp_rt::Function &function = program.function(name);
  fsdp_rt::StepOutputs outputs;
  {
    py::gil_scoped_release release; // collectives block; let other threads run
    outputs = fsdp_rt::run(program, function, std::move(inputs));
  }
  py::dict result;
  result["loss"] = outputs.loss.defined() ? py::cast(outputs.loss) : py::none();
  result["grads"] = outputs.grads;
  result["returned"] = outputs.returned;
  py::list events;
  for (const fsdp_rt::TraceEvent &event : outputs.trace)
    events.append(py::make_tuple(event.name, event.category, event.detail, event.startUs, event.durationUs));
  result["trace"] = events;
  result["reshard_leaks"] = outputs.reshardLeaks;
  result["recaptured_for"] = outputs.recapturedFor.empty() ? py::none() : py::cast(outputs.recapturedFor);
  result["replay_abandoned"] = outputs.replayAbandoned.empty() ? py::none() : py::cast(outputs.replayAbandoned);
  py::list collectives;
  for (const fsdp_rt::IssuedCollective &issued : outputs.collectives)
    collectives.append(py::make_tuple(issued.op, issued.bytes, issued.ranks));
  result["collectives"] = collectives;
  return result;
}

py::list shapeOf(const std::vector<int64_t> &shape) { return py::cast(shape); }

py::dict manifest(const fsdp_rt::Program &program) {
  py::list groups, params, buffers, functions;
  for (const fsdp_rt::GroupSpec &group : program.groups())
    groups.append(py::dict(py::arg("key") = group.key, py::arg("grid") = group.grid,
                           py::arg("grid_shape") = group.gridShape, py::arg("axes") = group.axes,
                           py::arg("size") = group.size, py::arg("members") = group.members));
  for (const fsdp_rt::ParamSpec &param : program.params())
    params.append(py::dict(py::arg("name") = param.name, py::arg("shape") = shapeOf(param.shape),
                           py::arg("dtype") = param.dtype, py::arg("unit") = param.unit,
                           py::arg("trainable") = param.trainable, py::arg("offloaded") = param.offloaded,
                           py::arg("ignored") = param.ignored,
                           py::arg("tied") = param.tied,
                           py::arg("group") = param.group ? py::cast(*param.group) : py::none(),
                           py::arg("shard_rows") = param.shardRows, py::arg("padding") = param.padding));
  for (const fsdp_rt::BufferSpec &buffer : program.buffers())
    buffers.append(py::dict(py::arg("name") = buffer.name, py::arg("shape") = shapeOf(buffer.shape),
                            py::arg("dtype") = buffer.dtype));
  for (const fsdp_rt::Function &function : program.functions()) {
    py::list inputTypes;
    for (const fsdp_rt::TensorSpec &spec : function.inputTypes)
      inputTypes.append(py::dict(py::arg("shape") = shapeOf(spec.shape),
                                 py::arg("dtype") = fsdp_rt::elementTypeOf(spec.dtype)));
    std::vector<std::string> hostUnits; // in the order the function gathers them
    for (const fsdp_rt::Instruction &inst : function.instructions)
      if (inst.kind == fsdp_rt::InstructionKind::AllGather && inst.host &&
          std::find(hostUnits.begin(), hostUnits.end(), inst.unit) == hostUnits.end())
        hostUnits.push_back(inst.unit);
    functions.append(py::dict(py::arg("name") = function.name, py::arg("step") = function.step,
                              py::arg("cuda_graph") = function.cudaGraph,
                              py::arg("input_types") = inputTypes,
                              py::arg("instructions") = function.instructions.size(),
                              py::arg("host_units") = hostUnits));
  }
  return py::dict(py::arg("device") = program.deviceKind(), py::arg("groups") = groups,
                  py::arg("params") = params, py::arg("buffers") = buffers, py::arg("functions") = functions);
}

} // namespace

PYBIND11_MODULE(_fsdp_rt, m) {
  m.doc() = "fsdpc runtime: loads compiled programs and runs their steps";
  m.attr("PROGRAM_FORMAT") = std::string(fsdp_rt::kProgramFormat);
  m.attr("PROGRAM_VERSION") = fsdp_rt::kProgramVersion;
  m.attr("KERNEL_LAUNCH_RECORD") = std::string(fsdp_rt::kKernelLaunchRecord);
  m.def("element_types", [] {
    std::vector<std::string> names;
    for (const fsdp_rt::ElementTypeInfo &info : fsdp_rt::kElementTypes)
      names.emplace_back(info.name);
    return names;
  }, "The element types a program may use (their MLIR spellings)");
  py::class_<fsdp_rt::HostUpdate, std::shared_ptr<fsdp_rt::HostUpdate>>(
      m, "HostUpdate", "Another thread's update of an offloaded unit's shards; the unit's host all-gather waits for it")
      .def(py::init<>())
      .def("finish", &fsdp_rt::HostUpdate::finish, "The shards hold their new values")
      .def("fail", &fsdp_rt::HostUpdate::fail, py::arg("why"),
           "The update failed; the step raises `why` at the unit's gather");
  py::class_<fsdp_rt::DeviceWaits, std::shared_ptr<fsdp_rt::DeviceWaits>>(
      m, "DeviceWaits",
      "A step's collectives that the host did not wait for (NCCL): an event per wait on the compute stream")
      .def(py::init<>())
      .def("first_unfinished", &fsdp_rt::DeviceWaits::firstUnfinished,
           "(description, group key) of the first collective noted and not yet complete, or None",
           py::call_guard<py::gil_scoped_release>()) // event queries: the step's thread may need the GIL
      .def("seal", &fsdp_rt::DeviceWaits::seal, "The step returned: nothing is noted after this")
      .def("sealed", &fsdp_rt::DeviceWaits::sealed);
  py::class_<fsdp_rt::GradientLandings, std::shared_ptr<fsdp_rt::GradientLandings>>(
      m, "GradientLandings",
      "Offloaded units' gradients as a step lands them in host memory, for a host optimizer stepping in backward")
      .def(py::init<std::vector<std::pair<std::string, std::vector<std::string>>>>(), py::arg("units"),
           "[(unit, [parameter, ...]), ...] in the order the host thread prefers them")
      .def(
          "next",
          [](fsdp_rt::GradientLandings &landings, double timeoutSeconds) {
            return landings.next(std::chrono::milliseconds(static_cast<int64_t>(std::ceil(timeoutSeconds * 1000))));
          },
          py::arg("timeout_seconds"), py::call_guard<py::gil_scoped_release>(),
          "(unit, {parameter: gradient}) for the first unit in order whose gradients have all landed, once "
          "copied; None once every unit was taken; raises if the step failed or ended without them")
      .def("close", &fsdp_rt::GradientLandings::close, py::arg("failure"),
           "The step ended (failure None) or failed before it ran or finished");
  py::class_<fsdp_rt::Program, std::shared_ptr<fsdp_rt::Program>>(m, "Program")
      .def(py::init([](const std::string &text, const std::optional<std::string> &device,
                       const std::string &kernelCache) {
             std::optional<c10::Device> runOn;
             if (device)
               runOn = c10::Device(*device);
             return std::make_shared<fsdp_rt::Program>(fsdp_rt::Program::load(text, runOn, kernelCache));
           }),
           py::arg("text"), py::arg("device") = py::none(), py::arg("kernel_cache") = "",
           "Loads `text` for `device` (its GPU kernels compiled and loaded there, their cubins cached in the "
           "folder `kernel_cache` when given)")
      .def("kernel_source", [](const fsdp_rt::Program &program, size_t index) {
             return fsdp_rt::kernelSource(program.kernels().at(index));
           }, py::arg("index"), "The CUDA source the runtime compiles for kernel `index`")
      .def("compile_kernel", [](const fsdp_rt::Program &program, size_t index, int arch) {
             std::string cubin;
             {
               py::gil_scoped_release released;
               cubin = fsdp_rt::compileKernel(program.kernels().at(index), arch);
             }
             return py::bytes(cubin);
           }, py::arg("index"), py::arg("arch"),
           "Kernel `index` compiled by NVRTC for compute capability `arch` (90: sm_90): the cubin")
      .def("release_replays", [](const fsdp_rt::Program &program) {
             if (fsdp_rt::ReplayedSteps *replays = program.replays())
               replays->release();
           }, py::call_guard<py::gil_scoped_release>(), // it waits for the graphs' last replays
           "Lets the CUDA graphs of the functions the program replays and their memory go; each is captured "
           "again at its function's next call")
      .def("captured_graphs", [](const fsdp_rt::Program &program) {
             return program.replays() ? program.replays()->captured() : std::vector<std::string>();
           }, "The functions whose CUDA graph is captured now, by name")
      .def("manifest", &manifest,
           "The manifest as plain data: {device, groups, params, buffers, functions}, the lists of dicts "
           "with the program's own field names (docs/program.md)")
      .def("run", &run, py::arg("function"), py::arg("params"), py::arg("buffers"),
           py::arg("accumulated"), py::arg("batch"), py::arg("groups"), py::arg("timeout_seconds"),
           py::arg("trace") = false, py::arg("check_reshard_frees") = false,
           py::arg("host_updates") = HostUpdateMap(), py::arg("device_waits") = nullptr,
           py::arg("gradient_landings") = nullptr, py::arg("pin_host_results") = true,
           "Runs one function (`host_updates`: {unit: HostUpdate} still running on offloaded shards); returns {loss, grads, returned, trace, reshard_leaks, collectives: [(c10d op, buffer bytes, group size)], recaptured_for: the changed input for which a step replayed as a CUDA graph was captured anew, or None, replay_abandoned: why such a step's capture failed, where it runs as instructions from then on (every group of one rank), or None}; `device_waits` notes the collectives whose waits leave the host running; `gradient_landings` receives offloaded units' gradients as they land in host memory, pinned unless `pin_host_results` is false");
}
