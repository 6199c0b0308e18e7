/* dlstore's CUDA kernels for io="gds": the TFRecord frame check and the gather of records.
 *
 *   dlstore_tfrecord_frames  checks each record's frame where it landed in device memory: its length
 *                            against the index, the masked CRC-32C of the length and of the data.
 *   dlstore_gather           copies records from several device buffers into one (a batch).
 *
 * One text, two compilers. NVRTC compiles it for the GPU (CuPy's RawModule at run time; CI links it to
 * sm_80 and sm_90 with nvJitLink). g++ compiles it for the host with -DDLSTORE_HOST
 * (tests/stand_ins/host_kernels.py): every device function is plain C++, and each __global__ wrapper
 * has a host twin right below it that runs the same device functions for every block and thread in turn,
 * each __syncthreads() becoming the end of a step that all threads finish before any starts the next.
 * Nothing is #included: NVRTC runs without the CUDA headers, and the host build needs none.
 *
 * CRC-32C here is the reflected Castagnoli CRC (polynomial 0x82F63B78), register initialised to all
 * ones and inverted at the end, as TFRecord and dlstore._C.crc32c compute it.
 */

#ifdef DLSTORE_HOST
#define DLSTORE_DEVICE static inline
#define DLSTORE_CONSTANT static const
#define DLSTORE_UNROLL
#else
#define DLSTORE_DEVICE static __device__ __forceinline__
#define DLSTORE_CONSTANT static __constant__
#define DLSTORE_UNROLL _Pragma("unroll")
#endif

typedef unsigned char dlstore_u8;
typedef unsigned int dlstore_u32;
typedef unsigned long long dlstore_u64;
typedef long long dlstore_i64;

/* 16 bytes moved by one instruction (LDG.128 / STG.128) where the address is 16-byte aligned. */
struct alignas(16) dlstore_word16 {
  dlstore_u32 w[4];
};

#define DLSTORE_FRAME_OK 0
#define DLSTORE_FRAME_LENGTH 1
#define DLSTORE_FRAME_LENGTH_CRC 2
#define DLSTORE_FRAME_DATA_CRC 3

#define DLSTORE_FRAME_THREADS 256   /* threads of a frame-check block: one record at a time per block */
#define DLSTORE_CRC_MIN_SLICE_LOG2 6 /* a thread's slice of a record is at least 64 bytes */
#define DLSTORE_CRC32C_POLY 0x82F63B78u

/* ------------------------------------------------------------------------------------------------
 * CRC-32C, sliced across the threads of a block.
 *
 * Why this should reach >= 100 GB/s on an H100 for 8 MiB reads of ~110 KB records (76 per read), an
 * estimate from the sm_90 SASS (not yet timed on a GPU: `python -m dlstore.bench gpu-check` does):
 *  - A block of 256 threads per record; the record's data is cut into at most 256 slices of 2^k bytes
 *    (k >= 6, the smallest that covers it: 512 bytes for 110 KB, 215 slices), one per thread, so all of
 *    a record's bytes are in flight at once and the 76 blocks run together on 76 of the 132 SMs.
 *  - Each thread reads its slice with aligned 16-byte loads (LD.E.128), several issued before the first
 *    is used. Neighbouring threads read neighbouring slices, so each 128-byte line a warp touches comes
 *    from DRAM (or L2, where the read just landed) once and its other 16-byte pieces from L1.
 *  - The CRC runs slicing-by-8: 8 bytes per step through eight 256-entry tables in shared memory (8 KB,
 *    built by each block in two steps), one shared load per byte, the loads of a step independent.
 *    The inner loop is 242 instructions per 64 bytes (64 of them LDS). Per SM and record: 110 KB /
 *    32 lanes = 3,400 warp-wide LDS at ~3.5 cycles each for bank conflicts (random table indices) =
 *    ~12,000 cycles, ~7 us at 1.7 GHz; the other instructions issue in under half that on 4 schedulers.
 *  - The slices are joined with the CRC's linearity in a tree of log2(slices) barrier-separated levels
 *    (8 for 215 slices), each a 32-step GF(2) multiplication by a constant: ~250 dependent instructions,
 *    ~3 us of latency per record for the 8 levels.
 *  With the 76 SMs in parallel, 8 MiB take ~7 us, plus the combine, the table build and the launch:
 *  ~15-20 us in all, 400-550 GB/s, four to five times the target.
 * ------------------------------------------------------------------------------------------------ */

