#include "selftest_env.hpp"

#include "conf/env_config.hpp"

namespace expanse::tools::selftest {

using driver::EntryPoint;

Env::Env(const driver::LoadedDriver& d, int ord) : t(d.table()), drv(d), ordinal(ord) {
  drv.check(t.device_get(&dev, ordinal), EntryPoint::device_get);
  const CUmemAllocationProp p = prop();
  drv.check(t.mem_get_allocation_granularity(&granularity, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            EntryPoint::mem_get_allocation_granularity);
  drv.check(t.device_primary_ctx_retain(&ctx, dev), EntryPoint::device_primary_ctx_retain);
}

Env::~Env() { t.device_primary_ctx_release(dev); }

std::string Env::code_name(CUresult r) const {
  const char* name = nullptr;
  if (t.get_error_name(r, &name) == CUDA_SUCCESS && name != nullptr) return name;
  return "CUresult " + std::to_string(static_cast<int>(r));
}

void Env::ok(CUresult r, const std::string& what) const {
  if (r != CUDA_SUCCESS) throw Failed{what + " failed: " + code_name(r)};
}

void Env::expect_code(CUresult r, CUresult want, const std::string& what) const {
  if (r != want) throw Failed{what + " returned " + code_name(r) + ", expected " + code_name(want)};
}

void Env::require(bool cond, const std::string& message) {
  if (!cond) throw Failed{message};
}

CUmemAllocationProp Env::prop() const {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = ordinal;
  return p;
}

CUmemLocation Env::location() const {
  CUmemLocation l{};
  l.type = CU_MEM_LOCATION_TYPE_DEVICE;
  l.id = ordinal;
  return l;
}

CUmemAccessDesc Env::read_write() const {
  CUmemAccessDesc d{};
  d.location = location();
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return d;
}

size_t Env::free_bytes() const {
  size_t free = 0, total = 0;
  ok(t.mem_get_info(&free, &total), "cuMemGetInfo");
  return free;
}

Current::Current(const Env& e) : e_(e) { e_.ok(e_.t.ctx_push_current(e_.ctx), "cuCtxPushCurrent"); }

Current::~Current() {
  CUcontext popped = nullptr;
  e_.t.ctx_pop_current(&popped);
}

Va::Va(const Env& e, size_t size, size_t alignment) : e_(e), size_(size) {
  e_.ok(e_.t.mem_address_reserve(&base_, size, alignment, 0, 0),
        "cuMemAddressReserve(" + conf::format_size(size) + ")");
}

Va::~Va() {
  if (base_ != 0) e_.t.mem_address_free(base_, size_);
}

CUresult Va::free() {
  const CUresult r = e_.t.mem_address_free(base_, size_);
  if (r == CUDA_SUCCESS) base_ = 0;
  return r;
}

Handle::Handle(const Env& e, size_t size) : e_(e), size_(size) {
  const CUmemAllocationProp p = e_.prop();
  e_.ok(e_.t.mem_create(&h_, size, &p, 0), "cuMemCreate(" + conf::format_size(size) + ")");
  held_ = true;
}

Handle::~Handle() {
  if (held_) e_.t.mem_release(h_);
}

CUresult Handle::release() {
  const CUresult r = e_.t.mem_release(h_);
  if (r == CUDA_SUCCESS) held_ = false;
  return r;
}

Mapping::Mapping(const Env& e, CUdeviceptr ptr, const Handle& h)
    : e_(e), ptr_(ptr), size_(h.size()) {
  e_.ok(e_.t.mem_map(ptr, size_, 0, h.get(), 0), "cuMemMap(" + conf::format_size(size_) + ")");
  mapped_ = true;
}

Mapping::~Mapping() {
  if (mapped_) e_.t.mem_unmap(ptr_, size_);
}

void Mapping::grant() const {
  const CUmemAccessDesc d = e_.read_write();
  e_.ok(e_.t.mem_set_access(ptr_, size_, &d, 1), "cuMemSetAccess(" + conf::format_size(size_) + ")");
}

CUresult Mapping::unmap() {
  const CUresult r = e_.t.mem_unmap(ptr_, size_);
  if (r == CUDA_SUCCESS) mapped_ = false;
  return r;
}

}  // namespace expanse::tools::selftest
