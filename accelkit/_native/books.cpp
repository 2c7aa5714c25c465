// The allocator's books in C: every op adopts a freshly computed array as a new buffer, and
// releases a buffer when its storage goes (accelkit/sdk/_allocator.py). In Python each is
// several frames — the buffer's constructor, its __del__, the release — around twenty counter
// updates; here the common case of each is one call on a C struct.
//
// - Books: the allocator's counters (the fields of _allocator._Books, which it replaces once the
//   extension is loaded), readable and writable from Python, so every other allocator path
//   (allocate, the cache, OOM, statistics) keeps working on them unchanged, under the same lock;
//   plus what the common case needs of the allocator: its lock, its capacity, its free device
//   addresses (the allocator's own dict) and whether its backend drops blocks itself.
// - adopt_buffer(books, allocator, block, nbytes): DeviceAllocator.adopt's common case (the
//   result fits beside the cache), or None, for the Python path to do the whole step; and
//   adopt(allocator, array), the whole of DeviceAllocator.adopt around it (the allocator's
//   adopt once the books are native).
// - Buffer: the allocator's payload type (the same attributes and constructor as the Python
//   Buffer), whose finalizer releases an adopted block in C when the backend does nothing to
//   drop a block, and otherwise calls the allocator's _release, as the Python Buffer's __del__.

#include <Python.h>
#include <structmember.h>

#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

namespace {

constexpr long long kSmallLimit = 1LL << 20;  // as _allocator.size_class
constexpr long long kSmallRound = 512;

long long size_class(long long nbytes) {
  if (nbytes <= kSmallLimit) {
    const long long rounded = (nbytes + kSmallRound - 1) / kSmallRound * kSmallRound;
    return rounded > kSmallRound ? rounded : kSmallRound;
  }
  const int bits = 64 - __builtin_clzll(static_cast<unsigned long long>(nbytes));
  const long long step = 1LL << (bits - 3);
  return (nbytes + step - 1) / step * step;
}

PyObject* interned(const char* name) {
  PyObject* text = PyUnicode_InternFromString(name);
  if (text == nullptr) throw py::error_already_set();
  return text;  // as long as the process
}

struct BooksObject {
  PyObject_HEAD
  long long allocated, requested, live, cached_bytes, cached_blocks;
  long long peak_allocated, peak_reserved, peak_requested, peak_live, peak_segments;
  long long freed_bytes, freed_requested, released_bytes;
  long long frees, device_frees, cache_hits, ooms, alloc_retries;
  long long capacity;
  char frees_blocks;
  PyObject* lock;            // the allocator's (reentrant) lock
  PyObject* free_addresses;  // the allocator's {size class: [freed addresses]}
};

PyTypeObject BooksType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// The books' lock held for a scope (reentrant: a buffer the garbage collector frees while this
// thread holds it is released inside it, as in Python). Waiting for it releases the GIL.
class Held {
 public:
  explicit Held(PyObject* lock) : lock_(lock) {
    static PyObject* const acquire = interned("acquire");
    PyObject* done = PyObject_CallMethodNoArgs(lock_, acquire);
    held_ = done != nullptr;
    Py_XDECREF(done);
  }
  ~Held() {
    if (!held_) return;
    static PyObject* const release = interned("release");
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);  // an error being raised survives the release
    PyObject* done = PyObject_CallMethodNoArgs(lock_, release);
    if (done == nullptr) PyErr_Clear();
    Py_XDECREF(done);
    PyErr_Restore(type, value, traceback);
  }
  bool held() const { return held_; }

 private:
  PyObject* lock_;
  bool held_ = false;
};

PyObject* books_new(PyTypeObject* type, PyObject*, PyObject*) {
  auto* self = reinterpret_cast<BooksObject*>(type->tp_alloc(type, 0));  // zeroed
  if (self == nullptr) return nullptr;
  Py_INCREF(Py_None);
  Py_INCREF(Py_None);
  self->lock = Py_None;
  self->free_addresses = Py_None;
  return reinterpret_cast<PyObject*>(self);
}

int books_traverse(PyObject* object, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<BooksObject*>(object);
  Py_VISIT(self->lock);
  Py_VISIT(self->free_addresses);
  return 0;
}

int books_clear(PyObject* object) {
  auto* self = reinterpret_cast<BooksObject*>(object);
  Py_CLEAR(self->lock);
  Py_CLEAR(self->free_addresses);
  return 0;
}

void books_dealloc(PyObject* object) {
  PyObject_GC_UnTrack(object);
  books_clear(object);
  Py_TYPE(object)->tp_free(object);
}