/* x^(8 * 2^k) mod P, k = 0..63, in the CRC's reflected bit order (bit 31 is x^0): multiplying a CRC
 * register by entry k is the same as feeding it 2^k zero bytes. tests/unit/test_gds_kernels.py
 * recomputes the table. */
DLSTORE_CONSTANT dlstore_u32 dlstore_x8_pow2[64] = {
  0x00800000u, 0x00008000u, 0x82F63B78u, 0x6EA2D55Cu, 0x18B8EA18u, 0x510AC59Au, 0xB82BE955u, 0xB8FDB1E7u,
  0x88E56F72u, 0x74C360A4u, 0xE4172B16u, 0x0D65762Au, 0x35D73A62u, 0x28461564u, 0xBF455269u, 0xE2EA32DCu,
  0xFE7740E6u, 0xF946610Bu, 0x3C204F8Fu, 0x538586E3u, 0x59726915u, 0x734D5309u, 0xBC1AC763u, 0x7D0722CCu,
  0xD289CABEu, 0xE94CA9BCu, 0x05B74F3Fu, 0xA51E1F42u, 0x40000000u, 0x20000000u, 0x08000000u, 0x00800000u,
  0x00008000u, 0x82F63B78u, 0x6EA2D55Cu, 0x18B8EA18u, 0x510AC59Au, 0xB82BE955u, 0xB8FDB1E7u, 0x88E56F72u,
  0x74C360A4u, 0xE4172B16u, 0x0D65762Au, 0x35D73A62u, 0x28461564u, 0xBF455269u, 0xE2EA32DCu, 0xFE7740E6u,
  0xF946610Bu, 0x3C204F8Fu, 0x538586E3u, 0x59726915u, 0x734D5309u, 0xBC1AC763u, 0x7D0722CCu, 0xD289CABEu,
  0xE94CA9BCu, 0x05B74F3Fu, 0xA51E1F42u, 0x40000000u, 0x20000000u, 0x08000000u, 0x00800000u, 0x00008000u,
};

/* Table build, step 1 of 2: table 0, entry i = the register after byte i from a zero register. */
DLSTORE_DEVICE void dlstore_crc_tables_first(dlstore_u32* tables, int tid, int nthreads) {
  for (int i = tid; i < 256; i += nthreads) {
    dlstore_u32 c = (dlstore_u32)i;
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ (DLSTORE_CRC32C_POLY & (0u - (c & 1u)));
    tables[i] = c;
  }
}

/* Table build, step 2 of 2 (table 0 complete): table k, entry i = byte i followed by k zero bytes. */
DLSTORE_DEVICE void dlstore_crc_tables_rest(dlstore_u32* tables, int tid, int nthreads) {
  for (int i = tid; i < 256; i += nthreads) {
    dlstore_u32 c = tables[i];
    for (int k = 1; k < 8; ++k) {
      c = (c >> 8) ^ tables[c & 0xFFu];
      tables[k * 256 + i] = c;
    }
  }
}

DLSTORE_DEVICE dlstore_u32 dlstore_crc_byte(const dlstore_u32* tables, dlstore_u32 c, dlstore_u8 byte) {
  return tables[(c ^ byte) & 0xFFu] ^ (c >> 8);
}

/* Eight bytes (lo: bytes 0-3, hi: bytes 4-7, little-endian) in one step: each byte's table is the
 * number of bytes that follow it. */
