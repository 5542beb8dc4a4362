/* A C99 program (-Wpedantic) on expanse.h: the stats struct made from expanse/stats_fields.h
 * compiles as C, and the list walks the fields in the library's order, printing each by name
 * with its meaning, as a C program that reports all of the stats can. */
#include <expanse/expanse.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;
static int index_ = 0;

/* The next field in the header's order must be the library's next field. */
static void expect_next(const char* name) {
  const char* listed = expanse_stats_field_name(index_);
  if (listed == NULL || strcmp(listed, name) != 0) {
    fprintf(stderr, "field %d: the header says %s, the library %s\n", index_, name,
            listed == NULL ? "(nothing)" : listed);
    ++failures;
  }
  ++index_;
}

static void print_uint64_t(const char* name, uint64_t value, const char* doc) {
  expect_next(name);
  printf("%-26s %20" PRIu64 "  %s\n", name, value, doc);
}
static void print_uint32_t(const char* name, uint32_t value, const char* doc) {
  print_uint64_t(name, value, doc);
}
static void print_size_t(const char* name, size_t value, const char* doc) {
  print_uint64_t(name, (uint64_t)value, doc);
}
static void print_double(const char* name, double value, const char* doc) {
  expect_next(name);
  printf("%-26s %20.9g  %s\n", name, value, doc);
}
static void print_uint64_t_array(const char* name, const uint64_t* values, int length,
                                 const char* doc) {
  int i;
  expect_next(name);
  printf("%-26s %20s  %s\n", name, "", doc);
  for (i = 0; i < length; ++i) {
    if (values[i] != 0) printf("  %-24s %20" PRIu64 "\n", expanse_entry_point_name(i), values[i]);
  }
}

int main(void) {
  expanse_stats s;
  void* p;
  if (expanse_init("driver:sim,sim_capacity:64MiB") != EXPANSE_OK) {
    fprintf(stderr, "expanse_init: %s\n", expanse_last_error());
    return 1;
  }
  p = expanse_malloc(1 << 20, 0, NULL);
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  if (p == NULL || expanse_get_stats(0, &s) != EXPANSE_OK) {
    fprintf(stderr, "expanse: %s\n", expanse_last_error());
    return 1;
  }
#define PRINT_FIELD(type, name, doc) print_##type(#name, s.name, doc);
#define PRINT_ARRAY(type, name, length, doc) \
  print_##type##_array(#name, s.name, (int)s.num_entry_points, doc);
  EXPANSE_STATS_FIELDS(PRINT_FIELD, PRINT_FIELD, PRINT_ARRAY)
#undef PRINT_FIELD
#undef PRINT_ARRAY
  if (expanse_stats_field_name(index_) != NULL) {
    fprintf(stderr, "the library lists more fields than the header\n");
    ++failures;
  }
  if (s.struct_size != sizeof s || s.requested_bytes != 1 << 20 || s.live_blocks != 1) {
    fprintf(stderr, "unexpected stats\n");
    ++failures;
  }
  expanse_free(p, 1 << 20, 0, NULL);
  if (expanse_shutdown() != EXPANSE_OK) ++failures;
  printf(failures == 0 ? "ok\n" : "FAILED\n");
  return failures == 0 ? 0 : 1;
}