#define BOOK(field, doc) {#field, T_LONGLONG, offsetof(BooksObject, field), 0, doc}
PyMemberDef books_members[] = {
    BOOK(allocated, "blocks of live buffers, in bytes"),
    BOOK(requested, "bytes live buffers asked for"),
    BOOK(live, "live buffers"),
    BOOK(cached_bytes, "bytes of cached (free) blocks"),
    BOOK(cached_blocks, "cached blocks"),
    BOOK(peak_allocated, "highest allocated since the last peak reset"),
    BOOK(peak_reserved, "highest allocated + cached"),
    BOOK(peak_requested, "highest requested"),
    BOOK(peak_live, "highest live"),
    BOOK(peak_segments, "highest live + cached blocks"),
    BOOK(freed_bytes, "blocks of freed buffers, in bytes, ever"),
    BOOK(freed_requested, "bytes freed buffers had asked for, ever"),
    BOOK(released_bytes, "bytes of blocks given back to the backend, ever"),
    BOOK(frees, "buffers freed"),
    BOOK(device_frees, "blocks given back to the backend"),
    BOOK(cache_hits, "requests served from the cache"),
    BOOK(ooms, "requests refused"),
    BOOK(alloc_retries, "requests that fitted once the cache was emptied"),
    BOOK(capacity, "the device's bytes (the allocator's capacity)"),
    {"frees_blocks", T_BOOL, offsetof(BooksObject, frees_blocks), 0, "whether the backend drops blocks itself"},
    {"lock", T_OBJECT, offsetof(BooksObject, lock), 0, "the allocator's lock"},
    {"free_addresses", T_OBJECT, offsetof(BooksObject, free_addresses), 0, "the allocator's freed addresses"},
    {nullptr},
};
#undef BOOK

struct BufferObject {
  PyObject_HEAD
  PyObject* block;
  PyObject* allocator;  // None once released
  BooksObject* books;   // the books an adopted block is released in, in C (or null)
  long long nbytes;
  long long block_bytes;
  long long address;
  char cacheable;
  PyObject* weakrefs;
};

PyTypeObject BufferType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* new_buffer(PyObject* allocator, BooksObject* books, PyObject* block, long long nbytes,
                     long long block_bytes, bool cacheable, long long address) {
  auto* self = PyObject_GC_New(BufferObject, &BufferType);
  if (self == nullptr) return nullptr;
  Py_INCREF(block);
  Py_INCREF(allocator);
  Py_XINCREF(books);
  self->block = block;
  self->allocator = allocator;
  self->books = books;
  self->nbytes = nbytes;
  self->block_bytes = block_bytes;
  self->address = address;
  self->cacheable = cacheable;
  self->weakrefs = nullptr;
  PyObject_GC_Track(self);
  return reinterpret_cast<PyObject*>(self);
}

// Buffer(allocator, block, nbytes, block_bytes, cacheable=True, address=0), as in Python.
PyObject* buffer_new(PyTypeObject*, PyObject* args, PyObject* kwargs) {
  static const char* keywords[] = {"allocator", "block", "nbytes", "block_bytes", "cacheable", "address", nullptr};
  PyObject *allocator, *block;
  long long nbytes, block_bytes, address = 0;
  int cacheable = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOLL|pL", const_cast<char**>(keywords), &allocator, &block,
                                   &nbytes, &block_bytes, &cacheable, &address)) {
    return nullptr;
  }
  return new_buffer(allocator, nullptr, block, nbytes, block_bytes, cacheable != 0, address);
}

// DeviceAllocator._release of a block that is not cached, in C (the lock is taken here).
// False when it could not be done; nothing was changed then.
bool release_in_c(BufferObject* self) {
  BooksObject* books = self->books;
  if (!PyDict_CheckExact(books->free_addresses)) return false;
  Held held(books->lock);
  if (!held.held()) return false;
  if (self->address) {
    PyObject* span = PyLong_FromLongLong(size_class(self->nbytes));
    if (span == nullptr) return false;
    PyObject* free = PyDict_GetItemWithError(books->free_addresses, span);  // borrowed
    PyObject* created = nullptr;
    if (free == nullptr && !PyErr_Occurred()) {
      created = free = PyList_New(0);
      if (created != nullptr && PyDict_SetItem(books->free_addresses, span, created) != 0) free = nullptr;
    }
    PyObject* address = free != nullptr ? PyLong_FromLongLong(self->address) : nullptr;
    const bool kept = address != nullptr && PyList_Append(free, address) == 0;
    Py_XDECREF(address);
    Py_XDECREF(created);
    Py_DECREF(span);
    if (!kept) return false;
  }
  books->allocated -= self->block_bytes;
  books->requested -= self->nbytes;
  books->live -= 1;
  books->freed_bytes += self->block_bytes;
  books->freed_requested += self->nbytes;
  books->frees += 1;
  books->device_frees += 1;
  books->released_bytes += self->block_bytes;
  return true;
}

