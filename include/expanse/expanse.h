/* expanse — a virtual-memory GPU allocator. C ABI (C99; no CUDA headers needed).
 *
 * Nothing here throws or aborts, except expanse_torch_malloc (below), by design. Failures return
 * NULL or a non-zero EXPANSE_E* code and leave a message (what was asked, what was free, what was
 * tried) for expanse_last_error() in the calling thread. Configuration: the EXPANSE_CONF
 * environment variable (see README), or expanse_init().
 *
 * PyTorch: give CUDAPluggableAllocator the pair expanse_torch_malloc / expanse_torch_free (the
 * Python package does: expanse.torch.use()). expanse_malloc / expanse_free have the same
 * signatures but C's contract: PyTorch does not check for NULL, so an OOM through them becomes a
 * tensor at address 0 and a crash at its first use.
 */
#ifndef EXPANSE_EXPANSE_H
#define EXPANSE_EXPANSE_H

#include <stddef.h>
#include <stdint.h>

#include "expanse/stats_fields.h"

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
  EXPANSE_EDRIVER = 3, /* the CUDA driver failed or could not be loaded */
  EXPANSE_EBUSY = 4    /* not now: a capture is announced (expanse_pool_trim, expanse_pool_sleep) */
};

/* Allocates size bytes on device, ordered on stream. NULL on failure (see expanse_last_error), and
 * NULL without an error for size 0. */
EXPANSE_C_API void* expanse_malloc(size_t size, int device, struct CUstream_st* stream);
/* Like expanse_malloc, with a status code: EXPANSE_ENOMEM tells lack of device memory from the
 * other failures. *out is NULL unless it returns EXPANSE_OK (and NULL for size 0). */
EXPANSE_C_API int expanse_malloc_checked(void** out, size_t size, int device,
                                         struct CUstream_st* stream);
/* Frees ptr (size: as passed to expanse_malloc, or 0 when unknown). NULL is ignored. A pointer
 * that is not live on device (double free, interior, foreign, wrong device or size) changes
 * nothing and sets expanse_last_error. */
EXPANSE_C_API void expanse_free(void* ptr, size_t size, int device, struct CUstream_st* stream);
/* Like expanse_free, with a status code. */
EXPANSE_C_API int expanse_free_checked(void* ptr, size_t size, int device,
                                       struct CUstream_st* stream);

/* ptr is also used by work on stream: its memory is reused only after that work completes. */
EXPANSE_C_API int expanse_record_stream(void* ptr, struct CUstream_st* stream);
/* Waits for freed memory's streams, then unmaps and releases every cached page of device. A device
 * expanse has not used yet has none: nothing is done (its CUDA context is not created). */
EXPANSE_C_API int expanse_release_cached(int device);
/* CUDA graph capture: call expanse_capture_begin(s) before cudaStreamBeginCapture(s) (or
 * cuStreamBeginCapture) and expanse_capture_end(s) after cudaStreamEndCapture(s), from any
 * thread. Synchronizing a context while any of its streams captures invalidates that capture,
 * whichever thread synchronizes; expanse synchronizes a context only when memory is needed that
 * no other proof shows free (a stream destroyed with its work pending, another thread's
 * per-thread stream), and no driver query can show a capture another thread is about to begin.
 * While a capture is announced in a stream's context, expanse never synchronizes that context:
 * such memory stays unused until the capture ends (an allocation may then fail where it would
 * have waited). Announcements nest and count per context (the context of s; for NULL,
 * CU_STREAM_LEGACY or CU_STREAM_PER_THREAD the calling thread's current one). An end without a
 * begin changes nothing. expanse.torch.use() announces torch.cuda.graph captures itself. */
EXPANSE_C_API int expanse_capture_begin(struct CUstream_st* stream);
EXPANSE_C_API int expanse_capture_end(struct CUstream_st* stream);
/* Caps the physical memory expanse holds on device (bytes; SIZE_MAX removes the cap). A cap below
 * the reservation is EXPANSE_EINVAL. */
