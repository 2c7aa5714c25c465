// The prepared-call lane's front at C++ speed: a PrivateUse1 kernel for a functional op whose
// call is all device tensors (every other argument at its schema default).
//
// The Python front (accelkit/_runtime/dispatch/specialize.py, Lane.front) costs a strict small
// op its dispatcher round trip into Python (the boxed stack turned into args and kwargs, the
// result back onto the stack), the layout key built from Python tuples, and the result tensor
// made through three Python calls. Here the layout key is a string of the tensors' geometry
// built from the stack, the plan is found in a C++ map, the result tensor is made in C++ over
// the buffer the allocator adopts, and the call is counted here (the runtime's op counters
// collect the count when they are read; while a thread has counting paused, each call goes to
// the Python counter, which knows which thread it is); what stays in Python is what the
// backend owns: the plan's run (the program call) and the allocator's adopt.
//
// Anything else takes the Python kernel exactly as PyTorch's own Python kernel holder would
// call it (same args and kwargs): a call with another argument, a tensor without a device
// buffer or with a conjugate/negative bit, a layout not met yet, a first call of a layout (its
// result is checked and recorded by the Python front), a declining kernel (the Python
// ``declined`` path), a result the allocator will not adopt as is.

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/library.h>

namespace py = pybind11;

at::Tensor tensor_over_buffer(PyObject* payload, c10::IntArrayRef shape, c10::ScalarType dtype,
                              std::optional<c10::IntArrayRef> strides = std::nullopt);  // device.cpp

namespace {

// Attribute names looked up on every call, made once (a C string would be a new str each time).
PyObject* interned(const char* name) {
  PyObject* text = PyUnicode_InternFromString(name);
  if (text == nullptr) throw py::error_already_set();
  return text;  // as long as the process, as the fronts that use it
}

PyObject* payload_name() {
  static PyObject* const name = interned("payload");
  return name;
}

constexpr size_t kPlansKept = 4096;  // as the Python lane: beyond it the map starts afresh

// A layout seen by the Python lane: its plan, and once its first call is done, the result.
struct Entry {
  py::object plan;        // the Python lane's _Plan (None: not covered)
  py::object run;         // plan.run
  py::list numbers;       // the numbers the Python lane hands the plan (defaults: fixed per layout)
  py::object result_type; // type of the array a call returns (set once the result is known)
  std::vector<int64_t> shape;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  bool known = false;
};

// One stack argument as Python sees it in a Python kernel: dtypes, layouts and memory formats
// (integers on the stack) as their torch objects, everything else by the JIT's conversion.
py::object python_value(const c10::Argument& argument, const c10::IValue& value) {
  // C++ callers pass an absent optional tensor as an undefined one; Python sees None.
  if (value.isNone() || (value.isTensor() && !value.toTensor().defined())) return py::none();
  c10::TypePtr type = argument.real_type();
  if (auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
  switch (type->kind()) {
    case c10::TypeKind::ScalarTypeType:
      return py::reinterpret_borrow<py::object>(
          reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(value.toInt()))));
    case c10::TypeKind::LayoutType:
      return py::reinterpret_borrow<py::object>(
          reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(value.toInt()))));
    case c10::TypeKind::MemoryFormatType:
      return py::reinterpret_borrow<py::object>(
          torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(value.toInt())));
    default:
      return torch::jit::toPyObject(value);
  }
}

// The stack's arguments as PyTorch's Python kernel holder hands them to a Python kernel:
// positional ones up to the last that differs from its default, keyword-only ones by name
// when they differ from their default.
std::pair<py::tuple, py::dict> python_arguments(const c10::FunctionSchema& schema,
                                                c10::ArrayRef<c10::IValue> values) {
  const auto& arguments = schema.arguments();
  auto defaulted = [&](size_t i) {
    const auto& fallback = arguments[i].default_value();
    return fallback.has_value() && *fallback == values[i];
  };
  size_t keywords_from = values.size();
  while (keywords_from > 0 && arguments[keywords_from - 1].kwarg_only()) --keywords_from;
  size_t positional = keywords_from;
  while (positional > 0 && defaulted(positional - 1)) --positional;
  py::tuple args(positional);
  for (size_t i = 0; i < positional; ++i) args[i] = python_value(arguments[i], values[i]);
  py::dict kwargs;
  for (size_t i = keywords_from; i < values.size(); ++i) {
    if (!defaulted(i)) kwargs[py::str(arguments[i].name())] = python_value(arguments[i], values[i]);
  }
  return {std::move(args), std::move(kwargs)};
}

