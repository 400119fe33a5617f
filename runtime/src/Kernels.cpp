//===- Kernels.cpp - compiling and launching a program's generated kernels -===//

#include "fsdp_rt/Kernels.h"

#include <ATen/ops/empty_strided.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#if FSDP_RT_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nvrtc.h>
#include <unistd.h>
#endif

namespace fsdp_rt {

namespace {

/// How the loop reads or writes one tensor: a 16-byte access per vector
/// where the tensor is contiguous along the innermost dimension and every
/// other step keeps vectors aligned; one element repeated where it is
/// broadcast there; else one element at a time.
enum class Access { Vector, Broadcast, Strided };

Access accessOf(const KernelOperand &operand, int64_t vector) {
  if (operand.steps.front() == 0)
    return Access::Broadcast;
  bool aligned = operand.steps.front() == 1;
  for (size_t d = 1; d < operand.steps.size(); ++d)
    aligned = aligned && operand.steps[d] % vector == 0;
  return aligned ? Access::Vector : Access::Strided;
}

/// Conversions between the tensors' storage and float: bf16 by its bits
/// (round to nearest even, NaN kept quiet, as c10::BFloat16), f16 by the
/// PTX conversions.
const char *conversions(c10::ScalarType dtype) {
  switch (dtype) {
  case c10::ScalarType::BFloat16:
    return R"(typedef unsigned short fsdp_storage;
__device__ __forceinline__ float fsdp_load(fsdp_storage x) { return __uint_as_float(static_cast<unsigned>(x) << 16); }
__device__ __forceinline__ fsdp_storage fsdp_store(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<fsdp_storage>(u >> 16);
}
)";
  case c10::ScalarType::Half:
    return R"(typedef unsigned short fsdp_storage;
__device__ __forceinline__ float fsdp_load(fsdp_storage x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
  return f;
}
__device__ __forceinline__ fsdp_storage fsdp_store(float f) {
  fsdp_storage x;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(x) : "f"(f));
  return x;
}
)";
  default:
    return R"(typedef float fsdp_storage;
__device__ __forceinline__ float fsdp_load(fsdp_storage x) { return x; }
__device__ __forceinline__ fsdp_storage fsdp_store(float f) { return f; }
)";
  }
}

std::string operandName(bool input, size_t i) { return (input ? "in" : "out") + std::to_string(i); }

} // namespace