EXPANSE_C_API int expanse_set_limit(int device, size_t bytes);
/* Holds `bytes` of physical memory on device from now on, used or not (rounded down to pages;
 * EXPANSE_RESERVE_FREE: all the driver says is free, less EXPANSE_CONF reserve_margin, within the
 * limit): allocations it covers take no memory beyond it, and no other process can take it;
 * expanse_release_cached, reclaim and pool sleep keep it. Grows (creating it now) or shrinks
 * (giving back what it no longer covers and no live block uses) the reservation; *reserved (may be
 * NULL) gets the bytes reserved. EXPANSE_ENOMEM when the driver cannot give it whole (the message
 * says what was asked, free and taken; nothing more is held) unless EXPANSE_CONF reserve_partial
 * is true, which keeps what it gave (stats: reserved_bytes < reserve_asked_bytes).
 * EXPANSE_EINVAL above the limit or the device's capacity. */
#define EXPANSE_RESERVE_FREE SIZE_MAX
EXPANSE_C_API int expanse_reserve(int device, size_t bytes, size_t* reserved);
/* Gives the reservation back: what no live block uses goes to the driver now (cached memory
 * beyond the reservation stays cached until expanse_release_cached). */
EXPANSE_C_API int expanse_unreserve(int device);

/* Per-device statistics. Set struct_size = sizeof(expanse_stats) before the call: fields past the
 * caller's struct_size are not written, so the struct can grow without breaking old callers. The
 * fields, in order, and what each counts: expanse/stats_fields.h. */
#define EXPANSE_STATS_MEMBER_(type, name, doc) type name;
#define EXPANSE_STATS_ARRAY_MEMBER_(type, name, length, doc) type name[length];
typedef struct expanse_stats {
  EXPANSE_STATS_FIELDS(EXPANSE_STATS_MEMBER_, EXPANSE_STATS_MEMBER_, EXPANSE_STATS_ARRAY_MEMBER_)
} expanse_stats;
#undef EXPANSE_STATS_MEMBER_
#undef EXPANSE_STATS_ARRAY_MEMBER_

EXPANSE_C_API int expanse_get_stats(int device, expanse_stats* out);
EXPANSE_C_API int expanse_reset_peak_stats(int device);
/* "cuMemMap" for index i of expanse_stats.driver_calls, NULL past the end. */
EXPANSE_C_API const char* expanse_entry_point_name(int i);
/* Field i of expanse_stats (0: struct_size), for bindings that lay the struct out at run time:
 * its name ("requested_bytes") and its C type ("size_t", "uint32_t", "uint64_t", "double", or
 * for an array the element type and length, "uint64_t[64]"). NULL past the last field. */
EXPANSE_C_API const char* expanse_stats_field_name(int i);
EXPANSE_C_API const char* expanse_stats_field_type(int i);

/* The calling thread's last error message ("" if none). Valid until the thread's next call. */
EXPANSE_C_API const char* expanse_last_error(void);

/* Configures expanse with an EXPANSE_CONF-style string instead of the environment. Allowed before
 * first use, or when no block is live (everything cached is released first). If it fails, expanse
 * stays unconfigured (calls fail, naming the reason) until expanse_init succeeds or
 * expanse_shutdown returns it to EXPANSE_CONF. Not to be called while other threads use expanse. */
EXPANSE_C_API int expanse_init(const char* conf);
/* Releases everything expanse holds; fails if blocks are still live. Exiting without it is safe:
 * live blocks, sleeping pools, imports and thread caches are left to the driver.
 * A child forked after expanse initialised the driver cannot use CUDA: there, every call that
 * would reach the driver or the allocator (expanse_init included) fails with EXPANSE_EDRIVER and
 * a message saying so, expanse_malloc returns NULL and expanse_free does nothing. */
EXPANSE_C_API int expanse_shutdown(void);
/* "cuda: libcuda.so.1, driver 13.0" or "sim: ...". Initializes on first use. NULL on failure.
 * The string stays valid until expanse_init or expanse_shutdown. */
EXPANSE_C_API const char* expanse_driver_description(void);
EXPANSE_C_API int expanse_device_count(void);

