/* Forced into every llama.cpp source by bench/vs-llamacpp (-include), on
 * every machine (where llama.cpp compiles no AMX code, nothing uses it). gcc 12's `_tile_loadconfig` tells the compiler it reads 8
 * bytes, so the stores filling the 64-byte tile configuration are dropped and
 * the first tile instruction faults (shared ANCHORS.md). This declares the
 * whole 64-byte read instead. */
#ifndef SPINDLE_LLAMA_AMX_FIX_H
#define SPINDLE_LLAMA_AMX_FIX_H
#include <immintrin.h>
typedef struct { char bytes[64]; } spindle_tile_config_bytes;
static inline void spindle_tile_loadconfig(const void *config) {
    __asm__ volatile("ldtilecfg %0" ::"m"(*(const spindle_tile_config_bytes *)config));
}
#define _tile_loadconfig(config) spindle_tile_loadconfig(config)
#endif
