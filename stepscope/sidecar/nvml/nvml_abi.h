/* What the native sampler and an NVML stand-in share of nvml.h: return codes, clock and sensor
   ids, nvmlFieldValue_t and nvmlMemory_t as the driver lays them out, and a clock read. */
#ifndef STEPSCOPE_NVML_ABI_H
#define STEPSCOPE_NVML_ABI_H

#include <stdint.h>
#include <time.h>

enum { NVML_SUCCESS = 0, NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_FUNCTION_NOT_FOUND = 13 };
enum { NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2 };
enum { NVML_TEMPERATURE_GPU = 0 };

/* nvmlFieldValue_t (nvml.h). */
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType, nvmlReturn;
    union { double d; unsigned int ui; unsigned long ul; unsigned long long ull; long long sll; int si; unsigned short us; } value;
} field_value_t;

typedef struct { unsigned long long total, free, used; } memory_t; /* nvmlMemory_t */

static inline int64_t now_ns(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

#endif