/* ---- Pools --------------------------------------------------------------------------------
 * A pool is a private reuse domain on one device: a block belongs to its pool for life, and only
 * allocations routed to the pool reuse its memory. While its use count is above 0 its pages stay
 * mapped where they are and no other pool takes them, so a CUDA graph captured into it may use
 * the same addresses on every replay. At use count 0 the pool is released: its live blocks stay
 * valid, and once expanse can prove the work that used it done (a context synchronize, never
 * while a capture is announced: at expanse_release_cached, expanse_pool_trim, or an allocation
 * that would fail otherwise) its free memory is returned to the default pool.
 *
 * Routing: expanse_malloc, expanse_malloc_checked and expanse_torch_malloc put an allocation in
 * the pool of the newest route that matches it (none: the default pool). A route only applies to
 * allocations on its pool's device. expanse_free needs no pool; a default-pool block freed on a
 * stream of a capture routed to pool P joins P (the graph uses its memory on every replay).
 * With no route at all, routing costs nothing measurable.
 *
 * Errors (EXPANSE_EINVAL, naming the id in expanse_last_error; nothing is changed): an id never
 * created, a pool released (use count 0) for retain, release and every begin, an end with no
 * route left, expanse_pool_malloc on a stream of another device. */
typedef unsigned long long expanse_pool_id; /* 0: never a pool */

/* Creates a pool on device with use count 1; *id receives its id (ids are never reused). */
EXPANSE_C_API int expanse_pool_create(int device, expanse_pool_id* id);
/* Creates a registrable pool: each of its blocks is one physical handle of its own (its size
 * rounded up to the page, created exportable as POSIX file descriptors and GPUDirect-RDMA-capable
 * where the device supports them) in an address range of its own. cuMemGetAddressRange and
 * cuMemRetainAllocationHandle on any address in such a block answer that block's handle, so
 * ncclCommRegister, ncclCommWindowRegister (offset 0 from the base) and nvidia_peermem see one
 * allocation per buffer, and expanse_ipc_export can share it. Its blocks never share pages with
 * other blocks and are unmapped and released when freed (after the device's work is done: a
 * context synchronize; refused while a capture is announced or the stream captures). Such a pool
 * cannot sleep. EXPANSE_CONF registrable:on makes every default-pool block registrable. */
EXPANSE_C_API int expanse_pool_create_registrable(int device, expanse_pool_id* id);
/* Use count + 1 (say, each graph captured into the pool holds one). */
EXPANSE_C_API int expanse_pool_retain(expanse_pool_id id);
/* Use count - 1; at 0 the pool is released (see above). End its routes first: an allocation
 * routed to a released pool fails. */
EXPANSE_C_API int expanse_pool_release(expanse_pool_id id);
/* Routes every allocation made on a stream of the capture that `stream` is in (or begins after
 * this call), side streams forked into it included, to the pool. Call it before
 * cuStreamBeginCapture (cudaStreamBeginCapture) on stream, and expanse_pool_end after
 * cuStreamEndCapture. It also announces the capture as expanse_capture_begin does (ended by
 * expanse_pool_end), so expanse never synchronizes the context while it captures. stream must
 * belong to the pool's device. */
EXPANSE_C_API int expanse_pool_begin_capture(expanse_pool_id id, struct CUstream_st* stream);
/* Routes every allocation the calling thread makes (on the pool's device) to the pool. */
EXPANSE_C_API int expanse_pool_begin_thread(expanse_pool_id id);
/* Routes every allocation (on the pool's device) whose stream filter(stream, ctx) accepts
 * (non-zero) to the pool. filter runs on the allocating thread, outside expanse's locks; it may
 * be called for allocations newer routes take first, or not at all. Once the expanse_pool_end
 * that ends this route returns, filter and ctx are never called again (the end waits for calls
 * under way; an end from inside a filter does not wait for itself), so ctx may be freed then. */
EXPANSE_C_API int expanse_pool_begin_filter(expanse_pool_id id,
                                            int (*filter)(struct CUstream_st* stream, void* ctx),
                                            void* ctx);
/* Stops the routing this pool's newest begin set (routes nest: the newest matching one wins). */
EXPANSE_C_API int expanse_pool_end(expanse_pool_id id);
/* Allocates size bytes in the pool, ordered on stream (a stream of the pool's device). NULL on
 * failure (see expanse_last_error), and for size 0. Free it with expanse_free. */
EXPANSE_C_API void* expanse_pool_malloc(expanse_pool_id id, size_t size,
                                        struct CUstream_st* stream);
/* Gives a released pool's cached memory back to the driver now (its use count must be 0).
 * EXPANSE_EBUSY when a capture is announced in the device's context (the proof needs a context
 * synchronize): nothing was given back; try again after the capture ends. */
EXPANSE_C_API int expanse_pool_trim(expanse_pool_id id);

