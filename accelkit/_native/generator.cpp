// Generators of the device: torch.Generator(device="<name>") and the device's default generators,
// which PyTorch asks the PrivateUse1 hooks for (hooks.cpp) and Python cannot make in torch 2.13.
//
// accelkit's kernels draw their random numbers from a CPU generator (the runtime's device
// generator is one), so a device generator is a CPU generator's stream under the device's name:
// seeding, get_state/set_state, clone and offsets are the CPU generator's, and the runtime hands
// a kernel the CPU generator inside (host_generator) wherever the caller passed the device one.

#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

namespace {

constexpr auto kDevice = c10::DeviceType::PrivateUse1;

struct DeviceGenerator final : public c10::GeneratorImpl {
  DeviceGenerator(c10::DeviceIndex index, at::Generator host)
      : c10::GeneratorImpl(c10::Device(kDevice, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        host_(std::move(host)) {}

  void set_current_seed(uint64_t seed) override { host_impl()->set_current_seed(seed); }
  void set_offset(uint64_t offset) override { host_impl()->set_offset(offset); }
  uint64_t get_offset() const override { return host_impl()->get_offset(); }
  uint64_t current_seed() const override { return host_impl()->current_seed(); }
  uint64_t seed() override { return host_impl()->seed(); }
  void set_state(const c10::TensorImpl& state) override { host_impl()->set_state(state); }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override { return host_impl()->get_state(); }

  const at::Generator& host() const { return host_; }

 private:
  c10::GeneratorImpl* host_impl() const { return host_.unsafeGetGeneratorImpl(); }
  DeviceGenerator* clone_impl() const override { return new DeviceGenerator(device().index(), host_.clone()); }

  at::Generator host_;
};

std::vector<at::Generator> default_generators;  // one per device, over the runtime's generator

}  // namespace

// For the hooks (hooks.cpp).
const at::Generator& default_device_generator(c10::DeviceIndex index) {
  TORCH_CHECK(!default_generators.empty(), "accelkit's device generators are not installed");
  auto at = index < 0 ? 0 : static_cast<size_t>(index);
  TORCH_CHECK(at < default_generators.size(), c10::get_privateuse1_backend(), ":", static_cast<int>(index),
              " has no default generator: the process has ", default_generators.size(), " device(s)");
  return default_generators[at];
}

at::Generator new_device_generator(c10::DeviceIndex index) {
  return at::make_generator<DeviceGenerator>(index < 0 ? 0 : index, at::detail::createCPUGenerator());
}

void add_generator_functions(py::module& m) {
  m.def("install_generators", [](at::Generator host, int count) {
    TORCH_CHECK(host.device().is_cpu(), "the runtime's device generator must be a CPU generator");
    default_generators.clear();
    for (int i = 0; i < count; ++i)
      default_generators.push_back(at::make_generator<DeviceGenerator>(static_cast<c10::DeviceIndex>(i), host));
  }, py::arg("host"), py::arg("count"),
     "Make the device's default generators, every one over the runtime's (CPU) generator `host`");
  m.def("host_generator", [](const at::Generator& generator) -> py::object {
    auto* device = dynamic_cast<DeviceGenerator*>(generator.unsafeGetGeneratorImpl());
    if (device == nullptr) return py::none();
    return py::cast(device->host());
  }, py::arg("generator"), "The CPU generator a device generator draws from, or None for any other generator");
}
