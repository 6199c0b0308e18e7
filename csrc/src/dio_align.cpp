// statx(STATX_DIOALIGN) through the raw syscall: glibc's struct statx may predate the DIO fields.
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <linux/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace dlstore {

bool statx_dio_alignment(int fd, uint32_t* mem_align, uint32_t* offset_align) {
#if defined(SYS_statx) && defined(STATX_DIOALIGN)
  struct statx sx;
  std::memset(&sx, 0, sizeof(sx));
  if (::syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) != 0) return false;
  if (!(sx.stx_mask & STATX_DIOALIGN)) return false;
  *mem_align = sx.stx_dio_mem_align;
  *offset_align = sx.stx_dio_offset_align;
  return true;
#else
  (void)fd;
  (void)mem_align;
  (void)offset_align;
  return false;
#endif
}

}  // namespace dlstore