std::string kernelSource(const KernelSpec &kernel) {
  const size_t dims = kernel.extents.size();
  int64_t elements = 1, reach = 0;
  for (int64_t extent : kernel.extents)
    elements *= extent;
  for (const std::vector<KernelOperand> *list : {&kernel.inputs, &kernel.outputs})
    for (const KernelOperand &operand : *list)
      reach = std::max(reach, furthestElement(kernel.extents, operand.steps).value()); // validated at load
  bool narrow = elements <= std::numeric_limits<int32_t>::max() && reach <= std::numeric_limits<int32_t>::max();
  const char *index = narrow ? "unsigned" : "unsigned long long";
  const char *suffix = narrow ? "u" : "ull";

  std::ostringstream os;
  os << conversions(kernel.dtype);
  os << "template <int V> struct alignas(sizeof(fsdp_storage) * V) fsdp_pack { fsdp_storage e[V]; };\n";
  os << kernel.source << "\n";

  std::ostringstream params, args;
  for (size_t i = 0; i < kernel.inputs.size(); ++i) {
    params << (i ? ", " : "") << "const fsdp_storage* __restrict__ in" << i;
    args << (i ? ", " : "") << "in" << i;
  }
  for (size_t i = 0; i < kernel.outputs.size(); ++i) {
    params << ", fsdp_storage* __restrict__ out" << i;
    args << ", out" << i;
  }

  os << "template <int V>\n__device__ __forceinline__ void fsdp_loop(" << params.str() << ") {\n";
  os << "  typedef " << index << " I;\n";
  os << "  const I count = " << elements << suffix << " / V;\n";
  os << "  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;"
     << " i += static_cast<I>(gridDim.x) * blockDim.x) {\n";
  // The loop index as one index per dimension, the innermost in vectors.
  os << "    I rest = i;\n";
  for (size_t d = 0; d < dims; ++d) {
    std::string extent = std::to_string(kernel.extents[d]) + suffix;
    if (d == 0)
      extent = "(" + extent + " / V)";
    std::string value = d + 1 == dims ? "rest" : "rest % " + extent;
    os << "    const I d" << d << " = " << (d == 0 ? "(" + value + ") * V" : value) << ";\n";
    if (d + 1 < dims)
      os << "    rest /= " << extent << ";\n";
  }
  auto offset = [&](const KernelOperand &operand) {
    std::string sum;
    for (size_t d = 0; d < dims; ++d)
      if (operand.steps[d] != 0)
        sum += (sum.empty() ? "" : " + ") + std::string("d") + std::to_string(d) + " * " +
               std::to_string(operand.steps[d]) + suffix;
    return sum.empty() ? std::string("0") : sum;
  };
  for (size_t i = 0; i < kernel.inputs.size(); ++i) {
    const KernelOperand &operand = kernel.inputs[i];
    std::string name = operandName(true, i);
    os << "    float x" << i << "[V];\n    {\n      const I at = " << offset(operand) << ";\n";
    switch (accessOf(operand, kernel.vector)) {
    case Access::Vector:
      os << "      const fsdp_pack<V> p = *reinterpret_cast<const fsdp_pack<V>*>(" << name << " + at);\n"
         << "#pragma unroll\n      for (int v = 0; v < V; ++v) x" << i << "[v] = fsdp_load(p.e[v]);\n";
      break;
    case Access::Broadcast:
      os << "      const float b = fsdp_load(" << name << "[at]);\n"
         << "#pragma unroll\n      for (int v = 0; v < V; ++v) x" << i << "[v] = b;\n";
      break;
    case Access::Strided:
      os << "#pragma unroll\n      for (int v = 0; v < V; ++v) x" << i << "[v] = fsdp_load(" << name << "[at + v * "
         << operand.steps.front() << suffix << "]);\n";
      break;
    }
    os << "    }\n";
  }
  for (size_t i = 0; i < kernel.outputs.size(); ++i)
    os << "    fsdp_pack<V> y" << i << ";\n";
  os << "#pragma unroll\n    for (int v = 0; v < V; ++v) {\n      float";
  for (size_t i = 0; i < kernel.outputs.size(); ++i)
    os << (i ? ", r" : " r") << i;
  os << ";\n      " << kernel.name << "(";
  for (size_t i = 0; i < kernel.inputs.size(); ++i)
    os << (i ? ", x" : "x") << i << "[v]";
  for (size_t i = 0; i < kernel.outputs.size(); ++i)
    os << ", r" << i;
  os << ");\n";
  for (size_t i = 0; i < kernel.outputs.size(); ++i)
    os << "      y" << i << ".e[v] = fsdp_store(r" << i << ");\n";
  os << "    }\n";
  for (size_t i = 0; i < kernel.outputs.size(); ++i) {
    const KernelOperand &operand = kernel.outputs[i];
    std::string name = operandName(false, i);
    os << "    {\n      const I at = " << offset(operand) << ";\n";
    if (accessOf(operand, kernel.vector) == Access::Vector)
      os << "      *reinterpret_cast<fsdp_pack<V>*>(" << name << " + at) = y" << i << ";\n";
    else
      os << "#pragma unroll\n      for (int v = 0; v < V; ++v) " << name << "[at + v * " << operand.steps.front()
         << suffix << "] = y" << i << ".e[v];\n";
    os << "    }\n";
  }
  os << "  }\n}\n";

  // The entry: 16-byte accesses only where every vector-accessed pointer is
  // aligned to them (a view may start anywhere in its storage).
  std::string aligned;
  for (const std::vector<KernelOperand> *list : {&kernel.inputs, &kernel.outputs})
    for (size_t i = 0; i < list->size(); ++i)
      if (accessOf((*list)[i], kernel.vector) == Access::Vector)
        aligned += " && reinterpret_cast<unsigned long long>(" + operandName(list == &kernel.inputs, i) + ") % " +
                   std::to_string(kernel.vector * static_cast<int64_t>(c10::elementSize(kernel.dtype))) +
                   "ull == 0";
  os << "extern \"C\" __global__ void __launch_bounds__(" << kernel.block << ") " << kernel.name << "_kernel("
     << params.str() << ") {\n";
  if (kernel.vector > 1)
    os << "  if (true" << aligned << ")\n    fsdp_loop<" << kernel.vector << ">(" << args.str() << ");\n  else\n  ";
  os << "  fsdp_loop<1>(" << args.str() << ");\n}\n";
  return os.str();
}

