// Rules for sharing memory: cuMemExportToShareableHandle, cuMemImportFromShareableHandle,
// cuMemGetAddressRange_v2 (what NCCL registration and inter-process sharing rely on, with
// cuMemRetainAllocationHandle in access_handle_test.cpp).
#include "conformance.hpp"

#include <fcntl.h>
#include <unistd.h>

namespace expanse::conformance {
namespace {

void* fd_arg(int fd) { return reinterpret_cast<void*>(static_cast<intptr_t>(fd)); }

class Share : public Conformance {
 protected:
  static CUmemAllocationProp fd_prop(int device = 0) {
    CUmemAllocationProp p = device_prop(device);
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return p;
  }
  // Skips where the device cannot export POSIX file descriptors (attribute 103).
  bool posix_fd_supported() {
    int v = 0;
    return t().device_get_attribute(
               &v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev(0)) ==
               CUDA_SUCCESS &&
           v != 0;
  }
  CUmemGenericAllocationHandle create_exportable(size_t size) {
    CUmemGenericAllocationHandle h = 0;
    must(try_create(&h, size, fd_prop(0)), "cuMemCreate(POSIX_FILE_DESCRIPTOR)");
    return h;
  }
};

#define REQUIRE_POSIX_FD()                                                            \
  do {                                                                                \
    make_current();                                                                   \
    if (!posix_fd_supported()) GTEST_SKIP() << "no POSIX fd export on this device";   \
  } while (0)

// A NULL output or flags other than 0 → INVALID_VALUE. On a real driver the case runs in a
// child process: misuse may be answered there with a crash, which must cost this case one
// failure (naming the call), not the rest of the run.
TEST_P(Share, ExportMisuseIsInvalidValue) {
  CONFORMANCE_ISOLATE_ON_REAL_DRIVER();
  REQUIRE_POSIX_FD();
  const CUmemGenericAllocationHandle h = create_exportable(gran());
  journal_step("export to a NULL output");
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            t().mem_export_to_shareable_handle(nullptr, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                               0));
  journal_step("export with flags 1");
  int fd = -1;
  const CUresult r =
      t().mem_export_to_shareable_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, r);
  if (r == CUDA_SUCCESS) {
    close(fd);  // the fd is the caller's, even from a call the rule says fails
  } else {
    EXPECT_EQ(fd, -1) << "a refused export wrote its output";
  }
}