// Python's Buffer.__del__: the block goes back to the allocator, once.
void buffer_finalize(PyObject* object) {
  auto* self = reinterpret_cast<BufferObject*>(object);
  if (self->allocator == nullptr || self->allocator == Py_None) return;
  PyObject* allocator = self->allocator;  // its reference moves here
  Py_INCREF(Py_None);
  self->allocator = Py_None;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  bool done = false;
  if (self->books != nullptr && !self->cacheable && !self->books->frees_blocks) {
    done = release_in_c(self);
    PyErr_Clear();
  }
  if (!done) {
    static PyObject* const release = interned("_release");
    PyObject* block_bytes = PyLong_FromLongLong(self->block_bytes);
    PyObject* nbytes = PyLong_FromLongLong(self->nbytes);
    PyObject* address = PyLong_FromLongLong(self->address);
    if (block_bytes != nullptr && nbytes != nullptr && address != nullptr) {
      PyObject* result = PyObject_CallMethodObjArgs(allocator, release, self->block, block_bytes, nbytes,
                                                    self->cacheable ? Py_True : Py_False, address, nullptr);
      Py_XDECREF(result);
    }
    Py_XDECREF(block_bytes);
    Py_XDECREF(nbytes);
    Py_XDECREF(address);
    PyErr_Clear();  // as the Python __del__: an allocator torn down at shutdown is ignored
  }
  Py_DECREF(allocator);
  PyErr_Restore(type, value, traceback);
}

int buffer_traverse(PyObject* object, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<BufferObject*>(object);
  Py_VISIT(self->block);
  Py_VISIT(self->allocator);
  Py_VISIT(reinterpret_cast<PyObject*>(self->books));
  return 0;
}

int buffer_clear(PyObject* object) {
  auto* self = reinterpret_cast<BufferObject*>(object);
  Py_CLEAR(self->block);
  Py_CLEAR(self->allocator);
  Py_CLEAR(self->books);
  return 0;
}

void buffer_dealloc(PyObject* object) {
  if (PyObject_CallFinalizerFromDealloc(object) < 0) return;  // resurrected
  auto* self = reinterpret_cast<BufferObject*>(object);
  PyObject_GC_UnTrack(object);
  if (self->weakrefs != nullptr) PyObject_ClearWeakRefs(object);
  buffer_clear(object);
  PyObject_GC_Del(object);
}

PyObject* buffer_repr(PyObject* object) {
  static PyObject* const device_name = interned("device");
  auto* self = reinterpret_cast<BufferObject*>(object);
  PyObject* device = self->allocator != nullptr && self->allocator != Py_None
                         ? PyObject_GetAttr(self->allocator, device_name) : Py_NewRef(Py_None);
  if (device == nullptr) return nullptr;
  PyObject* text = PyUnicode_FromFormat("Buffer(%lld bytes on %S)", self->nbytes, device);
  Py_DECREF(device);
  return text;
}

PyMemberDef buffer_members[] = {
    {"block", T_OBJECT, offsetof(BufferObject, block), READONLY, "the backend's raw block"},
    {"nbytes", T_LONGLONG, offsetof(BufferObject, nbytes), READONLY, "the bytes asked for"},
    {"block_bytes", T_LONGLONG, offsetof(BufferObject, block_bytes), READONLY, "the block's size class"},
    {"cacheable", T_BOOL, offsetof(BufferObject, cacheable), READONLY, "False for adopted blocks"},
    {"address", T_LONGLONG, offsetof(BufferObject, address), READONLY, "the device address (0: empty)"},
    {"_allocator", T_OBJECT, offsetof(BufferObject, allocator), READONLY, "the owner (None once released)"},
    {nullptr},
};

