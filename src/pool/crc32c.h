/* crc32c.h -- CRC-32C (Castagnoli) used by every checksummed on-media structure. */
#ifndef MANGO_CRC32C_H
#define MANGO_CRC32C_H
#include <stddef.h>
#include <stdint.h>
/* crc32c(0, buf, n) checksums buf; pass a previous result to continue. */
uint32_t crc32c(uint32_t crc, const void *buf, size_t n);
#endif