DLSTORE_DEVICE dlstore_u32 dlstore_crc_8(const dlstore_u32* t, dlstore_u32 c, dlstore_u32 lo, dlstore_u32 hi) {
  c ^= lo;
  return t[7 * 256 + (c & 0xFFu)] ^ t[6 * 256 + ((c >> 8) & 0xFFu)] ^ t[5 * 256 + ((c >> 16) & 0xFFu)] ^
         t[4 * 256 + (c >> 24)] ^ t[3 * 256 + (hi & 0xFFu)] ^ t[2 * 256 + ((hi >> 8) & 0xFFu)] ^
         t[256 + ((hi >> 16) & 0xFFu)] ^ t[hi >> 24];
}

DLSTORE_DEVICE dlstore_u32 dlstore_crc_16(const dlstore_u32* t, dlstore_u32 c, dlstore_word16 v) {
  return dlstore_crc_8(t, dlstore_crc_8(t, c, v.w[0], v.w[1]), v.w[2], v.w[3]);
}

/* The register after the bytes [p, end) from register c; `end` is 16-byte aligned, `p` need not be
 * (its first bytes go one at a time up to the first aligned address). */
DLSTORE_DEVICE dlstore_u32 dlstore_crc_run(const dlstore_u32* t, dlstore_u32 c, const dlstore_u8* p,
                                           const dlstore_u8* end) {
  for (; p < end && ((dlstore_u64)p & 15u) != 0; ++p) c = dlstore_crc_byte(t, c, *p);
  const dlstore_word16* w = (const dlstore_word16*)p;
  const dlstore_word16* w_end = (const dlstore_word16*)end;
  for (; w + 4 <= w_end; w += 4) {
    /* Four loads issued before the first is used: 64 bytes in flight per thread. */
    dlstore_word16 a = w[0], b = w[1], d = w[2], e = w[3];
    c = dlstore_crc_16(t, c, a);
    c = dlstore_crc_16(t, c, b);
    c = dlstore_crc_16(t, c, d);
    c = dlstore_crc_16(t, c, e);
  }
  for (; w < w_end; ++w) c = dlstore_crc_16(t, c, *w);
  return c;
}

/* a * b mod P, both in the reflected bit order (bit 31 is x^0). */
DLSTORE_DEVICE dlstore_u32 dlstore_crc_multiply(dlstore_u32 a, dlstore_u32 b) {
  dlstore_u32 product = 0;
  DLSTORE_UNROLL
  for (int i = 0; i < 32; ++i) {
    product ^= b & (0u - ((a >> (31 - i)) & 1u)); /* a's x^i term adds b * x^i */
    b = (b >> 1) ^ (DLSTORE_CRC32C_POLY & (0u - (b & 1u))); /* b *= x */
  }
  return product;
}

/* The register c followed by 2^k zero bytes. */
DLSTORE_DEVICE dlstore_u32 dlstore_crc_shift(dlstore_u32 c, int k) {
  return dlstore_crc_multiply(c, dlstore_x8_pow2[k]);
}

/* How a block computes the CRC of [begin, end). The body [begin, body_end) is cut back from body_end
 * (the last 16-byte aligned address in the range, or begin if there is none) into `slices` slices of
 * 2^slice_log2 bytes, slice g (g = 0 the last) being thread g's; the first slice, starting at begin, may
 * be shorter. [body_end, end), under 16 bytes, is thread 0's tail. */
struct dlstore_crc_job {
  const dlstore_u8* begin;
  const dlstore_u8* body_end;
  const dlstore_u8* end;
  int slice_log2;
  int slices;
};

DLSTORE_DEVICE struct dlstore_crc_job dlstore_crc_plan(const dlstore_u8* p, dlstore_u64 n, int nthreads) {
  struct dlstore_crc_job job;
  job.begin = p;
  job.end = p + n;
  dlstore_u64 tail = (dlstore_u64)job.end & 15u;
  job.body_end = n >= tail ? job.end - tail : p;
  dlstore_u64 body = (dlstore_u64)(job.body_end - p);
  int log2 = DLSTORE_CRC_MIN_SLICE_LOG2;
  while (((dlstore_u64)nthreads << log2) < body) ++log2;
  job.slice_log2 = log2;
  job.slices = (int)((body + (1ull << log2) - 1) >> log2);
  return job;
}

