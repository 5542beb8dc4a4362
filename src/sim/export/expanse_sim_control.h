/* Control functions of libexpanse_simcuda.so, the sim driver under the real libcuda symbol names.
 *
 * A test or program that loads the library (dlopen, or in place of libcuda.so.1) uses these to
 * configure the simulated devices, read call counters, inject failures, hold streams and check
 * what is outstanding. They mirror src/sim/sim.hpp. Without expanse_sim_configure(), the library
 * configures itself from the EXPANSE_CONF environment variable at its first call.
 *
 * C99; no CUDA headers needed. Entry points are named by their base name ("cuMemMap",
 * "cuMemGetInfo"); the exported symbol names ("cuMemGetInfo_v2") are accepted too. */
#ifndef EXPANSE_SIM_CONTROL_H
#define EXPANSE_SIM_CONTROL_H

#ifdef __cplusplus
extern "C" {
#endif

/* Replaces the whole sim state with a fresh, uninitialized one configured by conf (EXPANSE_CONF
 * syntax: "sim_devices:2,sim_capacity:8GiB,sim_granularity:2MiB,sim_backing:true"; other known
 * keys are ignored). Returns 0, or nonzero with the reason in expanse_sim_last_error().
 * The keys:
 *   sim_devices         number of devices (default 1)
 *   sim_capacity        physical memory per device (default 80GiB)
 *   sim_granularity     allocation granularity (default 2MiB)
 *   sim_backing         true: host memory behind pages; false: bookkeeping only (default true)
 *   sim_driver_version  what cuDriverGetVersion answers (default 13000); cuGetProcAddress knows
 *                       no entry point or ABI variant introduced after it (as a real driver of
 *                       that version), and expanse's loader leaves the newer optional entry
 *                       points out (dlsym still finds every symbol this library exports)
 *   sim_peer_access     cuDeviceCanAccessPeer between distinct devices, and cuMemSetAccess
 *                       granting a device access to another device's memory (default true)
 *   sim_posix_fd        CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED; without
 *                       it cuMemCreate refuses that handle type (CUDA_ERROR_NOT_SUPPORTED)
 *   sim_rdma            CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED; without it
 *                       cuMemCreate refuses allocFlags.gpuDirectRDMACapable (NOT_SUPPORTED);
 *                       sim_rdma:wsl is WSL2's driver (pytorch/pytorch#192330): the attribute
 *                       says 1, cuMemCreate and cuMemMap accept gpuDirectRDMACapable, and
 *                       cuMemSetAccess on such memory returns CUDA_ERROR_UNKNOWN (999)
 *   sim_host_capacity   pinned host memory cuMemHostAlloc hands out in all (default 1TiB);
 *                       beyond it cuMemHostAlloc returns CUDA_ERROR_OUT_OF_MEMORY
 * CUdevice values from cuDeviceGet are not the ordinals (0x100 + ordinal): functions taking a
 * CUdevice refuse an ordinal (CUDA_ERROR_INVALID_DEVICE), while CUmemLocation.id takes the
 * ordinal, as cuda.h documents. */
int expanse_sim_configure(const char* conf);

/* The message of the last failing control call on this thread ("" if none). */
const char* expanse_sim_last_error(void);

/* Calls of one entry point since the last configure/reset (failing and injected ones too);
 * 0 for an unknown name. */
unsigned long long expanse_sim_call_count(const char* base_name);
unsigned long long expanse_sim_total_calls(void);
void expanse_sim_reset_counts(void);

/* The nth call of base_name from now on (1 = the very next) returns code without side effects.
 * Returns 0, or nonzero for an unknown name or nth == 0. */
int expanse_sim_inject_failure(const char* base_name, unsigned long long nth, int code);
void expanse_sim_clear_injections(void);

/* Modeled GPU driver time of the successful calls so far, in seconds. */
double expanse_sim_modeled_seconds(void);

/* Work recorded on a held stream stays pending until released or synchronized (see sim.hpp).
 * stream is a CUstream: a live stream, NULL or (void*)0x1 (CU_STREAM_LEGACY: the legacy stream of
 * the calling thread's current context, device 0's without one), or (void*)0x2
 * (CU_STREAM_PER_THREAD: the calling thread's per-thread stream of that context). Unknown
 * streams are ignored (and reported through expanse_sim_last_error).
 * A held stream that is destroyed keeps its work pending until a synchronize covers it (its
 * context's, or an event it recorded) or expanse_sim_release_all(); meanwhile cuStreamCreate
 * may hand its handle value to a new stream, which is what the value then names here. */
void expanse_sim_hold_stream(void* stream);
void expanse_sim_release_stream(void* stream);
/* Releases every held stream: destroyed ones, other threads' per-thread streams, all of them. */
void expanse_sim_release_all(void);
unsigned long long expanse_sim_pending_events(void);
/* Calls that named a destroyed stream whose handle value no new stream has taken: undefined
 * behaviour on a real driver (a 580 driver answered CUDA_ERROR_CONTEXT_IS_DESTROYED once, then
 * crashed). The sim answers the code and counts the call here; code that keeps stream handles
 * must keep this at 0. */
unsigned long long expanse_sim_dead_handle_uses(void);

/* What is outstanding over all devices; any pointer may be NULL. Returns 0. */
int expanse_sim_outstanding(unsigned long long* reservations, unsigned long long* allocations,
                            unsigned long long* mappings, unsigned long long* physical_bytes);

/* Pinned host memory (cuMemHostAlloc) not yet freed: allocations and their bytes; any pointer
 * may be NULL. Returns 0. */
int expanse_sim_outstanding_host(unsigned long long* allocations, unsigned long long* bytes);

/* Asynchronous copies and memsets whose device range had been unmapped (or had lost the access
 * they need) by the time their stream ran them: an illegal-address fault on a GPU; the sim
 * skips them and counts them here. Code that keeps pages mapped under pending work keeps this
 * at 0. */
unsigned long long expanse_sim_async_faults(void);

/* A multi-line description of what is outstanding; valid until the next call on this thread. */
const char* expanse_sim_describe_outstanding(void);

#ifdef __cplusplus
}
#endif

#endif /* EXPANSE_SIM_CONTROL_H */
