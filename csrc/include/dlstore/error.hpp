// Errors that carry their context: what failed, in which file, at which byte offset.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace dlstore {

// Mirrors the Python hierarchy in dlstore/errors.py; the binding maps each kind to a class.
enum class ErrorKind { Generic, Corrupt, Alignment, Io, Gds };

struct Error : std::runtime_error {
  Error(ErrorKind kind, std::string message, std::string path = {}, int64_t offset = -1)
      : std::runtime_error(std::move(message)), kind(kind), path(std::move(path)), offset(offset) {}
  ErrorKind kind;
  std::string path;
  int64_t offset;  // byte offset in the file (or in the uncompressed stream); -1 when unknown
};

// Builds "path: at byte N: message" so every message names where it happened.
std::string describe(const std::string& path, int64_t offset, const std::string& what);

[[noreturn]] void throw_error(ErrorKind kind, const std::string& path, int64_t offset,
                              const std::string& what);
[[noreturn]] void throw_errno(const std::string& path, int64_t offset, const std::string& call,
                              int err);

}  // namespace dlstore

// DLSTORE_EXPECT(cond, kind, path, offset, "text" << value ...)
#define DLSTORE_EXPECT(cond, kind, path, offset, msg)                                   \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::ostringstream dlstore_os_;                                                   \
      dlstore_os_ << msg;                                                               \
      ::dlstore::throw_error(::dlstore::ErrorKind::kind, (path), (offset), dlstore_os_.str()); \
    }                                                                                   \
  } while (0)

// DLSTORE_SYSCALL_CHECK(ret, path, offset, "pread"): throws with strerror(errno) when ret < 0.
#define DLSTORE_SYSCALL_CHECK(ret, path, offset, call)                         \
  do {                                                                         \
    if ((ret) < 0) ::dlstore::throw_errno((path), (offset), (call), errno);    \
  } while (0)
