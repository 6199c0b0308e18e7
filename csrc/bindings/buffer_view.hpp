// A contiguous byte view of any Python object with the buffer protocol, held for a call.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>

// While held, the exporter may not resize or free the memory (a bytearray refuses to), so the view
// stays valid with the GIL released.
class ContiguousBytes {
 public:
  explicit ContiguousBytes(pybind11::handle obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_SIMPLE) != 0) throw pybind11::error_already_set();
  }
  ~ContiguousBytes() { PyBuffer_Release(&view_); }
  ContiguousBytes(const ContiguousBytes&) = delete;
  ContiguousBytes& operator=(const ContiguousBytes&) = delete;

  const uint8_t* data() const { return static_cast<const uint8_t*>(view_.buf); }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
};
