// Running long C++ work with the GIL released, safely at interpreter exit.
//
// A thread that asks for the GIL back once the interpreter is finalizing (a daemon thread, or a
// loader's background thread whose read returns after the main thread left) is ended by CPython
// before 3.14 with pthread_exit from inside PyEval_RestoreThread. Its forced unwind aborts the whole
// process (std::terminate) when it meets a noexcept frame, as pybind11's gil_scoped_release
// destructor is. So:
// - once Python's atexit hooks run (module.cpp registers one at import that marks the thread running
//   them, before finalization begins), any other thread coming back from C++ does not ask for the GIL
//   at all: it waits for the process to end, as CPython 3.14 does itself. The thread that finalizes may
//   still call into C++ (a reader collected at shutdown closes): it takes the GIL back as ever;
// - one that asked just before (it waits for the GIL while the hooks run) is let go by the unwind:
//   no frame here is noexcept, and an exception of the work is rethrown only once the GIL is back, so
//   the unwind never starts inside another one.
#pragma once

#include <pybind11/pybind11.h>
#include <unistd.h>

#include <atomic>
#include <exception>
#include <thread>
#include <optional>
#include <type_traits>
#include <utility>

namespace dlstore_bindings {

// Set by the atexit hook module.cpp registers: the flag, and the thread that runs the hooks and finalizes.
inline std::atomic<bool>& interpreter_exiting() {
  static std::atomic<bool> flag{false};
  return flag;
}
inline std::thread::id& finalizing_thread() {
  static std::thread::id id;
  return id;
}
inline void mark_exiting() {
  finalizing_thread() = std::this_thread::get_id();
  interpreter_exiting().store(true);  // after the id: a thread that sees the flag sees the id
}

inline void take_gil_back(PyThreadState* state) {  // not noexcept: see above
  if (interpreter_exiting().load() && std::this_thread::get_id() != finalizing_thread())
    for (;;) pause();  // the process is ending: this thread has nothing left to hand back
  PyEval_RestoreThread(state);
}

// f() with the GIL released; its result, or its exception rethrown with the GIL held.
template <class F>
auto without_gil(F&& f) -> decltype(f()) {
  using R = decltype(f());
  if constexpr (std::is_void_v<R>) {
    without_gil([&] {
      f();
      return true;
    });
  } else {
    std::exception_ptr error;
    std::optional<R> out;
    PyThreadState* state = PyEval_SaveThread();
    try {
      out.emplace(f());
    } catch (...) {
      error = std::current_exception();
    }
    take_gil_back(state);
    if (error) std::rethrow_exception(error);
    return std::move(*out);
  }
}

}  // namespace dlstore_bindings
