// View ops on the device at C++ speed: PyTorch's own CPU kernels of as_strided, view,
// _reshape_alias and alias, registered for PrivateUse1.
//
// A view only makes a TensorImpl over the same storage with other sizes, strides and offset;
// nothing is read or written. The runtime's Python kernels of these ops do the same through
// the Meta kernel (plus CPU's bounds check for as_strided), at about 5 µs a view, and the eager
// ops of a small model make many views (every linear layer transposes its weight, forward and
// backward). These are the very kernels CPU tensors use, so geometry, bounds checks and their
// messages are CPU's; the storage, and with it the backend's buffer on its Python object, is
// shared as the Meta path shares it.

#include <optional>

#include <ATen/ATen.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

namespace {

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  std::optional<int64_t> offset;
  if (storage_offset.has_value()) offset = storage_offset->expect_int();
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride), offset);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view_symint(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias_symint(self, size, stride);
}

at::Tensor alias(const at::Tensor& self) { return at::native::alias(self); }

// Registered once per process, when the runtime asks (at activation, instead of its Python
// kernels of these ops); the library lives as long as the process.
bool install_views() {
  static torch::Library* library = nullptr;
  if (library != nullptr) return false;
  library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  library->impl("as_strided", TORCH_FN(as_strided));
  library->impl("view", TORCH_FN(view));
  library->impl("_reshape_alias", TORCH_FN(reshape_alias));
  library->impl("alias", TORCH_FN(alias));
  return true;
}

}  // namespace

void add_view_functions(py::module& m) {
  m.def("install_views", &install_views,
        "Register PyTorch's CPU kernels of as_strided, view, _reshape_alias and alias for PrivateUse1 "
        "(once per process; False when already registered)");
}
