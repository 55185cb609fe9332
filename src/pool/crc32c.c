/* crc32c.c -- CRC-32C: SSE4.2 instruction when the CPU has it, table otherwise. */
#include "pool/crc32c.h"

#include <stdbool.h>
#include <string.h>

static uint32_t table[256];
static bool have_table;
static int use_hw = -1;

static void make_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[i] = c;
    }
    have_table = true;
}

static uint32_t crc_sw(uint32_t crc, const unsigned char *p, size_t n)
{
    if (!have_table)
        make_table();
    while (n--)
        crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}

uint32_t crc32c(uint32_t crc, const void *buf, size_t n)
{
    if (use_hw < 0) {
        __builtin_cpu_init();
        use_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    }
    crc = ~crc;
    crc = use_hw ? crc_hw(crc, buf, n) : crc_sw(crc, buf, n);
    return ~crc;
}
