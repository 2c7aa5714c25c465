// ``torch.empty`` on the device at C++ speed: the PrivateUse1 kernels of aten::empty.memory_format
// and aten::empty_strided.
//
// Every factory starts here (``zeros``, ``ones`` and ``full`` fill an ``empty``; ``*_like`` an
// ``empty_strided`` with the model's strides), and the runtime's Python kernels of them
// (accelkit/_runtime/dispatch/core_ops.py) cost the dispatcher's round trip into Python, their
// checks and the tensor made through three Python calls: about 7 µs, where a CPU ``empty``
// takes 1. Here the common case — a strided, unpinned tensor of a dtype the device holds, with
// at least one element, on a process's only device, contiguous or with given non-negative
// strides — is one call of the allocator's ``allocate`` and the tensor made over its buffer in
// C++. Every other call (another layout or memory format, pinned memory, a dtype the device
// refuses, an empty or negative size, another device index) takes the Python kernel, with the
// arguments PyTorch's Python kernel holder would give it, for its checks and errors.

#include <memory>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/library.h>

namespace py = pybind11;

at::Tensor tensor_over_buffer(PyObject* payload, c10::IntArrayRef shape, c10::ScalarType dtype,
                              std::optional<c10::IntArrayRef> strides);  // device.cpp

namespace {

using OptionalDtype = std::optional<c10::ScalarType>;
using OptionalLayout = std::optional<c10::Layout>;
using OptionalDevice = std::optional<c10::Device>;
using OptionalFormat = std::optional<c10::MemoryFormat>;

py::object python_list(c10::SymIntArrayRef values) {
  py::list list;
  for (const c10::SymInt& value : values) list.append(py::cast(value));
  return std::move(list);
}

struct EmptyFront {
  py::object empty;          // the runtime's Python kernel of empty.memory_format
  py::object empty_strided;  // and of empty_strided
  py::object allocator;      // the device's allocator (its ``allocate`` is looked up per call)
  std::vector<bool> held;    // per ScalarType: the device holds it

  // The fast path's tensor, or an undefined one for the Python kernel. ``strides``: none for a
  // contiguous tensor.
  at::Tensor fast(c10::IntArrayRef size, std::optional<c10::IntArrayRef> strides, c10::ScalarType dtype,
                  OptionalLayout layout, OptionalDevice device, std::optional<bool> pin_memory) {
    if (layout.value_or(c10::kStrided) != c10::kStrided || pin_memory.value_or(false)) return {};
    if (device.has_value() && (device->type() != c10::DeviceType::PrivateUse1 || device->index() > 0)) return {};
    const auto type = static_cast<size_t>(dtype);
    if (type >= held.size() || !held[type]) return {};
    if (strides.has_value() && strides->size() != size.size()) return {};
    // Bytes of storage: as the runtime's storage_bytes, here with no offset and every size > 0.
    uint64_t elements = 1;
    for (size_t i = 0; i < size.size(); ++i) {
      if (size[i] <= 0) return {};
      uint64_t extent = 0;
      if (strides.has_value()) {
        if ((*strides)[i] < 0 ||
            __builtin_mul_overflow(static_cast<uint64_t>(size[i] - 1), static_cast<uint64_t>((*strides)[i]), &extent) ||
            __builtin_add_overflow(elements, extent, &elements)) {
          return {};
        }
      } else if (__builtin_mul_overflow(elements, static_cast<uint64_t>(size[i]), &elements)) {
        return {};
      }
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(elements, c10::elementSize(dtype), &nbytes) || nbytes > INT64_MAX) return {};
    static PyObject* const allocate = PyUnicode_InternFromString("allocate");
    py::gil_scoped_acquire gil;
    PyObject* requested = PyLong_FromUnsignedLongLong(nbytes);
    if (requested == nullptr) throw py::error_already_set();
    PyObject* payload = PyObject_CallMethodOneArg(allocator.ptr(), allocate, requested);  // an OOM raises here
    Py_DECREF(requested);
    if (payload == nullptr) throw py::error_already_set();
    py::object owned = py::reinterpret_steal<py::object>(payload);
    return tensor_over_buffer(payload, size, dtype, strides);
  }

