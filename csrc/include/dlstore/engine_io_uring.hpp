// What the io_uring engine (engine_io_uring.cpp) tells beyond the Engine interface: whether the kernel
// lets this process use io_uring, and how many reads it keeps in flight on a file's device.
#pragma once

#include <cstddef>
#include <string>

namespace dlstore {

// Why io_uring cannot run here ("" when it can): io_uring_setup refused (seccomp, sysctl), or a kernel
// without IORING_OP_READ. Probed at each call (one setup and close), so it is never stale.
std::string io_uring_refusal();
// Reads io_uring keeps in flight per I/O thread on `path`'s device for the queue_depth setting (0: the
// device's nr_requests, at most kMaxQueueDepth), and why that many.
size_t io_uring_queue_depth(const std::string& path, size_t setting, std::string* why);
// For tests: makes io_uring_refusal() give `why` (empty: probe the kernel again), as a kernel that
// refuses io_uring would.
void simulate_io_uring_refusal(const std::string& why);

}  // namespace dlstore