// Sim policy: exporting a released handle → INVALID_VALUE. On a real driver a handle that is not
// valid is undefined behaviour (cuda.h says so of cuMemRelease; the handle no longer names
// anything the driver holds), and the likeliest crash of the export rules: a NULL output is
// answered INVALID_VALUE (NVIDIA/cuda-python#27), flags are a plain value.
TEST_P(Share, ExportOfReleasedHandleIsInvalidValue) {
  CONFORMANCE_REQUIRE_SIM("a released handle is undefined behaviour on the real driver");
  REQUIRE_POSIX_FD();
  const CUmemGenericAllocationHandle h = create_exportable(gran());
  ASSERT_CU(CUDA_SUCCESS, release(h));
  int fd = -1;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_export_to_shareable_handle(
                                          &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  EXPECT_EQ(fd, -1);
}

// Handle types are fixed at cuMemCreate: exporting a type not requested then → INVALID_VALUE
// (fabric asked for and not exportable: "invalid argument", pytorch PR #173606).
TEST_P(Share, ExportOfTypeNotRequestedIsInvalidValue) {
  make_current();
  const CUmemGenericAllocationHandle plain = create(gran());
  int fd = -1;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_export_to_shareable_handle(
                                          &fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  if (!posix_fd_supported()) return;
  const CUmemGenericAllocationHandle h = create_exportable(gran());
  CUmemFabricHandle fabric{};
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            t().mem_export_to_shareable_handle(&fabric, h, CU_MEM_HANDLE_TYPE_FABRIC, 0));
}

// An exported fd imports as a new handle over the same memory: bytes written through one mapping
// are read through the other; the import needs a cuMemRelease of its own.
TEST_P(Share, ImportSeesTheExportersBytes) {
  REQUIRE_POSIX_FD();
  const size_t size = 2 * gran();
  const CUmemGenericAllocationHandle h = create_exportable(size);
  const CUdeviceptr a = reserve(size);
  map(a, size, h);
  ASSERT_CU(CUDA_SUCCESS, set_access(a, size));
  std::vector<unsigned char> pattern(size);
  for (size_t i = 0; i < size; ++i) pattern[i] = static_cast<unsigned char>(i * 7 + 3);
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_htod(a, pattern.data(), size));

  int fd = -1;
  ASSERT_CU(CUDA_SUCCESS, t().mem_export_to_shareable_handle(
                              &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  ASSERT_GE(fd, 0);
  CUmemGenericAllocationHandle imported = 0;
  ASSERT_CU(CUDA_SUCCESS, t().mem_import_from_shareable_handle(
                              &imported, fd_arg(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);  // the fd is the caller's: the import does not need it any more
  CUmemAllocationProp prop{};
  ASSERT_CU(CUDA_SUCCESS, t().mem_get_allocation_properties_from_handle(&prop, imported));
  EXPECT_EQ(prop.location.id, 0);
  const CUdeviceptr b = reserve(size);
  map(b, size, imported);
  ASSERT_CU(CUDA_SUCCESS, set_access(b, size));
  std::vector<unsigned char> got(size);
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_dtoh(got.data(), b, size));
  EXPECT_EQ(got, pattern);
  // Writes through the import show through the exporter's mapping.
  const unsigned char tail[4] = {0xde, 0xad, 0xbe, 0xef};
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_htod(b + size - 4, tail, 4));
  unsigned char back[4] = {};
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_dtoh(back, a + size - 4, 4));
  EXPECT_EQ(std::memcmp(back, tail, 4), 0);
  // The import's own reference: one release, which the mapping outlives.
  EXPECT_CU(CUDA_SUCCESS, t().mem_release(imported));
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_dtoh(back, b + size - 4, 4));
  EXPECT_EQ(std::memcmp(back, tail, 4), 0);
}