#if FSDP_RT_CUDA

namespace {

void checkNvrtc(nvrtcResult result, const char *call) {
  if (result != NVRTC_SUCCESS)
    throw std::runtime_error(std::string(call) + ": " + nvrtcGetErrorString(result));
}

/// Whether `result` is success; a failure's error is cleared, else the next
/// launch checked on this thread (ATen's) would report it again.
bool succeeded(cudaError_t result) {
  if (result == cudaSuccess)
    return true;
  cudaGetLastError();
  return false;
}

void checkCuda(cudaError_t result, const std::string &what) {
  if (!succeeded(result))
    throw std::runtime_error(what + ": " + cudaGetErrorString(result));
}

/// NVRTC's options for `arch`: part of a cache entry's key.
std::vector<std::string> nvrtcOptions(int arch) { return {"--gpu-architecture=sm_" + std::to_string(arch), "--std=c++17"}; }

/// `source` (kernelSource of `kernel`) compiled by NVRTC for `arch`.
std::string compileSource(const KernelSpec &kernel, const std::string &source, int arch) {
  nvrtcProgram program = nullptr;
  checkNvrtc(nvrtcCreateProgram(&program, source.c_str(), (kernel.name + ".cu").c_str(), 0, nullptr, nullptr),
             "nvrtcCreateProgram");
  std::vector<std::string> options = nvrtcOptions(arch);
  std::vector<const char *> optionPointers;
  for (const std::string &option : options)
    optionPointers.push_back(option.c_str());
  nvrtcResult compiled = nvrtcCompileProgram(program, static_cast<int>(optionPointers.size()), optionPointers.data());
  size_t logSize = 0;
  nvrtcGetProgramLogSize(program, &logSize);
  std::string log(logSize, '\0');
  if (logSize > 0)
    nvrtcGetProgramLog(program, log.data());
  std::string cubin;
  if (compiled == NVRTC_SUCCESS) {
    size_t size = 0;
    checkNvrtc(nvrtcGetCUBINSize(program, &size), "nvrtcGetCUBINSize");
    cubin.resize(size);
    checkNvrtc(nvrtcGetCUBIN(program, cubin.data()), "nvrtcGetCUBIN");
  }
  nvrtcDestroyProgram(&program);
  if (compiled != NVRTC_SUCCESS)
    throw std::runtime_error("kernel " + kernel.name + " does not compile for sm_" + std::to_string(arch) + " (" +
                             nvrtcGetErrorString(compiled) + "):\n" + log);
  return cubin;
}

/// FNV-1a: a stable name for a cache entry (the entry holds its source,
/// compared on reading, so a collision only costs a compile).
uint64_t fingerprint(const std::string &text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text)
    hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

/// A kernel's cubin, and whether it was read from the cache.
struct Cubin {
  std::string bytes;
  bool cached = false;
};

/// A kernel's cache entry: its file and its key (the source, NVRTC's
/// version and options). The file holds the key, "bytes N\n", then the N
/// bytes of the cubin.
struct CacheEntry {
  std::filesystem::path path;
  std::string key;
};

CacheEntry cacheEntry(const std::string &source, int arch, const std::string &cacheDir) {
  int major = 0, minor = 0;
  checkNvrtc(nvrtcVersion(&major, &minor), "nvrtcVersion");
  std::string key = source + "\n// nvrtc " + std::to_string(major) + "." + std::to_string(minor);
  for (const std::string &option : nvrtcOptions(arch))
    key += " " + option;
  key += "\n";
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.cubin", static_cast<unsigned long long>(fingerprint(key)));
  return {std::filesystem::path(cacheDir) / name, key};
}

/// The cubin `entry` holds, where its file is whole and has the same key.
std::optional<std::string> readEntry(const CacheEntry &entry) {
  std::ifstream in{entry.path, std::ios::binary};
  if (!in)
    return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string header = "bytes ";
  if (text.compare(0, entry.key.size(), entry.key) != 0 ||
      text.compare(entry.key.size(), header.size(), header) != 0)
    return std::nullopt;
  size_t sizeAt = entry.key.size() + header.size(), newline = text.find('\n', sizeAt), size = 0;
  if (newline == std::string::npos)
    return std::nullopt;
  auto [end, error] = std::from_chars(text.data() + sizeAt, text.data() + newline, size);
  if (error != std::errc() || end != text.data() + newline || text.size() - newline - 1 != size)
    return std::nullopt;
  return text.substr(newline + 1);
}

/// Writes `entry` under a name of this process and thread first, then
/// renames it into place: ranks filling the same entry never write one
/// file, and a reader sees a whole entry or none.
void writeEntry(const CacheEntry &entry, const std::string &cubin) {
  std::error_code ignored;
  std::filesystem::create_directories(entry.path.parent_path(), ignored);
  std::filesystem::path partial = entry.path;
  partial += "." + std::to_string(::getpid()) + "." +
             std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id())) + ".partial";
  if (std::ofstream out{partial, std::ios::binary | std::ios::trunc}) {
    out << entry.key << "bytes " << cubin.size() << "\n" << cubin;
    out.close();
    if (out)
      std::filesystem::rename(partial, entry.path, ignored); // another rank writing the same entry is harmless
  }
  std::filesystem::remove(partial, ignored);
}

