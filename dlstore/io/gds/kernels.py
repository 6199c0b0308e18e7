"""What a TFRecord frame is on the device: the frame status codes and the CUDA source of the frame check and
the gather (plain-C device functions, so that tests compile the same text for the host)."""
from __future__ import annotations

__all__ = ["FRAME_OK", "FRAME_LENGTH", "FRAME_LENGTH_CRC", "FRAME_DATA_CRC", "FRAME_HEADER", "FRAME_FOOTER",
           "FRAME_KERNEL", "GATHER_KERNEL", "CUDA_SOURCE"]


#: Frame status codes, the same from the CUDA kernel and the host stand-in.
FRAME_OK, FRAME_LENGTH, FRAME_LENGTH_CRC, FRAME_DATA_CRC = 0, 1, 2, 3
FRAME_HEADER, FRAME_FOOTER = 12, 4  # TFRecord: u64 length + u32 masked CRC of it; u32 masked CRC of the data

# One thread per record; the CRC-32C table is built in shared memory by each block. The device
# functions are plain C so that tests compile the same text for the host (tests/unit/test_gds.py).
FRAME_KERNEL = r"""
DLSTORE_DEVICE void dlstore_crc_table(unsigned int* table, int first, int step) {
  for (int i = first; i < 256; i += step) {
    unsigned int c = (unsigned int)i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    table[i] = c;
  }
}

DLSTORE_DEVICE unsigned int dlstore_masked_crc(const unsigned int* table, const unsigned char* p,
                                               unsigned long long n) {
  unsigned int c = 0xFFFFFFFFu;
  for (unsigned long long i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
  c ^= 0xFFFFFFFFu;
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

DLSTORE_DEVICE unsigned int dlstore_load_u32(const unsigned char* p) {
  return (unsigned int)p[0] | ((unsigned int)p[1] << 8) | ((unsigned int)p[2] << 16) | ((unsigned int)p[3] << 24);
}

/* rel: where each frame starts in buf; size: its frame size from the index. */
DLSTORE_DEVICE unsigned char dlstore_frame_status(const unsigned int* table, const unsigned char* buf,
                                                  long long rel, long long size, int verify) {
  const unsigned char* p = buf + rel;
  if (size < 16) return 1; /* not even a header and footer: read none of it (it may end the buffer) */
  unsigned long long len = 0;
  for (int k = 0; k < 8; ++k) len |= (unsigned long long)p[k] << (8 * k);
  if (len != (unsigned long long)(size - 16)) return 1;
  if (!verify) return 0;
  if (dlstore_masked_crc(table, p, 8) != dlstore_load_u32(p + 8)) return 2;
  if (dlstore_masked_crc(table, p + 12, len) != dlstore_load_u32(p + 12 + len)) return 3;
  return 0;
}
"""

# Gathers records from several device buffers into one (a batch in emission order, or a chunk's
# stragglers): record r's bytes [src_at[r], src_at[r] + len[r]) of buffer sources[src_buf[r]] go to
# dst + dst_at[r]. On the GPU a block per record, its threads copying every blockDim.x-th byte; plain C
# too, so that tests compile it for the host (tests/unit/test_gds.py).
GATHER_KERNEL = r"""
DLSTORE_DEVICE void dlstore_copy_record(const unsigned char* const* sources, const long long* src_buf,
                                        const long long* src_at, const long long* len, const long long* dst_at,
                                        unsigned char* dst, long long r, long long first, long long step) {
  const unsigned char* s = sources[src_buf[r]] + src_at[r];
  unsigned char* d = dst + dst_at[r];
  for (long long i = first; i < len[r]; i += step) d[i] = s[i];
}
"""

CUDA_SOURCE = r"""
#define DLSTORE_DEVICE __device__
""" + FRAME_KERNEL + GATHER_KERNEL + r"""
extern "C" __global__ void dlstore_tfrecord_frames(const unsigned char* buf, const long long* rel,
                                                   const long long* size, int n, int verify,
                                                   unsigned char* status) {
  __shared__ unsigned int table[256];
  dlstore_crc_table(table, threadIdx.x, blockDim.x);
  __syncthreads();
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < n) status[r] = dlstore_frame_status(table, buf, rel[r], size[r], verify);
}

extern "C" __global__ void dlstore_gather(const unsigned long long* sources, const long long* src_buf,
                                          const long long* src_at, const long long* len, const long long* dst_at,
                                          long long n, unsigned char* dst) {
  for (long long r = blockIdx.x; r < n; r += gridDim.x)
    dlstore_copy_record((const unsigned char* const*)sources, src_buf, src_at, len, dst_at, dst, r,
                        threadIdx.x, blockDim.x);
}
"""
