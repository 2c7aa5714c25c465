// accelkit's native PrivateUse1 support: what torch 2.13 fixes in C++ for a Python backend.
//
// - A device guard with a device count and a current device per thread (the Python guard
//   PyTorch offers always answers device 0 of 1), so tpu:1, set_device and the device()
//   context work, and the autograd engine gets one worker per device.
// - Device tensors at any index (torch._C._acc.create_empty_tensor makes index 0 only), over
//   a storage whose data pointer is the backend buffer's device address.
//
// Everything here is device-agnostic bookkeeping; the memory and the kernels stay in Python.
// hooks.cpp adds the PrivateUse1 hooks (pinned host memory) to the same module, memory.cpp the
// device's memory figures for torch.accelerator, generator.cpp the device's generators.

#include <atomic>
#include <optional>
#include <cctype>
#include <string>
#include <cstdint>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

namespace {

constexpr auto kDevice = c10::DeviceType::PrivateUse1;

std::atomic<c10::DeviceIndex> device_count{1};
thread_local c10::DeviceIndex current_device = 0;
// Called (with the GIL) for torch.accelerator.synchronize(): the backend's own wait.
py::object* synchronize_callback = nullptr;

std::string upper_name() {
  auto name = c10::get_privateuse1_backend();
  for (auto& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(
      index >= 0 && index < device_count.load(),
      c10::get_privateuse1_backend(), ":", static_cast<int>(index),
      " does not exist: this process has ", static_cast<int>(device_count.load()), " ",
      c10::get_privateuse1_backend(), " device(s) (indices 0 to ",
      static_cast<int>(device_count.load()) - 1, "); ACCELKIT_", upper_name(),
      "_DEVICES sets how many a simulated backend has");
}

struct Guard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kDevice; }

  c10::Device exchangeDevice(c10::Device device) const override {
    auto previous = getDevice();
    setDevice(device);
    return previous;
  }
  c10::Device getDevice() const override { return c10::Device(kDevice, current_device); }
  void setDevice(c10::Device device) const override {
    if (device.index() < 0) return;  // "the current device": nothing to switch
    check_index(device.index());
    current_device = device.index();
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.index() >= 0 && device.index() < device_count.load()) current_device = device.index();
  }

  // One in-order queue per device: every stream is its default stream.
  c10::Stream getStream(c10::Device device) const noexcept override { return stream_on(device); }
  c10::Stream getNewStream(c10::Device device, int priority = 0) const override {
    (void)priority;
    return stream_on(device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const noexcept override { return stream_on(stream.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count.load(); }

  // Events are points in that queue; timing and waiting are done in Python (torch.<name>.Event).
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream& stream) const override { synchronize(stream.device_index()); }
  void synchronizeDevice(const c10::DeviceIndex index) const override { synchronize(index); }

 private:
  static c10::Stream stream_on(c10::Device device) {
    auto index = device.index() < 0 ? current_device : device.index();
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kDevice, index));
  }
  static void synchronize(c10::DeviceIndex index) {
    if (synchronize_callback == nullptr) return;
    py::gil_scoped_acquire gil;
    (*synchronize_callback)(static_cast<int>(index));
  }
};

Guard* guard = nullptr;

void install_guard(int count, py::object synchronize) {
  TORCH_CHECK(count >= 1 && count <= 64, "device count must be 1 to 64, got ", count);
  device_count.store(static_cast<c10::DeviceIndex>(count));
  if (synchronize_callback == nullptr) {
    synchronize_callback = new py::object(std::move(synchronize));  // lives as long as the process
  } else {
    *synchronize_callback = std::move(synchronize);
  }
  if (guard == nullptr) {
    guard = new Guard();  // the registry keeps a raw pointer for the rest of the process
    c10::impl::registerDeviceGuard(kDevice, guard);
  }
}

