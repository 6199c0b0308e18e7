// Page-aligned buffers and a pool that hands them out again, because on these VMs a page fault on
// fresh memory costs more than reading the bytes; reusing warm buffers avoids it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace dlstore {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(size_t size, size_t alignment = 4096);
  ~AlignedBuffer();
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& o) noexcept { swap(o); }
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    swap(o);
    return *this;
  }
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Grows (never shrinks) keeping the first `keep` bytes.
  void reserve(size_t size, size_t keep = 0);

 private:
  void swap(AlignedBuffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(alignment_, o.alignment_);
  }
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t alignment_ = 4096;
};

// Fixed-size buffers; a buffer returns to the pool when its last shared_ptr goes away, even when a
// Python object held it longer than the reader lived.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static std::shared_ptr<BufferPool> create(size_t buffer_size, size_t alignment = 4096) {
    return std::shared_ptr<BufferPool>(new BufferPool(buffer_size, alignment));
  }
  // The process-wide pool for this size, kept alive by its users.
  static std::shared_ptr<BufferPool> shared(size_t buffer_size, size_t alignment = 4096);
  // A buffer of at least max(buffer_size(), at_least) bytes. Buffers grow to what they are asked
  // for and stay that size, so a pool serving reads of varying size converges on the largest.
  std::shared_ptr<AlignedBuffer> acquire(size_t at_least = 0);
  size_t buffer_size() const { return buffer_size_; }
  size_t allocated() const { return allocated_.load(std::memory_order_relaxed); }  // any thread

 private:
  BufferPool(size_t buffer_size, size_t alignment) : buffer_size_(buffer_size), alignment_(alignment) {}
  void release(AlignedBuffer* b);
  size_t buffer_size_;
  size_t alignment_;
  std::atomic<size_t> allocated_{0};  // changed under mu_, read without it (a reader's stats, another thread)
  std::mutex mu_;
  std::vector<std::unique_ptr<AlignedBuffer>> free_;
};

}  // namespace dlstore
