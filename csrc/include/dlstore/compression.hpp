// GZIP and ZLIB compressed record files: a filter that inflates a file's chunks into chunks of the
// uncompressed stream, so record framing works the same on both.
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "dlstore/engine.hpp"

namespace dlstore {

enum class Compression { None, Gzip, Zlib };
Compression parse_compression(const std::string& name);

class InflateStream : public ChunkStream {
 public:
  // `per_file[i]` says how file i is compressed; uncompressed files pass through untouched.
  InflateStream(ChunkStream& upstream, std::vector<Compression> per_file, std::vector<std::string> paths,
                std::shared_ptr<BufferPool> pool, size_t headroom);
  ~InflateStream() override;
  bool next(Chunk& out) override;

 private:
  struct State;
  bool pull_input();
  void check_input() const;  // the input chunk, a view of a mapping, still held by its file
  ChunkStream& up_;
  std::vector<Compression> per_file_;
  std::vector<std::string> paths_;
  std::shared_ptr<BufferPool> pool_;
  size_t headroom_;
  std::unique_ptr<State> st_;
  std::exception_ptr pending_error_;  // raised by the next call, after the bytes before it
};

}  // namespace dlstore
