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
    // The device module's memory_stats() has CUDA's keys for the "all" pool; the struct's
    // other pools and figures (splits, oversize blocks, private pools) stay zero.
    auto stats = module_.attr("memory_stats")(static_cast<int>(device)).cast<py::dict>();
    auto get = [&](const std::string& key) {
      return stats.contains(key.c_str()) ? stats[key.c_str()].cast<int64_t>() : 0;
    };
    auto fill = [&](c10::CachingAllocator::StatArray& array, const std::string& name) {
      auto& stat = array[kAggregate];
      stat.current = get(name + ".all.current");
      stat.peak = get(name + ".all.peak");
      stat.allocated = get(name + ".all.allocated");
      stat.freed = get(name + ".all.freed");
    };
    c10::CachingDeviceAllocator::DeviceStats out;
    fill(out.allocation, "allocation");
    fill(out.segment, "segment");
    fill(out.active, "active");
    fill(out.allocated_bytes, "allocated_bytes");
    fill(out.reserved_bytes, "reserved_bytes");
    fill(out.active_bytes, "active_bytes");
    fill(out.requested_bytes, "requested_bytes");
    out.num_alloc_retries = get("num_alloc_retries");
    out.num_ooms = get("num_ooms");
    out.num_device_alloc = get("num_device_alloc");
    out.num_device_free = get("num_device_free");
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