/* The pool the live block at ptr belongs to: *out receives its id, or 0 for the default pool
 * (a pool's block stays its pool's while live, its pool released or not). EXPANSE_EINVAL, *out 0,
 * when ptr is not the start of a live block on any device. */
EXPANSE_C_API int expanse_pool_of(const void* ptr, expanse_pool_id* out);

/* One pool's figures. Set struct_size = sizeof(expanse_pool_stats) before the call: fields past
 * the caller's struct_size are not written. */
typedef struct expanse_pool_stats {
  size_t struct_size;
  uint64_t id;
  int32_t device;
  int32_t use_count;
  uint32_t released;        /* 1: its use count reached 0 */
  uint32_t returned;        /* 1: released and its free memory given to the default pool */
  uint64_t live_blocks;
  uint64_t requested_bytes; /* live blocks, as asked for */
  uint64_t live_bytes;      /* live blocks, as carved (multiples of 512 B) */
  uint64_t cached_bytes;    /* free blocks still the pool's (reused only by its allocations) */
  uint64_t physical_bytes;  /* mapped pages under the pool's blocks */
  uint32_t asleep;          /* 1: put to sleep (expanse_pool_sleep) and not yet woken */
  uint32_t reserved0;
  uint64_t host_backup_bytes; /* pinned host memory it holds: its content while asleep, and the
                                 staging kept for the next sleep (expanse_release_host_backup) */
  uint64_t sleeps;            /* times put to sleep */
  uint64_t released_bytes;    /* physical memory the latest sleep gave back to the driver */
  uint64_t sleep_ns;          /* the latest sleep and wake, as this process timed them */
  uint64_t wake_ns;
  uint64_t sleep_modeled_ns;  /* the same, priced by the cost model (on the sim: what the driver */
  uint64_t wake_modeled_ns;   /* calls and copies would take on the modeled GPU) */
} expanse_pool_stats;
EXPANSE_C_API int expanse_pool_get_stats(expanse_pool_id id, expanse_pool_stats* s);

/* Sleep and wake: a pool's physical memory goes back to the driver while its addresses and
 * blocks stay, and comes back at the same addresses, so pointers into it (and CUDA graphs
 * captured over them) stay valid across a cycle.
 *
 * expanse_pool_sleep waits for all work on the device's context (stream's included, and replays
 * of graphs that use the pool), then, with EXPANSE_SLEEP_OFFLOAD, copies every live block of the
 * pool to pinned host memory (kept for the next cycle), and unmaps and releases every page of the
 * pool's blocks, live and free: cuMemGetInfo's free memory grows by all of it. With
 * EXPANSE_SLEEP_DISCARD the content is dropped (EXPANSE_SLEEP_DISCARD | EXPANSE_SLEEP_ZERO_ON_WAKE:
 * the blocks come back zeroed). While asleep, allocating into the pool or
 * recording a stream on its blocks is an error; freeing its blocks is allowed (they do not come
 * back). Refused (EXPANSE_EBUSY) while a capture is announced in the device's context or routed
 * into the pool. On a failure the pool is awake with its data.
 *
 * expanse_pool_wake maps pages under every block of the pool again at the same addresses, grants
 * access (peers included), copies offloaded content back (each block's copy starts as soon as
 * its pages are mapped; adjacent blocks go in one copy), and returns when it is there (work on
 * `stream` after the call sees it). Discarded blocks come back with undefined content. On a
 * failure the pool stays asleep with its backup, and a later wake may succeed. Then the wake hook
 * runs (expanse_set_wake_hook): the physical pages are new, so registrations of the old ones
 * (NCCL's ncclCommRegister, ibv_reg_mr / GPUDirect RDMA, cuMemExport handles) are stale and must
 * be made again.
 *
 * expanse_pool_is_asleep returns 1 or 0, or minus an error code for an unknown pool.
 * expanse_release_host_backup frees the pinned staging of every awake pool on device. */
enum { EXPANSE_SLEEP_OFFLOAD = 1, EXPANSE_SLEEP_DISCARD = 2, EXPANSE_SLEEP_ZERO_ON_WAKE = 4 };
EXPANSE_C_API int expanse_pool_sleep(expanse_pool_id id, int mode, struct CUstream_st* stream);
EXPANSE_C_API int expanse_pool_wake(expanse_pool_id id, struct CUstream_st* stream);
EXPANSE_C_API int expanse_pool_is_asleep(expanse_pool_id id);
EXPANSE_C_API int expanse_release_host_backup(int device);
/* hook(id, ctx) runs after every successful expanse_pool_wake, on the waking thread, with no
 * expanse lock held; NULL removes it. */