// A new buffer of nbytes counted in the books, under the allocator's lock, when it fits beside
// the cache (DeviceAllocator.adopt's common case, see its Python twin there): 1 with its device
// address set, 0 when it does not fit (the cache, or an OOM: the Python path's to decide), -1
// with a Python error. Nothing is changed unless it returns 1.
int reserve(BooksObject* books, PyObject* allocator, PyObject* size, long long nbytes, long long* address) {
  *address = 0;
  if (!PyDict_CheckExact(books->free_addresses)) return 0;
  Held held(books->lock);
  if (!held.held()) return -1;
  const long long allocated = books->allocated + nbytes;
  if (allocated + books->cached_bytes > books->capacity) return 0;
  if (nbytes) {
    PyObject* span = PyLong_FromLongLong(size_class(nbytes));
    if (span == nullptr) return -1;
    PyObject* free = PyDict_GetItemWithError(books->free_addresses, span);  // borrowed
    Py_DECREF(span);
    if (free != nullptr && PyList_CheckExact(free) && PyList_GET_SIZE(free) > 0) {
      const Py_ssize_t last = PyList_GET_SIZE(free) - 1;
      *address = PyLong_AsLongLong(PyList_GET_ITEM(free, last));
      if (*address == -1 && PyErr_Occurred()) return -1;
      if (PyList_SetSlice(free, last, last + 1, nullptr) != 0) return -1;
    } else {
      if (PyErr_Occurred()) return -1;
      static PyObject* const claim = interned("_claim_address");
      PyObject* claimed = PyObject_CallMethodOneArg(allocator, claim, size);
      if (claimed == nullptr) return -1;  // out of device addresses: that error
      *address = PyLong_AsLongLong(claimed);
      Py_DECREF(claimed);
      if (*address == -1 && PyErr_Occurred()) return -1;
    }
  }
  books->allocated = allocated;
  books->requested += nbytes;
  books->live += 1;
  if (allocated > books->peak_allocated) books->peak_allocated = allocated;
  if (allocated + books->cached_bytes > books->peak_reserved) books->peak_reserved = allocated + books->cached_bytes;
  if (books->requested > books->peak_requested) books->peak_requested = books->requested;
  if (books->live > books->peak_live) books->peak_live = books->live;
  if (books->live + books->cached_blocks > books->peak_segments) {
    books->peak_segments = books->live + books->cached_blocks;
  }
  return 1;
}

// adopt_buffer(books, allocator, block, nbytes) -> Buffer | None: DeviceAllocator.adopt's
// common case, or None for the Python path.
PyObject* adopt_buffer(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4 || Py_TYPE(args[0]) != &BooksType) {
    PyErr_SetString(PyExc_TypeError, "adopt_buffer(books, allocator, block, nbytes)");
    return nullptr;
  }
  auto* books = reinterpret_cast<BooksObject*>(args[0]);
  const long long nbytes = PyLong_AsLongLong(args[3]);
  if (nbytes == -1 && PyErr_Occurred()) return nullptr;
  long long address;
  const int reserved = reserve(books, args[1], args[3], nbytes, &address);
  if (reserved <= 0) return reserved < 0 ? nullptr : Py_NewRef(Py_None);
  return new_buffer(args[1], books, args[2], nbytes, nbytes, false, address);
}

// adopt(allocator, array) -> Buffer | None: DeviceAllocator.adopt with native books, one call
// (the runtime binds it to the allocator as its ``adopt``): the backend's _block_from_array,
// then adopt_buffer, and the allocator's _adopt_block (Python) for anything else.
PyObject* adopt(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "adopt(allocator, array)");
    return nullptr;
  }
  static PyObject* const block_from_array = interned("_block_from_array");
  static PyObject* const books_name = interned("_books");
  static PyObject* const general = interned("_adopt_block");
  PyObject *allocator = args[0], *array = args[1];
  PyObject* adopted = PyObject_CallMethodOneArg(allocator, block_from_array, array);
  if (adopted == nullptr || adopted == Py_None) return adopted;
  if (!PyTuple_CheckExact(adopted) || PyTuple_GET_SIZE(adopted) != 2) {
    Py_DECREF(adopted);
    PyErr_SetString(PyExc_TypeError, "_block_from_array must return (block, nbytes) or None");
    return nullptr;
  }
  PyObject *block = PyTuple_GET_ITEM(adopted, 0), *nbytes = PyTuple_GET_ITEM(adopted, 1);
  PyObject* books = PyObject_GetAttr(allocator, books_name);
  if (books == nullptr) {
    Py_DECREF(adopted);
    return nullptr;
  }
  PyObject* const common[4] = {books, allocator, block, nbytes};
  PyObject* buffer = Py_TYPE(books) == &BooksType ? adopt_buffer(nullptr, common, 4) : Py_NewRef(Py_None);
  Py_DECREF(books);
  if (buffer == Py_None) {
    Py_DECREF(buffer);
    PyObject* const rest[4] = {allocator, array, block, nbytes};
    buffer = PyObject_VectorcallMethod(general, rest, 4, nullptr);
  }
  Py_DECREF(adopted);
  return buffer;
}