  // The keyword-only arguments given, as the Python kernel holder passes them (the GIL held).
  static py::dict keywords(OptionalDtype dtype, OptionalLayout layout, OptionalDevice device,
                           std::optional<bool> pin_memory, OptionalFormat memory_format) {
    py::dict kwargs;
    auto borrowed = [](PyObject* object) { return py::reinterpret_borrow<py::object>(object); };
    if (dtype) kwargs["dtype"] = borrowed(reinterpret_cast<PyObject*>(torch::getTHPDtype(*dtype)));
    if (layout) kwargs["layout"] = borrowed(reinterpret_cast<PyObject*>(torch::getTHPLayout(*layout)));
    if (device) kwargs["device"] = py::reinterpret_steal<py::object>(THPDevice_New(*device));
    if (pin_memory) kwargs["pin_memory"] = py::bool_(*pin_memory);
    if (memory_format) kwargs["memory_format"] = borrowed(torch::utils::getTHPMemoryFormat(*memory_format));
    return kwargs;
  }

  at::Tensor empty_memory_format(c10::SymIntArrayRef size, OptionalDtype dtype, OptionalLayout layout,
                                 OptionalDevice device, std::optional<bool> pin_memory, OptionalFormat memory_format) {
    auto concrete = c10::asIntArrayRefSlowOpt(size);
    if (concrete && memory_format.value_or(c10::MemoryFormat::Contiguous) == c10::MemoryFormat::Contiguous) {
      at::Tensor made = fast(*concrete, std::nullopt, dtype.value_or(c10::get_default_dtype_as_scalartype()),
                             layout, device, pin_memory);
      if (made.defined()) return made;
    }
    py::gil_scoped_acquire gil;
    py::object out = empty(python_list(size), **keywords(dtype, layout, device, pin_memory, memory_format));
    return out.cast<at::Tensor>();
  }

  at::Tensor strided(c10::SymIntArrayRef size, c10::SymIntArrayRef stride, OptionalDtype dtype,
                     OptionalLayout layout, OptionalDevice device, std::optional<bool> pin_memory) {
    auto concrete = c10::asIntArrayRefSlowOpt(size);
    auto concrete_strides = c10::asIntArrayRefSlowOpt(stride);
    if (concrete && concrete_strides) {
      at::Tensor made = fast(*concrete, *concrete_strides, dtype.value_or(c10::get_default_dtype_as_scalartype()),
                             layout, device, pin_memory);
      if (made.defined()) return made;
    }
    py::gil_scoped_acquire gil;
    py::object out = empty_strided(python_list(size), python_list(stride),
                                   **keywords(dtype, layout, device, pin_memory, std::nullopt));
    return out.cast<at::Tensor>();
  }
};

EmptyFront& front() {
  static auto* kept = new EmptyFront();  // as long as the process, as the library below
  return *kept;
}

// Registered once per process, when the runtime asks (at activation, instead of its Python
// kernels); a later call gives the front the new kernels, allocator and dtypes.
void install_empty(py::object empty, py::object empty_strided, py::object allocator,
                   const std::vector<py::object>& dtypes) {
  static torch::Library* library = nullptr;
  EmptyFront& made = front();
  made.empty = std::move(empty);
  made.empty_strided = std::move(empty_strided);
  made.allocator = std::move(allocator);
  made.held.clear();
  for (const py::object& dtype : dtypes) {
    TORCH_CHECK(THPDtype_Check(dtype.ptr()), "install_empty: dtypes must be torch dtypes");
    const auto type = static_cast<size_t>(reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type);
    if (made.held.size() <= type) made.held.resize(type + 1, false);
    made.held[type] = true;
  }
  if (library != nullptr) return;
  library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  library->impl("empty.memory_format",
                [](c10::SymIntArrayRef size, OptionalDtype dtype, OptionalLayout layout, OptionalDevice device,
                   std::optional<bool> pin_memory, OptionalFormat memory_format) {
                  return front().empty_memory_format(size, dtype, layout, device, pin_memory, memory_format);
                });
  library->impl("empty_strided",
                [](c10::SymIntArrayRef size, c10::SymIntArrayRef stride, OptionalDtype dtype, OptionalLayout layout,
                   OptionalDevice device, std::optional<bool> pin_memory) {
                  return front().strided(size, stride, dtype, layout, device, pin_memory);
                });
}

}  // namespace

void add_factory_functions(py::module& m) {
  m.def("install_empty", &install_empty, py::arg("empty"), py::arg("empty_strided"), py::arg("allocator"),
        py::arg("dtypes"),
        "Make the C++ kernels of empty.memory_format and empty_strided PrivateUse1's, the Python kernels "
        "behind them");
}
