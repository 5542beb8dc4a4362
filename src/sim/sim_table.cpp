// The in-process sim's driver table: every entry point, as driver/ and the tests see it.
#include "sim/sim.hpp"
#include "sim/sim_entry.hpp"

namespace expanse::sim {

// ---- the table ----------------------------------------------------------------------------------

const driver::DriverTable& table() {
  static const driver::DriverTable t = [] {
    driver::DriverTable d;
    d.get_error_name = &sim_get_error_name;
    d.get_error_string = &sim_get_error_string;
    d.init = &sim_init;
    d.driver_get_version = &sim_driver_get_version;
    d.device_get = &sim_device_get;
    d.device_get_count = &sim_device_get_count;
    d.device_get_attribute = &sim_device_get_attribute;
    d.device_get_name = &sim_device_get_name;
    d.device_total_mem = &sim_device_total_mem;
    d.device_primary_ctx_retain = &sim_device_primary_ctx_retain;
    d.device_primary_ctx_release = &sim_device_primary_ctx_release;
    d.ctx_get_current = &sim_ctx_get_current;
    d.ctx_set_current = &sim_ctx_set_current;
    d.ctx_push_current = &sim_ctx_push_current;
    d.ctx_pop_current = &sim_ctx_pop_current;
    d.ctx_synchronize = &sim_ctx_synchronize;
    d.mem_get_info = &sim_mem_get_info;
    d.mem_address_reserve = &sim_mem_address_reserve;
    d.mem_address_free = &sim_mem_address_free;
    d.mem_create = &sim_mem_create;
    d.mem_release = &sim_mem_release;
    d.mem_map = &sim_mem_map;
    d.mem_unmap = &sim_mem_unmap;
    d.mem_set_access = &sim_mem_set_access;
    d.mem_get_access = &sim_mem_get_access;
    d.mem_get_allocation_granularity = &sim_mem_get_allocation_granularity;
    d.mem_get_allocation_properties_from_handle = &sim_mem_get_allocation_properties_from_handle;
    d.mem_retain_allocation_handle = &sim_mem_retain_allocation_handle;
    d.stream_create = &sim_stream_create;
    d.stream_destroy = &sim_stream_destroy;
    d.stream_synchronize = &sim_stream_synchronize;
    d.stream_query = &sim_stream_query;
    d.stream_wait_event = &sim_stream_wait_event;
    d.event_create = &sim_event_create;
    d.event_destroy = &sim_event_destroy;
    d.event_record = &sim_event_record;
    d.event_query = &sim_event_query;
    d.event_synchronize = &sim_event_synchronize;
    d.memcpy_htod = &sim_memcpy_htod;
    d.memcpy_dtoh = &sim_memcpy_dtoh;
    d.stream_get_ctx = &sim_stream_get_ctx;
    d.stream_get_id = &sim_stream_get_id;
    d.stream_get_flags = &sim_stream_get_flags;
    d.stream_get_device = &sim_stream_get_device;
    d.stream_begin_capture = &sim_stream_begin_capture;
    d.stream_end_capture = &sim_stream_end_capture;
    d.stream_is_capturing = &sim_stream_is_capturing;
    d.stream_get_capture_info = &sim_stream_get_capture_info;
    d.thread_exchange_stream_capture_mode = &sim_thread_exchange_stream_capture_mode;
    d.graph_destroy = &sim_graph_destroy;
    d.device_can_access_peer = &sim_device_can_access_peer;
    d.ctx_get_device = &sim_ctx_get_device;
    d.ctx_get_id = &sim_ctx_get_id;
    return d;
  }();
  return t;
}

}  // namespace expanse::sim
