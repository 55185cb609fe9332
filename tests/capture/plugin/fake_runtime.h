/* fake_runtime.h -- see fake_runtime.c. */
#ifndef FAKE_RUNTIME_H
#define FAKE_RUNTIME_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

extern __thread bool mango_capture_active __attribute__((tls_model("initial-exec")));
void mango_capture(const void *addr, size_t len);

#define FR_MAX_RANGES (1u << 20)
typedef struct fr_range {
    uintptr_t addr;
    size_t len;
} fr_range;
extern fr_range fr_ranges[FR_MAX_RANGES];
extern size_t fr_count;
extern size_t fr_dropped;

typedef struct fr_region {
    const char *name;
    void *base;
    size_t len;
    void *before;
} fr_region;

/* Out of line on purpose: a call ends the plugin's check-coalescing segment,
 * as the real runtime's batch boundaries do. */
void fr_set_active(bool on);
void fr_reset(void);
void fr_sink(void *p);               /* makes p escape */
void fr_snapshot(fr_region *r);
/* Changed bytes of r not covered by a recorded range (prints the first few). */
size_t fr_uncovered(const fr_region *r, const char *what);
/* Does any recorded range touch [p, p+len)? */
bool fr_intersects(const void *p, size_t len);

#ifdef __cplusplus
}
#endif
#endif