EXPANSE_C_API int expanse_set_wake_hook(void (*hook)(expanse_pool_id id, void* ctx), void* ctx);

/* ---- PyTorch ------------------------------------------------------------------------------
 * expanse_torch_malloc / expanse_torch_free keep PyTorch's pluggable-allocator contract:
 *   CUDAPluggableAllocator("libexpanse.so", "expanse_torch_malloc", "expanse_torch_free").
 * expanse_torch_malloc returns NULL only for size 0. On failure it THROWS a C++ exception derived
 * from std::runtime_error (so from std::exception); for lack of memory its what() starts with
 * "CUDA out of memory. Tried to allocate <size>." followed by expanse's explanation. PyTorch's
 * bindings turn it into a Python RuntimeError with that message. Call it only from C++ built with
 * exceptions (never from C or through ctypes: an exception cannot cross those frames).
 * expanse_torch_free never throws. It frees by pointer on whichever device holds it: a size that
 * disagrees with the allocation's is counted (expanse_stats.num_free_size_mismatches), reported
 * once on stderr, and the block is freed; a pointer that is not a live block is reported on
 * stderr, counted (num_unknown_frees) and ignored. */
EXPANSE_C_API void* expanse_torch_malloc(size_t size, int device, struct CUstream_st* stream);
EXPANSE_C_API void expanse_torch_free(void* ptr, size_t size, int device,
                                      struct CUstream_st* stream);
/* The message of an allocation of `requested` bytes on device refused for lack of memory, in
 * PyTorch's words, as expanse_torch_malloc's exception and the native PyTorch allocator's
 * OutOfMemoryError carry it: "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total
 * capacity of ... of which ... is free to expanse (not touched by live blocks[, under its limit
 * of ...]). Of the allocated memory ... is allocated by PyTorch through expanse, and ... is
 * reserved by expanse but unallocated." then `reason` (expanse's explanation, e.g.
 * expanse_last_error() at the failure; NULL or "": none), after "expanse: " unless it starts with
 * "expanse". The figures are stats' (its first struct_size bytes; NULL: the device's now), none
 * when its capacity_bytes is 0; sizes as PyTorch writes them ("512 bytes", "1.50 KiB").
 * Takes buf's capacity in *size and sets *size to the bytes the message needs, its NUL included;
 * the message is written only when it fits. A NULL buf with *size 0 asks for the size only. */
EXPANSE_C_API int expanse_format_oom(size_t requested, int device, const expanse_stats* stats,
                                     const char* reason, char* buf, size_t* size);

/* Memory history, as torch.cuda.memory._record_memory_history() keeps it. enabled != 0 starts a
 * new trace (alloc, free_requested, free_completed, segment_map, segment_unmap and oom entries
 * with address, size, stream and time; at most max_entries per device, the oldest dropped);
 * enabled == 0 stops recording and keeps the trace for expanse_dump_snapshot. Every allocation
 * path (expanse_malloc, expanse_torch_malloc, the C++ API) is recorded. */
EXPANSE_C_API int expanse_record_history(int enabled, size_t max_entries);
/* Writes a snapshot to path: a pickle with the structure of torch.cuda.memory._snapshot()
 * ("segments": each mapped range with its blocks; "device_traces": the recorded trace per
 * device; "allocator_settings"), which pytorch.org/memory_viz draws and `expanse replay` replays.
 * No stack frames ("frames" lists are empty). */
EXPANSE_C_API int expanse_dump_snapshot(const char* path);

/* The segments and blocks of device now, and its recorded memory history, as plain records (what
 * expanse_dump_snapshot writes, for callers that build their own view: the PyTorch native
 * allocator's snapshot and memory_stats). Both calls take capacities in *num_* and set them to the
 * totals; entries past a capacity are not written, so a caller whose totals came back larger
 * calls again with more room (the books may have changed in between). NULL arrays with zero
 * capacities ask for the totals only. A device expanse has not used yet has no segments. */