/// The cubin for `kernel` on `arch`: from `cacheDir` when it holds a whole
/// entry for it (and `readCache`), else compiled (and written there).
Cubin cachedCubin(const KernelSpec &kernel, int arch, const std::string &cacheDir, bool readCache = true) {
  std::string source = kernelSource(kernel);
  if (cacheDir.empty())
    return {compileSource(kernel, source, arch), false};
  CacheEntry entry = cacheEntry(source, arch, cacheDir);
  if (readCache)
    if (std::optional<std::string> cubin = readEntry(entry))
      return {std::move(*cubin), true};
  std::string cubin = compileSource(kernel, source, arch);
  writeEntry(entry, cubin);
  return {std::move(cubin), false};
}

/// `count` jobs over at most as many threads as the host has cores.
void inParallel(size_t count, const std::function<void(size_t)> &job) {
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> failures(count);
  auto work = [&] {
    for (size_t i = next++; i < count; i = next++) {
      try {
        job(i);
      } catch (...) {
        failures[i] = std::current_exception();
      }
    }
  };
  size_t threads = std::min<size_t>(count, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::jthread> workers; // joined however this returns
  for (size_t t = 1; t < threads; ++t)
    workers.emplace_back(work);
  work();
  workers.clear();
  for (const std::exception_ptr &failure : failures)
    if (failure)
      std::rethrow_exception(failure);
}

} // namespace

std::string compileKernel(const KernelSpec &kernel, int arch) { return compileSource(kernel, kernelSource(kernel), arch); }

struct LoadedKernels::Loaded {
  cudaLibrary_t library = nullptr;
  cudaKernel_t kernel = nullptr;
};

