/* expanse — a virtual-memory GPU allocator. C ABI (C99; no CUDA headers needed).
 *
 * expanse_malloc / expanse_free have exactly the signatures PyTorch's CUDAPluggableAllocator
 * expects:  CUDAPluggableAllocator("libexpanse.so", "expanse_malloc", "expanse_free").
 * Nothing here throws or aborts. Failures return NULL or a non-zero EXPANSE_E* code and leave a
 * message (what was asked, what was free, what was tried) for expanse_last_error() in the calling
 * thread. Configuration: the EXPANSE_CONF environment variable (see README), or expanse_init().
 */
#ifndef EXPANSE_EXPANSE_H
#define EXPANSE_EXPANSE_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define EXPANSE_C_API
#else
#define EXPANSE_C_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st; /* the same type as cudaStream_t and CUstream */

enum {
  EXPANSE_OK = 0,
  EXPANSE_EINVAL = 1,  /* bad argument: pointer, size, device, configuration */
  EXPANSE_ENOMEM = 2,  /* out of device memory */
  EXPANSE_EDRIVER = 3  /* the CUDA driver failed or could not be loaded */
};

/* Allocates size bytes on device, ordered on stream. NULL on failure (see expanse_last_error), and
 * NULL without an error for size 0. */
EXPANSE_C_API void* expanse_malloc(size_t size, int device, struct CUstream_st* stream);
/* Frees ptr (size: as passed to expanse_malloc, or 0 when unknown). NULL is ignored. A pointer
 * that is not live on device (double free, interior, foreign, wrong device or size) changes
 * nothing and sets expanse_last_error. */
EXPANSE_C_API void expanse_free(void* ptr, size_t size, int device, struct CUstream_st* stream);
/* Like expanse_free, with a status code. */
EXPANSE_C_API int expanse_free_checked(void* ptr, size_t size, int device,
                                       struct CUstream_st* stream);

/* ptr is also used by work on stream: its memory is reused only after that work completes. */
EXPANSE_C_API int expanse_record_stream(void* ptr, struct CUstream_st* stream);
/* Waits for freed memory's streams, then unmaps and releases every cached page of device. */
EXPANSE_C_API int expanse_release_cached(int device);
/* Caps the physical memory expanse holds on device (bytes; SIZE_MAX removes the cap). */
EXPANSE_C_API int expanse_set_limit(int device, size_t bytes);

#define EXPANSE_MAX_ENTRY_POINTS 64

/* Per-device statistics. Set struct_size = sizeof(expanse_stats) before the call: fields past the
 * caller's struct_size are not written, so the struct can grow without breaking old callers. */
typedef struct expanse_stats {
  size_t struct_size;
  uint64_t requested_bytes;   /* live bytes as asked */
  uint64_t allocated_bytes;   /* live bytes as carved (512 B granularity) */
  uint64_t touched_bytes;     /* pages touched by live blocks */
  uint64_t mapped_bytes;      /* pages mapped */
  uint64_t cached_bytes;      /* mapped, touched by no live block */
  uint64_t pooled_bytes;      /* physical pages held unmapped */
  uint64_t physical_bytes;    /* mapped + pooled */
  uint64_t va_reserved_bytes;
  uint64_t peak_requested_bytes;
  uint64_t peak_allocated_bytes;
  uint64_t peak_mapped_bytes;
  uint64_t peak_physical_bytes;
  uint64_t peak_va_reserved_bytes;
  uint64_t live_blocks;
  uint64_t num_allocs;
  uint64_t num_frees;
  uint64_t num_ooms;
  uint64_t num_reclaimed_pages;
  uint64_t num_created_pages;
  uint64_t num_released_pages;
  uint64_t driver_calls_total;
  double modeled_driver_seconds;
  uint64_t page_size;
  uint64_t capacity_bytes;
  uint64_t limit_bytes;       /* UINT64_MAX when none */
  uint32_t num_entry_points;  /* valid entries of driver_calls */
  uint64_t driver_calls[EXPANSE_MAX_ENTRY_POINTS]; /* per entry point, see expanse_entry_point_name */
} expanse_stats;

EXPANSE_C_API int expanse_get_stats(int device, expanse_stats* out);
EXPANSE_C_API int expanse_reset_peak_stats(int device);
/* "cuMemMap" for index i of expanse_stats.driver_calls, NULL past the end. */
EXPANSE_C_API const char* expanse_entry_point_name(int i);

/* The calling thread's last error message ("" if none). Valid until the thread's next call. */
EXPANSE_C_API const char* expanse_last_error(void);

/* Configures expanse with an EXPANSE_CONF-style string instead of the environment. Allowed before
 * first use, or when no block is live (everything cached is released first). If it fails, expanse
 * stays unconfigured (calls fail, naming the reason) until expanse_init succeeds or
 * expanse_shutdown returns it to EXPANSE_CONF. Not to be called while other threads use expanse. */
EXPANSE_C_API int expanse_init(const char* conf);
/* Releases everything expanse holds; fails if blocks are still live. */
EXPANSE_C_API int expanse_shutdown(void);
/* "cuda: libcuda.so.1, driver 13.0" or "sim: ...". Initializes on first use. NULL on failure.
 * The string stays valid until expanse_init or expanse_shutdown. */
EXPANSE_C_API const char* expanse_driver_description(void);
EXPANSE_C_API int expanse_device_count(void);

/* Grants device `peer` read-write access to all of `device`'s memory, present and future (VMM
 * memory needs its own access grant per device: cudaDeviceEnablePeerAccess does not cover it).
 * With EXPANSE_CONF peer_access:auto (the default) every peer the driver allows already has it.
 * EXPANSE_EINVAL when cuDeviceCanAccessPeer says peer cannot access device. */
EXPANSE_C_API int expanse_enable_peer_access(int device, int peer);

#ifdef __cplusplus
}
#endif

#endif /* EXPANSE_EXPANSE_H */
