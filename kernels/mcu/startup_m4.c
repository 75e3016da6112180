/* Cortex-M4 start-up for port-rt on the MPS2 AN386 under qemu-system-arm: vector table, FPU on, .bss zeroed,
 * then newlib's semihosting C runtime (rdimon) runs main and exits through semihosting. */
#include <stdint.h>

extern uint32_t __bss_start__, __bss_end__, __stack_top;
extern void _start(void);      /* newlib rdimon crt0: initialises the C library, calls main, then exit */

void reset_handler(void) {
    volatile uint32_t *cpacr = (volatile uint32_t *)0xE000ED88u;
    *cpacr |= 0xFu << 20;                              /* CP10, CP11: full access (the FPU) */
    __asm volatile("dsb\n isb");
    for (uint32_t *p = &__bss_start__; p < &__bss_end__; p++) *p = 0;
    _start();
    for (;;) {}
}

static void fault(void) { for (;;) {} }

__attribute__((section(".vectors"), used)) static const void *const vectors[16] = {
    &__stack_top, (const void *)reset_handler, (const void *)fault, (const void *)fault,
    (const void *)fault, (const void *)fault, (const void *)fault, 0, 0, 0, 0,
    (const void *)fault, (const void *)fault, 0, (const void *)fault, (const void *)fault};