// A Python kernel's result onto the stack, per the schema's returns.
void push_python_result(const c10::FunctionSchema& schema, torch::jit::Stack* stack, const py::object& out) {
  const auto& returns = schema.returns();
  if (returns.empty()) {
    TORCH_CHECK(out.is_none(), schema.name(), ": the kernel returned a value for an op that returns none");
  } else if (returns.size() == 1) {
    torch::jit::push(*stack, torch::jit::toIValue(out, returns[0].real_type()));
  } else {
    auto items = py::cast<py::sequence>(out);
    TORCH_CHECK(items.size() == returns.size(), schema.name(), ": the kernel returned ", items.size(),
                " values, the op ", returns.size());
    for (size_t i = 0; i < returns.size(); ++i) {
      torch::jit::push(*stack, torch::jit::toIValue(items[i], returns[i].real_type()));
    }
  }
}

class Front {
 public:
  Front(py::object kernel, py::object lookup, py::object count, py::object counters, py::object adopt,
            py::object declined, py::object declined_error, std::vector<int> tensor_slots,
            std::vector<c10::IValue> defaults)
      : kernel_(std::move(kernel)), lookup_(std::move(lookup)), count_(std::move(count)),
        counters_(std::move(counters)), adopt_(std::move(adopt)), declined_(std::move(declined)),
        declined_error_(std::move(declined_error)), tensor_slots_(std::move(tensor_slots)),
        defaults_(std::move(defaults)) {}

  // The calls counted here since the last take (the GIL held), and none from then on.
  int64_t take_calls() {
    const int64_t calls = calls_;
    calls_ = 0;
    return calls;
  }

  void call(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    py::gil_scoped_acquire gil;
    if (!fast(op, stack)) python_kernel(kernel_, op, stack);
  }

 private:
  // The Python kernel (or ``declined``) called as PyTorch's Python kernel holder calls it.
  static void python_kernel(const py::object& fn, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    auto arguments = torch::jit::pop(*stack, schema.arguments().size());
    auto args_kwargs = python_arguments(schema, arguments);
    py::object out = fn(*args_kwargs.first, **args_kwargs.second);
    push_python_result(schema, stack, out);
  }