/* Thread g's slice: its register without the initial all-ones (which only the slice at `begin` takes),
 * so that the slices' registers add up (XOR) once each is moved to the body's end. */
DLSTORE_DEVICE dlstore_u32 dlstore_crc_slice(const dlstore_u32* tables, const struct dlstore_crc_job* job, int g) {
  if (g >= job->slices) return 0;
  const dlstore_u8* hi = job->body_end - ((dlstore_u64)g << job->slice_log2);
  const dlstore_u8* lo = g == job->slices - 1 ? job->begin : hi - (1ll << job->slice_log2);
  return dlstore_crc_run(tables, lo == job->begin ? 0xFFFFFFFFu : 0u, lo, hi);
}

/* Step `step` of a block's CRC of `job` by thread `tid`: step 0 computes each thread's slice into
 * part[tid]; step s >= 1 is level s - 1 of the tree, where slot g (a multiple of 2d, d = 2^(s-1)) takes
 * in slot g + d, moved over the d full slices between the two ends: crc(A || B) = shift(crc(A), |B|) ^
 * crc(B). Returns whether another step follows (the same in every thread). After the last, part[0]
 * holds the body's register (if there are slices); thread 0 reads it with dlstore_crc_finish. */
DLSTORE_DEVICE int dlstore_crc_step(const dlstore_u32* tables, dlstore_u32* part, const struct dlstore_crc_job* job,
                                    int step, int tid) {
  if (step == 0) {
    if (tid < job->slices) part[tid] = dlstore_crc_slice(tables, job, tid);
    return job->slices > 1;
  }
  int level = step - 1;
  int d = 1 << level;
  if ((tid & (2 * d - 1)) == 0 && tid + d < job->slices)
    part[tid] ^= dlstore_crc_shift(part[tid + d], job->slice_log2 + level);
  return 2 * d < job->slices;
}

/* The CRC-32C of the job's bytes, from the body's register: the tail, then the final inversion. */
DLSTORE_DEVICE dlstore_u32 dlstore_crc_finish(const dlstore_u32* tables, const struct dlstore_crc_job* job,
                                              dlstore_u32 body) {
  dlstore_u32 c = job->slices > 0 ? body : 0xFFFFFFFFu;
  for (const dlstore_u8* p = job->body_end; p < job->end; ++p) c = dlstore_crc_byte(tables, c, *p);
  return ~c;
}

