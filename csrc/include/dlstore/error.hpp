// Errors that carry their context: what failed, in which file, at which byte offset.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "dlstore/text.hpp"

namespace dlstore {

// Mirrors the Python hierarchy in dlstore/errors.py; the binding maps each kind to a class.
// Alignment never leaves the core: the engine catches it and reads that file buffered, saying so.
enum class ErrorKind { Generic, Corrupt, Alignment, Io };

struct Error : std::runtime_error {
  Error(ErrorKind kind, std::string message, std::string path = {}, int64_t offset = -1)
      : std::runtime_error(message), kind(kind), path(std::move(path)), offset(offset),
        reason(std::move(message)) {}
  ErrorKind kind;
  std::string path;
  int64_t offset;      // byte offset in the file (or in the uncompressed stream); -1 when unknown
  int64_t record = -1; // index of the record in the call (a batch), -1 when not about one record
  int err = 0;         // errno of a failed system call, 0 otherwise
  std::string reason;  // what went wrong, without the file, offset and record prefixes of what()
};

// An Error about record `record` of a batch: what() reads "record N: reason".
[[noreturn]] void throw_record_error(ErrorKind kind, int64_t record, const std::string& reason);

// Builds "path: at byte N: message" so every message names where it happened.
std::string describe(const std::string& path, int64_t offset, const std::string& what);
// An Error whose what() is describe(path, offset, what) and whose reason is `what` alone.
Error located_error(ErrorKind kind, const std::string& path, int64_t offset, const std::string& what);

[[noreturn]] void throw_error(ErrorKind kind, const std::string& path, int64_t offset,
                              const std::string& what);
[[noreturn]] void throw_errno(const std::string& path, int64_t offset, const std::string& call,
                              int err);

}  // namespace dlstore

// DLSTORE_EXPECT(cond, kind, path, offset, "text" << value ...)
#define DLSTORE_EXPECT(cond, kind, path, offset, msg)                                   \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      ::dlstore::Text dlstore_os_;                                                      \
      dlstore_os_ << msg;                                                               \
      ::dlstore::throw_error(::dlstore::ErrorKind::kind, (path), (offset), dlstore_os_.str()); \
    }                                                                                   \
  } while (0)

// DLSTORE_SYSCALL_CHECK(ret, path, offset, "pread"): throws with strerror(errno) when ret < 0.
#define DLSTORE_SYSCALL_CHECK(ret, path, offset, call)                         \
  do {                                                                         \
    if ((ret) < 0) ::dlstore::throw_errno((path), (offset), (call), errno);    \
  } while (0)
