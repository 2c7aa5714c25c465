// The device's allocator as PyTorch's generic memory API sees it: torch.accelerator.memory_*,
// empty_cache and get_memory_info go through a C++ c10::DeviceAllocator registered for the
// device type, which a Python backend cannot register. This one holds no memory: every figure
// and action is the runtime's own allocator's (the backend's DeviceAllocator in Python), reached
// through the device module (torch.<name>.memory_stats, empty_cache, ...).
//
// Device storages are made by accelkit's runtime, never by this allocator: a request for bytes
// through it (which only a direct torch.UntypedStorage(n, device=...) makes) is refused.

#include <string>
#include <utility>

#include <c10/core/CachingDeviceAllocator.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

namespace {

constexpr auto kAggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);

struct DeviceMemory final : public c10::DeviceAllocator {
  explicit DeviceMemory(py::object module) : module_(std::move(module)) {}

  c10::DataPtr allocate(size_t nbytes) override {
    TORCH_CHECK(
        nbytes == 0, c10::get_privateuse1_backend(),
        " storages are made by accelkit's runtime, not by PyTorch's allocator: make a tensor instead, "
        "e.g. torch.empty(", nbytes, ", dtype=torch.uint8, device=...).untyped_storage()");
    return {nullptr, c10::Device(c10::DeviceType::PrivateUse1, 0)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    TORCH_CHECK(count == 0, "device memory is not addressable from the host");
  }

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {
    py::gil_scoped_acquire gil;
    module_.attr("empty_cache")();
  }
  void recordStream(const c10::DataPtr&, c10::Stream) override {}  // one in-order queue per device

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    py::gil_scoped_acquire gil;
    auto stats = module_.attr("memory_stats")(static_cast<int>(device)).cast<py::dict>();
    auto get = [&](const char* key) { return stats.contains(key) ? stats[key].cast<int64_t>() : 0; };
    c10::CachingDeviceAllocator::DeviceStats out;
    auto& allocated = out.allocated_bytes[kAggregate];
    allocated.current = get("allocated_bytes.current");
    allocated.peak = get("allocated_bytes.peak");
    auto& reserved = out.reserved_bytes[kAggregate];
    reserved.current = get("reserved_bytes.current");
    reserved.peak = get("reserved_bytes.peak");
    out.requested_bytes[kAggregate].current = get("requested_bytes.current");
    auto& allocations = out.allocation[kAggregate];
    allocations.allocated = get("num_allocations");
    allocations.freed = get("num_frees");
    allocations.current = allocations.allocated - allocations.freed;
    out.num_ooms = get("num_ooms");
    return out;
  }
  // The runtime's allocator keeps running totals only for its statistics (accelkit.stats()).
  void resetAccumulatedStats(c10::DeviceIndex) override {}
  void resetPeakStats(c10::DeviceIndex device) override {
    py::gil_scoped_acquire gil;
    module_.attr("reset_peak_memory_stats")(static_cast<int>(device));
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    py::gil_scoped_acquire gil;
    return module_.attr("mem_get_info")(static_cast<int>(device)).cast<std::pair<size_t, size_t>>();
  }

 private:
  py::object module_;
};

DeviceMemory* device_memory = nullptr;

bool install_device_memory(py::object module) {
  if (device_memory != nullptr) return false;
  device_memory = new DeviceMemory(std::move(module));  // the registry keeps a raw pointer
  c10::SetAllocator(c10::DeviceType::PrivateUse1, device_memory, /*priority=*/1);
  return c10::GetAllocator(c10::DeviceType::PrivateUse1) == device_memory;
}

}  // namespace

void add_memory_functions(py::module& m) {
  m.def("install_device_memory", &install_device_memory, py::arg("device_module"),
        "Register the device's memory figures for torch.accelerator (False if registered already)");
}