DLSTORE_DEVICE dlstore_u32 dlstore_crc_masked(dlstore_u32 crc) {
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

/* ------------------------------------------------------------------------------------------------
 * The frame check. A TFRecord frame: u64 length | u32 masked CRC of the length | data | u32 masked
 * CRC of the data, little-endian, at any byte offset (the loads of the fields go byte by byte).
 * ------------------------------------------------------------------------------------------------ */

DLSTORE_DEVICE dlstore_u64 dlstore_load_le(const dlstore_u8* p, int bytes) {
  dlstore_u64 v = 0;
  for (int k = 0; k < bytes; ++k) v |= (dlstore_u64)p[k] << (8 * k);
  return v;
}

/* What every thread of the block knows of one record. done: status is final without a CRC (the frame
 * size is under 16 bytes, the length differs from the index, or verify is off). */
struct dlstore_frame {
  const dlstore_u8* p;
  int done;
  int status;
  struct dlstore_crc_job data;
};

DLSTORE_DEVICE struct dlstore_frame dlstore_frame_plan(const dlstore_u8* buf, dlstore_i64 rel, dlstore_i64 size,
                                                       int verify, int nthreads) {
  struct dlstore_frame f;
  f.p = buf + rel;
  f.done = 1;
  f.status = DLSTORE_FRAME_LENGTH;
  f.data = dlstore_crc_plan(f.p, 0, nthreads);
  if (size < 16) return f; /* not even a header and footer: read none of it (it may end the buffer) */
  dlstore_u64 length = dlstore_load_le(f.p, 8);
  if (length != (dlstore_u64)(size - 16)) return f;
  f.status = DLSTORE_FRAME_OK;
  if (!verify) return f;
  f.done = 0;
  f.data = dlstore_crc_plan(f.p + 12, length, nthreads);
  return f;
}

/* Thread 0, after the data's CRC steps: the length's CRC, then the data's. */
DLSTORE_DEVICE int dlstore_frame_verdict(const dlstore_u32* tables, const struct dlstore_frame* f, dlstore_u32 body) {
  dlstore_u32 length_crc = 0xFFFFFFFFu;
  for (int k = 0; k < 8; ++k) length_crc = dlstore_crc_byte(tables, length_crc, f->p[k]);
  if (dlstore_crc_masked(~length_crc) != (dlstore_u32)dlstore_load_le(f->p + 8, 4)) return DLSTORE_FRAME_LENGTH_CRC;
  dlstore_u32 data_crc = dlstore_crc_finish(tables, &f->data, body);
  if (dlstore_crc_masked(data_crc) != (dlstore_u32)dlstore_load_le(f->data.end, 4)) return DLSTORE_FRAME_DATA_CRC;
  return DLSTORE_FRAME_OK;
}

/* Step `step` of record r's check by thread tid of nthreads (<= DLSTORE_FRAME_THREADS); returns whether
 * another step follows. The steps of a record are separated by barriers, and its last is followed by one
 * too (part[] is reused by the next record). */
DLSTORE_DEVICE int dlstore_frame_step(const dlstore_u32* tables, dlstore_u32* part, const dlstore_u8* buf,
                                      const dlstore_i64* rel, const dlstore_i64* size, int verify,
                                      dlstore_u8* status, dlstore_i64 r, int step, int tid, int nthreads) {
  struct dlstore_frame f = dlstore_frame_plan(buf, rel[r], size[r], verify, nthreads);
  if (f.done) {
    if (tid == 0) status[r] = (dlstore_u8)f.status;
    return 0;
  }
  if (dlstore_crc_step(tables, part, &f.data, step, tid)) return 1;
  if (tid == 0) status[r] = (dlstore_u8)dlstore_frame_verdict(tables, &f, f.data.slices > 0 ? part[0] : 0u);
  return 0;
}

#ifndef DLSTORE_HOST
/* dlstore_tfrecord_frames(buf, rel, size, n, verify, status): status[r], a DLSTORE_FRAME_* code, for the
 * frame of size[r] bytes (the index's) at buf + rel[r], r < n; verify 1 checks the CRCs, 0 the length only. Blocks of at most DLSTORE_FRAME_THREADS threads, each block taking records
 * blockIdx.x, blockIdx.x + gridDim.x, ...; any grid size is correct (kernels.py: frames_launch). */
extern "C" __global__ void __launch_bounds__(DLSTORE_FRAME_THREADS)
dlstore_tfrecord_frames(const dlstore_u8* buf, const dlstore_i64* rel, const dlstore_i64* size, int n, int verify,
                        dlstore_u8* status) {
  __shared__ dlstore_u32 tables[8 * 256];
  __shared__ dlstore_u32 part[DLSTORE_FRAME_THREADS];
  dlstore_crc_tables_first(tables, threadIdx.x, blockDim.x);
  __syncthreads();
  dlstore_crc_tables_rest(tables, threadIdx.x, blockDim.x);
  __syncthreads();
  for (dlstore_i64 r = blockIdx.x; r < n; r += gridDim.x) {
    for (int step = 0, more = 1; more; ++step) {
      more = dlstore_frame_step(tables, part, buf, rel, size, verify, status, r, step, threadIdx.x, blockDim.x);
      __syncthreads();
    }
  }
}
#else
extern "C" void dlstore_tfrecord_frames_host(int grid, int block, const dlstore_u8* buf, const dlstore_i64* rel,
                                             const dlstore_i64* size, int n, int verify, dlstore_u8* status) {
  dlstore_u32 tables[8 * 256], part[DLSTORE_FRAME_THREADS];
  for (int b = 0; b < grid; ++b) {
    for (int t = 0; t < block; ++t) dlstore_crc_tables_first(tables, t, block);
    for (int t = 0; t < block; ++t) dlstore_crc_tables_rest(tables, t, block);
    for (dlstore_i64 r = b; r < n; r += grid) {
      for (int step = 0, more = 1; more; ++step) {
        for (int t = 0; t < block; ++t)
          more = dlstore_frame_step(tables, part, buf, rel, size, verify, status, r, step, t, block);
      }
    }
  }
}

/* The CRC-32C of [p, p + n) as a block of nthreads computes it (tests compare it with dlstore._C). */
extern "C" dlstore_u32 dlstore_crc32c_host(const dlstore_u8* p, dlstore_u64 n, int nthreads) {
  dlstore_u32 tables[8 * 256], part[DLSTORE_FRAME_THREADS];
  for (int t = 0; t < nthreads; ++t) dlstore_crc_tables_first(tables, t, nthreads);
  for (int t = 0; t < nthreads; ++t) dlstore_crc_tables_rest(tables, t, nthreads);
  struct dlstore_crc_job job = dlstore_crc_plan(p, n, nthreads);
  for (int step = 0, more = 1; more; ++step) {
    for (int t = 0; t < nthreads; ++t) more = dlstore_crc_step(tables, part, &job, step, t);
  }
  return dlstore_crc_finish(tables, &job, job.slices > 0 ? part[0] : 0u);
}

/* The register c followed by 2^k zero bytes, as the tree's levels compute it. */
extern "C" dlstore_u32 dlstore_crc_shift_host(dlstore_u32 c, int k) { return dlstore_crc_shift(c, k); }
#endif

/* ------------------------------------------------------------------------------------------------
 * The gather. Record r: len[r] bytes from sources[src_buf[r]] + src_at[r] to dst + dst_at[r], by the
 * threads of one block, thread t taking the destination's aligned 16-byte words t, t + nthreads, ...
 * (a warp stores 512 contiguous bytes per instruction). Where the source's alignment differs from the
 * destination's, each word is assembled from the two aligned source words it straddles (L1 serves the
 * one the neighbouring thread also reads). The bytes before the first such word and after the last
 * (under 32 at each end) go one byte per thread, so that no read leaves the record's bytes (what
 * compute-sanitizer checks when buffers are allocated at their exact size).
 * ------------------------------------------------------------------------------------------------ */

/* The four bytes at byte `shift8 / 8` of the eight bytes lo, hi (little-endian); shift8 in 0, 8, 16, 24. */
DLSTORE_DEVICE dlstore_u32 dlstore_funnel(dlstore_u32 lo, dlstore_u32 hi, unsigned shift8) {
  return (dlstore_u32)((((dlstore_u64)hi << 32) | lo) >> shift8);
}

/* The 16 bytes at byte `shift` (1..15) of the 32 bytes a, b. `shift` is the same in every thread of
 * the block, so the switch does not diverge and the words stay in registers. */
DLSTORE_DEVICE dlstore_word16 dlstore_word16_at(dlstore_word16 a, dlstore_word16 b, unsigned shift) {
  dlstore_u32 v0, v1, v2, v3, v4;
  switch (shift >> 2) {
    case 0: v0 = a.w[0]; v1 = a.w[1]; v2 = a.w[2]; v3 = a.w[3]; v4 = b.w[0]; break;
    case 1: v0 = a.w[1]; v1 = a.w[2]; v2 = a.w[3]; v3 = b.w[0]; v4 = b.w[1]; break;
    case 2: v0 = a.w[2]; v1 = a.w[3]; v2 = b.w[0]; v3 = b.w[1]; v4 = b.w[2]; break;
    default: v0 = a.w[3]; v1 = b.w[0]; v2 = b.w[1]; v3 = b.w[2]; v4 = b.w[3]; break;
  }
  unsigned shift8 = (shift & 3u) * 8u;
  dlstore_word16 out;
  out.w[0] = dlstore_funnel(v0, v1, shift8);
  out.w[1] = dlstore_funnel(v1, v2, shift8);
  out.w[2] = dlstore_funnel(v2, v3, shift8);
  out.w[3] = dlstore_funnel(v3, v4, shift8);
  return out;
}

DLSTORE_DEVICE void dlstore_gather_record(const dlstore_u64* sources, const dlstore_i64* src_buf,
                                          const dlstore_i64* src_at, const dlstore_i64* len,
                                          const dlstore_i64* dst_at, dlstore_u8* dst, dlstore_i64 r, int tid,
                                          int nthreads) {
  const dlstore_u8* s = (const dlstore_u8*)sources[src_buf[r]] + src_at[r];
  dlstore_u8* d = dst + dst_at[r];
  dlstore_i64 n = len[r];
  /* Destination words from byte `head` on (d + head is 16-byte aligned); word i's bytes come from
   * s + head + 16 i, which lies `shift` bytes into the aligned source word in[i]. */
  dlstore_i64 head = (dlstore_i64)((16u - ((dlstore_u64)d & 15u)) & 15u);
  if (head > n) head = n;
  dlstore_i64 first = 0, last = (n - head) >> 4;
  unsigned shift = (unsigned)((dlstore_u64)(s + head) & 15u);
  const dlstore_word16* in = (const dlstore_word16*)(s + head - shift);
  if (shift != 0) {
    /* Word i is assembled from in[i] and in[i + 1]: only where both lie inside the record. */
    if (head < (dlstore_i64)shift) first = 1;
    dlstore_i64 fit = (n - head + (dlstore_i64)shift) / 16 - 1;
    if (last > fit) last = fit;
    if (last <= first) first = last = 0; /* no word: the record goes byte by byte */
  }
  dlstore_i64 words_begin = head + 16 * first, words_end = head + 16 * last;
  for (dlstore_i64 i = tid; i < words_begin; i += nthreads) d[i] = s[i];
  for (dlstore_i64 i = words_end + tid; i < n; i += nthreads) d[i] = s[i];
  dlstore_word16* out = (dlstore_word16*)(d + head);
  if (shift == 0) {
    for (dlstore_i64 i = first + tid; i < last; i += nthreads) out[i] = in[i];
  } else {
    for (dlstore_i64 i = first + tid; i < last; i += nthreads) out[i] = dlstore_word16_at(in[i], in[i + 1], shift);
  }
}

#ifndef DLSTORE_HOST
/* dlstore_gather(sources, src_buf, src_at, len, dst_at, n, dst): records r < n gathered into dst, a
 * block per record (block b taking records b, b + gridDim.x, ...); any grid and block size is correct
 * (kernels.py: gather_launch). sources: the device addresses of the source buffers. */
extern "C" __global__ void dlstore_gather(const dlstore_u64* sources, const dlstore_i64* src_buf,
                                          const dlstore_i64* src_at, const dlstore_i64* len,
                                          const dlstore_i64* dst_at, dlstore_i64 n, dlstore_u8* dst) {
  for (dlstore_i64 r = blockIdx.x; r < n; r += gridDim.x)
    dlstore_gather_record(sources, src_buf, src_at, len, dst_at, dst, r, threadIdx.x, blockDim.x);
}
#else
extern "C" void dlstore_gather_host(int grid, int block, const dlstore_u64* sources, const dlstore_i64* src_buf,
                                    const dlstore_i64* src_at, const dlstore_i64* len, const dlstore_i64* dst_at,
                                    dlstore_i64 n, dlstore_u8* dst) {
  for (int b = 0; b < grid; ++b) {
    for (dlstore_i64 r = b; r < n; r += grid) {
      for (int t = 0; t < block; ++t) dlstore_gather_record(sources, src_buf, src_at, len, dst_at, dst, r, t, block);
    }
  }
}
#endif
