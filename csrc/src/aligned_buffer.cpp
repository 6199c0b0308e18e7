#include "dlstore/aligned_buffer.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

namespace dlstore {

AlignedBuffer::AlignedBuffer(size_t size, size_t alignment) : alignment_(alignment) { reserve(size); }

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

void AlignedBuffer::reserve(size_t size, size_t keep) {
  if (size <= size_) return;
  size_t rounded = (size + alignment_ - 1) / alignment_ * alignment_;
  void* p = nullptr;
  if (posix_memalign(&p, alignment_, rounded) != 0) throw std::bad_alloc();
  if (keep && data_) std::memcpy(p, data_, keep < size_ ? keep : size_);
  std::free(data_);
  data_ = static_cast<uint8_t*>(p);
  size_ = rounded;
}

std::shared_ptr<AlignedBuffer> BufferPool::acquire() {
  std::unique_ptr<AlignedBuffer> b;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      b = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (!b) {
    b.reset(new AlignedBuffer(buffer_size_, alignment_));
    std::lock_guard<std::mutex> lock(mu_);
    ++allocated_;
  }
  std::shared_ptr<BufferPool> self = shared_from_this();
  return std::shared_ptr<AlignedBuffer>(b.release(), [self](AlignedBuffer* p) { self->release(p); });
}

void BufferPool::release(AlignedBuffer* b) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.emplace_back(b);
}

}  // namespace dlstore