enum {
  EXPANSE_BLOCK_FREE = 0,         /* mapped, no live block: reusable */
  EXPANSE_BLOCK_LIVE = 1,         /* allocated and not freed */
  EXPANSE_BLOCK_AWAITING_FREE = 2 /* freed, waiting for other streams' work (record_stream) */
};
typedef struct expanse_block_info {
  uint64_t address;
  uint64_t size;      /* bytes of the block inside its segment (512 B granularity) */
  uint64_t requested; /* live: bytes asked for; else 0 */
  uint32_t state;     /* EXPANSE_BLOCK_* */
  uint32_t unused_;
} expanse_block_info;
typedef struct expanse_segment_info {
  uint64_t address;     /* one maximal run of mapped pages */
  uint64_t size;
  uint64_t first_block; /* its blocks: blocks[first_block .. first_block + num_blocks) */
  uint64_t num_blocks;
  uint32_t small_arena; /* 1: the arena of requests up to EXPANSE_CONF small_max (1 MiB) */
  uint32_t unused_;
} expanse_segment_info;
EXPANSE_C_API int expanse_get_segments(int device, expanse_segment_info* segments,
                                       size_t* num_segments, expanse_block_info* blocks,
                                       size_t* num_blocks);

enum {
  EXPANSE_TRACE_ALLOC = 0,
  EXPANSE_TRACE_FREE_REQUESTED = 1,
  EXPANSE_TRACE_FREE_COMPLETED = 2,
  EXPANSE_TRACE_SEGMENT_MAP = 3,
  EXPANSE_TRACE_SEGMENT_UNMAP = 4,
  EXPANSE_TRACE_OOM = 5
};
typedef struct expanse_trace_entry {
  uint32_t action; /* EXPANSE_TRACE_* */
  uint32_t unused_;
  uint64_t addr;   /* OOM: the bytes the device could still give */
  uint64_t size;
  uint64_t stream;
  int64_t time_us; /* microseconds since the Unix epoch */
} expanse_trace_entry;
/* The trace expanse_record_history keeps for device, oldest first. */
EXPANSE_C_API int expanse_get_trace(int device, expanse_trace_entry* entries, size_t* num_entries);

/* ---- Sharing across processes ----------------------------------------------------------------
 * A live block of a registrable pool (or of the default pool under EXPANSE_CONF registrable:on)
 * can be mapped by other processes. The exporter describes it in an expanse_ipc_handle (its size,
 * its offset into its first physical handle, one POSIX fd per physical handle) and sends it over
 * a Unix-domain socket (the fds travel by SCM_RIGHTS: no ptrace rights, no pidfd_getfd); the
 * importer maps it in an address range of the block's extent only (its size rounded up to the
 * page: 10,000 imports of 2 MiB reserve 20 GiB of VA) and gets a pointer to the same bytes.
 *
 * The exporter may free an exported block at any time: its handle is unmapped and released
 * there and never reused for another block, and importers' mappings keep the memory alive until
 * they close it. Nothing is synchronized between processes: order the work through your own
 * means (events, a message on the socket).
 *
 * expanse_ipc_handle is a fixed-size, opaque record (128 bytes; its layout is expanse's own
 * and may change with the version it carries). The fds it holds belong to the process holding
 * it: expanse_ipc_handle_release closes them (the exporter after sending, the importer after
 * importing, or when it will import no more); releasing twice is harmless. Copying the struct
 * copies the fd numbers, not the fds.
 *
 *   expanse_ipc_export(ptr, &h)      ptr: the start of a live registrable block on any device
 *   expanse_ipc_send(sock, &h)       one message on a connected Unix-domain socket
 *   expanse_ipc_recv(sock, &h)       the matching receive: h holds the received fds
 *   expanse_ipc_import(&h, dev, &p)  p: the block's address in this process (device dev's memory)
 *   expanse_ipc_close(p)             after the work using p is done: unmaps, releases, frees VA
 *   expanse_ipc_handle_release(&h)   closes the fds h holds
 *
 * Errors (EXPANSE_EINVAL, naming what is wrong; nothing is changed or leaked): a pointer that is
 * not the start of a live registrable block (a block of a plain pool cannot be exported: its
 * pages may be shared with other blocks), a handle that was released or never filled, an fd that
 * is closed or not one expanse exported, memory of another device than the one imported on, a
 * socket error (EXPANSE_EINVAL with errno's text), a close of an address not imported. */