namespace {

/// Libraries of dropped programs, unloaded once the streams their kernels
/// ran on have passed the events recorded at the drop: a program dropped
/// right after a step returned still has kernels queued, which must not
/// lose their code, and waiting for them at the drop could hang behind a
/// hung collective.
struct Retired {
  std::vector<cudaEvent_t> after;
  std::vector<cudaLibrary_t> libraries;
};

std::mutex retiredMutex;

std::vector<Retired> &retired() {
  static auto *entries = new std::vector<Retired>; // kept at exit: the driver reclaims what is left with the context
  return *entries;
}

/// Whether the stream has passed `event`. Anything but success counts as
/// not yet: a query refused during another thread's graph capture says
/// nothing about the stream, and in a broken context the libraries stay
/// until the driver drops them with the context.
bool passed(cudaEvent_t event) { return succeeded(cudaEventQuery(event)); }

/// Unloads the retired libraries whose streams have passed their events.
/// Holds retiredMutex.
void unloadFinished() {
  std::erase_if(retired(), [](const Retired &entry) {
    if (!std::all_of(entry.after.begin(), entry.after.end(), passed))
      return false;
    for (cudaEvent_t event : entry.after)
      cudaEventDestroy(event);
    for (cudaLibrary_t library : entry.libraries)
      cudaLibraryUnload(library); // at exit the context may be gone already: nothing to report
    return true;
  });
}

} // namespace

LoadedKernels::LoadedKernels(const std::vector<KernelSpec> &specs, c10::Device device, const std::string &cacheDir)
    : kernels(specs), device(device) {
  c10::cuda::CUDAGuard guard(device);
  int major = 0, minor = 0;
  checkCuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index()),
            "the GPU's compute capability");
  checkCuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device.index()),
            "the GPU's compute capability");
  int arch = major * 10 + minor;
  {
    std::lock_guard<std::mutex> lock(retiredMutex);
    unloadFinished();
  }
  std::vector<Cubin> cubins(kernels.size());
  inParallel(kernels.size(), [&](size_t i) { cubins[i] = cachedCubin(kernels[i], arch, cacheDir); });
  try {
    for (size_t i = 0; i < kernels.size(); ++i) {
      try {
        load(kernels[i], cubins[i].bytes);
      } catch (const std::exception &) {
        if (!cubins[i].cached)
          throw;
        // A damaged cache entry: compiled again, and the entry replaced.
        load(kernels[i], cachedCubin(kernels[i], arch, cacheDir, /*readCache=*/false).bytes);
      }
    }
  } catch (...) {
    retire();
    throw;
  }
}

/// Loads `cubin` and finds `kernel`'s entry point in it, loaded now (lazy
/// loading would load it at its first launch, inside the first step).
void LoadedKernels::load(const KernelSpec &kernel, const std::string &cubin) {
  Loaded entry;
  checkCuda(cudaLibraryLoadData(&entry.library, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
            "loading kernel " + kernel.name);
  try {
    checkCuda(cudaLibraryGetKernel(&entry.kernel, entry.library, (kernel.name + "_kernel").c_str()),
              "finding kernel " + kernel.name);
    cudaFuncAttributes attributes{};
    checkCuda(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void *>(entry.kernel)),
              "loading kernel " + kernel.name);
    if (attributes.maxThreadsPerBlock < kernel.block)
      throw std::runtime_error("kernel " + kernel.name + " runs at most " +
                               std::to_string(attributes.maxThreadsPerBlock) + " threads per block on this GPU; " +
                               "the program launches " + std::to_string(kernel.block));
  } catch (...) {
    cudaLibraryUnload(entry.library);
    throw;
  }
  loaded.push_back(entry);
}

void LoadedKernels::retire() {
  Retired entry;
  for (const Loaded &kernel : loaded)
    entry.libraries.push_back(kernel.library);
  loaded.clear();
  {
    std::lock_guard<std::mutex> lock(launchedMutex);
    // Events are recorded on their own device's streams; a guard would throw here once the context is gone. A
    // call that fails means there is nothing to wait for.
    int caller = -1;
    bool switched = !launchedOn.empty() && succeeded(cudaGetDevice(&caller)) && caller != device.index() &&
                    succeeded(cudaSetDevice(device.index()));
    for (const c10::Stream &stream : launchedOn) {
      cudaEvent_t event = nullptr;
      if (!succeeded(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)))
        continue;
      if (succeeded(cudaEventRecord(event, c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, stream).stream())))
        entry.after.push_back(event);
      else
        cudaEventDestroy(event);
    }
    launchedOn.clear();
    if (switched)
      succeeded(cudaSetDevice(caller));
  }
  std::lock_guard<std::mutex> lock(retiredMutex);
  retired().push_back(std::move(entry));
  unloadFinished();
}

