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
 * keys are ignored). Returns 0, or nonzero with the reason in expanse_sim_last_error(). */
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
 * stream is a CUstream (NULL: the legacy default stream). Unknown streams are ignored (and
 * reported through expanse_sim_last_error). */
void expanse_sim_hold_stream(void* stream);
void expanse_sim_release_stream(void* stream);
unsigned long long expanse_sim_pending_events(void);

/* What is outstanding over all devices; any pointer may be NULL. Returns 0. */
int expanse_sim_outstanding(unsigned long long* reservations, unsigned long long* allocations,
                            unsigned long long* mappings, unsigned long long* physical_bytes);

/* A multi-line description of what is outstanding; valid until the next call on this thread. */
const char* expanse_sim_describe_outstanding(void);

#ifdef __cplusplus
}
#endif

#endif /* EXPANSE_SIM_CONTROL_H */
