#include "dlstore/error.hpp"

#include <cstring>

namespace dlstore {

std::string describe(const std::string& path, int64_t offset, const std::string& what) {
  std::ostringstream os;
  if (!path.empty()) os << path << ": ";
  if (offset >= 0) os << "at byte " << offset << ": ";
  os << what;
  return os.str();
}

void throw_error(ErrorKind kind, const std::string& path, int64_t offset, const std::string& what) {
  throw Error(kind, describe(path, offset, what), path, offset);
}

void throw_errno(const std::string& path, int64_t offset, const std::string& call, int err) {
  std::string what = call + " failed: " + std::strerror(err) + " (errno " + std::to_string(err) + ")";
  throw Error(ErrorKind::Io, describe(path, offset, what), path, offset);
}

}  // namespace dlstore
