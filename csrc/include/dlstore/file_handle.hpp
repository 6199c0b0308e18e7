// RAII file descriptors and mappings; every failure names the file and the offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dlstore {

struct DirectAlignment {
  uint32_t memory = 4096;  // buffer address alignment
  uint32_t offset = 4096;  // file offset and length alignment
  std::string source;      // "statx" or "logical block size" or "default"
  bool supported = true;   // false: statx reports that this file cannot do direct I/O
};

class FileHandle {
 public:
  FileHandle() = default;
  // Opens read-only; with `direct` adds O_DIRECT and throws Error(kind Alignment) when the
  // filesystem refuses it (tmpfs does), so the caller can fall back and say why.
  FileHandle(const std::string& path, bool direct);
  ~FileHandle();
  FileHandle(const FileHandle&) = delete;
  FileHandle& operator=(const FileHandle&) = delete;
  FileHandle(FileHandle&& o) noexcept;
  FileHandle& operator=(FileHandle&& o) noexcept;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  int64_t mtime_ns() const { return mtime_ns_; }
  bool direct() const { return direct_; }

  // Reads up to n bytes at offset, retrying EINTR and short reads; stops early only at end of file.
  size_t pread_full(void* dst, size_t n, uint64_t offset) const;
  DirectAlignment direct_alignment() const;
  // Requests the file's block device queues at once (sysfs queue/nr_requests); 0 when the file lies
  // on no block device (tmpfs, NFS, an overlay) or sysfs does not say.
  uint32_t device_requests() const;
  // Whether `other` is open on the same file (device and inode, as each was when opened), not one since
  // renamed over its path.
  bool same_file(const FileHandle& other) const;

 private:
  int fd_ = -1;
  std::string path_;
  uint64_t size_ = 0;
  int64_t mtime_ns_ = 0;
  uint64_t dev_ = 0, ino_ = 0;  // what fstat said when opened
  bool direct_ = false;
};

// Whether the page cache holds every page of bytes [offset, offset + n) of the file open as `fd`:
// cachestat(2) where the kernel has it (6.5+), else mincore over a mapping of just that range, made and
// dropped here (nothing is read or faulted in). False when it cannot say: n is 0, the range cannot be
// mapped, or the kernel keeps this file's page-cache state from this process (both calls report it only
// for files the process owns or may write, or with CAP_FOWNER: cachestat refuses with EPERM, and mincore
// reports every page resident, so it is not asked about such a file).
// `how` forces one call (for tests: Cachestat is false where the kernel lacks it). `told`: the caller has
// found page_cache_tells(fd) true, so mincore's who-may-ask check is not made again.
enum class CacheProbe { Auto, Cachestat, Mincore };
bool page_cache_holds(int fd, uint64_t offset, size_t n, CacheProbe how = CacheProbe::Auto, bool told = false);
// The pages of bytes [offset, offset + n) the page cache holds, by the same calls, and in `pages` how many
// pages the range spans; -1 where the kernel does not say (the cases above).
int64_t cached_pages(int fd, uint64_t offset, uint64_t n, CacheProbe how, uint64_t* pages, bool told = false);
// Whether the kernel tells this process the page cache's state of the file open as `fd` (the who-may-ask
// rule above): what an engine asks once per file, not before every read.
bool page_cache_tells(int fd);

// A read-only mapping of a whole file. `sequential` advises the kernel to read ahead and drop pages
// behind (a sequential pass); otherwise the default advice suits reads in any order.
class Mapping {
 public:
  explicit Mapping(const std::string& path, bool sequential = true);
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Faults in [offset, offset+n) ahead of use (MADV_POPULATE_READ where the kernel has it, else a
  // touch per page), so the consumer thread does not pay the page faults.
  void populate(uint64_t offset, size_t n) const;
  // Raises an I/O error naming the file when it no longer holds [offset, offset + n): it shrank since it
  // was mapped (truncated or rewritten in place), and touching those bytes would raise SIGBUS. Probes
  // the range's last page (MADV_POPULATE_READ fails with EFAULT past the end of the file); passes where
  // the kernel lacks it.
  void expect_holds(uint64_t offset, size_t n) const;
  // That error, for bytes [offset, offset + n) found gone another way (a copy stopped by SIGBUS).
  [[noreturn]] void lost(uint64_t offset, size_t n) const;

 private:
  std::string path_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace dlstore
