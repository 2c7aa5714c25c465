// PrivateUse1's hooks in C++: what PyTorch asks of a device through PrivateUse1HooksInterface
// that the Python hooks of torch 2.13 cannot answer (they answer only is_built, is_available and
// has_primary_context).
//
// - Device generators: the default ones and torch.Generator(device=...) (generator.cpp).
// - Pinned host memory: `tensor.pin_memory()`, `is_pinned()` and `DataLoader(pin_memory=True)`
//   (Hugging Face Trainer's default). A simulated device has no DMA engine to pin pages for, so a
//   pinned tensor is ordinary, aligned host memory that remembers it was allocated as pinned; a
//   copy from it takes the same path as from any host tensor.

#include <cstdint>
#include <map>
#include <mutex>

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

const at::Generator& default_device_generator(c10::DeviceIndex index);  // generator.cpp
at::Generator new_device_generator(c10::DeviceIndex index);

namespace {

std::mutex pinned_mutex;
std::map<uintptr_t, size_t> pinned_blocks;  // start address -> bytes, of live pinned blocks
at::HostStats pinned_stats;                 // guarded by pinned_mutex

void free_pinned(void* data) {
  {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    auto block = pinned_blocks.find(reinterpret_cast<uintptr_t>(data));
    if (block != pinned_blocks.end()) {
      pinned_stats.active_requests.decrease(1);
      pinned_stats.active_bytes.decrease(block->second);
      pinned_stats.allocations.decrease(1);
      pinned_stats.allocated_bytes.decrease(block->second);
      pinned_stats.num_host_free += 1;
      pinned_blocks.erase(block);
    }
  }
  c10::free_cpu(data);
}

bool is_pinned(const void* data) {
  auto address = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(pinned_mutex);
  auto after = pinned_blocks.upper_bound(address);
  if (after == pinned_blocks.begin()) return false;
  auto block = std::prev(after);
  return address < block->first + (block->second > 0 ? block->second : 1);
}

// PyTorch's host allocator for the device (at::getHostAllocator(PrivateUse1)), behind
// torch.accelerator.empty_host_cache() and host_memory_stats(): vLLM's teardown calls the first,
// which dereferences a null allocator when none is registered. Nothing is cached (a block is
// freed when its tensor is) and copies are synchronous, so there is no stream use to record.
struct PinnedAllocator final : public at::HostAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes > 0 ? c10::alloc_cpu(nbytes) : nullptr;
    if (data != nullptr) {
      std::lock_guard<std::mutex> lock(pinned_mutex);
      pinned_blocks[reinterpret_cast<uintptr_t>(data)] = nbytes;
      pinned_stats.active_requests.increase(1);
      pinned_stats.active_bytes.increase(nbytes);
      pinned_stats.allocations.increase(1);
      pinned_stats.allocated_bytes.increase(nbytes);
      pinned_stats.num_host_alloc += 1;
    }
    return {data, data, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    return pinned_stats;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    for (auto* stat : {&pinned_stats.active_requests, &pinned_stats.active_bytes,
                       &pinned_stats.allocations, &pinned_stats.allocated_bytes}) {
      stat->reset_accumulated();
    }
    pinned_stats.num_host_alloc = 0;
    pinned_stats.num_host_free = 0;
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    for (auto* stat : {&pinned_stats.active_requests, &pinned_stats.active_bytes,
                       &pinned_stats.allocations, &pinned_stats.allocated_bytes}) {
      stat->reset_peak();
    }
  }
};

PinnedAllocator pinned_allocator;

struct Hooks final : public at::PrivateUse1HooksInterface {
  explicit Hooks(bool available) : available_(available) {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return available_; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_device_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override { return new_device_generator(index); }

 private:
  bool available_;
};

// Registration is first-wins for the process, like torch's Python hook registration.
bool install_hooks(bool available) {
  if (at::isPrivateUse1HooksRegistered()) return false;
  at::RegisterPrivateUse1HooksInterface(new Hooks(available));  // kept for the process
  at::setHostAllocator(c10::DeviceType::PrivateUse1, &pinned_allocator);
  return true;
}

}  // namespace

void add_hook_functions(py::module& m) {
  m.def("install_hooks", &install_hooks, py::arg("available"),
        "Register accelkit's PrivateUse1 hooks (pinned host memory); False if hooks are registered already");
  m.def("pinned_bytes", [] {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    size_t total = 0;
    for (const auto& block : pinned_blocks) total += block.second;
    return total;
  }, "Bytes of pinned host memory alive now");
}
