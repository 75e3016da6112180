/* port-rt on a Cortex-M4 with no OS and no malloc: the bundle and a few real samples are compiled in
 * (`port compile --emit-c`: port_bundle.c, port_data.c), the arena is a static array, losses go out through
 * semihosting.  Prints one line per step ("step I loss L bits 0xXXXXXXXX") and the sizes. */
#include <stdio.h>
#include <string.h>

#include "port_rt.h"
#include "port_bundle.h"   /* PORT_ARENA_BYTES, PORT_BATCH, PORT_BATCH_FLOATS (written by port compile --emit-c) */

extern const uint8_t port_bundle[];
extern const uint64_t port_bundle_bytes;
extern const float port_data_x[];
extern const int64_t port_data_y[];
extern const int64_t port_data_n, port_data_sample_floats;
#ifndef PORT_STEPS
#define PORT_STEPS 10
#endif

static uint8_t arena[PORT_ARENA_BYTES] __attribute__((aligned(64)));
static float xb[PORT_BATCH_FLOATS];
static int64_t yb[PORT_BATCH];

int main(void) {
    port_rt rt;
    int st = port_rt_load(&rt, port_bundle, port_bundle_bytes, arena, sizeof arena);
    if (st != PORT_OK) {
        printf("error: port_rt_load status %d\n", st);
        return 2;
    }
    int64_t B = rt.batch, F = port_data_sample_floats;
    for (int s = 0; s < PORT_STEPS; s++) {
        for (int64_t j = 0; j < B; j++) {
            int64_t k = ((int64_t)s * B + j) % port_data_n;
            memcpy(xb + j * F, port_data_x + k * F, (size_t)F * 4);
            yb[j] = port_data_y[k];
        }
        float loss = 0.0f;
        st = port_rt_step(&rt, xb, yb, &loss);
        if (st != PORT_OK) {
            printf("error: step %d status %d (call %d)\n", s, st, (int)rt.failed_call);
            return 1;
        }
        uint32_t bits;
        memcpy(&bits, &loss, 4);
        printf("step %lld loss %.9g bits 0x%08lx\n", (long long)rt.state.step, (double)loss, (unsigned long)bits);
    }
    printf("summary arena_bytes %lu bundle_bytes %lu\n", (unsigned long)sizeof arena, (unsigned long)port_bundle_bytes);
    return 0;
}
