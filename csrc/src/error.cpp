#include "dlstore/error.hpp"

#include <cstring>

namespace dlstore {

std::string describe(const std::string& path, int64_t offset, const std::string& what) {
  Text os;
  if (!path.empty()) os << path << ": ";
  if (offset >= 0) os << "at byte " << offset << ": ";
  os << what;
  return os.str();
}

Error located_error(ErrorKind kind, const std::string& path, int64_t offset, const std::string& what) {
  Error e(kind, describe(path, offset, what), path, offset);
  e.reason = what;
  return e;
}

void throw_error(ErrorKind kind, const std::string& path, int64_t offset, const std::string& what) {
  throw located_error(kind, path, offset, what);
}

void throw_errno(const std::string& path, int64_t offset, const std::string& call, int err) {
  std::string what = call + " failed: " + std::strerror(err) + " (errno " + std::to_string(err) + ")";
  Error e = located_error(ErrorKind::Io, path, offset, what);
  e.err = err;
  throw e;
}

void throw_record_error(ErrorKind kind, int64_t record, const std::string& reason) {
  Error e(kind, "record " + std::to_string(record) + ": " + reason);
  e.reason = reason;
  e.record = record;
  throw e;
}

}  // namespace dlstore