  bool fast(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const size_t count = defaults_.size();
    auto arguments = torch::jit::last(*stack, count);
    // Local, not members: a plan's run may dispatch ops of its own (a fused flush).
    std::string key;
    py::list blocks;
    size_t slot = 0;
    for (size_t i = 0; i < count; ++i) {
      const c10::IValue& value = arguments[i];
      const bool tensor_slot = slot < tensor_slots_.size() && tensor_slots_[slot] == static_cast<int>(i);
      if (tensor_slot) ++slot;
      if (tensor_slot && value.isTensor()) {
        const at::Tensor& t = value.toTensor();
        if (!t.defined()) return false;  // an absent optional tensor: the Python kernel's call
        if (t.device().type() != c10::DeviceType::PrivateUse1 || t.device().index() != 0 || t.is_neg() ||
            t.is_conj()) {
          return false;
        }
        PyObject* storage = THPStorage_Wrap(t.storage());
        if (storage == nullptr) throw py::error_already_set();
        py::object owned = py::reinterpret_steal<py::object>(storage);
        PyObject* payload = PyObject_GetAttr(storage, payload_name());
        if (payload == nullptr) {
          PyErr_Clear();
          return false;
        }
        py::object held = py::reinterpret_steal<py::object>(payload);
        if (payload == Py_None) return false;
        static PyObject* const block_name = interned("block");
        PyObject* block = PyObject_GetAttr(payload, block_name);
        if (block == nullptr) throw py::error_already_set();
        blocks.append(py::reinterpret_steal<py::object>(block));
        append(key, static_cast<int64_t>(i));
        append(key, static_cast<int64_t>(t.scalar_type()));
        append(key, t.dim());
        for (int64_t s : t.sizes()) append(key, s);
        for (int64_t s : t.strides()) append(key, s);
        append(key, t.storage_offset());
      } else if (!equal(value, defaults_[i])) {
        return false;  // a tensor where none is expected, or a non-default argument
      }
    }
    Entry* entry = find(op, arguments, key);
    if (entry == nullptr) return false;
    if (!entry->known && !learn(*entry)) return false;

    py::object out;
    try {
      out = entry->run(blocks, entry->numbers);
    } catch (py::error_already_set& e) {
      if (!e.matches(declined_error_)) throw;
      python_kernel(declined_, op, stack);
      return true;
    }
    count_call();
    if (Py_TYPE(out.ptr()) != reinterpret_cast<PyTypeObject*>(entry->result_type.ptr())) {
      return wrapped(op, stack, out);
    }
    py::object payload = adopt_(out);
    if (payload.is_none()) return wrapped(op, stack, out);
    at::Tensor result = tensor_over_buffer(payload.ptr(), entry->shape, entry->dtype);
    torch::jit::drop(*stack, count);
    torch::jit::push(*stack, std::move(result));
    return true;
  }

  // One native call of the op: counted here, unless some thread has counting paused (the
  // counters' ``_pausing``), when the Python counter decides for the calling thread.
  void count_call() {
    static PyObject* const pausing_name = interned("_pausing");
    PyObject* pausing = PyObject_GetAttr(counters_.ptr(), pausing_name);
    if (pausing == nullptr) throw py::error_already_set();
    const int paused = PyObject_IsTrue(pausing);
    Py_DECREF(pausing);
    if (paused < 0) throw py::error_already_set();
    if (paused) {
      count_();
    } else {
      ++calls_;
    }
  }

  // A result the Python front does not adopt directly either (another array type, or the
  // allocator declines it): wrapped by the runtime, as the Python front does.
  bool wrapped(const c10::OperatorHandle& op, torch::jit::Stack* stack, const py::object& out) {
    py::object result = wrap_(out);
    torch::jit::drop(*stack, defaults_.size());
    push_python_result(op.schema(), stack, result);
    return true;
  }

  Entry* find(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments, const std::string& key) {
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      // First meeting of the layout here: ask the Python lane with the arguments the Python
      // kernel would get (it makes the plan, or says the layout is not covered).
      auto args_kwargs = python_arguments(op.schema(), arguments);
      py::object found = lookup_(args_kwargs.first, args_kwargs.second);
      if (plans_.size() >= kPlansKept) plans_.clear();
      Entry fresh;
      if (!found.is_none()) {
        py::tuple pair = found.cast<py::tuple>();
        fresh.plan = pair[0];
        fresh.numbers = pair[1].cast<py::list>();
        fresh.run = fresh.plan.attr("run");
      }
      it = plans_.emplace(key, std::move(fresh)).first;
    }
    if (!it->second.plan) return nullptr;
    return &it->second;
  }

  // The layout's result, once the Python front has run its first call: (array type, shape,
  // dtype) in plan.result. False while it is not known yet (or not one array).
  static bool learn(Entry& entry) {
    py::object result = entry.plan.attr("result");
    if (result.is_none()) return false;
    py::tuple known = result.cast<py::tuple>();
    entry.result_type = known[0];
    entry.shape = known[1].cast<std::vector<int64_t>>();
    PyObject* dtype = known[2].ptr();
    if (!THPDtype_Check(dtype)) return false;
    entry.dtype = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
    for (int64_t size : entry.shape) {
      if (size == 0) return false;  // an empty result: the Python path's own wrapping
    }
    entry.known = true;
    return true;
  }

  static bool equal(const c10::IValue& a, const c10::IValue& b) {
    if (a.isNone() || b.isNone()) return a.isNone() && b.isNone();
    if (a.isBool() && b.isBool()) return a.toBool() == b.toBool();
    if (a.isInt() && b.isInt()) return a.toInt() == b.toInt();
    if (a.isDouble() && b.isDouble()) return a.toDouble() == b.toDouble();
    if (a.isString() && b.isString()) return a.toStringRef() == b.toStringRef();
    return false;
  }

  static void append(std::string& key, int64_t value) {
    key.append(reinterpret_cast<const char*>(&value), sizeof(value));
  }

 public:
  py::object wrap_;

 private:
  py::object kernel_, lookup_, count_, counters_, adopt_, declined_, declined_error_;
  int64_t calls_ = 0;  // counted here, not yet taken by the counters
  std::vector<int> tensor_slots_;       // positions of the schema's Tensor / Tensor? arguments
  std::vector<c10::IValue> defaults_;   // every argument's default (None for tensors)
  std::unordered_map<std::string, Entry> plans_;
};