#define EXPANSE_IPC_HANDLE_SIZE 128
typedef struct expanse_ipc_handle {
  uint64_t opaque[EXPANSE_IPC_HANDLE_SIZE / 8];
} expanse_ipc_handle;
EXPANSE_C_API int expanse_ipc_export(void* ptr, expanse_ipc_handle* out);
EXPANSE_C_API int expanse_ipc_send(int unix_socket, const expanse_ipc_handle* h);
EXPANSE_C_API int expanse_ipc_recv(int unix_socket, expanse_ipc_handle* out);
EXPANSE_C_API int expanse_ipc_import(const expanse_ipc_handle* h, int device, void** ptr);
EXPANSE_C_API int expanse_ipc_close(void* ptr);
EXPANSE_C_API int expanse_ipc_handle_release(expanse_ipc_handle* h);
/* The block's size as exported (bytes asked for), or 0 for a handle not filled or released. */
EXPANSE_C_API size_t expanse_ipc_handle_size(const expanse_ipc_handle* h);
/* Grants device `peer` read-write access to all of `device`'s memory, present and future (VMM
 * memory needs its own access grant per device: cudaDeviceEnablePeerAccess does not cover it).
 * With EXPANSE_CONF peer_access:auto (the default) every peer the driver allows already has it.
 * EXPANSE_EINVAL when cuDeviceCanAccessPeer says peer cannot access device. */
EXPANSE_C_API int expanse_enable_peer_access(int device, int peer);

/* ---- Pinned host memory ---------------------------------------------------------------------
 * Page-locked host memory for asynchronous copies, exact and fungible as device memory is: pages
 * created on a host NUMA node (cuMemCreate, CU_MEM_LOCATION_TYPE_HOST_NUMA), one granule each,
 * mapped into one address range per node with access for the host and every device that asked,
 * and moved (unmapped under free memory, mapped again) to serve a contiguous request whenever the
 * pages exist within host_limit. A block is the asked size rounded to the granularity (below it,
 * to 512 bytes, packed beside others). Reuse is stream-ordered: a block freed with a stream (and
 * the streams expanse_host_record_stream named) is reused only once that work is done. Where the
 * driver lacks host VMM (CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, or a
 * probe page it refuses) each block is its own mmap pinned with cuMemHostRegister instead, and
 * expanse_host_stats' path says so. */
typedef struct expanse_host_stats {
  size_t struct_size; /* set to sizeof(expanse_host_stats) */
  uint64_t requested_bytes;    /* live blocks, as asked */
  uint64_t allocated_bytes;    /* live blocks, as placed */
  uint64_t pinned_bytes;       /* pages held (mapped and pooled) */
  uint64_t mapped_bytes;
  uint64_t peak_pinned_bytes;
  uint64_t limit_bytes;        /* UINT64_MAX: none */
  uint64_t live_blocks;
  uint64_t pending_blocks;     /* freed, their streams' work not yet known done */
  uint64_t num_allocs;
  uint64_t num_frees;
  uint64_t num_created_pages;
  uint64_t num_released_pages;
  uint64_t num_remapped_pages; /* moved from under free memory to a request */
  uint64_t num_waits;          /* requests that waited for freed blocks' streams */
  uint64_t num_ooms;
  uint64_t page_bytes;         /* the host granularity (the fallback: the host page) */
  uint64_t path;               /* 1: HOST_NUMA pages through the VMM API; 2: the fallback, mmap +
                                  cuMemHostRegister per block (exact, but every block pins anew:
                                  no page moves between blocks), where the driver lacks host VMM;
                                  0: no host memory asked for yet */
} expanse_host_stats;
/* numa_node -1: the host node nearest the stream's device. EXPANSE_ENOMEM when the pages do not
 * exist within host_limit; EXPANSE_EINVAL for a size of 0 or a node the driver refuses. */
EXPANSE_C_API int expanse_host_malloc(void** out, size_t size, int numa_node,
                                      struct CUstream_st* stream);
EXPANSE_C_API int expanse_host_free(void* ptr, struct CUstream_st* stream);
EXPANSE_C_API int expanse_host_record_stream(void* ptr, struct CUstream_st* stream);
/* The live block (from expanse_host_malloc) that holds ptr: its start and requested size.
 * EXPANSE_EINVAL where ptr is in none (a cheap answer: tensor libraries ask it of every pointer
 * they copy from). */
