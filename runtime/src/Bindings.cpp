//===- Bindings.cpp - the Python face of a compiled step module -----------===//
//
// Built with the generated step file into one extension per compiled module
// (fsdpc/runtime.py). The only translation unit that includes Python headers.
//
//===----------------------------------------------------------------------===//

#include "fsdp_rt/Step.h"

#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

namespace {

using GroupMap = std::map<std::string, c10::intrusive_ptr<c10d::ProcessGroup>>;
using TensorMap = std::map<std::string, at::Tensor>;

std::pair<at::Tensor, TensorMap> run(const std::string &name, TensorMap params, TensorMap buffers,
                                     TensorMap accumulated, const std::vector<at::Tensor> &batch,
                                     GroupMap groups, double timeoutSeconds, const std::string &device) {
  const fsdp_rt::ModuleSpec &spec = fsdp_rt_module();
  for (const fsdp_rt::StepSpec &step : spec.steps) {
    if (step.name != name)
      continue;
    fsdp_rt::StepContext ctx(std::move(params), std::move(buffers), std::move(accumulated),
                             std::move(groups),
                             std::chrono::milliseconds(static_cast<int64_t>(timeoutSeconds * 1000)),
                             c10::Device(device));
    fsdp_rt::StepResult result;
    {
      py::gil_scoped_release release; // collectives block; let other threads run
      result = step.function(ctx, batch);
    }
    return {result.loss, result.grads};
  }
  throw std::runtime_error("fsdp_rt: the module has no step '" + name + "'");
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "A training step compiled by fsdpc";
  m.def("groups", [] {
    py::list out;
    for (const auto &group : fsdp_rt_module().groups)
      out.append(py::make_tuple(group.key, group.gridShape, group.axes));
    return out;
  }, "Communication groups: (key, grid shape, grid axes)");
  m.def("steps", [] {
    py::list out;
    for (const auto &step : fsdp_rt_module().steps)
      out.append(py::make_tuple(step.name, step.collectiveHash));
    return out;
  }, "Steps: (name, collective hash)");
  m.def("run", &run, py::arg("step"), py::arg("params"), py::arg("buffers"),
        py::arg("accumulated"), py::arg("batch"), py::arg("groups"), py::arg("timeout_seconds"),
        py::arg("device"), "Runs one step; returns (loss, {parameter: gradient})");
}