// The dispatcher's kernel: a front that is never destroyed. The dispatcher drops its kernels
// during C++ static destruction, after Python has finalised, when the front's Python objects
// can no longer be released; a front lives as long as the process anyway.
class LaneKernel final : public c10::OperatorKernel {
 public:
  explicit LaneKernel(Front* front) : front_(front) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    front_->call(op, stack);
  }

 private:
  Front* front_;
};

std::vector<torch::Library*>& libraries() {
  static auto* kept = new std::vector<torch::Library*>();  // as long as the process
  return *kept;
}

// Register the C++ front as ``qualified_name``'s PrivateUse1 kernel. The op must have a
// default for every argument but its Tensor / Tensor? ones (the caller checks). Returns the
// front's ``take()``: the calls it counted since the last take.
py::cpp_function install_lane_front(const std::string& qualified_name, const std::string& overload,
                                    py::object kernel, py::object lookup, py::object count, py::object counters,
                                    py::object adopt, py::object wrap, py::object declined,
                                    py::object declined_error) {
  auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(qualified_name.c_str(), overload.c_str());
  const auto& schema = handle.schema();
  std::vector<int> tensor_slots;
  std::vector<c10::IValue> defaults;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const auto& argument = schema.arguments()[i];
    auto type = argument.type();
    bool tensor = type->kind() == c10::TypeKind::TensorType;
    if (type->kind() == c10::TypeKind::OptionalType) {
      tensor = type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType;
    }
    if (tensor) {
      tensor_slots.push_back(static_cast<int>(i));
      defaults.emplace_back();
    } else {
      TORCH_CHECK(argument.default_value().has_value(), qualified_name, ": argument ", argument.name(),
                  " has no default; the lane's C++ front takes ops whose other arguments all have one");
      defaults.push_back(*argument.default_value());
    }
  }
  auto* front = new Front(std::move(kernel), std::move(lookup), std::move(count), std::move(counters),
                          std::move(adopt), std::move(declined), std::move(declined_error),
                          std::move(tensor_slots), std::move(defaults));
  front->wrap_ = std::move(wrap);
  std::string name = qualified_name.substr(qualified_name.find("::") + 2);
  if (!overload.empty()) name += "." + overload;
  auto* library = new torch::Library(torch::Library::IMPL, qualified_name.substr(0, qualified_name.find("::")),
                                     c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<LaneKernel>(front)));
  libraries().push_back(library);
  return py::cpp_function([front] { return front->take_calls(); });
}

}  // namespace

void add_lane_functions(py::module& m) {
  m.def("install_lane_front", &install_lane_front, py::arg("qualified_name"), py::arg("overload"),
        py::arg("kernel"), py::arg("lookup"), py::arg("count"), py::arg("counters"), py::arg("adopt"), py::arg("wrap"),
        py::arg("declined"), py::arg("declined_error"),
        "Make a C++ front of the prepared-call lane the PrivateUse1 kernel of an op (see lane.cpp)");
}