// The memory stays alive while any handle or mapping references it: the exporter releases and
// unmaps everything, and the importer still reads the bytes.
TEST_P(Share, ImportKeepsMemoryAliveAfterTheExporterLetsGo) {
  REQUIRE_POSIX_FD();
  const size_t size = gran();
  const CUmemGenericAllocationHandle h = create_exportable(size);
  const CUdeviceptr a = reserve(size);
  map(a, size, h);
  ASSERT_CU(CUDA_SUCCESS, set_access(a, size));
  std::vector<unsigned char> pattern(size, 0x5a);
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_htod(a, pattern.data(), size));
  int fd = -1;
  ASSERT_CU(CUDA_SUCCESS, t().mem_export_to_shareable_handle(
                              &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CUmemGenericAllocationHandle imported = 0;
  ASSERT_CU(CUDA_SUCCESS, t().mem_import_from_shareable_handle(
                              &imported, fd_arg(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  ASSERT_CU(CUDA_SUCCESS, unmap(a, size));
  ASSERT_CU(CUDA_SUCCESS, release(h));
  const CUdeviceptr b = reserve(size);
  map(b, size, imported);
  ASSERT_CU(CUDA_SUCCESS, set_access(b, size));
  ASSERT_CU(CUDA_SUCCESS, t().mem_release(imported));
  std::vector<unsigned char> got(size);
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_dtoh(got.data(), b, size));
  EXPECT_EQ(got, pattern);
}

// Importing something that is not an exported handle: a closed fd, a file that is not device
// memory, a NULL output → INVALID_VALUE; a type other than POSIX fd or fabric → INVALID_VALUE.
TEST_P(Share, ImportOfBadFdIsInvalidValue) {
  REQUIRE_POSIX_FD();
  CUmemGenericAllocationHandle h = 0;
  const int closed = dup(0);
  ASSERT_GE(closed, 0);
  close(closed);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_import_from_shareable_handle(
                                          &h, fd_arg(closed),
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(devnull, 0);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_import_from_shareable_handle(
                                          &h, fd_arg(devnull),
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_import_from_shareable_handle(
                                          nullptr, fd_arg(devnull),
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(devnull);
  if (hooks() != nullptr) {
    EXPECT_TRUE(hooks()->outstanding().empty());
  }
}

// Sim policy: fabric handles need an IMEX channel, which sim devices never have → NOT_SUPPORTED
// (a real driver answers NOT_PERMITTED or NOT_SUPPORTED there).
TEST_P(Share, ImportFabricIsNotSupportedOnTheSim) {
  CONFORMANCE_REQUIRE_SIM("a real device may have an IMEX channel");
  make_current();
  CUmemFabricHandle fabric{};
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_NOT_SUPPORTED,
            t().mem_import_from_shareable_handle(&h, &fabric, CU_MEM_HANDLE_TYPE_FABRIC));
}

// Every export and import is its own reference: releasing an import twice is misuse (undefined
// on a real driver; INVALID_VALUE on the sim).
TEST_P(Share, ImportedHandleNeedsExactlyOneRelease) {
  CONFORMANCE_REQUIRE_SIM("a double release is undefined behaviour on the real driver");
  REQUIRE_POSIX_FD();
  const CUmemGenericAllocationHandle h = create_exportable(gran());
  int fd = -1;
  ASSERT_CU(CUDA_SUCCESS, t().mem_export_to_shareable_handle(
                              &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CUmemGenericAllocationHandle i1 = 0;
  CUmemGenericAllocationHandle i2 = 0;
  ASSERT_CU(CUDA_SUCCESS, t().mem_import_from_shareable_handle(
                              &i1, fd_arg(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  ASSERT_CU(CUDA_SUCCESS, t().mem_import_from_shareable_handle(
                              &i2, fd_arg(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  EXPECT_NE(i1, h);
  EXPECT_NE(i1, i2);
  EXPECT_CU(CUDA_SUCCESS, t().mem_release(i1));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_release(i1));
  EXPECT_CU(CUDA_SUCCESS, t().mem_release(i2));
  ASSERT_CU(CUDA_SUCCESS, release(h));
  EXPECT_TRUE(hooks()->outstanding().empty()) << to_string(hooks()->outstanding());
}

// cuMemGetAddressRange_v2 answers the mapping (one handle's extent) holding the address, not
// the reservation: two handles side by side in one reservation answer one each, from any
// interior address; both outputs are optional; an address in no mapping → NOT_FOUND.
TEST_P(Share, AddressRangeIsTheMappingOfOneHandle) {
  make_current();
  const CUdeviceptr p = reserve(4 * gran());
  const CUmemGenericAllocationHandle h1 = create(gran());
  const CUmemGenericAllocationHandle h2 = create(2 * gran());
  map(p, gran(), h1);
  map(p + gran(), 2 * gran(), h2);
  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_CU(CUDA_SUCCESS, t().mem_get_address_range(&base, &size, p + 100));
  EXPECT_EQ(base, p);
  EXPECT_EQ(size, gran());
  ASSERT_CU(CUDA_SUCCESS, t().mem_get_address_range(&base, &size, p + 3 * gran() - 1));
  EXPECT_EQ(base, p + gran());
  EXPECT_EQ(size, 2 * gran());
  EXPECT_CU(CUDA_SUCCESS, t().mem_get_address_range(nullptr, &size, p + gran()));
  EXPECT_CU(CUDA_SUCCESS, t().mem_get_address_range(&base, nullptr, p + gran()));
  EXPECT_CU(CUDA_ERROR_NOT_FOUND, t().mem_get_address_range(&base, &size, p + 3 * gran()));
  // The retained handle of any address in the range is the one mapped there.
  CUmemGenericAllocationHandle got = 0;
  ASSERT_CU(CUDA_SUCCESS, retain(&got, p + 2 * gran() + 5));
  EXPECT_EQ(got, h2);
  EXPECT_CU(CUDA_SUCCESS, release(got));
}

INSTANTIATE_TEST_SUITE_P(Drivers, Share,
                         ::testing::Values(Variant::sim_inprocess, Variant::sim_dlopen,
                                           Variant::cuda),
                         [](const ::testing::TestParamInfo<Variant>& i) {
                           return std::string(variant_name(i.param));
                         });

}  // namespace
}  // namespace expanse::conformance
