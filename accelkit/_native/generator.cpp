// Generators of the device: torch.Generator(device="<name>") and the device's default generators,
// which PyTorch asks the PrivateUse1 hooks for (hooks.cpp) and Python cannot make in torch 2.13.
//
// A device generator is a counter-based Philox state, as CUDA's is: a 64-bit seed and a 64-bit
// offset, get_state() 16 bytes (seed, then offset, little-endian: CUDA's layout, which DTensor's
// RNG tracker reads and writes). The generator only keeps the state; a random op reserves its
// counters from it (`reserve`, under the generator's lock) and computes its values on the device
// from (seed, offset) — accelkit/sdk/_random.py defines the stream. The default generators of all
// the devices of a process share one state (the runtime's device generator).

#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/GeneratorImpl.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

namespace {

constexpr auto kDevice = c10::DeviceType::PrivateUse1;
constexpr uint64_t kAlignment = 4;  // offsets are multiples of 4, as CUDA's
constexpr uint64_t kDefaultSeed = 67280421310721ULL;  // CPU's and CUDA's default seed
constexpr int64_t kStateBytes = 16;

struct PhiloxState {
  std::mutex lock;
  uint64_t seed = kDefaultSeed;
  uint64_t offset = 0;
};

struct DeviceGenerator final : public c10::GeneratorImpl {
  DeviceGenerator(c10::DeviceIndex index, std::shared_ptr<PhiloxState> state)
      : c10::GeneratorImpl(c10::Device(kDevice, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        state_(std::move(state)) {}

  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> guard(state_->lock);
    state_->seed = seed;
    state_->offset = 0;
  }
  void set_offset(uint64_t offset) override {
    TORCH_CHECK(offset % kAlignment == 0, "offset must be a multiple of ", kAlignment, " (", c10::get_privateuse1_backend(),
                " generators advance by whole blocks of 4 counters, as CUDA's), got ", offset);
    std::lock_guard<std::mutex> guard(state_->lock);
    state_->offset = offset;
  }
  uint64_t get_offset() const override {
    std::lock_guard<std::mutex> guard(state_->lock);
    return state_->offset;
  }
  uint64_t current_seed() const override {
    std::lock_guard<std::mutex> guard(state_->lock);
    return state_->seed;
  }
  uint64_t seed() override {
    auto random = c10::detail::getNonDeterministicRandom(true);
    set_current_seed(random);
    return random;
  }
  void set_state(const c10::TensorImpl& state) override {
    at::detail::check_rng_state(state);
    TORCH_CHECK(state.numel() == kStateBytes, "RNG state is wrong size: a ", c10::get_privateuse1_backend(),
                " generator's state is ", kStateBytes, " bytes (a 64-bit seed and a 64-bit offset, as CUDA's), got ",
                state.numel());
    uint64_t seed = 0;
    uint64_t offset = 0;
    const auto* bytes = static_cast<const uint8_t*>(state.data());
    std::memcpy(&seed, bytes, sizeof(seed));
    std::memcpy(&offset, bytes + sizeof(seed), sizeof(offset));
    TORCH_CHECK(offset % kAlignment == 0, "RNG state's offset must be a multiple of ", kAlignment, ", got ", offset);
    std::lock_guard<std::mutex> guard(state_->lock);
    state_->seed = seed;
    state_->offset = offset;
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto state = at::detail::empty_cpu({kStateBytes}, at::ScalarType::Byte);
    auto* bytes = state.data_ptr<uint8_t>();
    std::lock_guard<std::mutex> guard(state_->lock);
    std::memcpy(bytes, &state_->seed, sizeof(uint64_t));
    std::memcpy(bytes + sizeof(uint64_t), &state_->offset, sizeof(uint64_t));
    return state.getIntrusivePtr();
  }

  // The (seed, offset) a random op drawing `count` counters starts at; the offset advances by
  // `count` rounded up to the alignment.
  std::pair<uint64_t, uint64_t> reserve(uint64_t count) {
    std::lock_guard<std::mutex> guard(state_->lock);
    auto start = state_->offset;
    state_->offset += (count + kAlignment - 1) / kAlignment * kAlignment;
    return {state_->seed, start};
  }

 private:
  DeviceGenerator* clone_impl() const override {
    auto copy = std::make_shared<PhiloxState>();
    {
      std::lock_guard<std::mutex> guard(state_->lock);
      copy->seed = state_->seed;
      copy->offset = state_->offset;
    }
    return new DeviceGenerator(device().index(), std::move(copy));
  }

  std::shared_ptr<PhiloxState> state_;
};

std::vector<at::Generator> default_generators;  // one per device, over one shared state

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
  return at::make_generator<DeviceGenerator>(index < 0 ? 0 : index, std::make_shared<PhiloxState>());
}

void add_generator_functions(py::module& m) {
  m.def("install_generators", [](int count) -> at::Generator {
    TORCH_CHECK(count >= 1, "a backend has at least one device");
    auto state = std::make_shared<PhiloxState>();
    default_generators.clear();
    for (int i = 0; i < count; ++i)
      default_generators.push_back(at::make_generator<DeviceGenerator>(static_cast<c10::DeviceIndex>(i), state));
    return default_generators[0];
  }, py::arg("count"),
     "Make the device's default generators, one per device over one shared Philox state; returns device 0's");
  m.def("reserve", [](const at::Generator& generator, uint64_t count) -> py::object {
    auto* device = dynamic_cast<DeviceGenerator*>(generator.unsafeGetGeneratorImpl());
    if (device == nullptr) return py::none();
    auto [seed, offset] = device->reserve(count);
    return py::make_tuple(seed, offset);
  }, py::arg("generator"), py::arg("count"),
     "(seed, offset) for a draw of `count` counters from a device generator, advancing its offset; "
     "None for any other generator");
}