EXPANSE_C_API int expanse_host_block_of(const void* ptr, void** base, size_t* size);
/* Frees a block whose user cannot name the stream that last used it (a tensor's deleter): it is
 * reused once the streams expanse_host_record_stream named are done, or, where none was named
 * (or flags has EXPANSE_HOST_EVERY_STREAM), once every stream of `device` has passed this call
 * (-1: the block's own device, the context current when it was allocated). No event can prove
 * the latter, so a request that would pin new memory while at least its size waits so
 * synchronizes that context (cuCtxSynchronize) first: name the streams to keep copies
 * asynchronous. A per-thread stream named by record_stream counts as none named (another
 * thread's free cannot reach it). */
#define EXPANSE_HOST_EVERY_STREAM 1u /* ignore the named streams: every stream of the device */
EXPANSE_C_API int expanse_host_free_after_device(void* ptr, int device, unsigned flags);
/* A DLPack tensor (a DLManagedTensor*, the unversioned DLPack ABI, as torch.from_dlpack and
 * numpy.from_dlpack take it in a "dltensor" capsule) over the live block at ptr: one dimension,
 * uint8, the block's requested size, on kDLCPU. The block is the tensor's from then on: its
 * deleter frees it as expanse_host_free_after_device(ptr, device, 0) does. EXPANSE_EINVAL for a
 * pointer that is not a live block's start (named); nothing changes then. */
EXPANSE_C_API int expanse_host_dlpack(void* ptr, int device, void** managed_tensor);
/* Gives back every pinned page no live block (or block whose stream work is pending) uses. */
EXPANSE_C_API int expanse_host_release_cached(void);
/* Most bytes of pinned pages per NUMA node (SIZE_MAX: none); lowering it releases cached pages. */
EXPANSE_C_API int expanse_host_set_limit(size_t bytes);
/* Every node's peak_pinned_bytes starts again from its pinned bytes now. */
EXPANSE_C_API int expanse_host_reset_peak_stats(void);
/* numa_node -1: every node's figures summed. */
EXPANSE_C_API int expanse_host_get_stats(int numa_node, expanse_host_stats* out);

#ifdef __cplusplus
}
#endif

/* A NULL stream is the legacy default stream, one per context whichever thread names it (as the
 * CUDA driver API reads it). Code built with nvcc --default-stream per-thread (which defines
 * CUDA_API_PER_THREAD_DEFAULT_STREAM) means each thread's own stream by NULL: there the calls
 * below pass CU_STREAM_PER_THREAD for NULL, so that a block one thread frees is not another
 * thread's before its work is done. C++ code calling the expanse:: API with a null stream, and
 * code built otherwise, set EXPANSE_CONF null_stream:per_thread instead. */
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM) && !defined(EXPANSE_NULL_STREAM_IS_LEGACY)
static inline struct CUstream_st* expanse_null_stream_per_thread_(struct CUstream_st* s) {
#ifdef __cplusplus
  return s != nullptr ? s : reinterpret_cast<struct CUstream_st*>(uintptr_t{0x2});
#else
  return s != NULL ? s : (struct CUstream_st*)(uintptr_t)0x2; /* CU_STREAM_PER_THREAD */
#endif
}
#define expanse_malloc(size, device, stream) \
  (expanse_malloc)((size), (device), expanse_null_stream_per_thread_(stream))
#define expanse_malloc_checked(out, size, device, stream) \
  (expanse_malloc_checked)((out), (size), (device), expanse_null_stream_per_thread_(stream))
#define expanse_free(ptr, size, device, stream) \
  (expanse_free)((ptr), (size), (device), expanse_null_stream_per_thread_(stream))
#define expanse_free_checked(ptr, size, device, stream) \
  (expanse_free_checked)((ptr), (size), (device), expanse_null_stream_per_thread_(stream))
#define expanse_record_stream(ptr, stream) \
  (expanse_record_stream)((ptr), expanse_null_stream_per_thread_(stream))
#define expanse_host_malloc(out, size, numa_node, stream) \
  (expanse_host_malloc)((out), (size), (numa_node), expanse_null_stream_per_thread_(stream))
#define expanse_host_free(ptr, stream) \
  (expanse_host_free)((ptr), expanse_null_stream_per_thread_(stream))
#define expanse_host_record_stream(ptr, stream) \
  (expanse_host_record_stream)((ptr), expanse_null_stream_per_thread_(stream))
#endif

#endif /* EXPANSE_EXPANSE_H */