// allocate(allocator, nbytes) -> Buffer: DeviceAllocator.allocate of an allocator that caches
// nothing (the runtime binds it as the allocator's ``allocate`` then): a block of exactly nbytes
// from the backend's _alloc_block, counted as adopt counts one and released in C like an
// adopted block. Anything else (an empty or negative size, a request the books cannot take
// beside the cache, an OOM) takes DeviceAllocator.allocate itself.
PyObject* allocate(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "allocate(allocator, nbytes)");
    return nullptr;
  }
  static PyObject* const books_name = interned("_books");
  static PyObject* const alloc_block = interned("_alloc_block");
  static PyObject* const general = interned("allocate");
  PyObject *allocator = args[0], *size = args[1];
  const long long nbytes = PyLong_Check(size) ? PyLong_AsLongLong(size) : 0;
  if (nbytes == -1 && PyErr_Occurred()) return nullptr;
  PyObject* books = nbytes > 0 ? PyObject_GetAttr(allocator, books_name) : nullptr;
  if (nbytes > 0 && books == nullptr) return nullptr;
  long long address = 0;
  const int reserved = books != nullptr && Py_TYPE(books) == &BooksType
      ? reserve(reinterpret_cast<BooksObject*>(books), allocator, size, nbytes, &address) : 0;
  if (reserved <= 0) {
    Py_XDECREF(books);
    if (reserved < 0) return nullptr;
    PyObject* python = PyObject_GetAttr(reinterpret_cast<PyObject*>(Py_TYPE(allocator)), general);
    if (python == nullptr) return nullptr;
    PyObject* buffer = PyObject_CallFunctionObjArgs(python, allocator, size, nullptr);
    Py_DECREF(python);
    return buffer;
  }
  PyObject* block = PyObject_CallMethodOneArg(allocator, alloc_block, size);
  if (block == nullptr) {  // the backend failed: the reservation goes back, its error stays
    static PyObject* const unreserve = interned("_unreserve");
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject* at = PyLong_FromLongLong(address);
    PyObject* done = at != nullptr ? PyObject_CallMethodObjArgs(allocator, unreserve, size, size, at, nullptr) : nullptr;
    Py_XDECREF(done);
    Py_XDECREF(at);
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
    Py_DECREF(books);
    return nullptr;
  }
  PyObject* buffer = new_buffer(allocator, reinterpret_cast<BooksObject*>(books), block, nbytes, nbytes, false, address);
  Py_DECREF(block);
  Py_DECREF(books);
  return buffer;
}

PyMethodDef book_functions[] = {
    {"adopt_buffer", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(adopt_buffer)), METH_FASTCALL,
     "DeviceAllocator.adopt's common case: a new Buffer for block (nbytes), or None for the Python path"},
    {"adopt", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(adopt)), METH_FASTCALL,
     "DeviceAllocator.adopt with native books, in one call: adopt(allocator, array)"},
    {"allocate", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(allocate)), METH_FASTCALL,
     "DeviceAllocator.allocate with native books, for an allocator that caches nothing"},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

void add_book_functions(py::module& m) {
  BooksType.tp_name = "accelkit._native.Books";
  BooksType.tp_basicsize = sizeof(BooksObject);
  BooksType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  BooksType.tp_doc = "An allocator's counters in C (accelkit.sdk._allocator._Books): see _native/books.cpp";
  BooksType.tp_new = books_new;
  BooksType.tp_dealloc = books_dealloc;
  BooksType.tp_traverse = books_traverse;
  BooksType.tp_clear = books_clear;
  BooksType.tp_members = books_members;
  BufferType.tp_name = "accelkit._native.Buffer";
  BufferType.tp_basicsize = sizeof(BufferObject);
  BufferType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  BufferType.tp_doc = "One device allocation (accelkit.sdk's Buffer) in C: see _native/books.cpp";
  BufferType.tp_new = buffer_new;
  BufferType.tp_dealloc = buffer_dealloc;
  BufferType.tp_finalize = buffer_finalize;
  BufferType.tp_traverse = buffer_traverse;
  BufferType.tp_clear = buffer_clear;
  BufferType.tp_repr = buffer_repr;
  BufferType.tp_members = buffer_members;
  BufferType.tp_weaklistoffset = offsetof(BufferObject, weakrefs);
  if (PyType_Ready(&BooksType) < 0 || PyType_Ready(&BufferType) < 0) throw py::error_already_set();
  Py_INCREF(&BooksType);
  Py_INCREF(&BufferType);
  m.add_object("Books", reinterpret_cast<PyObject*>(&BooksType));
  m.add_object("Buffer", reinterpret_cast<PyObject*>(&BufferType));
  if (PyModule_AddFunctions(m.ptr(), book_functions) != 0) throw py::error_already_set();
}
