// ``torch.empty`` on the device at C++ speed: the PrivateUse1 kernel of aten::empty.memory_format.
//
// Every factory starts here (``zeros``, ``ones``, ``full`` and ``*_like`` fill an ``empty``),
// and the runtime's Python kernel of it (accelkit/_runtime/dispatch/core_ops.py) costs the
// dispatcher's round trip into Python, its checks and the tensor made through three Python
// calls: about 7 µs, where a CPU ``empty`` takes 1. Here the common case — a contiguous,
// strided, unpinned tensor of a dtype the device holds, with at least one element, on a
// process's only device — is one call of the allocator's ``allocate`` and the tensor made over
// its buffer in C++. Every other call (another layout or memory format, pinned memory, a dtype
// the device refuses, an empty or negative size, another device index) takes the Python
// kernel, with the arguments PyTorch's Python kernel holder would give it, for its checks and
// errors.

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

at::Tensor tensor_over_buffer(PyObject* payload, c10::IntArrayRef shape, c10::ScalarType dtype);  // device.cpp

namespace {

struct EmptyFront {
  py::object python;     // the runtime's Python kernel of empty.memory_format
  py::object allocator;  // the device's allocator (its ``allocate`` is looked up per call)
  std::vector<bool> held;  // per ScalarType: the device holds it

  // The fast path's tensor, or an undefined one for the Python kernel.
  at::Tensor fast(c10::IntArrayRef size, c10::ScalarType dtype, std::optional<c10::Layout> layout,
                  std::optional<c10::Device> device, std::optional<bool> pin_memory,
                  std::optional<c10::MemoryFormat> memory_format) {
    if (layout.value_or(c10::kStrided) != c10::kStrided || pin_memory.value_or(false) ||
        memory_format.value_or(c10::MemoryFormat::Contiguous) != c10::MemoryFormat::Contiguous) {
      return {};
    }
    if (device.has_value() && (device->type() != c10::DeviceType::PrivateUse1 || device->index() > 0)) return {};
    const auto type = static_cast<size_t>(dtype);
    if (type >= held.size() || !held[type]) return {};
    uint64_t nbytes = c10::elementSize(dtype);
    for (int64_t s : size) {
      if (s <= 0 || __builtin_mul_overflow(nbytes, static_cast<uint64_t>(s), &nbytes)) return {};
    }
    if (nbytes > static_cast<uint64_t>(INT64_MAX)) return {};
    static PyObject* const allocate = PyUnicode_InternFromString("allocate");
    py::gil_scoped_acquire gil;
    PyObject* requested = PyLong_FromUnsignedLongLong(nbytes);
    if (requested == nullptr) throw py::error_already_set();
    PyObject* payload = PyObject_CallMethodOneArg(allocator.ptr(), allocate, requested);  // an OOM raises here
    Py_DECREF(requested);
    if (payload == nullptr) throw py::error_already_set();
    py::object owned = py::reinterpret_steal<py::object>(payload);
    return tensor_over_buffer(payload, size, dtype);
  }

  at::Tensor operator()(c10::SymIntArrayRef sym_size, std::optional<c10::ScalarType> dtype,
                        std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                        std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
    if (auto size = c10::asIntArrayRefSlowOpt(sym_size)) {
      at::Tensor made = fast(*size, dtype.value_or(c10::get_default_dtype_as_scalartype()), layout, device,
                             pin_memory, memory_format);
      if (made.defined()) return made;
    }
    py::gil_scoped_acquire gil;
    py::dict kwargs;  // as the Python kernel holder passes them: the keyword-only ones given
    if (dtype) kwargs["dtype"] = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(*dtype)));
    if (layout) kwargs["layout"] = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPLayout(*layout)));
    if (device) kwargs["device"] = py::reinterpret_steal<py::object>(THPDevice_New(*device));
    if (pin_memory) kwargs["pin_memory"] = py::bool_(*pin_memory);
    if (memory_format) kwargs["memory_format"] = py::reinterpret_borrow<py::object>(torch::utils::getTHPMemoryFormat(*memory_format));
    py::list size;
    for (const c10::SymInt& s : sym_size) size.append(py::cast(s));
    return python(size, **kwargs).cast<at::Tensor>();
  }
};

// Registered once per process, when the runtime asks (at activation, instead of its Python
// kernel); the front and its library live as long as the process (see lane.cpp's LaneKernel).
// A later call gives the front the new kernel, allocator and dtypes.
void install_empty(py::object python, py::object allocator, const std::vector<py::object>& dtypes) {
  static torch::Library* library = nullptr;
  static auto* front = new EmptyFront();
  front->python = std::move(python);
  front->allocator = std::move(allocator);
  front->held.clear();
  for (const py::object& dtype : dtypes) {
    TORCH_CHECK(THPDtype_Check(dtype.ptr()), "install_empty: dtypes must be torch dtypes");
    const auto type = static_cast<size_t>(reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type);
    if (front->held.size() <= type) front->held.resize(type + 1, false);
    front->held[type] = true;
  }
  if (library != nullptr) return;
  library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  library->impl("empty.memory_format",
                [](c10::SymIntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                        std::optional<c10::Device> device, std::optional<bool> pin_memory,
                        std::optional<c10::MemoryFormat> memory_format) {
                  return (*front)(size, dtype, layout, device, pin_memory, memory_format);
                });
}

}  // namespace

void add_factory_functions(py::module& m) {
  m.def("install_empty", &install_empty, py::arg("python"), py::arg("allocator"), py::arg("dtypes"),
        "Make the C++ kernel of empty.memory_format PrivateUse1's, the Python kernel behind it");
}
