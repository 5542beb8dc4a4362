/* A plain C99 client of libexpanse_simcuda.so.
 *
 * It uses cuda.h for types only and links no CUDA library: like a C application loading a
 * libcuda.so.1 replacement, it dlopens the library named by argv[1], looks up the driver entry
 * points by their exported names, runs the whole VMM sequence (reserve, create, map, set access,
 * write and read through the pointer, unmap, release, free) and checks the codes of some misuse.
 * Exit status 0 only when every check matched. Run with EXPANSE_CONF=sim_capacity:64MiB (ctest
 * sets it) to keep the device small.
 */
#include <cuda.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*device_get_fn)(CUdevice*, int);
typedef CUresult (*device_total_mem_fn)(size_t*, CUdevice);
typedef CUresult (*granularity_fn)(size_t*, const CUmemAllocationProp*,
                                   CUmemAllocationGranularity_flags);
typedef CUresult (*reserve_fn)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*create_fn)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                              unsigned long long);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                           unsigned long long);
typedef CUresult (*set_access_fn)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*address_free_fn)(CUdeviceptr, size_t);

static int g_checks = 0;
static int g_failures = 0;

/* Records one check: got must equal expected. */
static void check(const char* what, CUresult got, CUresult expected) {
  ++g_checks;
  if (got == expected) {
    printf("ok    %-58s -> %d\n", what, (int)got);
  } else {
    ++g_failures;
    printf("FAIL  %-58s -> %d, expected %d\n", what, (int)got, (int)expected);
  }
}

static void check_true(const char* what, int ok) {
  ++g_checks;
  if (ok) {
    printf("ok    %s\n", what);
  } else {
    ++g_failures;
    printf("FAIL  %s\n", what);
  }
}

/* dlsym into a function pointer without converting an object pointer to a function pointer. */
static int lookup(void* lib, const char* name, void* fn_out, size_t fn_size) {
  void* sym = dlsym(lib, name);
  if (sym == NULL) {
    printf("FAIL  dlsym(%s): %s\n", name, dlerror());
    return 0;
  }
  memcpy(fn_out, &sym, fn_size);
  return 1;
}

#define LOOKUP(lib, name, var) lookup((lib), (name), &(var), sizeof(var))