LoadedKernels::~LoadedKernels() { retire(); }

std::vector<at::Tensor> LoadedKernels::launch(size_t index, const std::vector<at::Tensor> &inputs) const {
  const KernelSpec &kernel = kernels.at(index);
  if (inputs.size() != kernel.inputs.size())
    throw std::runtime_error("kernel " + kernel.name + " takes " + std::to_string(kernel.inputs.size()) +
                             " tensors, got " + std::to_string(inputs.size()));
  void *pointers[2 * kMostKernelTensors];
  void *arguments[2 * kMostKernelTensors];
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor &input = inputs[i];
    const KernelOperand &spec = kernel.inputs[i];
    bool laidOut = input.device() == device && input.scalar_type() == kernel.dtype &&
                   input.sizes() == c10::IntArrayRef(spec.shape);
    for (size_t d = 0; laidOut && d < spec.shape.size(); ++d)
      laidOut = spec.shape[d] == 1 || input.stride(static_cast<int64_t>(d)) == spec.strides[d];
    if (!laidOut)
      throw std::runtime_error("kernel " + kernel.name + " input " + std::to_string(i) + " is " +
                               std::string(c10::toString(input.scalar_type())) + " " + c10::str(input.sizes()) +
                               " strides " + c10::str(input.strides()) + " on " + input.device().str() +
                               "; the program laid the kernel out for " + c10::toString(kernel.dtype) + " " +
                               c10::str(c10::IntArrayRef(spec.shape)) + " strides " +
                               c10::str(c10::IntArrayRef(spec.strides)) + " on " + device.str());
    pointers[i] = const_cast<void *>(input.const_data_ptr());
  }
  std::vector<at::Tensor> outputs;
  for (const KernelOperand &spec : kernel.outputs) {
    outputs.push_back(at::empty_strided(spec.shape, spec.strides, at::TensorOptions().dtype(kernel.dtype).device(device)));
    pointers[inputs.size() + outputs.size() - 1] = outputs.back().data_ptr();
  }
  for (size_t i = 0; i < inputs.size() + outputs.size(); ++i)
    arguments[i] = &pointers[i];
  RECORD_FUNCTION(kKernelLaunchRecord, c10::ArrayRef<const c10::IValue>{});
  c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device.index());
  {
    std::lock_guard<std::mutex> lock(launchedMutex);
    if (std::find(launchedOn.begin(), launchedOn.end(), current.unwrap()) == launchedOn.end())
      launchedOn.push_back(current.unwrap());
  }
  cudaStream_t stream = current.stream();
  checkCuda(cudaLaunchKernel(reinterpret_cast<const void *>(loaded[index].kernel),
                             dim3(static_cast<unsigned>(kernel.grid)), dim3(static_cast<unsigned>(kernel.block)),
                             arguments, 0, stream),
            "launching kernel " + kernel.name);
  return outputs;
}

#else

namespace {
[[noreturn]] void noCuda(const std::string &what) {
  throw std::runtime_error(what + ": this runtime was built against a torch without CUDA and cannot compile or "
                                  "launch generated kernels (rebuild it with `make runtime` against the GPU host's torch)");
}
} // namespace

std::string compileKernel(const KernelSpec &kernel, int) { noCuda("kernel " + kernel.name); }

struct LoadedKernels::Loaded {};

LoadedKernels::LoadedKernels(const std::vector<KernelSpec> &specs, c10::Device device, const std::string &)
    : kernels(specs), device(device) {
  noCuda("the program's kernels");
}

LoadedKernels::~LoadedKernels() = default;

std::vector<at::Tensor> LoadedKernels::launch(size_t index, const std::vector<at::Tensor> &) const {
  noCuda("kernel " + kernels.at(index).name);
}

#endif

} // namespace fsdp_rt
