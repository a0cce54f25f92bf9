/* A simulated GPU node's fast reads as NVML functions (stepscope/testing/nvml/simulated.py's
   reads, over a sim_gpu_t "device"), so that the tests and the benchmarks run the native sampler's
   loop (stepscope/sidecar/nvml/fast_sampler.c) on the same simulated node as the Python tier. A test
   double: built beside simulated.py as _simulated_nvml.so by `make`, never into the sampler the
   image ships.

   Build: cc -O2 -shared -fPIC -I stepscope/sidecar/nvml -o stepscope/testing/nvml/_simulated_nvml.so
          stepscope/testing/nvml/simulated_nvml.c */
#include "nvml_abi.h"

typedef struct {
    double sm_mhz, mem_mhz;
    unsigned long long reasons;
    double nvlink_kib_per_us, pcie_bytes_per_us, ecc_sbe, ecc_dbe;
    int nvlinks;
    int64_t origin_us, step_us, event_us;
    double comm_us;
    double power_w, temperature_c;
    unsigned long long memory_used_bytes;
} sim_gpu_t;

int ss_sim_power(void *device, unsigned int *milliwatts) {
    *milliwatts = (unsigned int)(((const sim_gpu_t *)device)->power_w * 1000.0 + 0.5);
    return NVML_SUCCESS;
}

int ss_sim_temperature(void *device, unsigned int sensor, unsigned int *celsius) {
    (void)sensor;
    *celsius = (unsigned int)((const sim_gpu_t *)device)->temperature_c;
    return NVML_SUCCESS;
}

int ss_sim_memory_info(void *device, memory_t *memory) {
    memory->used = ((const sim_gpu_t *)device)->memory_used_bytes;
    memory->total = memory->used * 2;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

int ss_sim_clock_info(void *device, unsigned int type, unsigned int *mhz) {
    const sim_gpu_t *g = device;
    *mhz = (unsigned int)(type == NVML_CLOCK_SM ? g->sm_mhz : g->mem_mhz);
    return NVML_SUCCESS;
}

int ss_sim_reasons(void *device, unsigned long long *reasons) {
    *reasons = ((const sim_gpu_t *)device)->reasons;
    return NVML_SUCCESS;
}

int ss_sim_field_values(void *device, int count, field_value_t *values) {
    const sim_gpu_t *g = device;
    int64_t now = now_ns(CLOCK_REALTIME) / 1000, since = now > g->origin_us ? now - g->origin_us : 0;
    /* Time spent communicating since the origin: the last comm_us of every step. */
    double compute_us = g->step_us - g->comm_us, within = (double)(since % g->step_us);
    double comm = (double)(since / g->step_us) * g->comm_us + (within > compute_us ? within - compute_us : 0.0);
    int due = now >= g->event_us;
    for (int i = 0; i < count; i++) {
        field_value_t *v = &values[i];
        v->nvmlReturn = NVML_SUCCESS;
        v->valueType = 3; /* unsigned long long */
        switch (v->fieldId) {
        case 197: case 198: /* PCIe tx, rx: 32-bit counters that wrap, as a real GPU's */
            v->value.ull = (unsigned long long)(comm * g->pcie_bytes_per_us) % 4294967296ULL;
            break;
        case 3: v->value.ull = due ? (unsigned long long)g->ecc_sbe : 0; break;
        case 4: v->value.ull = due ? (unsigned long long)g->ecc_dbe : 0; break;
        case 138: case 139: /* NVLink tx, rx of link scopeId */
            if ((int)v->scopeId < g->nvlinks) {
                v->value.ull = (unsigned long long)(comm * g->nvlink_kib_per_us);
                break;
            }
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            break;
        default: v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}