int main(int argc, char** argv) {
  void* lib;
  init_fn cu_init = NULL;
  device_get_fn cu_device_get = NULL;
  device_total_mem_fn cu_device_total_mem = NULL;
  granularity_fn cu_granularity = NULL;
  reserve_fn cu_reserve = NULL;
  create_fn cu_create = NULL;
  map_fn cu_map = NULL;
  set_access_fn cu_set_access = NULL;
  unmap_fn cu_unmap = NULL;
  release_fn cu_release = NULL;
  address_free_fn cu_address_free = NULL;
  CUdevice dev = -1;
  size_t gran = 0;
  size_t total = 0;
  size_t i;
  CUmemAllocationProp prop;
  CUmemAccessDesc access;
  CUdeviceptr ptr = 0;
  CUmemGenericAllocationHandle handle = 0;
  CUmemGenericAllocationHandle big = 0;
  unsigned char* host;
  int data_ok = 1;
  const char* conf = getenv("EXPANSE_CONF");

  if (argc != 2) {
    fprintf(stderr, "usage: %s path/to/libexpanse_simcuda.so\n", argv[0]);
    return 2;
  }
  printf("library      %s\nEXPANSE_CONF %s\n", argv[1], conf != NULL ? conf : "(unset)");
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    printf("FAIL  dlopen: %s\n", dlerror());
    return 1;
  }
  if (!LOOKUP(lib, "cuInit", cu_init) || !LOOKUP(lib, "cuDeviceGet", cu_device_get) ||
      !LOOKUP(lib, "cuDeviceTotalMem_v2", cu_device_total_mem) ||
      !LOOKUP(lib, "cuMemGetAllocationGranularity", cu_granularity) ||
      !LOOKUP(lib, "cuMemAddressReserve", cu_reserve) || !LOOKUP(lib, "cuMemCreate", cu_create) ||
      !LOOKUP(lib, "cuMemMap", cu_map) || !LOOKUP(lib, "cuMemSetAccess", cu_set_access) ||
      !LOOKUP(lib, "cuMemUnmap", cu_unmap) || !LOOKUP(lib, "cuMemRelease", cu_release) ||
      !LOOKUP(lib, "cuMemAddressFree", cu_address_free)) {
    return 1;
  }

  /* The full sequence. */
  check("cuInit(0)", cu_init(0), CUDA_SUCCESS);
  check("cuDeviceGet(&dev, 0)", cu_device_get(&dev, 0), CUDA_SUCCESS);
  check("cuDeviceTotalMem_v2(&total, dev)", cu_device_total_mem(&total, dev), CUDA_SUCCESS);
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0; /* an ordinal, not the CUdevice */
  check("cuMemGetAllocationGranularity(MINIMUM)",
        cu_granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  printf("      device 0: %zu bytes, granularity %zu bytes\n", total, gran);
  if (gran == 0 || total < 4 * gran) {
    printf("FAIL  granularity %zu / capacity %zu unusable\n", gran, total);
    return 1;
  }
  check("cuMemAddressReserve(4 pages)", cu_reserve(&ptr, 4 * gran, 0, 0, 0), CUDA_SUCCESS);
  check("cuMemCreate(2 pages)", cu_create(&handle, 2 * gran, &prop, 0), CUDA_SUCCESS);
  check("cuMemMap(ptr, 2 pages, 0, handle)", cu_map(ptr, 2 * gran, 0, handle, 0), CUDA_SUCCESS);
  memset(&access, 0, sizeof access);
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check("cuMemSetAccess(ptr, 2 pages, READWRITE)", cu_set_access(ptr, 2 * gran, &access, 1),
        CUDA_SUCCESS);

  /* Data through the pointer: a pattern over both pages, read back. */
  host = (unsigned char*)(uintptr_t)ptr;
  for (i = 0; i < 2 * gran; i += 97) host[i] = (unsigned char)(i * 31u + 7u);
  for (i = 0; i < 2 * gran; i += 97) {
    if (host[i] != (unsigned char)(i * 31u + 7u)) data_ok = 0;
  }
  check_true("pattern written through the mapped pointer reads back", data_ok);

  /* Misuse. */
  /* NOT_SUPPORTED, as a real H100 answers (driver 580.159.04, 2026-11-23). */
  check("cuMemMap with offset != 0", cu_map(ptr + 2 * gran, gran, gran, handle, 0),
        CUDA_ERROR_NOT_SUPPORTED);
  check("cuMemUnmap of half a mapping", cu_unmap(ptr, gran), CUDA_ERROR_INVALID_VALUE);
  check("cuMemCreate beyond the device's capacity",
        cu_create(&big, (total / gran + 1) * gran, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  check("cuMemAddressFree with the wrong size", cu_address_free(ptr, 2 * gran),
        CUDA_ERROR_INVALID_VALUE);
  check("cuMemMap over the existing mapping", cu_map(ptr, 2 * gran, 0, handle, 0),
        CUDA_ERROR_INVALID_VALUE);

  /* The data survived the failed calls; then undo everything. */
  check_true("data intact after the failed calls",
             host[0] == 7u && host[97] == (unsigned char)(97u * 31u + 7u));
  check("cuMemUnmap(ptr, 2 pages)", cu_unmap(ptr, 2 * gran), CUDA_SUCCESS);
  check("cuMemRelease(handle)", cu_release(handle), CUDA_SUCCESS);
  check("cuMemAddressFree(ptr, 4 pages)", cu_address_free(ptr, 4 * gran), CUDA_SUCCESS);
  check("cuMemAddressFree again", cu_address_free(ptr, 4 * gran), CUDA_ERROR_INVALID_VALUE);

  printf("%d checks, %d failed\n", g_checks, g_failures);
  /* lib stays loaded: dlclose would unmap the globals that own the sim state, and LeakSanitizer
   * would then report that state as leaked. */
  return g_failures == 0 ? 0 : 1;
}
