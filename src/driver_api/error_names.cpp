// cuGetErrorName / cuGetErrorString tables (CUDA 13.0 CUresult values).
#include "driver_api/error_names.hpp"

namespace expanse::driver {
namespace {

struct ErrorInfo {
  int code;
  const char* name;
  const char* text;
};

#define EXPANSE_E(code, text) \
  { static_cast<int>(code), #code, text }
constexpr ErrorInfo kErrors[] = {
    EXPANSE_E(CUDA_SUCCESS, "no error"),
    EXPANSE_E(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    EXPANSE_E(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    EXPANSE_E(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    EXPANSE_E(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    EXPANSE_E(CUDA_ERROR_PROFILER_DISABLED,
              "profiler disabled while using external profiling tool"),
    EXPANSE_E(CUDA_ERROR_PROFILER_NOT_INITIALIZED, "profiler not initialized"),
    EXPANSE_E(CUDA_ERROR_PROFILER_ALREADY_STARTED, "profiler already started"),
    EXPANSE_E(CUDA_ERROR_PROFILER_ALREADY_STOPPED, "profiler already stopped"),
    EXPANSE_E(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library"),
    EXPANSE_E(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, "call requires a newer driver"),
    EXPANSE_E(CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable"),
    EXPANSE_E(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    EXPANSE_E(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    EXPANSE_E(CUDA_ERROR_DEVICE_NOT_LICENSED, "device doesn't have valid Grid license"),
    EXPANSE_E(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    EXPANSE_E(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    EXPANSE_E(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current"),
    EXPANSE_E(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed"),
    EXPANSE_E(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed"),
    EXPANSE_E(CUDA_ERROR_ARRAY_IS_MAPPED, "array is mapped"),
    EXPANSE_E(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped"),
    EXPANSE_E(CUDA_ERROR_NO_BINARY_FOR_GPU,
              "no kernel image is available for execution on the device"),
    EXPANSE_E(CUDA_ERROR_ALREADY_ACQUIRED, "resource already acquired"),
    EXPANSE_E(CUDA_ERROR_NOT_MAPPED, "resource not mapped"),
    EXPANSE_E(CUDA_ERROR_NOT_MAPPED_AS_ARRAY, "resource not mapped as array"),
    EXPANSE_E(CUDA_ERROR_NOT_MAPPED_AS_POINTER, "resource not mapped as pointer"),
    EXPANSE_E(CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error encountered"),
    EXPANSE_E(CUDA_ERROR_UNSUPPORTED_LIMIT, "limit is not supported on this architecture"),
    EXPANSE_E(CUDA_ERROR_CONTEXT_ALREADY_IN_USE,
              "exclusive-thread device already in use by a different thread"),
    EXPANSE_E(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
              "peer access is not supported between these two devices"),
    EXPANSE_E(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed"),
    EXPANSE_E(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, "invalid OpenGL or DirectX context"),
    EXPANSE_E(CUDA_ERROR_NVLINK_UNCORRECTABLE,
              "uncorrectable NVLink error detected during the execution"),
    EXPANSE_E(CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "PTX JIT compiler library not found"),
    EXPANSE_E(CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
              "the provided PTX was compiled with an unsupported toolchain"),
    EXPANSE_E(CUDA_ERROR_JIT_COMPILATION_DISABLED, "PTX JIT compilation was disabled"),
    EXPANSE_E(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY,
              "the provided execution affinity is not supported"),
    EXPANSE_E(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC,
              "the provided code uses unsupported device-side synchronization"),
    EXPANSE_E(CUDA_ERROR_CONTAINED, "an exception was contained"),
    EXPANSE_E(CUDA_ERROR_INVALID_SOURCE, "device kernel image is invalid"),
    EXPANSE_E(CUDA_ERROR_FILE_NOT_FOUND, "file not found"),
    EXPANSE_E(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "shared object symbol not found"),
    EXPANSE_E(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "shared object initialization failed"),
    EXPANSE_E(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS"),
    EXPANSE_E(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    EXPANSE_E(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"),
    EXPANSE_E(CUDA_ERROR_LOSSY_QUERY, "attempted introspection would be semantically lossy"),
    EXPANSE_E(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    EXPANSE_E(CUDA_ERROR_NOT_READY, "device not ready"),
    EXPANSE_E(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    EXPANSE_E(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch"),
    EXPANSE_E(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated"),
    EXPANSE_E(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, "launch uses incompatible texturing mode"),
    EXPANSE_E(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled"),
    EXPANSE_E(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled"),
    EXPANSE_E(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,
              "cannot set while device is active in this process"),
    EXPANSE_E(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    EXPANSE_E(CUDA_ERROR_ASSERT, "device-side assert triggered"),
    EXPANSE_E(CUDA_ERROR_TOO_MANY_PEERS, "peer mapping resources exhausted"),
    EXPANSE_E(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
              "part or all of the requested memory range is already mapped"),
    EXPANSE_E(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
              "pointer does not correspond to a registered memory region"),
    EXPANSE_E(CUDA_ERROR_HARDWARE_STACK_ERROR, "hardware stack error"),
    EXPANSE_E(CUDA_ERROR_ILLEGAL_INSTRUCTION, "an illegal instruction was encountered"),
    EXPANSE_E(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address"),
    EXPANSE_E(CUDA_ERROR_INVALID_ADDRESS_SPACE,
              "operation not supported on global/shared address space"),
    EXPANSE_E(CUDA_ERROR_INVALID_PC, "invalid program counter"),
    EXPANSE_E(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    EXPANSE_E(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "too many blocks in cooperative launch"),
    EXPANSE_E(CUDA_ERROR_TENSOR_MEMORY_LEAK, "tensor memory not completely freed"),
    EXPANSE_E(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    EXPANSE_E(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    EXPANSE_E(CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized"),
    EXPANSE_E(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
              "system has unsupported display driver / cuda driver combination"),
    EXPANSE_E(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
              "forward compatibility was attempted on non supported HW"),
    EXPANSE_E(CUDA_ERROR_MPS_CONNECTION_FAILED,
              "MPS client failed to connect to the MPS control daemon or the MPS server"),
    EXPANSE_E(CUDA_ERROR_MPS_RPC_FAILURE,
              "the remote procedural call between the MPS server and the MPS client failed"),
    EXPANSE_E(CUDA_ERROR_MPS_SERVER_NOT_READY,
              "MPS server is not ready to accept new MPS client requests"),
    EXPANSE_E(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED,
              "the hardware resources required to create MPS client have been exhausted"),
    EXPANSE_E(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED,
              "the hardware resources required to support device connections have been exhausted"),
    EXPANSE_E(CUDA_ERROR_MPS_CLIENT_TERMINATED, "the MPS client has been terminated by the server"),
    EXPANSE_E(CUDA_ERROR_CDP_NOT_SUPPORTED,
              "the module is using CUDA Dynamic Parallelism, but the current configuration does "
              "not support it"),
    EXPANSE_E(CUDA_ERROR_CDP_VERSION_MISMATCH, "CUDA Dynamic Parallelism versions do not match"),
    EXPANSE_E(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
              "operation not permitted when stream is capturing"),
    EXPANSE_E(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
              "operation failed due to a previous error during capture"),
    EXPANSE_E(CUDA_ERROR_STREAM_CAPTURE_MERGE,
              "operation would result in a merge of separate capture sequences"),
    EXPANSE_E(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
              "capture was not ended in the same stream as it began"),
    EXPANSE_E(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "capturing stream has unjoined work"),
    EXPANSE_E(CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
              "dependency created on uncaptured work in another stream"),
    EXPANSE_E(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
              "operation would make the legacy stream depend on a capturing blocking stream"),
    EXPANSE_E(CUDA_ERROR_CAPTURED_EVENT,
              "operation not permitted on an event last recorded in a capturing stream"),
    EXPANSE_E(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
              "attempt to terminate a thread-local capture sequence from another thread"),
    EXPANSE_E(CUDA_ERROR_TIMEOUT, "wait operation timed out"),
    EXPANSE_E(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
              "the graph update was not performed because it included changes which violated "
              "constraints specific to instantiated graph update"),
    EXPANSE_E(CUDA_ERROR_EXTERNAL_DEVICE,
              "an async error has occurred in an external entity outside of CUDA"),
    EXPANSE_E(CUDA_ERROR_INVALID_CLUSTER_SIZE,
              "a kernel launch error has occurred due to cluster misconfiguration"),
    EXPANSE_E(
        CUDA_ERROR_FUNCTION_NOT_LOADED,
        "the function handle is not loaded when calling an API that requires a loaded function"),
    EXPANSE_E(CUDA_ERROR_INVALID_RESOURCE_TYPE,
              "one or more resources passed in are not valid resource types for the operation"),
    EXPANSE_E(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
              "one or more resources are insufficient or non-applicable for the operation"),
    EXPANSE_E(CUDA_ERROR_KEY_ROTATION, "an error occurred during the key rotation sequence"),
    EXPANSE_E(CUDA_ERROR_UNKNOWN, "unknown error"),
};
#undef EXPANSE_E

const ErrorInfo* find(int code) noexcept {
  for (const auto& e : kErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

}  // namespace

const char* error_name(int code) noexcept {
  const ErrorInfo* e = find(code);
  return e == nullptr ? nullptr : e->name;
}

const char* error_string(int code) noexcept {
  const ErrorInfo* e = find(code);
  return e == nullptr ? nullptr : e->text;
}

}  // namespace expanse::driver