// A device tensor on `index` with this geometry (contiguous when `stride` is absent), over
// `nbytes` of storage at device address `address`. Address 0 is an empty buffer: a resizable
// storage with no data, as torch._C._acc.create_empty_tensor gives.
at::Tensor tensor_at(c10::IntArrayRef size, std::optional<c10::IntArrayRef> stride, c10::ScalarType dtype,
                     c10::DeviceIndex index, uintptr_t address, int64_t nbytes) {
  c10::Device device(kDevice, index);
  c10::Storage storage = address == 0
      ? c10::Storage(c10::Storage::use_byte_size_t{}, 0, c10::GetAllocator(c10::kMeta), true)
      : c10::Storage(c10::Storage::use_byte_size_t{}, nbytes,
                     c10::DataPtr(reinterpret_cast<void*>(address), device), nullptr, false);
  if (address == 0) storage.set_data_ptr_noswap(c10::DataPtr(nullptr, device));
  at::Tensor tensor = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::scalarTypeToTypeMeta(dtype));
  if (stride.has_value()) {
    tensor.unsafeGetTensorImpl()->set_sizes_and_strides(size, *stride, 0);
  } else {
    tensor.unsafeGetTensorImpl()->set_sizes_contiguous(size);
  }
  return tensor;
}

// tensor_at for Python: the index checked against the device count.
at::Tensor device_tensor(
    const std::vector<int64_t>& size, const std::vector<int64_t>& stride, c10::ScalarType dtype,
    int index, uintptr_t address, int64_t nbytes) {
  check_index(static_cast<c10::DeviceIndex>(index));
  TORCH_CHECK(size.size() == stride.size(), "size and stride differ in length");
  return tensor_at(size, stride, dtype, static_cast<c10::DeviceIndex>(index), address, nbytes);
}

}  // namespace

// A device tensor of device 0 over a runtime buffer (an accelkit.sdk Buffer), contiguous unless
// ``strides`` are given, as the Python runtime's adopted_tensor makes it: the storage at the
// buffer's address with its byte size, and the buffer as the storage's Python object's
// ``payload``. The GIL is held.
at::Tensor tensor_over_buffer(PyObject* payload, c10::IntArrayRef shape, c10::ScalarType dtype,
                              std::optional<c10::IntArrayRef> strides) {
  static PyObject* const address_name = PyUnicode_InternFromString("address");
  static PyObject* const nbytes_name = PyUnicode_InternFromString("nbytes");
  static PyObject* const payload_name = PyUnicode_InternFromString("payload");
  auto read = [payload](PyObject* name) {
    PyObject* value = PyObject_GetAttr(payload, name);
    if (value == nullptr) throw py::error_already_set();
    const long long number = PyLong_AsLongLong(value);
    Py_DECREF(value);
    if (number == -1 && PyErr_Occurred()) throw py::error_already_set();
    return number;
  };
  const auto address = static_cast<uintptr_t>(read(address_name));
  at::Tensor tensor = tensor_at(shape, strides, dtype, 0, address, read(nbytes_name));
  py::object python_storage = py::reinterpret_steal<py::object>(THPStorage_Wrap(tensor.storage()));
  if (!python_storage) throw py::error_already_set();
  if (PyObject_SetAttr(python_storage.ptr(), payload_name, payload) != 0) throw py::error_already_set();
  return tensor;
}

void add_hook_functions(py::module& m);    // hooks.cpp
void add_memory_functions(py::module& m);  // memory.cpp
void add_generator_functions(py::module& m);  // generator.cpp
void add_view_functions(py::module& m);  // views.cpp
void add_lane_functions(py::module& m);  // lane.cpp
void add_book_functions(py::module& m);  // books.cpp
void add_factory_functions(py::module& m);  // factories.cpp

PYBIND11_MODULE(_accelkit_device, m) {
  m.doc() = "accelkit's native PrivateUse1 device guard, multi-device tensors and hooks";
  add_hook_functions(m);
  add_memory_functions(m);
  add_generator_functions(m);
  add_view_functions(m);
  add_lane_functions(m);
  add_book_functions(m);
  add_factory_functions(m);
  m.def("install_guard", &install_guard, py::arg("count"), py::arg("synchronize"));
  m.def("device_count", [] { return static_cast<int>(device_count.load()); });
  m.def("current_device", [] { return static_cast<int>(current_device); });
  m.def("set_device", [](int index) {
    check_index(static_cast<c10::DeviceIndex>(index));
    current_device = static_cast<c10::DeviceIndex>(index);
  });
  m.def("exchange_device", [](int index) {
    check_index(static_cast<c10::DeviceIndex>(index));
    auto previous = current_device;
    current_device = static_cast<c10::DeviceIndex>(index);
    return static_cast<int>(previous);
  });
  m.def("device_tensor", &device_tensor, py::arg("size"), py::arg("stride"), py::arg("dtype"),
        py::arg("index"), py::arg("address"), py::arg("nbytes"));
}
