/*
 * fakenvml.c - a scripted stand-in for NVIDIA's libnvidia-ml.so.1, for gpumon's tests.
 *
 * The unmodified pynvml module loads this library and calls it through ctypes, so what is
 * exercised is the real binding code: symbol names, struct layouts, size-query protocols and
 * error codes.  The GPUs it reports come from a scenario file (path in $FAKE_NVML_SCENARIO),
 * read at nvmlInit and re-read when the file changes (stat at most every ~10 ms).
 *
 * Scenario format (written by tests/fakenvml/__init__.py): one "key=value" per line; global
 * keys first, then one "[gpu]" line per GPU followed by that GPU's keys.  '#' starts a comment.
 *   global: driver_version nvml_version cuda_version init_error timestamp_clock epoch
 *           epoch_align timestamp_offset_s (seconds added to the timestamp clock: rewrite
 *           it to step the clock, as NTP or a resumed VM does)
 *           unsupported=<call,...> error=<call>=<ERROR_NAME> (repeatable)
 *   [gpu]:  uuid name bus_id serial mem_total mem_used mem_reserved power_limit_w
 *           power_idle_w power_busy_w sm_clock_mhz sm_clock_idle_mhz temperature_c fan_pct
 *           pcie_rx_kbps pcie_tx_kbps sample_period_s buffer_len idle_no_samples
 *           samples_supported pattern=steady|burst|off busy_pct idle_pct period_s duty phase_s
 *           noise_pct mem_busy_pct clock_reasons lost process=<pid>,<bytes>,<sm%|-1>,<mem%>
 *           gpm_supported gpm_sm_active_pct gpm_sm_occupancy_pct gpm_tensor_active_pct
 *           gpm_dram_active_pct gpm_fp64_active_pct gpm_fp32_active_pct gpm_fp16_active_pct
 *           mig_instance=<gpu instance id>,<sm%>,<occupancy%>,<tensor%> (repeatable; any
 *           makes MIG enabled) unsupported=... error=... (see gpu_set for the rest)
 *           memory_temperature_c ecc_corrected ecc_uncorrected ecc_corrected_aggregate
 *           ecc_uncorrected_aggregate pcie_replays nvlink_links nvlink_tx_kbps nvlink_rx_kbps
 *           xid=<CLOCK_MONOTONIC seconds>,<code> (repeatable: an XID critical error then)
 *           encoder_pct decoder_pct remapped_rows_corrected remapped_rows_uncorrected
 *           row_remap_pending row_remap_failed
 *           driven=<file>: activity written by real processes (see "driven GPUs" below)
 *
 * Time model: every utilisation pattern is a function of CLOCK_MONOTONIC seconds since the
 * scenario's epoch.  Driver samples sit at multiples of sample_period on the chosen timestamp
 * clock (realtime, monotonic or boottime, in microseconds); each one is the busy fraction of
 * the period that ended at its timestamp, integrated exactly over the pattern.  With
 * epoch_align=1 the epoch is snapped back onto each GPU's sample grid.  When the same file is
 * rewritten, a GPU's old pattern still describes the time before the new epoch (samples not yet
 * read keep the past), and an unchanged pattern with epoch_align=1 keeps its old epoch.
 *
 * GPM (Hopper's counters): a sample records the CLOCK_MONOTONIC time it was taken; the metrics
 * of two samples are the pattern's busy fraction between them times the GPU's (or the MIG
 * instance's) percentage while busy, so a steady 100 % pattern with gpm_sm_active_pct=2 is a
 * GPU that reads busy while its SMs idle (a collective spinning).  A negative percentage makes
 * that metric NOT_SUPPORTED.  With MIG enabled the whole-GPU sample is NOT_SUPPORTED and each
 * GPU instance is read with nvmlGpmMigSampleGet (SM activity, occupancy and tensor activity
 * only: an instance's DRAM and FP pipe metrics are NOT_SUPPORTED here).
 *
 * Events: an event set (nvmlEventSetCreate) delivers, through nvmlEventSetWait_v2, the XID
 * critical errors of the GPUs registered on it whose scripted time lies after the registration
 * and has passed, oldest first, each once per set.  XID times are absolute CLOCK_MONOTONIC
 * seconds, so rewriting the scenario with the same errors delivers nothing twice.
 *
 * Threads: readers never lock; a reload swaps a pointer and frees old scenarios 32 reloads
 * later.  The file is re-stat()ed at most every 10 ms (CLOCK_MONOTONIC_COARSE check).
 *
 * Build: gcc -shared -fPIC -O2 -Wall -Wextra -Wl,-soname,libnvidia-ml.so.1 \
 *            -o libnvidia-ml.so.1 fakenvml.c -lm
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#define API __attribute__((visibility("default")))

/* ------------------------------------------------------------------ NVML types */
typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NO_PERMISSION = 4, NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_TIMEOUT = 10, NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12, NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14, NVML_ERROR_GPU_IS_LOST = 15, NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17, NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19, NVML_ERROR_MEMORY = 20, NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22, NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24, NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26, NVML_ERROR_NOT_READY = 27, NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29, NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30,
    NVML_ERROR_UNKNOWN = 999
};

#define NVML_STRUCT_VERSION(s, v) ((unsigned int)(sizeof(s) | ((v) << 24U)))
#define NVML_VALUE_NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFULL

typedef struct nvmlDevice_st {
    int index;
} *nvmlDevice_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned long long timeStamp;
    nvmlValue_t sampleValue;
} nvmlSample_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { /* the original (v1) layout used by the unversioned symbols */
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct { /* v2 and v3 share this layout */
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    unsigned long long timeStamp;
    unsigned int pid, smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil;
} nvmlProcessUtilizationInfo_v1_t;

typedef struct {
    unsigned int version;
    unsigned int processSamplesCount;
    unsigned long long lastSeenTimeStamp;
    nvmlProcessUtilizationInfo_v1_t *procUtilArray;
} nvmlProcessesUtilizationInfo_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct {
    unsigned int version;
    int sensorType;
    int temperature;
} nvmlTemperature_t;

typedef struct {
    unsigned long long bar1Total, bar1Free, bar1Used;
} nvmlBAR1Memory_t;

typedef struct {
    unsigned int version, isSupportedDevice;
} nvmlGpmSupport_t;

typedef struct {
    unsigned int version, fan, speed;
} nvmlFanSpeedInfo_t;

/* nvmlEventData_t as nvmlEventSetWait_v2 fills it (the legacy nvmlEventSetWait fills the
 * first three members only). */
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

#define NVML_EVENT_TYPE_SINGLE_BIT_ECC 0x1ULL
#define NVML_EVENT_TYPE_DOUBLE_BIT_ECC 0x2ULL
#define NVML_EVENT_TYPE_PSTATE 0x4ULL
#define NVML_EVENT_TYPE_XID 0x8ULL
#define NVML_EVENT_TYPE_CLOCK 0x10ULL
#define SUPPORTED_EVENT_TYPES                                                                 \
    (NVML_EVENT_TYPE_SINGLE_BIT_ECC | NVML_EVENT_TYPE_DOUBLE_BIT_ECC | NVML_EVENT_TYPE_PSTATE | \
     NVML_EVENT_TYPE_XID | NVML_EVENT_TYPE_CLOCK)

/* GPM: an opaque sample (the fake's own content) and the metrics request. */
typedef struct nvmlGpmSample_st {
    unsigned int magic;
    int gpu;        /* index of the GPU it was taken on; -1: never filled */
    int gi;         /* MIG GPU instance id; -1: the whole GPU */
    double t;       /* CLOCK_MONOTONIC seconds when taken */
} *nvmlGpmSample_t;

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct {
        char *shortName, *longName, *unit;
    } metricInfo;
} nvmlGpmMetric_t;

/* metrics[] has NVML_GPM_METRIC_MAX entries in nvml.h; only numMetrics are touched here, so
 * any binding's maximum fits. */
typedef struct {
    unsigned int version, numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[];
} nvmlGpmMetricsGet_t;

/* ------------------------------------------------------------------ scenario model */
#define MAX_GPUS 64
#define MAX_PROCS 64
#define MAX_MIG 8 /* MIG devices per GPU (an H100 has at most 7) */
#define MAX_XIDS 64 /* scripted XID errors per GPU */
#define STR_LEN 96
enum {
    GPM_SM_ACTIVE = 0,
    GPM_SM_OCCUPANCY = 1,
    GPM_TENSOR_ACTIVE = 2,
    GPM_DRAM_ACTIVE = 3, /* NVML_GPM_METRIC_DRAM_BW_UTIL */
    GPM_FP64_ACTIVE = 4,
    GPM_FP32_ACTIVE = 5,
    GPM_FP16_ACTIVE = 6,
    N_GPM = 7
};

/* Short call names: the keys of "unsupported" and "error" in the scenario. */
#define CALL_LIST(X)                                                                       \
    X(HANDLE, "handle") X(UUID, "uuid") X(NAME, "name") X(PCI, "pci") X(INDEX, "index")     \
    X(SERIAL, "serial") X(MINOR, "minor") X(BRAND, "brand") X(UTILIZATION, "utilization")   \
    X(SAMPLES, "samples") X(MEMORY, "memory") X(POWER, "power") X(POWER_LIMIT, "power_limit") \
    X(ENERGY, "energy") X(CLOCKS, "clocks") X(CLOCK_REASONS, "clock_reasons") X(PCIE, "pcie") \
    X(TEMPERATURE, "temperature") X(FAN, "fan") X(PSTATE, "pstate")                          \
    X(PROCESSES, "processes") X(PROCESS_UTILIZATION, "process_utilization")                   \
    X(PERSISTENCE, "persistence") X(COMPUTE_MODE, "compute_mode") X(MIG, "mig")              \
    X(DISPLAY, "display") X(ECC, "ecc") X(FIELD_VALUES, "field_values") X(GPM, "gpm")        \
    X(MISC, "misc") X(COUNT, "count") X(DRIVER_VERSION, "driver_version")                    \
    X(NVML_VERSION, "nvml_version") X(CUDA_VERSION, "cuda_version")                          \
    X(PROCESS_NAME, "process_name") X(MEMORY_TEMPERATURE, "memory_temperature")               \
    X(PCIE_REPLAY, "pcie_replay") X(NVLINK, "nvlink") X(EVENTS, "events")                    \
    X(ENCODER, "encoder") X(DECODER, "decoder") X(REMAPPED_ROWS, "remapped_rows")

#define X_ENUM(id, s) C_##id,
enum call_id { CALL_LIST(X_ENUM) N_CALLS };
#define X_NAME(id, s) s,
static const char *const call_names[N_CALLS] = {CALL_LIST(X_NAME)};

enum { PAT_STEADY = 0, PAT_BURST = 1, PAT_OFF = 2 };
enum { TS_REALTIME = 0, TS_MONOTONIC = 1, TS_BOOTTIME = 2 };

typedef struct {
    unsigned int pid;
    unsigned long long mem;
    int sm;     /* -1: follow the GPU's utilisation */
    int memutil;
} proc_t;

/* A utilisation pattern; `epoch` is its origin in CLOCK_MONOTONIC seconds. */
typedef struct {
    int kind;
    double busy_pct, idle_pct, period_s, duty, phase_s, noise_pct, epoch;
} pat_t;

typedef struct {
    char uuid[STR_LEN], name[STR_LEN], bus_id[32], serial[32], vbios[32];
    unsigned int pci_domain, pci_bus, pci_dev, pci_func, pci_device_id, pci_subsys_id;
    unsigned int minor, brand, arch, cc_major, cc_minor, bus_width, cores;
    unsigned long long mem_total, mem_used, mem_reserved;
    double power_limit_w, power_min_limit_w, power_idle_w, power_busy_w;
    unsigned int sm_clock_mhz, sm_clock_idle_mhz, sm_clock_max_mhz, mem_clock_mhz;
    int temperature_c;
    unsigned int fan_pct, pcie_rx_kbps, pcie_tx_kbps, pcie_gen, pcie_width, pstate_idle;
    unsigned int persistence, compute_mode;
    double sample_period_s;
    int buffer_len, idle_no_samples, samples_supported, lost;
    pat_t pat;      /* the scenario's pattern (epoch maybe snapped to the sample grid) */
    pat_t prev;     /* after a rewrite: the pattern that ran before switch_t */
    int has_prev;
    double switch_t;
    double mem_busy_pct;
    unsigned long long clock_reasons;
    int err[N_CALLS];
    int nproc;
    proc_t procs[MAX_PROCS];
    int gpm_supported;
    double gpm_pct[N_GPM]; /* while busy; < 0: that metric is NOT_SUPPORTED */
    int nmig;              /* > 0: MIG enabled, with these GPU instances */
    struct {
        unsigned int gi;
        double pct[N_GPM];
    } mig[MAX_MIG];
    int memory_temperature_c;
    unsigned long long ecc[4]; /* corrected, uncorrected (volatile); the same, aggregate */
    unsigned int pcie_replays, nvlink_links, nvlink_tx_kbps, nvlink_rx_kbps;
    unsigned int encoder_pct, decoder_pct;
    unsigned int remap_corrected, remap_uncorrected, remap_pending, remap_failed;
    int nxid;
    struct {
        double t; /* CLOCK_MONOTONIC seconds */
        unsigned long long code;
    } xid[MAX_XIDS];
    char driven[256]; /* non-empty: activity written by processes into this file (live lab) */
} gpu_t;

typedef struct {
    char driver_version[80], nvml_version[80];
    int cuda_version, init_error, ts_clock, epoch_align;
    long long ts_offset_us; /* added to the timestamp clock: a step of it, as NTP makes */
    double epoch;
    int err[N_CALLS];
    int ngpu;
    gpu_t gpus[MAX_GPUS];
} scn_t;

/* ------------------------------------------------------------------ global state */
static struct nvmlDevice_st g_handles[MAX_GPUS];
static struct nvmlDevice_st g_mig_handles[MAX_GPUS * MAX_MIG];
static atomic_llong g_calls[N_CALLS]; /* calls per call name, for tests (fakenvml_calls) */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;      /* init, reload */
static pthread_mutex_t g_energy_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(scn_t *) g_scn;
static atomic_int g_refcount;
static atomic_llong g_last_check_ns;
static atomic_llong g_generation;
static struct stat g_stat;       /* of the loaded file; guarded by g_lock */
static char g_path[4096];        /* guarded by g_lock */
static char g_loaded_path[4096]; /* the file g_scn came from; guarded by g_lock */
#define RETIRE_RING 32
static scn_t *g_retired[RETIRE_RING]; /* old scenarios are freed late: readers never lock */
static int g_retired_pos;
static double g_lib_t0 = -1.0;   /* CLOCK_MONOTONIC at first init: "driver load" */
static struct {
    double t_last, mj;
    int started;
} g_energy[MAX_GPUS];

/* ------------------------------------------------------------------ helpers */
static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long long clock_us(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

static long long ts_now_us(int which) {
    switch (which) {
    case TS_MONOTONIC: return clock_us(CLOCK_MONOTONIC);
    case TS_BOOTTIME: return clock_us(CLOCK_BOOTTIME);
    default: return clock_us(CLOCK_REALTIME);
    }
}

/* The scenario's timestamp clock, with its offset (timestamp_offset_s: a clock stepped). */
static long long scn_ts_us(const scn_t *s) { return ts_now_us(s->ts_clock) + s->ts_offset_us; }

static const struct {
    const char *name;
    int code;
    const char *text;
} g_errors[] = {
    {"SUCCESS", 0, "Success"},
    {"UNINITIALIZED", 1, "Uninitialized"},
    {"INVALID_ARGUMENT", 2, "Invalid Argument"},
    {"NOT_SUPPORTED", 3, "Not Supported"},
    {"NO_PERMISSION", 4, "Insufficient Permissions"},
    {"ALREADY_INITIALIZED", 5, "Already Initialized"},
    {"NOT_FOUND", 6, "Not Found"},
    {"INSUFFICIENT_SIZE", 7, "Insufficient Size"},
    {"INSUFFICIENT_POWER", 8, "Insufficient External Power"},
    {"DRIVER_NOT_LOADED", 9, "Driver Not Loaded"},
    {"TIMEOUT", 10, "Timeout"},
    {"IRQ_ISSUE", 11, "Interrupt request issue"},
    {"LIBRARY_NOT_FOUND", 12, "NVML Shared Library Not Found"},
    {"FUNCTION_NOT_FOUND", 13, "Function Not Found"},
    {"CORRUPTED_INFOROM", 14, "Corrupted infoROM"},
    {"GPU_IS_LOST", 15, "GPU is lost"},
    {"RESET_REQUIRED", 16, "GPU requires restart"},
    {"OPERATING_SYSTEM", 17, "The operating system has blocked the request."},
    {"LIB_RM_VERSION_MISMATCH", 18, "RM has detected an NVML/RM version mismatch."},
    {"IN_USE", 19, "In use by another client"},
    {"MEMORY", 20, "Insufficient Memory"},
    {"NO_DATA", 21, "No data"},
    {"VGPU_ECC_NOT_SUPPORTED", 22, "ECC is not supported on vGPU"},
    {"INSUFFICIENT_RESOURCES", 23, "Insufficient resources"},
    {"FREQ_NOT_SUPPORTED", 24, "Frequency not supported"},
    {"ARGUMENT_VERSION_MISMATCH", 25, "Argument version mismatch"},
    {"DEPRECATED", 26, "Deprecated"},
    {"NOT_READY", 27, "Not ready"},
    {"GPU_NOT_FOUND", 28, "GPU not found"},
    {"INVALID_STATE", 29, "Invalid state"},
    {"RESET_TYPE_NOT_SUPPORTED", 30, "Reset type not supported"},
    {"UNKNOWN", 999, "Unknown Error"},
};
#define N_ERRORS ((int)(sizeof(g_errors) / sizeof(g_errors[0])))

static int parse_error(const char *s) {
    if (!*s) return 0;
    if (strncasecmp(s, "NVML_ERROR_", 11) == 0) s += 11;
    for (int i = 0; i < N_ERRORS; i++)
        if (strcasecmp(s, g_errors[i].name) == 0) return g_errors[i].code;
    char *end;
    long v = strtol(s, &end, 10);
    if (end != s && *end == '\0') return (int)v;
    return NVML_ERROR_UNKNOWN;
}

static int call_index(const char *s) {
    for (int i = 0; i < N_CALLS; i++)
        if (strcmp(s, call_names[i]) == 0) return i;
    return -1;
}

static void copy_field(char *dst, size_t cap, const char *src) {
    snprintf(dst, cap, "%s", src);
}

static void parse_bus_id(gpu_t *g) {
    unsigned int d = 0, b = 0, dv = 0, f = 0;
    if (sscanf(g->bus_id, "%x:%x:%x.%x", &d, &b, &dv, &f) != 4) {
        d = 0;
        sscanf(g->bus_id, "%x:%x.%x", &b, &dv, &f);
    }
    g->pci_domain = d;
    g->pci_bus = b;
    g->pci_dev = dv;
    g->pci_func = f;
}

static void gpu_defaults(gpu_t *g, int index) {
    memset(g, 0, sizeof(*g));
    snprintf(g->uuid, sizeof g->uuid, "GPU-%08x-0000-4000-8000-%012x", 0xfa4e0000U + index,
             index);
    copy_field(g->name, sizeof g->name, "NVIDIA H100 80GB HBM3");
    snprintf(g->bus_id, sizeof g->bus_id, "00000000:%02X:00.0", 0x17 + index);
    snprintf(g->serial, sizeof g->serial, "16543210%04d", index);
    copy_field(g->vbios, sizeof g->vbios, "96.00.99.00.01");
    g->pci_device_id = 0x233010DE;
    g->pci_subsys_id = 0x16C110DE;
    g->minor = (unsigned int)index;
    g->brand = 14; /* NVML_BRAND_NVIDIA */
    g->arch = 9;   /* Hopper */
    g->cc_major = 9;
    g->bus_width = 5120;
    g->cores = 16896;
    g->mem_total = 85899345920ULL; /* 80 GiB */
    g->mem_used = 536870912ULL;
    g->mem_reserved = 536870912ULL;
    g->power_limit_w = 700;
    g->power_min_limit_w = 200;
    g->power_idle_w = 90;
    g->power_busy_w = 650;
    g->sm_clock_mhz = 1980;
    g->sm_clock_max_mhz = 1980;
    g->mem_clock_mhz = 2619;
    g->temperature_c = 40;
    g->fan_pct = 30;
    g->pcie_gen = 5;
    g->pcie_width = 16;
    g->pstate_idle = 0;
    g->persistence = 1;
    g->sample_period_s = 1.0 / 6.0;
    g->buffer_len = 120;
    g->samples_supported = 1;
    g->pat.kind = PAT_STEADY;
    g->pat.busy_pct = 100;
    g->pat.idle_pct = 0;
    g->mem_busy_pct = 40;
    g->pat.period_s = 1;
    g->pat.duty = 0.5;
    g->gpm_pct[GPM_SM_ACTIVE] = 80;
    g->gpm_pct[GPM_SM_OCCUPANCY] = 40;
    g->gpm_pct[GPM_TENSOR_ACTIVE] = 30;
    g->gpm_pct[GPM_DRAM_ACTIVE] = 50;
    g->gpm_pct[GPM_FP64_ACTIVE] = 10;
    g->gpm_pct[GPM_FP32_ACTIVE] = 20;
    g->gpm_pct[GPM_FP16_ACTIVE] = 5;
    g->memory_temperature_c = 50;
    g->nvlink_links = 18;
    parse_bus_id(g);
}

static void add_errors(int *err, const char *val, int force_code) {
    /* "a,b,c" (force_code != 0) or "name=ERROR" */
    char buf[1024];
    copy_field(buf, sizeof buf, val);
    if (force_code) {
        char *save = NULL;
        for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
            int ci = call_index(tok);
            if (ci >= 0) err[ci] = force_code;
        }
        return;
    }
    char *eq = strchr(buf, '=');
    if (!eq) return;
    *eq = '\0';
    int ci = call_index(buf);
    if (ci >= 0) err[ci] = parse_error(eq + 1);
}

static int parse_bool(const char *v) {
    return strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0 || strcasecmp(v, "yes") == 0;
}

#define KEY(k) (strcmp(key, k) == 0)

static void gpu_set(gpu_t *g, const char *key, const char *v) {
    if (KEY("uuid")) copy_field(g->uuid, sizeof g->uuid, v);
    else if (KEY("name")) copy_field(g->name, sizeof g->name, v);
    else if (KEY("bus_id")) { copy_field(g->bus_id, sizeof g->bus_id, v); parse_bus_id(g); }
    else if (KEY("serial")) copy_field(g->serial, sizeof g->serial, v);
    else if (KEY("vbios")) copy_field(g->vbios, sizeof g->vbios, v);
    else if (KEY("pci_device_id")) g->pci_device_id = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("pci_subsys_id")) g->pci_subsys_id = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("minor")) g->minor = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("brand")) g->brand = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("arch")) g->arch = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("cc_major")) g->cc_major = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("cc_minor")) g->cc_minor = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("mem_total")) g->mem_total = strtoull(v, NULL, 0);
    else if (KEY("mem_used")) g->mem_used = strtoull(v, NULL, 0);
    else if (KEY("mem_reserved")) g->mem_reserved = strtoull(v, NULL, 0);
    else if (KEY("power_limit_w")) g->power_limit_w = strtod(v, NULL);
    else if (KEY("power_min_limit_w")) g->power_min_limit_w = strtod(v, NULL);
    else if (KEY("power_idle_w")) g->power_idle_w = strtod(v, NULL);
    else if (KEY("power_busy_w")) g->power_busy_w = strtod(v, NULL);
    else if (KEY("sm_clock_mhz")) g->sm_clock_mhz = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("sm_clock_idle_mhz")) g->sm_clock_idle_mhz = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("sm_clock_max_mhz")) g->sm_clock_max_mhz = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("mem_clock_mhz")) g->mem_clock_mhz = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("temperature_c")) g->temperature_c = (int)strtol(v, NULL, 0);
    else if (KEY("fan_pct")) g->fan_pct = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("pcie_rx_kbps")) g->pcie_rx_kbps = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("pcie_tx_kbps")) g->pcie_tx_kbps = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("pcie_gen")) g->pcie_gen = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("pcie_width")) g->pcie_width = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("pstate_idle")) g->pstate_idle = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("persistence")) g->persistence = (unsigned int)parse_bool(v);
    else if (KEY("compute_mode")) g->compute_mode = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("sample_period_s")) g->sample_period_s = strtod(v, NULL);
    else if (KEY("buffer_len")) g->buffer_len = (int)strtol(v, NULL, 0);
    else if (KEY("idle_no_samples")) g->idle_no_samples = parse_bool(v);
    else if (KEY("samples_supported")) g->samples_supported = parse_bool(v);
    else if (KEY("lost")) g->lost = parse_bool(v);
    else if (KEY("pattern"))
        g->pat.kind = strcmp(v, "burst") == 0 ? PAT_BURST : strcmp(v, "off") == 0 ? PAT_OFF
                                                                                 : PAT_STEADY;
    else if (KEY("busy_pct")) g->pat.busy_pct = strtod(v, NULL);
    else if (KEY("idle_pct")) g->pat.idle_pct = strtod(v, NULL);
    else if (KEY("mem_busy_pct")) g->mem_busy_pct = strtod(v, NULL);
    else if (KEY("period_s")) g->pat.period_s = strtod(v, NULL);
    else if (KEY("duty")) g->pat.duty = strtod(v, NULL);
    else if (KEY("phase_s")) g->pat.phase_s = strtod(v, NULL);
    else if (KEY("noise_pct")) g->pat.noise_pct = strtod(v, NULL);
    else if (KEY("clock_reasons")) g->clock_reasons = strtoull(v, NULL, 0);
    else if (KEY("driven")) copy_field(g->driven, sizeof g->driven, v);
    else if (KEY("unsupported")) add_errors(g->err, v, NVML_ERROR_NOT_SUPPORTED);
    else if (KEY("error")) add_errors(g->err, v, 0);
    else if (KEY("gpm_supported")) g->gpm_supported = parse_bool(v);
    else if (KEY("gpm_sm_active_pct")) g->gpm_pct[GPM_SM_ACTIVE] = strtod(v, NULL);
    else if (KEY("gpm_sm_occupancy_pct")) g->gpm_pct[GPM_SM_OCCUPANCY] = strtod(v, NULL);
    else if (KEY("gpm_tensor_active_pct")) g->gpm_pct[GPM_TENSOR_ACTIVE] = strtod(v, NULL);
    else if (KEY("gpm_dram_active_pct")) g->gpm_pct[GPM_DRAM_ACTIVE] = strtod(v, NULL);
    else if (KEY("gpm_fp64_active_pct")) g->gpm_pct[GPM_FP64_ACTIVE] = strtod(v, NULL);
    else if (KEY("gpm_fp32_active_pct")) g->gpm_pct[GPM_FP32_ACTIVE] = strtod(v, NULL);
    else if (KEY("gpm_fp16_active_pct")) g->gpm_pct[GPM_FP16_ACTIVE] = strtod(v, NULL);
    else if (KEY("encoder_pct")) g->encoder_pct = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("decoder_pct")) g->decoder_pct = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("remapped_rows_corrected")) g->remap_corrected = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("remapped_rows_uncorrected"))
        g->remap_uncorrected = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("row_remap_pending")) g->remap_pending = (unsigned int)parse_bool(v);
    else if (KEY("row_remap_failed")) g->remap_failed = (unsigned int)parse_bool(v);
    else if (KEY("mig_instance") && g->nmig < MAX_MIG) {
        unsigned int gi = 0;
        double a = -1, b = -1, c = -1;
        if (sscanf(v, "%u,%lf,%lf,%lf", &gi, &a, &b, &c) >= 1) {
            g->mig[g->nmig].gi = gi;
            g->mig[g->nmig].pct[GPM_SM_ACTIVE] = a;
            g->mig[g->nmig].pct[GPM_SM_OCCUPANCY] = b;
            g->mig[g->nmig].pct[GPM_TENSOR_ACTIVE] = c;
            for (int k = GPM_DRAM_ACTIVE; k < N_GPM; k++) g->mig[g->nmig].pct[k] = -1;
            g->nmig++;
        }
    }
    else if (KEY("memory_temperature_c")) g->memory_temperature_c = (int)strtol(v, NULL, 0);
    else if (KEY("ecc_corrected")) g->ecc[0] = strtoull(v, NULL, 0);
    else if (KEY("ecc_uncorrected")) g->ecc[1] = strtoull(v, NULL, 0);
    else if (KEY("ecc_corrected_aggregate")) g->ecc[2] = strtoull(v, NULL, 0);
    else if (KEY("ecc_uncorrected_aggregate")) g->ecc[3] = strtoull(v, NULL, 0);
    else if (KEY("pcie_replays")) g->pcie_replays = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("nvlink_links")) g->nvlink_links = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("nvlink_tx_kbps")) g->nvlink_tx_kbps = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("nvlink_rx_kbps")) g->nvlink_rx_kbps = (unsigned int)strtoul(v, NULL, 0);
    else if (KEY("xid") && g->nxid < MAX_XIDS) {
        double t = 0;
        unsigned long long code = 0;
        if (sscanf(v, "%lf,%llu", &t, &code) == 2) {
            g->xid[g->nxid].t = t;
            g->xid[g->nxid].code = code;
            g->nxid++;
        }
    }
    else if (KEY("process") && g->nproc < MAX_PROCS) {
        proc_t *p = &g->procs[g->nproc];
        unsigned long long mem = 0;
        unsigned int pid = 0;
        int sm = -1, mu = 0;
        if (sscanf(v, "%u,%llu,%d,%d", &pid, &mem, &sm, &mu) >= 1) {
            p->pid = pid;
            p->mem = mem;
            p->sm = sm;
            p->memutil = mu;
            g->nproc++;
        }
    }
}

static void global_set(scn_t *s, const char *key, const char *v) {
    if (KEY("driver_version")) copy_field(s->driver_version, sizeof s->driver_version, v);
    else if (KEY("nvml_version")) copy_field(s->nvml_version, sizeof s->nvml_version, v);
    else if (KEY("cuda_version")) s->cuda_version = (int)strtol(v, NULL, 0);
    else if (KEY("init_error")) s->init_error = parse_error(v);
    else if (KEY("timestamp_clock"))
        s->ts_clock = strcmp(v, "monotonic") == 0 ? TS_MONOTONIC
                      : strcmp(v, "boottime") == 0 ? TS_BOOTTIME : TS_REALTIME;
    else if (KEY("epoch")) s->epoch = strtod(v, NULL);
    else if (KEY("timestamp_offset_s")) s->ts_offset_us = llround(strtod(v, NULL) * 1e6);
    else if (KEY("epoch_align")) s->epoch_align = parse_bool(v);
    else if (KEY("unsupported")) add_errors(s->err, v, NVML_ERROR_NOT_SUPPORTED);
    else if (KEY("error")) add_errors(s->err, v, 0);
}

static long long sample_period_us(const gpu_t *g) {
    long long sp = llround(g->sample_period_s * 1e6);
    return sp < 1000 ? 1000 : sp;
}

/* Parse the scenario text; returns a new heap object or NULL. */
static scn_t *parse_scenario(char *text) {
    scn_t *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    copy_field(s->driver_version, sizeof s->driver_version, "550.54.15");
    copy_field(s->nvml_version, sizeof s->nvml_version, "12.550.54.15");
    s->cuda_version = 12040;
    s->epoch = NAN;
    gpu_t *g = NULL;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        size_t n = strlen(line);
        while (n && (line[n - 1] == '\r' || line[n - 1] == ' ')) line[--n] = '\0';
        while (*line == ' ' || *line == '\t') line++;
        if (!*line || *line == '#') continue;
        if (strcmp(line, "[gpu]") == 0) {
            if (s->ngpu >= MAX_GPUS) { g = NULL; continue; }
            g = &s->gpus[s->ngpu];
            gpu_defaults(g, s->ngpu);
            s->ngpu++;
            continue;
        }
        char *eq = strchr(line, '=');
        if (!eq) continue;
        *eq = '\0';
        const char *key = line;
        if (g) gpu_set(g, key, eq + 1);
        else if (s->ngpu == 0) global_set(s, key, eq + 1);
    }
    if (isnan(s->epoch)) s->epoch = mono_now();
    /* Offset of the timestamp clock from CLOCK_MONOTONIC, to snap epochs to sample grids. */
    long long off_us = scn_ts_us(s) - llround(mono_now() * 1e6);
    for (int i = 0; i < s->ngpu; i++) {
        gpu_t *gi = &s->gpus[i];
        for (int c = 0; c < N_CALLS; c++)
            if (!gi->err[c]) gi->err[c] = s->err[c];
        gi->pat.epoch = s->epoch;
        if (s->epoch_align) {
            /* Start the pattern on a sample boundary (a shift < one sample period), so that
             * sample values do not depend on where the write fell between two samples. */
            long long sp = sample_period_us(gi);
            long long e_ts = llround(s->epoch * 1e6) + off_us;
            long long snapped = (e_ts / sp) * sp;
            gi->pat.epoch = (double)(snapped - off_us) * 1e-6;
        }
    }
    return s;
}

static char *read_file(const char *path, struct stat *st) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fstat(fileno(f), st) != 0) { fclose(f); return NULL; }
    size_t cap = (size_t)st->st_size + 1;
    char *buf = malloc(cap);
    if (!buf) { fclose(f); return NULL; }
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static int same_pattern(const pat_t *a, const pat_t *b) {
    return a->kind == b->kind && a->busy_pct == b->busy_pct && a->idle_pct == b->idle_pct &&
           a->period_s == b->period_s && a->duty == b->duty && a->phase_s == b->phase_s &&
           a->noise_pct == b->noise_pct;
}

/* After a rewrite of the same file, keep each GPU's past: the old pattern holds until the new
 * one's epoch, and an unchanged pattern without an explicit epoch simply carries on. */
static void link_history(scn_t *s, const scn_t *old) {
    int n = s->ngpu < old->ngpu ? s->ngpu : old->ngpu;
    for (int i = 0; i < n; i++) {
        gpu_t *g = &s->gpus[i];
        const gpu_t *o = &old->gpus[i];
        if (s->epoch_align && same_pattern(&g->pat, &o->pat)) {
            g->pat.epoch = o->pat.epoch;
            g->prev = o->prev;
            g->has_prev = o->has_prev;
            g->switch_t = o->switch_t;
        } else {
            g->prev = o->has_prev && g->pat.epoch < o->switch_t ? o->prev : o->pat;
            g->has_prev = 1;
            g->switch_t = g->pat.epoch;
        }
    }
}

static void retire(scn_t *old) {
    if (!old) return;
    free(g_retired[g_retired_pos]);
    g_retired[g_retired_pos] = old;
    g_retired_pos = (g_retired_pos + 1) % RETIRE_RING;
}

/* Load the scenario at g_path; caller holds g_lock.  Returns 0 on success. */
static int load_locked(void) {
    struct stat st;
    char *text = read_file(g_path, &st);
    if (!text) return -1;
    scn_t *s = parse_scenario(text);
    free(text);
    if (!s) return -1;
    scn_t *old = atomic_load(&g_scn);
    if (old && strcmp(g_loaded_path, g_path) == 0) link_history(s, old);
    copy_field(g_loaded_path, sizeof g_loaded_path, g_path);
    g_stat = st;
    retire(atomic_exchange(&g_scn, s));
    atomic_fetch_add(&g_generation, 1);
    return 0;
}

static int stat_changed(const struct stat *a, const struct stat *b) {
    return a->st_ino != b->st_ino || a->st_dev != b->st_dev || a->st_size != b->st_size ||
           a->st_mtim.tv_sec != b->st_mtim.tv_sec || a->st_mtim.tv_nsec != b->st_mtim.tv_nsec;
}

static void maybe_reload(long long now_ns, int force) {
    if (force) pthread_mutex_lock(&g_lock);
    else if (pthread_mutex_trylock(&g_lock) != 0) return;
    atomic_store(&g_last_check_ns, now_ns);
    struct stat st;
    if (g_path[0] && stat(g_path, &st) == 0 && (force || stat_changed(&st, &g_stat)))
        load_locked();
    pthread_mutex_unlock(&g_lock);
}

/* The current scenario; re-stats the file at most every 10 ms (coarse clock: a few ns). */
static inline scn_t *cur(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    long long now = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    if (now - atomic_load_explicit(&g_last_check_ns, memory_order_relaxed) >= 10000000LL)
        maybe_reload(now, 0);
    return atomic_load_explicit(&g_scn, memory_order_acquire);
}

/* ------------------------------------------------------------------ driven GPUs (live lab) */
/*
 * A GPU whose activity comes from real processes instead of a pattern: "driven=<file>" in its
 * [gpu] block names a file that processes of a workload write through tests/livelab/emulator.py
 * (EmulatedDevice) and this library maps read-only.  Layout (native byte order, 8-byte
 * aligned; the Python side mirrors it with ctypes):
 *
 *   header (64 bytes)   magic "GPUEMU01", version, ring_len, max_ctx, entry_size, ctx_off,
 *                       ring_off, head (entries published), ctx_gen (bumped per ctx change)
 *   ctx[max_ctx]        32 bytes each: seq (odd while written), pid (0: free), mem_bytes
 *                       (context overhead + live allocations)
 *   ring[ring_len]      32 bytes each: seq (i + 1 once entry i is complete), t_ns
 *                       (CLOCK_MONOTONIC), pid, kind (0 idle, 1 compute, 2 spin), sm (share of
 *                       SMs active), power (share of the idle-to-busy power range drawn)
 *
 * An entry says "from t_ns on, process pid's stream is <kind>": a kernel of s seconds is two
 * entries, (t, compute) and (t + s, idle), written when it is launched, so a writer that is
 * descheduled never stretches a kernel.  Writers serialise among themselves with flock; the
 * entry is written first and published after (seq, then head), and the reader checks seq
 * before and after copying (a seqlock), so a lagging writer never shows a torn entry.
 *
 * What the fake derives over any interval: utilisation = the share covered by any process's
 * kernel (compute or spin); power = idle + the power shares' integral x (busy - idle); GPM SM
 * activity = the integral of the SM shares (tensor activity: compute only); memory used = the
 * scenario's + every live context's mem_bytes; processes = live contexts.  A process that
 * exited (or is a zombie) leaves the process list at once, and its kernels stop when this
 * library first sees it dead (the driver frees a dead process's context); what it ran
 * before stays in the past, as the driver's sample buffer keeps it.
 */
/* (This region's own includes, here so that its changes stay in one place.) */
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#define EMU_MAGIC 0x3130554D45555047ULL /* "GPUEMU01" */
#define EMU_VERSION 1U
#define EMU_MAX_PIDS 64

typedef struct {
    uint64_t magic;
    uint32_t version, ring_len, max_ctx, entry_size, ctx_off, ring_off;
    _Atomic uint64_t head;
    _Atomic uint64_t ctx_gen;
    uint64_t reserved[2];
} emu_header_t;

typedef struct {
    _Atomic uint32_t seq;
    uint32_t pid;
    uint64_t mem_bytes;
    uint64_t reserved[2];
} emu_ctx_t;

typedef struct {
    _Atomic uint64_t seq;
    int64_t t_ns;
    uint32_t pid, kind;
    float sm, power;
} emu_entry_t;

enum { EMU_IDLE = 0, EMU_COMPUTE = 1, EMU_SPIN = 2 };

typedef struct { /* integrals over an interval, in seconds */
    double cover, compute, spin, sm, power;
} emu_acc_t;

typedef struct {
    double t;
    uint64_t idx; /* publication order: ties at one instant apply in it */
    int slot;     /* index into the snapshot's pids */
    int kind;
    float sm, power;
} emu_ev_t;

typedef struct {
    int nev, cap, npid, nstream;
    emu_ev_t *ev;
    unsigned int pid[EMU_MAX_PIDS]; /* live contexts (the process list) and their memory */
    unsigned long long mem[EMU_MAX_PIDS];
    unsigned int stream[EMU_MAX_PIDS]; /* the processes that wrote entries (event slots) */
    uint64_t head, gen;
    long long checked_ns;
    const void *src; /* the mapping it was read from */
} emu_snap_t;

static struct { /* mapped files, by path; never unmapped (a fake for tests) */
    char path[256];
    const void *base;
    size_t size;
    long long tried_ns;
} g_emu_maps[MAX_GPUS];
static pthread_mutex_t g_emu_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread emu_snap_t *tl_emu_cache[MAX_GPUS]; /* per thread: readers never lock */
#define EMU_DEAD_MAX 256
static struct { /* when this process first saw a writer dead (its stream is idle after) */
    unsigned int pid;
    double t;
} g_emu_dead[EMU_DEAD_MAX];
static int g_emu_ndead;

static long long emu_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int emu_on(const gpu_t *g) { return g->driven[0] != '\0'; }

/* The header of a GPU's driven file, mapping it on first use (None yet: NULL, retried
 * every 50 ms, so a workload may create the file after the monitor started). */
static const emu_header_t *emu_map(const gpu_t *g, int *map_slot) {
    pthread_mutex_lock(&g_emu_lock);
    int slot = -1, free_slot = -1;
    for (int i = 0; i < MAX_GPUS; i++) {
        if (g_emu_maps[i].path[0] == '\0') { if (free_slot < 0) free_slot = i; continue; }
        if (strcmp(g_emu_maps[i].path, g->driven) == 0) { slot = i; break; }
    }
    if (slot < 0) {
        slot = free_slot;
        if (slot < 0) { pthread_mutex_unlock(&g_emu_lock); return NULL; }
        copy_field(g_emu_maps[slot].path, sizeof g_emu_maps[slot].path, g->driven);
    }
    const emu_header_t *h = g_emu_maps[slot].base;
    long long now = emu_now_ns();
    if (!h && now - g_emu_maps[slot].tried_ns >= 50000000LL) {
        g_emu_maps[slot].tried_ns = now;
        int fd = open(g->driven, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(emu_header_t)) {
            void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
            const emu_header_t *m = p == MAP_FAILED ? NULL : p;
            size_t need = m ? (size_t)m->ring_off + (size_t)m->ring_len * sizeof(emu_entry_t) : 0;
            if (m && m->magic == EMU_MAGIC && m->version == EMU_VERSION &&
                m->entry_size == sizeof(emu_entry_t) && m->ring_len > 0 &&
                (size_t)m->ctx_off + (size_t)m->max_ctx * sizeof(emu_ctx_t) <= (size_t)st.st_size &&
                need <= (size_t)st.st_size) {
                g_emu_maps[slot].base = m;
                g_emu_maps[slot].size = (size_t)st.st_size;
                h = m;
            } else if (m) {
                munmap(p, (size_t)st.st_size); /* not (yet) a complete file: try again later */
            }
        }
        if (fd >= 0) close(fd);
    }
    pthread_mutex_unlock(&g_emu_lock);
    *map_slot = slot;
    return h;
}

/* A pid that still runs (a zombie has exited: the driver has freed its context). */
static int emu_alive(unsigned int pid) {
    if (pid == 0 || (kill((pid_t)pid, 0) != 0 && errno != EPERM)) return 0;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *close_paren = strrchr(buf, ')');
    return !(close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X'));
}

/* The event slot of a writing process (added on first sight; -1 when full). */
static int emu_stream(emu_snap_t *sn, unsigned int pid) {
    for (int i = 0; i < sn->nstream; i++)
        if (sn->stream[i] == pid) return i;
    if (sn->nstream >= EMU_MAX_PIDS) return -1;
    sn->stream[sn->nstream] = pid;
    return sn->nstream++;
}

/* When a dead writer was first seen dead by this process (now, the first time asked). */
static double emu_death(unsigned int pid) {
    double now = mono_now();
    pthread_mutex_lock(&g_emu_lock);
    double t = now;
    int found = 0;
    for (int i = 0; i < g_emu_ndead && !found; i++)
        if (g_emu_dead[i].pid == pid) { t = g_emu_dead[i].t; found = 1; }
    if (!found) {
        int k = g_emu_ndead < EMU_DEAD_MAX ? g_emu_ndead++ : (int)(pid % EMU_DEAD_MAX);
        g_emu_dead[k].pid = pid;
        g_emu_dead[k].t = now;
    }
    pthread_mutex_unlock(&g_emu_lock);
    return t;
}

/* Fill sn from the file: live contexts, then every entry in time order, with each dead
 * writer's stream going idle when it was seen dead (what ran before stays as it ran: the
 * driver's sample buffer keeps a process's past after it exits). */
static void emu_read(const emu_header_t *h, emu_snap_t *sn) {
    const emu_ctx_t *ctx = (const emu_ctx_t *)((const char *)h + h->ctx_off);
    const emu_entry_t *ring = (const emu_entry_t *)((const char *)h + h->ring_off);
    sn->gen = atomic_load_explicit(&h->ctx_gen, memory_order_acquire);
    sn->npid = 0;
    for (unsigned int i = 0; i < h->max_ctx && sn->npid < EMU_MAX_PIDS; i++) {
        uint32_t s1 = atomic_load_explicit(&ctx[i].seq, memory_order_acquire);
        unsigned int pid = ctx[i].pid;
        unsigned long long mem = ctx[i].mem_bytes;
        atomic_thread_fence(memory_order_acquire);
        uint32_t s2 = atomic_load_explicit(&ctx[i].seq, memory_order_relaxed);
        if ((s1 & 1U) || s1 != s2 || pid == 0 || !emu_alive(pid)) continue;
        sn->pid[sn->npid] = pid;
        sn->mem[sn->npid] = mem;
        sn->npid++;
    }
    uint64_t head = atomic_load_explicit(&h->head, memory_order_acquire);
    uint64_t first = head > h->ring_len ? head - h->ring_len : 0;
    int want = (int)(head - first);
    if (want > sn->cap) {
        emu_ev_t *p = realloc(sn->ev, (size_t)want * sizeof *p);
        if (!p) want = sn->cap;
        else { sn->ev = p; sn->cap = want; }
    }
    sn->head = head;
    sn->nev = 0;
    sn->nstream = 0;
    for (uint64_t i = head - (uint64_t)want; i < head; i++) {
        const emu_entry_t *e = &ring[i % h->ring_len];
        uint64_t s1 = atomic_load_explicit(&e->seq, memory_order_acquire);
        if (s1 != i + 1) continue; /* being overwritten by a writer far ahead */
        emu_entry_t c;
        c.t_ns = e->t_ns;
        c.pid = e->pid;
        c.kind = e->kind;
        c.sm = e->sm;
        c.power = e->power;
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&e->seq, memory_order_relaxed) != s1) continue;
        int slot = emu_stream(sn, c.pid);
        if (slot < 0) continue;
        emu_ev_t *o = &sn->ev[sn->nev++];
        o->t = (double)c.t_ns * 1e-9;
        o->idx = i;
        o->slot = slot;
        o->kind = c.kind <= EMU_SPIN ? (int)c.kind : EMU_IDLE;
        o->sm = c.sm < 0 ? 0 : c.sm > 1 ? 1 : c.sm;
        o->power = c.power < 0 ? 0 : c.power > 1 ? 1 : c.power;
    }
    for (int k = 0; k < sn->nstream; k++) { /* a dead writer's stream stops when seen dead */
        if (emu_alive(sn->stream[k])) continue;
        if (sn->nev >= sn->cap) {
            emu_ev_t *p = realloc(sn->ev, (size_t)(sn->cap + EMU_MAX_PIDS) * sizeof *p);
            if (!p) break;
            sn->ev = p;
            sn->cap += EMU_MAX_PIDS;
        }
        emu_ev_t *o = &sn->ev[sn->nev++];
        o->t = emu_death(sn->stream[k]);
        o->idx = UINT64_MAX;
        o->slot = k;
        o->kind = EMU_IDLE;
        o->sm = o->power = 0;
    }
    /* Insertion sort by (t, idx): entries come almost in order (a kernel's end is written
     * ahead of time, so only entries of several processes interleave). */
    for (int i = 1; i < sn->nev; i++) {
        emu_ev_t x = sn->ev[i];
        int j = i - 1;
        while (j >= 0 && (sn->ev[j].t > x.t || (sn->ev[j].t == x.t && sn->ev[j].idx > x.idx))) {
            sn->ev[j + 1] = sn->ev[j];
            j--;
        }
        sn->ev[j + 1] = x;
    }
}

/* This thread's snapshot of GPU g, re-read when the file changed or every 20 ms (process
 * liveness); NULL when the file is not there yet. */
static const emu_snap_t *emu_snapshot(const gpu_t *g) {
    int gi = 0;
    const emu_header_t *h = emu_map(g, &gi);
    if (!h) return NULL;
    emu_snap_t *sn = tl_emu_cache[gi];
    if (!sn) {
        sn = calloc(1, sizeof *sn);
        if (!sn) return NULL;
        tl_emu_cache[gi] = sn;
    }
    long long now = emu_now_ns();
    if (sn->src != h || now - sn->checked_ns >= 20000000LL ||
        atomic_load_explicit(&h->head, memory_order_acquire) != sn->head ||
        atomic_load_explicit(&h->ctx_gen, memory_order_acquire) != sn->gen) {
        emu_read(h, sn);
        sn->checked_ns = now;
        sn->src = h;
    }
    return sn;
}

/* Cumulative integrals at the ascending times ts[0..n-1] (from the first entry on), and the
 * rates in force at the last of them (rates_end, if asked). */
static void emu_cum(const emu_snap_t *sn, const double *ts, int n, emu_acc_t *out,
                    emu_acc_t *rates_end) {
    int kind[EMU_MAX_PIDS] = {0};
    float sm[EMU_MAX_PIDS] = {0}, pw[EMU_MAX_PIDS] = {0};
    emu_acc_t acc = {0, 0, 0, 0, 0}, rate = {0, 0, 0, 0, 0};
    double t_prev = sn && sn->nev ? fmin(sn->ev[0].t, ts[0]) : ts[0];
    int e = 0;
    for (int q = 0; q < n; q++) {
        for (;;) {
            int have = sn && e < sn->nev && sn->ev[e].t <= ts[q];
            double upto = have ? sn->ev[e].t : ts[q];
            double dt = upto - t_prev;
            if (dt > 0) {
                acc.cover += rate.cover * dt;
                acc.compute += rate.compute * dt;
                acc.spin += rate.spin * dt;
                acc.sm += rate.sm * dt;
                acc.power += rate.power * dt;
                t_prev = upto;
            }
            if (!have) break;
            const emu_ev_t *v = &sn->ev[e++];
            kind[v->slot] = v->kind;
            sm[v->slot] = v->kind ? v->sm : 0;
            pw[v->slot] = v->kind ? v->power : 0;
            int any = 0, comp = 0;
            double smsum = 0, pwsum = 0;
            for (int i = 0; i < sn->nstream; i++) {
                any |= kind[i] != EMU_IDLE;
                comp |= kind[i] == EMU_COMPUTE;
                smsum += sm[i];
                pwsum += pw[i];
            }
            rate.cover = any;
            rate.compute = comp;
            rate.spin = any && !comp;
            rate.sm = smsum > 1 ? 1 : smsum;
            rate.power = pwsum > 1 ? 1 : pwsum;
        }
        out[q] = acc;
    }
    if (rates_end) *rates_end = rate;
}

/* Integrals over [t0, t1] of a driven GPU (all zero before its file exists). */
static emu_acc_t emu_between(const gpu_t *g, double t0, double t1) {
    emu_acc_t r = {0, 0, 0, 0, 0}, c[2];
    if (t1 <= t0) return r;
    double ts[2] = {t0, t1};
    emu_cum(emu_snapshot(g), ts, 2, c, NULL);
    r.cover = c[1].cover - c[0].cover;
    r.compute = c[1].compute - c[0].compute;
    r.spin = c[1].spin - c[0].spin;
    r.sm = c[1].sm - c[0].sm;
    r.power = c[1].power - c[0].power;
    return r;
}

/* What runs at instant t: rates (each 0 or 1 for cover/compute/spin; shares for sm, power). */
static emu_acc_t emu_at(const gpu_t *g, double t) {
    emu_acc_t out, rate;
    emu_cum(emu_snapshot(g), &t, 1, &out, &rate);
    return rate;
}

/* The processes holding a context on g: the scenario's, then a driven GPU's live ones. */
static int gpu_procs(const gpu_t *g, proc_t *out) {
    int n = 0;
    for (int i = 0; i < g->nproc && n < MAX_PROCS; i++) out[n++] = g->procs[i];
    if (!emu_on(g)) return n;
    const emu_snap_t *sn = emu_snapshot(g);
    for (int i = 0; sn && i < sn->npid && n < MAX_PROCS; i++) {
        if (!emu_alive(sn->pid[i])) continue; /* died since the snapshot */
        proc_t *p = &out[n++];
        p->pid = sn->pid[i];
        p->mem = sn->mem[i];
        p->sm = -1;
        p->memutil = 0;
    }
    return n;
}

/* GPM over [t0, t1] of a driven GPU: the share of each metric's percentage it reads.  SM
 * activity is the integral of the SM shares (scaled so the scenario's percentage is what a
 * fully busy GPU reads), occupancy follows it, tensor activity comes from compute only. */
static void gpm_driven(const gpu_t *g, double t0, double t1, const double *pct, double *frac) {
    emu_acc_t a = emu_between(g, t0, t1);
    double dt = t1 - t0;
    double sm_share = a.sm / dt;
    double full = pct[GPM_SM_ACTIVE] > 0 ? pct[GPM_SM_ACTIVE] / 100.0 : 1.0;
    sm_share = sm_share < 0 ? 0 : sm_share > 1 ? 1 : sm_share;
    frac[GPM_SM_ACTIVE] = sm_share / full;
    frac[GPM_SM_OCCUPANCY] = sm_share / full;
    frac[GPM_TENSOR_ACTIVE] = a.compute / dt < 0 ? 0 : a.compute / dt > 1 ? 1 : a.compute / dt;
}

/* Memory in use: the scenario's figure plus every live context's (driven GPUs). */
static unsigned long long gpu_mem_used(const gpu_t *g) {
    unsigned long long used = g->mem_used;
    if (emu_on(g)) {
        const emu_snap_t *sn = emu_snapshot(g);
        for (int i = 0; sn && i < sn->npid; i++)
            if (emu_alive(sn->pid[i])) used += sn->mem[i];
    }
    return used > g->mem_total ? g->mem_total : used;
}

/* ------------------------------------------------------------------ the time model */
/* Busy seconds of pattern p in [epoch - phase, t]; any t. */
static double pat_cum(const pat_t *p, double t) {
    double u = t - p->epoch + p->phase_s;
    if (p->kind == PAT_OFF) return 0.0;
    if (p->kind == PAT_STEADY) return u;
    double P = p->period_s > 0 ? p->period_s : 1.0;
    double d = p->duty < 0 ? 0 : p->duty > 1 ? 1 : p->duty;
    double n = floor(u / P);
    double r = u - n * P;
    return n * d * P + fmin(r, d * P);
}

static int pat_busy_at(const pat_t *p, double t) {
    if (p->kind == PAT_OFF) return 0;
    if (p->kind == PAT_STEADY) return 1;
    double P = p->period_s > 0 ? p->period_s : 1.0;
    double u = t - p->epoch + p->phase_s;
    double r = u - floor(u / P) * P;
    return r < p->duty * P;
}

/* Integral over [t0, t1] of busy (want_util = 0) or of the utilisation % (want_util = 1). */
static double pat_integral(const pat_t *p, double t0, double t1, int want_util) {
    if (t1 <= t0) return 0.0;
    double busy = pat_cum(p, t1) - pat_cum(p, t0);
    if (!want_util) return busy;
    return busy * p->busy_pct + ((t1 - t0) - busy) * p->idle_pct;
}

/* The same over a GPU's history: the previous pattern before a rewrite, the new one after. */
static double gpu_integral(const gpu_t *g, double t0, double t1, int want_util) {
    if (!g->has_prev || t0 >= g->switch_t) return pat_integral(&g->pat, t0, t1, want_util);
    if (t1 <= g->switch_t) return pat_integral(&g->prev, t0, t1, want_util);
    return pat_integral(&g->prev, t0, g->switch_t, want_util) +
           pat_integral(&g->pat, g->switch_t, t1, want_util);
}

static double busy_between(const scn_t *s, const gpu_t *g, double t0, double t1) {
    (void)s;
    if (emu_on(g)) return emu_between(g, t0, t1).cover;
    return gpu_integral(g, t0, t1, 0);
}

static int busy_at(const scn_t *s, const gpu_t *g, double t) {
    (void)s;
    if (emu_on(g)) return emu_at(g, t).cover > 0;
    return pat_busy_at(g->has_prev && t < g->switch_t ? &g->prev : &g->pat, t);
}

static double frac_last_1s(const scn_t *s, const gpu_t *g, double now) {
    double f = busy_between(s, g, now - 1.0, now);
    return f < 0 ? 0 : f > 1 ? 1 : f;
}

/* Mean utilisation % over [t0, t1]. */
static double util_between(const gpu_t *g, double t0, double t1) {
    if (emu_on(g)) return 100.0 * emu_between(g, t0, t1).cover / (t1 - t0);
    return gpu_integral(g, t0, t1, 1) / (t1 - t0);
}

static double power_w(const gpu_t *g, double frac) {
    return g->power_idle_w + frac * (g->power_busy_w - g->power_idle_w);
}

/* Share of the idle-to-busy power range drawn over [t0, t1]: a pattern's busy fraction, or a
 * driven GPU's power shares (a spinning kernel draws little of it). */
static double power_frac_between(const scn_t *s, const gpu_t *g, double t0, double t1) {
    double f = emu_on(g) ? emu_between(g, t0, t1).power : busy_between(s, g, t0, t1);
    f /= t1 - t0;
    return f < 0 ? 0 : f > 1 ? 1 : f;
}

static unsigned int clamp_pct(double v) {
    if (v < 0) return 0;
    if (v > 100) return 100;
    return (unsigned int)lround(v);
}

static unsigned long long splitmix64(unsigned long long x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* Deterministic jitter in [-1, 1) for sample k. */
static double noise_unit(long long k, int gpu, int type) {
    unsigned long long h =
        splitmix64((unsigned long long)k ^ ((unsigned long long)gpu << 48) ^
                   ((unsigned long long)type << 56));
    return (double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* ------------------------------------------------------------------ call prologues */
static int g_inited_check(void) {
    return atomic_load_explicit(&g_refcount, memory_order_relaxed) > 0;
}

static int resolve(const scn_t *s, nvmlDevice_t dev, int call, const gpu_t **out) {
    if (!dev || dev < &g_handles[0] || dev >= &g_handles[MAX_GPUS])
        return NVML_ERROR_INVALID_ARGUMENT;
    int idx = (int)(dev - g_handles);
    if (!s || idx >= s->ngpu) return NVML_ERROR_GPU_IS_LOST;
    const gpu_t *g = &s->gpus[idx];
    if (g->lost) return NVML_ERROR_GPU_IS_LOST;
    if (g->err[call]) return g->err[call];
    *out = g;
    return NVML_SUCCESS;
}

#define COUNT(call) atomic_fetch_add_explicit(&g_calls[C_##call], 1, memory_order_relaxed)

#define DEV(call)                                                   \
    if (!g_inited_check()) return NVML_ERROR_UNINITIALIZED;         \
    COUNT(call);                                                    \
    const scn_t *S = cur();                                         \
    const gpu_t *G = NULL;                                          \
    do {                                                            \
        int r_ = resolve(S, device, C_##call, &G);                  \
        if (r_) return r_;                                          \
    } while (0)

#define SYS(call)                                                   \
    if (!g_inited_check()) return NVML_ERROR_UNINITIALIZED;         \
    COUNT(call);                                                    \
    const scn_t *S = cur();                                         \
    if (S->err[C_##call]) return S->err[C_##call]

#define NONNULL(p) if (!(p)) return NVML_ERROR_INVALID_ARGUMENT

static nvmlReturn_t put_str(char *buf, unsigned int len, const char *s) {
    NONNULL(buf);
    size_t n = strlen(s);
    if (len < n + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, n + 1);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ init / system */
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&g_lock);
    const char *p = getenv("FAKE_NVML_SCENARIO");
    if (!p || !*p) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    copy_field(g_path, sizeof g_path, p);
    if (load_locked() != 0) {
        fprintf(stderr, "fakenvml: cannot read scenario %s: %s\n", g_path, strerror(errno));
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNKNOWN;
    }
    atomic_store(&g_last_check_ns, 0);
    scn_t *s = atomic_load(&g_scn);
    if (s->init_error) {
        pthread_mutex_unlock(&g_lock);
        return s->init_error;
    }
    if (g_lib_t0 < 0) g_lib_t0 = mono_now();
    for (int i = 0; i < MAX_GPUS; i++) g_handles[i].index = i;
    atomic_fetch_add(&g_refcount, 1);
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

API nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    int rc = NVML_SUCCESS;
    if (atomic_load(&g_refcount) <= 0) rc = NVML_ERROR_UNINITIALIZED;
    else atomic_fetch_sub(&g_refcount, 1);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

API const char *nvmlErrorString(nvmlReturn_t result) {
    for (int i = 0; i < N_ERRORS; i++)
        if (g_errors[i].code == result) return g_errors[i].text;
    return "Unknown Error";
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    SYS(DRIVER_VERSION);
    return put_str(version, length, S->driver_version);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    SYS(NVML_VERSION);
    return put_str(version, length, S->nvml_version);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    SYS(CUDA_VERSION);
    NONNULL(v);
    *v = S->cuda_version;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
    return nvmlSystemGetCudaDriverVersion(v);
}

API nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
    SYS(PROCESS_NAME);
    NONNULL(name);
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%u/comm", pid);
    FILE *f = fopen(path, "r");
    if (!f) return NVML_ERROR_NOT_FOUND;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    while (n && buf[n - 1] == '\n') buf[--n] = '\0';
    return put_str(name, length, buf);
}

API nvmlReturn_t nvmlUnitGetCount(unsigned int *count) {
    if (!g_inited_check()) return NVML_ERROR_UNINITIALIZED;
    NONNULL(count);
    *count = 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGetExcludedDeviceCount(unsigned int *count) {
    return nvmlUnitGetCount(count);
}

/* ------------------------------------------------------------------ device enumeration */
API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    SYS(COUNT);
    NONNULL(count);
    *count = (unsigned int)S->ngpu;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

static nvmlReturn_t handle_for(const scn_t *s, int idx, nvmlDevice_t *device) {
    const gpu_t *g = &s->gpus[idx];
    if (g->lost) return NVML_ERROR_GPU_IS_LOST;
    if (g->err[C_HANDLE]) return g->err[C_HANDLE];
    *device = &g_handles[idx];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!g_inited_check()) return NVML_ERROR_UNINITIALIZED;
    const scn_t *S = cur();
    NONNULL(device);
    if (index >= (unsigned int)S->ngpu) return NVML_ERROR_INVALID_ARGUMENT;
    return handle_for(S, (int)index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!g_inited_check()) return NVML_ERROR_UNINITIALIZED;
    const scn_t *S = cur();
    NONNULL(uuid);
    NONNULL(device);
    for (int i = 0; i < S->ngpu; i++)
        if (strcmp(S->gpus[i].uuid, uuid) == 0) return handle_for(S, i, device);
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device) {
    if (!g_inited_check()) return NVML_ERROR_UNINITIALIZED;
    const scn_t *S = cur();
    NONNULL(serial);
    NONNULL(device);
    for (int i = 0; i < S->ngpu; i++)
        if (strcmp(S->gpus[i].serial, serial) == 0) return handle_for(S, i, device);
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *busId, nvmlDevice_t *device) {
    if (!g_inited_check()) return NVML_ERROR_UNINITIALIZED;
    const scn_t *S = cur();
    NONNULL(busId);
    NONNULL(device);
    gpu_t probe;
    memset(&probe, 0, sizeof probe);
    copy_field(probe.bus_id, sizeof probe.bus_id, busId);
    parse_bus_id(&probe);
    for (int i = 0; i < S->ngpu; i++) {
        const gpu_t *g = &S->gpus[i];
        if (g->pci_domain == probe.pci_domain && g->pci_bus == probe.pci_bus &&
            g->pci_dev == probe.pci_dev && g->pci_func == probe.pci_func)
            return handle_for(S, i, device);
    }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *busId, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(busId, device);
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    DEV(INDEX);
    NONNULL(index);
    *index = (unsigned int)(G - S->gpus);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ identity */
API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEV(UUID);
    return put_str(uuid, length, G->uuid);
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEV(NAME);
    return put_str(name, length, G->name);
}

API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    DEV(SERIAL);
    return put_str(serial, length, G->serial);
}

API nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *v, unsigned int length) {
    DEV(MISC);
    return put_str(v, length, G->vbios);
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEV(PCI);
    NONNULL(pci);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X",
             G->pci_domain & 0xffff, G->pci_bus & 0xff, G->pci_dev & 0xff, G->pci_func & 0xf);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", G->pci_domain,
             G->pci_bus & 0xff, G->pci_dev & 0xff, G->pci_func & 0xf);
    pci->domain = G->pci_domain;
    pci->bus = G->pci_bus;
    pci->device = G->pci_dev;
    pci->pciDeviceId = G->pci_device_id;
    pci->pciSubSystemId = G->pci_subsys_id;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

#define UINT_GETTER(fn, call, expr)                                 \
    API nvmlReturn_t fn(nvmlDevice_t device, unsigned int *out) {   \
        DEV(call);                                                  \
        NONNULL(out);                                               \
        *out = (unsigned int)(expr);                                \
        return NVML_SUCCESS;                                        \
    }

#define UNSUPPORTED_GETTER(fn)                                      \
    API nvmlReturn_t fn(nvmlDevice_t device, void *out) {           \
        DEV(MISC);                                                  \
        (void)G;                                                    \
        (void)out;                                                  \
        return NVML_ERROR_NOT_SUPPORTED;                            \
    }

UINT_GETTER(nvmlDeviceGetMinorNumber, MINOR, G->minor)
UINT_GETTER(nvmlDeviceGetBrand, BRAND, G->brand)
UINT_GETTER(nvmlDeviceGetArchitecture, MISC, G->arch)
UINT_GETTER(nvmlDeviceGetMemoryBusWidth, MISC, G->bus_width)
UINT_GETTER(nvmlDeviceGetNumGpuCores, MISC, G->cores)
UINT_GETTER(nvmlDeviceGetMultiGpuBoard, MISC, 0)
UINT_GETTER(nvmlDeviceGetBoardId, MISC, 0x1700U + G->minor)
UINT_GETTER(nvmlDeviceGetPersistenceMode, PERSISTENCE, G->persistence)
UINT_GETTER(nvmlDeviceGetComputeMode, COMPUTE_MODE, G->compute_mode)
UINT_GETTER(nvmlDeviceGetDisplayActive, DISPLAY, 0)
UINT_GETTER(nvmlDeviceGetDisplayMode, DISPLAY, 0)
UINT_GETTER(nvmlDeviceGetAccountingMode, MISC, 0)
UINT_GETTER(nvmlDeviceGetVirtualizationMode, MISC, 0)
UINT_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, PCIE, G->pcie_gen)
UINT_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, PCIE, G->pcie_gen)
UINT_GETTER(nvmlDeviceGetGpuMaxPcieLinkGeneration, PCIE, G->pcie_gen)
UINT_GETTER(nvmlDeviceGetCurrPcieLinkWidth, PCIE, G->pcie_width)
UINT_GETTER(nvmlDeviceGetMaxPcieLinkWidth, PCIE, G->pcie_width)
UINT_GETTER(nvmlDeviceGetPcieSpeed, PCIE, G->pcie_gen >= 5 ? 32000 : 16000)
UINT_GETTER(nvmlDeviceGetPcieLinkMaxSpeed, PCIE, G->pcie_gen >= 5 ? 32000 : 16000)
UINT_GETTER(nvmlDeviceGetPcieReplayCounter, PCIE_REPLAY, G->pcie_replays)
UINT_GETTER(nvmlDeviceGetEnforcedPowerLimit, POWER_LIMIT, lround(G->power_limit_w * 1000))
UINT_GETTER(nvmlDeviceGetPowerManagementLimit, POWER_LIMIT, lround(G->power_limit_w * 1000))
UINT_GETTER(nvmlDeviceGetPowerManagementDefaultLimit, POWER_LIMIT,
            lround(G->power_limit_w * 1000))
UINT_GETTER(nvmlDeviceGetPowerManagementMode, POWER_LIMIT, 1)

UNSUPPORTED_GETTER(nvmlDeviceGetDynamicPstatesInfo)
UNSUPPORTED_GETTER(nvmlDeviceGetBoardPartNumber)
UNSUPPORTED_GETTER(nvmlDeviceGetGpuOperationMode)
UNSUPPORTED_GETTER(nvmlDeviceGetFanSpeedRPM)
UNSUPPORTED_GETTER(nvmlDeviceGetGpuFabricInfo)
UNSUPPORTED_GETTER(nvmlDeviceGetGpuFabricInfoV)

/* Rows of HBM remapped (Ampere and later): for correctable and uncorrectable errors, one
 * pending until the GPU is reset, and whether a remapping failed. */
API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                           unsigned int *uncRows, unsigned int *isPending,
                                           unsigned int *failureOccurred) {
    DEV(REMAPPED_ROWS);
    NONNULL(corrRows);
    NONNULL(uncRows);
    NONNULL(isPending);
    NONNULL(failureOccurred);
    *corrRows = G->remap_corrected;
    *uncRows = G->remap_uncorrected;
    *isPending = G->remap_pending;
    *failureOccurred = G->remap_failed;
    return NVML_SUCCESS;
}
UNSUPPORTED_GETTER(nvmlDeviceGetRetiredPagesPendingStatus)
UNSUPPORTED_GETTER(nvmlDeviceGetInforomImageVersion)
UNSUPPORTED_GETTER(nvmlDeviceGetNumaNodeId)
UNSUPPORTED_GETTER(nvmlDeviceGetModuleId)

/* Exotic device getters probed by nvitop / gpustat: present, but not supported here. */
UNSUPPORTED_GETTER(nvmlDeviceGetDriverModel)
UNSUPPORTED_GETTER(nvmlDeviceGetDriverModel_v2)
UNSUPPORTED_GETTER(nvmlDeviceGetNvLinkState)
UNSUPPORTED_GETTER(nvmlDeviceGetNvLinkVersion)
UNSUPPORTED_GETTER(nvmlDeviceGetNvLinkCapability)
UNSUPPORTED_GETTER(nvmlDeviceGetNvLinkRemotePciInfo_v2)
UNSUPPORTED_GETTER(nvmlDeviceGetNvLinkErrorCounter)
UNSUPPORTED_GETTER(nvmlDeviceGetNvLinkUtilizationCounter)
UNSUPPORTED_GETTER(nvmlDeviceGetNvLinkUtilizationControl)
UNSUPPORTED_GETTER(nvmlDeviceGetNvLinkRemoteDeviceType)
UNSUPPORTED_GETTER(nvmlDeviceGetCpuAffinity)
UNSUPPORTED_GETTER(nvmlDeviceGetCpuAffinityWithinScope)
UNSUPPORTED_GETTER(nvmlDeviceGetMemoryAffinity)
UNSUPPORTED_GETTER(nvmlDeviceGetTopologyCommonAncestor)
UNSUPPORTED_GETTER(nvmlDeviceGetTopologyNearestGpus)
UNSUPPORTED_GETTER(nvmlDeviceGetP2PStatus)
UNSUPPORTED_GETTER(nvmlDeviceOnSameBoard)
UNSUPPORTED_GETTER(nvmlDeviceGetMemoryErrorCounter)
UNSUPPORTED_GETTER(nvmlDeviceGetDetailedEccErrors)
UNSUPPORTED_GETTER(nvmlDeviceGetRetiredPages)
UNSUPPORTED_GETTER(nvmlDeviceGetRetiredPages_v2)
UNSUPPORTED_GETTER(nvmlDeviceGetDefaultEccMode)
UNSUPPORTED_GETTER(nvmlDeviceGetInforomVersion)
UNSUPPORTED_GETTER(nvmlDeviceGetInforomConfigurationChecksum)
UNSUPPORTED_GETTER(nvmlDeviceGetPowerSource)
UNSUPPORTED_GETTER(nvmlDeviceGetEncoderStats)
UNSUPPORTED_GETTER(nvmlDeviceGetEncoderSessions)
UNSUPPORTED_GETTER(nvmlDeviceGetEncoderCapacity)
UNSUPPORTED_GETTER(nvmlDeviceGetFBCStats)
UNSUPPORTED_GETTER(nvmlDeviceGetFBCSessions)
UNSUPPORTED_GETTER(nvmlDeviceGetAccountingStats)
UNSUPPORTED_GETTER(nvmlDeviceGetAccountingPids)
UNSUPPORTED_GETTER(nvmlDeviceGetAccountingBufferSize)
UNSUPPORTED_GETTER(nvmlDeviceGetViolationStatus)
UNSUPPORTED_GETTER(nvmlDeviceGetBusType)
UNSUPPORTED_GETTER(nvmlDeviceGetIrqNum)
UNSUPPORTED_GETTER(nvmlDeviceGetGspFirmwareMode)
UNSUPPORTED_GETTER(nvmlDeviceGetGspFirmwareVersion)
UNSUPPORTED_GETTER(nvmlDeviceGetC2cModeInfoV)
UNSUPPORTED_GETTER(nvmlDeviceGetHostVgpuMode)
UNSUPPORTED_GETTER(nvmlDeviceGetCurrentClockFreqs)
UNSUPPORTED_GETTER(nvmlDeviceGetPerformanceModes)
UNSUPPORTED_GETTER(nvmlDeviceGetAdaptiveClockInfoStatus)
UNSUPPORTED_GETTER(nvmlDeviceGetJpgUtilization)
UNSUPPORTED_GETTER(nvmlDeviceGetOfaUtilization)
UNSUPPORTED_GETTER(nvmlDeviceGetMinMaxFanSpeed)
UNSUPPORTED_GETTER(nvmlDeviceGetSupportedPerformanceStates)
UNSUPPORTED_GETTER(nvmlDeviceGetMinMaxClockOfPState)
UNSUPPORTED_GETTER(nvmlDeviceGetClockOffsets)
UNSUPPORTED_GETTER(nvmlDeviceGetSupportedMemoryClocks)
UNSUPPORTED_GETTER(nvmlDeviceGetSupportedGraphicsClocks)
UNSUPPORTED_GETTER(nvmlDeviceGetThermalSettings)
UNSUPPORTED_GETTER(nvmlDeviceGetMarginTemperature)
UNSUPPORTED_GETTER(nvmlDeviceGetAPIRestriction)
UNSUPPORTED_GETTER(nvmlDeviceGetAutoBoostedClocksEnabled)
UNSUPPORTED_GETTER(nvmlDeviceGetDramEncryptionMode)
UNSUPPORTED_GETTER(nvmlDeviceGetPlatformInfo)
UNSUPPORTED_GETTER(nvmlDeviceGetPdi)
UNSUPPORTED_GETTER(nvmlDeviceGetCoolerInfo)
UNSUPPORTED_GETTER(nvmlDeviceGetFanControlPolicy_v2)
UNSUPPORTED_GETTER(nvmlDeviceGetMemClkVfOffset)
UNSUPPORTED_GETTER(nvmlDeviceGetGpcClkVfOffset)
UNSUPPORTED_GETTER(nvmlDeviceGetMemClkMinMaxVfOffset)
UNSUPPORTED_GETTER(nvmlDeviceGetGpcClkMinMaxVfOffset)
UNSUPPORTED_GETTER(nvmlDeviceGetPowerMizerMode_v1)
UNSUPPORTED_GETTER(nvmlDeviceGetSramEccErrorStatus)
UNSUPPORTED_GETTER(nvmlDeviceGetRemappedRows_v2)
UNSUPPORTED_GETTER(nvmlDeviceGetRowRemapperHistogram)
UNSUPPORTED_GETTER(nvmlDeviceGetPciInfoExt)
UNSUPPORTED_GETTER(nvmlDeviceGetRunningProcessDetailList)
UNSUPPORTED_GETTER(nvmlDeviceGetGpuInstances)
UNSUPPORTED_GETTER(nvmlDeviceGetGpuInstanceProfileInfo)
UNSUPPORTED_GETTER(nvmlDeviceGetGpuInstanceProfileInfoV)
UNSUPPORTED_GETTER(nvmlDeviceGetVgpuUtilization)
UNSUPPORTED_GETTER(nvmlDeviceGetVgpuProcessUtilization)
UNSUPPORTED_GETTER(nvmlDeviceGetActiveVgpus)
UNSUPPORTED_GETTER(nvmlDeviceGetSupportedVgpus)
UNSUPPORTED_GETTER(nvmlDeviceGetCreatableVgpus)
UNSUPPORTED_GETTER(nvmlDeviceGetGridLicensableFeatures_v4)
UNSUPPORTED_GETTER(nvmlDeviceGetHostname_v1)
UNSUPPORTED_GETTER(nvmlDeviceGetBridgeChipInfo)
UNSUPPORTED_GETTER(nvmlDeviceGetAttributes_v2)
UNSUPPORTED_GETTER(nvmlDeviceGetConfComputeMemSizeInfo)
UNSUPPORTED_GETTER(nvmlDeviceGetConfComputeProtectedMemoryUsage)
UNSUPPORTED_GETTER(nvmlDeviceGetTotalEccErrors_v2)
UNSUPPORTED_GETTER(nvmlDeviceGetNvlinkBwMode)
UNSUPPORTED_GETTER(nvmlDeviceGetNvlinkSupportedBwModes)
UNSUPPORTED_GETTER(nvmlDeviceGetPgpuMetadataString)
UNSUPPORTED_GETTER(nvmlDeviceGetVgpuMetadata)
UNSUPPORTED_GETTER(nvmlDeviceGetVirtualizationMode_v2)
UNSUPPORTED_GETTER(nvmlDeviceGetBAR1MemoryInfo_v2)
UNSUPPORTED_GETTER(nvmlDeviceGetCapabilities)
UNSUPPORTED_GETTER(nvmlDeviceGetAddressingMode)
UNSUPPORTED_GETTER(nvmlDeviceGetRepairStatus)
UNSUPPORTED_GETTER(nvmlDeviceGetMemoryLimits_v1)
UNSUPPORTED_GETTER(nvmlDeviceGetUnrepairableMemoryFlag_v1)
UNSUPPORTED_GETTER(nvmlDeviceGetLastBBXFlushTime)
UNSUPPORTED_GETTER(nvmlDeviceGetBBXTimeData_v1)
UNSUPPORTED_GETTER(nvmlDeviceGetBankRemapperStatus_v1)
UNSUPPORTED_GETTER(nvmlDeviceGetSramUniqueUncorrectedEccErrorCounts)
UNSUPPORTED_GETTER(nvmlDeviceGetNvLinkTelemetrySamples_v1)
UNSUPPORTED_GETTER(nvmlDeviceGetAdaptiveTgpModeInfo_v1)
UNSUPPORTED_GETTER(nvmlDeviceGetVgpuCapabilities)
UNSUPPORTED_GETTER(nvmlDeviceGetVgpuHeterogeneousMode)
UNSUPPORTED_GETTER(nvmlDeviceGetVgpuSchedulerCapabilities)
UNSUPPORTED_GETTER(nvmlDeviceGetVgpuSchedulerLog)
UNSUPPORTED_GETTER(nvmlDeviceGetVgpuSchedulerState)
UNSUPPORTED_GETTER(nvmlDeviceGetVgpuInstancesUtilizationInfo)
UNSUPPORTED_GETTER(nvmlDeviceGetVgpuProcessesUtilizationInfo)
UNSUPPORTED_GETTER(nvmlDeviceGetGpuFabricInfo_v4)
UNSUPPORTED_GETTER(nvmlDeviceGetConfComputeGpuAttestationReport)
UNSUPPORTED_GETTER(nvmlDeviceGetConfComputeGpuCertificate)
UNSUPPORTED_GETTER(nvmlDevicePerfMetricsGetSamples_v1)
UNSUPPORTED_GETTER(nvmlDeviceWorkloadPowerProfileGetCurrentProfiles)
UNSUPPORTED_GETTER(nvmlDeviceWorkloadPowerProfileGetProfilesInfo)
UNSUPPORTED_GETTER(nvmlDeviceQueryDrainState)

#define SYS_UNSUPPORTED(fn)                                         \
    API nvmlReturn_t fn(void *a, void *b, void *c) {                \
        (void)a;                                                    \
        (void)b;                                                    \
        (void)c;                                                    \
        if (!g_inited_check()) return NVML_ERROR_UNINITIALIZED;     \
        return NVML_ERROR_NOT_SUPPORTED;                            \
    }
SYS_UNSUPPORTED(nvmlSystemGetTopologyGpuSet)
SYS_UNSUPPORTED(nvmlSystemGetDriverBranch)
SYS_UNSUPPORTED(nvmlSystemGetHicVersion)
SYS_UNSUPPORTED(nvmlSystemGetConfComputeState)
SYS_UNSUPPORTED(nvmlSystemGetConfComputeSettings)
SYS_UNSUPPORTED(nvmlSystemGetConfComputeCapabilities)
SYS_UNSUPPORTED(nvmlGetVgpuVersion)
SYS_UNSUPPORTED(nvmlGetVgpuDriverCapabilities)
SYS_UNSUPPORTED(nvmlSystemGetNvlinkBwMode)
SYS_UNSUPPORTED(nvmlSystemEventSetCreate)

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    DEV(MISC);
    NONNULL(major);
    NONNULL(minor);
    *major = (int)G->cc_major;
    *minor = (int)G->cc_minor;
    return NVML_SUCCESS;
}

/* ECC is on (an "unsupported=ecc" GPU has it off: every ECC call says NOT_SUPPORTED). */
API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, int *cur_, int *pend) {
    DEV(ECC);
    (void)G;
    NONNULL(cur_);
    NONNULL(pend);
    *cur_ = *pend = 1;
    return NVML_SUCCESS;
}

/* errorType: 0 corrected (single bit), 1 uncorrected (double bit); counterType: 0 volatile
 * (since the driver loaded), 1 aggregate (the GPU's lifetime). */
API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errType, int counterType,
                                             unsigned long long *count) {
    DEV(ECC);
    NONNULL(count);
    if (errType < 0 || errType > 1 || counterType < 0 || counterType > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = G->ecc[counterType * 2 + errType];
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ MIG */
/* A MIG device handle: slot `slot` of GPU `gpu`; 0 if `dev` is not one. */
static int mig_of(nvmlDevice_t dev, int *gpu, int *slot) {
    if (!dev || dev < &g_mig_handles[0] || dev >= &g_mig_handles[MAX_GPUS * MAX_MIG]) return 0;
    int off = (int)(dev - g_mig_handles);
    *gpu = off / MAX_MIG;
    *slot = off % MAX_MIG;
    return 1;
}

/* The parent GPU of a MIG handle, with the parent's errors applied. */
static nvmlReturn_t resolve_mig(nvmlDevice_t dev, const gpu_t **g, int *slot) {
    if (!g_inited_check()) return NVML_ERROR_UNINITIALIZED;
    COUNT(MIG);
    int gpu;
    if (!mig_of(dev, &gpu, slot)) return NVML_ERROR_NOT_SUPPORTED; /* not a MIG device */
    const gpu_t *G = NULL;
    int r = resolve(cur(), &g_handles[gpu], C_MIG, &G);
    if (r) return r;
    if (*slot >= G->nmig) return NVML_ERROR_INVALID_ARGUMENT; /* MIG was reconfigured */
    *g = G;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *cur_, unsigned int *pend) {
    DEV(MIG);
    NONNULL(cur_);
    NONNULL(pend);
    *cur_ = *pend = G->nmig > 0;
    return NVML_SUCCESS;
}

UINT_GETTER(nvmlDeviceGetMaxMigDeviceCount, MIG, G->nmig > 0 ? 7 : 0)

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                     nvmlDevice_t *mig) {
    DEV(MIG);
    NONNULL(mig);
    if (G->nmig == 0) return NVML_ERROR_INVALID_ARGUMENT; /* MIG disabled */
    if (index >= 7) return NVML_ERROR_INVALID_ARGUMENT;
    if ((int)index >= G->nmig) return NVML_ERROR_NOT_FOUND; /* an empty slot */
    *mig = &g_mig_handles[(G - S->gpus) * MAX_MIG + (int)index];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig) {
    int gpu, slot;
    if (mig_of(device, &gpu, &slot)) {
        if (!g_inited_check()) return NVML_ERROR_UNINITIALIZED;
        NONNULL(is_mig);
        *is_mig = 1;
        return NVML_SUCCESS;
    }
    DEV(MIG);
    (void)G;
    NONNULL(is_mig);
    *is_mig = 0;
    return NVML_SUCCESS;
}

/* A getter of a MIG device (its parent's scenario in G, its slot in `slot`). */
#define MIG_GETTER(fn, expr)                                        \
    API nvmlReturn_t fn(nvmlDevice_t device, unsigned int *out) {   \
        const gpu_t *G = NULL;                                      \
        int slot = 0;                                               \
        nvmlReturn_t r_ = resolve_mig(device, &G, &slot);           \
        if (r_) return r_;                                          \
        NONNULL(out);                                               \
        *out = (expr);                                              \
        return NVML_SUCCESS;                                        \
    }
MIG_GETTER(nvmlDeviceGetGpuInstanceId, G->mig[slot].gi)
MIG_GETTER(nvmlDeviceGetComputeInstanceId, ((void)slot, 0U))

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig,
                                                              nvmlDevice_t *device) {
    const gpu_t *G = NULL;
    int slot = 0;
    nvmlReturn_t r = resolve_mig(mig, &G, &slot);
    if (r) return r;
    NONNULL(device);
    *device = &g_handles[(mig - g_mig_handles) / MAX_MIG];
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ GPM */
#define GPM_MAGIC 0x47504D31U /* "GPM1" */
#define GPM_VERSION 1U        /* NVML_GPM_SUPPORT_VERSION, NVML_GPM_METRICS_GET_VERSION */

API nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *support) {
    DEV(GPM);
    NONNULL(support);
    if (support->version != GPM_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    support->isSupportedDevice = (unsigned int)G->gpm_supported;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    if (!g_inited_check()) return NVML_ERROR_UNINITIALIZED;
    NONNULL(sample);
    nvmlGpmSample_t s = calloc(1, sizeof *s);
    if (!s) return NVML_ERROR_MEMORY;
    s->magic = GPM_MAGIC;
    s->gpu = -1;
    s->gi = -1;
    *sample = s;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    if (!g_inited_check()) return NVML_ERROR_UNINITIALIZED;
    if (!sample || sample->magic != GPM_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    sample->magic = 0;
    free(sample);
    return NVML_SUCCESS;
}

static nvmlReturn_t gpm_fill(const scn_t *s, const gpu_t *g, int gi, nvmlGpmSample_t sample) {
    if (!sample || sample->magic != GPM_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->gpm_supported) return NVML_ERROR_NOT_SUPPORTED;
    sample->gpu = (int)(g - s->gpus);
    sample->gi = gi;
    sample->t = mono_now();
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t sample) {
    DEV(GPM);
    if (G->nmig > 0 && G->gpm_supported) return NVML_ERROR_NOT_SUPPORTED; /* read per instance */
    return gpm_fill(S, G, -1, sample);
}

API nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId,
                                     nvmlGpmSample_t sample) {
    DEV(GPM);
    if (!G->gpm_supported) return NVML_ERROR_NOT_SUPPORTED;
    for (int i = 0; i < G->nmig; i++)
        if (G->mig[i].gi == gpuInstanceId) return gpm_fill(S, G, (int)gpuInstanceId, sample);
    return NVML_ERROR_NOT_FOUND;
}

/* By metric (GPM_*), then the graphics utilisation at N_GPM. */
static const char *const gpm_names[N_GPM + 1][3] = {
    {"sm_util", "SM utilization", "%"},
    {"sm_occupancy", "SM occupancy", "%"},
    {"any_tensor_util", "Any tensor utilization", "%"},
    {"dram_bw_util", "DRAM bandwidth utilization", "%"},
    {"fp64_util", "FP64 utilization", "%"},
    {"fp32_util", "FP32 utilization", "%"},
    {"fp16_util", "FP16 utilization", "%"},
    {"gr_util", "Graphics utilization", "%"},
};

API nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
    if (!g_inited_check()) return NVML_ERROR_UNINITIALIZED;
    COUNT(GPM);
    NONNULL(m);
    if (m->version != GPM_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    const struct nvmlGpmSample_st *a = m->sample1, *b = m->sample2;
    if (!a || !b || a->magic != GPM_MAGIC || b->magic != GPM_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (a->gpu < 0 || a->gpu != b->gpu || a->gi != b->gi || !(b->t > a->t))
        return NVML_ERROR_INVALID_ARGUMENT; /* unfilled, from two sources, or out of order */
    if (m->numMetrics > 1024) return NVML_ERROR_INVALID_ARGUMENT;
    const scn_t *S = cur();
    if (!S || a->gpu >= S->ngpu) return NVML_ERROR_GPU_IS_LOST;
    const gpu_t *G = &S->gpus[a->gpu];
    if (G->lost) return NVML_ERROR_GPU_IS_LOST;
    if (G->err[C_GPM]) return G->err[C_GPM];
    const double *pct = G->gpm_pct;
    if (a->gi >= 0) {
        pct = NULL;
        for (int i = 0; i < G->nmig; i++)
            if ((int)G->mig[i].gi == a->gi) pct = G->mig[i].pct;
        if (!pct) return NVML_ERROR_NOT_FOUND; /* the instance went away */
    }
    double frac = busy_between(S, G, a->t, b->t) / (b->t - a->t);
    frac = frac < 0 ? 0 : frac > 1 ? 1 : frac;
    double gpm_frac[N_GPM]; /* per metric: the share of pct it reads */
    for (int k = 0; k < N_GPM; k++) gpm_frac[k] = frac;
    if (emu_on(G)) gpm_driven(G, a->t, b->t, pct, gpm_frac);
    for (unsigned int i = 0; i < m->numMetrics; i++) {
        nvmlGpmMetric_t *o = &m->metrics[i];
        int k;
        switch (o->metricId) {
        case 2: k = GPM_SM_ACTIVE; break;     /* NVML_GPM_METRIC_SM_UTIL */
        case 3: k = GPM_SM_OCCUPANCY; break;  /* NVML_GPM_METRIC_SM_OCCUPANCY */
        case 5: k = GPM_TENSOR_ACTIVE; break; /* NVML_GPM_METRIC_ANY_TENSOR_UTIL */
        case 10: k = GPM_DRAM_ACTIVE; break;  /* NVML_GPM_METRIC_DRAM_BW_UTIL */
        case 11: k = GPM_FP64_ACTIVE; break;  /* NVML_GPM_METRIC_FP64_UTIL */
        case 12: k = GPM_FP32_ACTIVE; break;  /* NVML_GPM_METRIC_FP32_UTIL */
        case 13: k = GPM_FP16_ACTIVE; break;  /* NVML_GPM_METRIC_FP16_UTIL */
        case 1: k = N_GPM; break;             /* NVML_GPM_METRIC_GRAPHICS_UTIL */
        default: k = -1;
        }
        double p = k < 0 ? -1 : k == N_GPM ? 100.0 : pct[k];
        if (p < 0) {
            o->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            o->value = 0;
            o->metricInfo.shortName = o->metricInfo.longName = o->metricInfo.unit = NULL;
            continue;
        }
        o->nvmlReturn = NVML_SUCCESS;
        o->value = k == N_GPM ? util_between(G, a->t, b->t) : gpm_frac[k] * p;
        const char *const *names = gpm_names[k];
        o->metricInfo.shortName = (char *)names[0];
        o->metricInfo.longName = (char *)names[1];
        o->metricInfo.unit = (char *)names[2];
    }
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ utilisation & samples */
API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    DEV(UTILIZATION);
    NONNULL(util);
    double now = mono_now();
    double f = frac_last_1s(S, G, now);
    util->gpu = clamp_pct(util_between(G, now - 1.0, now));
    util->memory = clamp_pct(f * G->mem_busy_pct);
    return NVML_SUCCESS;
}

/* The video engines: the scenario's percentage, over a 167 ms sample period. */
API nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *u,
                                                 unsigned int *period) {
    DEV(ENCODER);
    NONNULL(u);
    NONNULL(period);
    *u = G->encoder_pct;
    *period = 167000;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *u,
                                                 unsigned int *period) {
    DEV(DECODER);
    NONNULL(u);
    NONNULL(period);
    *u = G->decoder_pct;
    *period = 167000;
    return NVML_SUCCESS;
}

/* Value of one driver sample of `type` over the mono window [t0, t1]. */
static int sample_value(const scn_t *s, const gpu_t *g, int type, long long k, double t0,
                        double t1, unsigned int *value) {
    double frac = busy_between(s, g, t0, t1) / (t1 - t0);
    if (frac < 0) frac = 0;
    if (frac > 1) frac = 1;
    /* The driver reports whole percent: a period busy for less than 0.5 % of its length
     * reads as idle, so with idle_no_samples it records no sample either. */
    if (g->idle_no_samples && frac < 0.005) return 0;
    int gi = (int)(g - s->gpus);
    switch (type) {
    case 0: /* NVML_TOTAL_POWER_SAMPLES, mW */
    case 7: /* NVML_MODULE_POWER_SAMPLES */
        *value = (unsigned int)lround(power_w(g, power_frac_between(s, g, t0, t1)) * 1000.0);
        return 1;
    case 1: {
        double v = util_between(g, t0, t1) + g->pat.noise_pct * noise_unit(k, gi, type);
        *value = clamp_pct(v);
        return 1;
    }
    case 2: {
        double v = frac * g->mem_busy_pct + g->pat.noise_pct * noise_unit(k, gi, type);
        *value = clamp_pct(v);
        return 1;
    }
    case 3: case 4: case 8: case 9:
        *value = 0;
        return 1;
    case 5: {
        double idle = g->sm_clock_idle_mhz ? g->sm_clock_idle_mhz : g->sm_clock_mhz;
        *value = (unsigned int)lround(idle + frac * (g->sm_clock_mhz - idle));
        return 1;
    }
    case 6:
        *value = g->mem_clock_mhz;
        return 1;
    default:
        return -1;
    }
}

API nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, int type,
                                      unsigned long long lastSeenTimeStamp, int *valType,
                                      unsigned int *sampleCount, nvmlSample_t *samples) {
    DEV(SAMPLES);
    NONNULL(valType);
    NONNULL(sampleCount);
    if (!G->samples_supported) return NVML_ERROR_NOT_SUPPORTED;
    if (type < 0 || type > 9) return NVML_ERROR_INVALID_ARGUMENT;
    long long sp = sample_period_us(G);
    long long now_ts = scn_ts_us(S);
    double now_m = mono_now();
    long long off_us = now_ts - llround(now_m * 1e6); /* ts clock minus monotonic */
    long long kmax = now_ts / sp;
    long long kmin = kmax - (G->buffer_len > 0 ? G->buffer_len : 1) + 1;
    if (kmin < 1) kmin = 1;
    long long kstart = (long long)(lastSeenTimeStamp / (unsigned long long)sp) + 1;
    if (kstart > kmin) kmin = kstart;
    unsigned int cap = samples ? *sampleCount : 0;
    unsigned int n = 0;
    for (long long k = kmin; k <= kmax; k++) {
        long long ts = k * sp;
        if ((unsigned long long)ts <= lastSeenTimeStamp) continue;
        double t1 = (double)(ts - off_us) * 1e-6;
        unsigned int v = 0;
        int r = sample_value(S, G, type, k, t1 - (double)sp * 1e-6, t1, &v);
        if (r < 0) return NVML_ERROR_NOT_SUPPORTED;
        if (r == 0) continue;
        if (samples) {
            if (n >= cap) break;
            samples[n].timeStamp = (unsigned long long)ts;
            samples[n].sampleValue.ullVal = 0;
            samples[n].sampleValue.uiVal = v;
        }
        n++;
    }
    *valType = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
    *sampleCount = n;
    return n ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}

/* ------------------------------------------------------------------ memory */
API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *mem) {
    DEV(MEMORY);
    NONNULL(mem);
    unsigned long long used = gpu_mem_used(G);
    mem->total = G->mem_total;
    mem->used = used;
    mem->free = G->mem_total - used;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *mem) {
    DEV(MEMORY);
    NONNULL(mem);
    if (mem->version != NVML_STRUCT_VERSION(nvmlMemory_v2_t, 2U))
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long used = gpu_mem_used(G);
    unsigned long long res = G->mem_reserved > used ? used : G->mem_reserved;
    mem->total = G->mem_total;
    mem->reserved = res;
    mem->used = used - res;
    mem->free = G->mem_total - used;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1) {
    DEV(MEMORY);
    NONNULL(bar1);
    bar1->bar1Total = 128ULL << 30;
    bar1->bar1Used = 2ULL << 20;
    bar1->bar1Free = bar1->bar1Total - bar1->bar1Used;
    (void)G;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ power, energy */
API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *mw) {
    DEV(POWER);
    NONNULL(mw);
    double now = mono_now();
    *mw = (unsigned int)lround(power_w(G, power_frac_between(S, G, now - 1.0, now)) * 1000.0);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device,
                                                              unsigned int *minLimit,
                                                              unsigned int *maxLimit) {
    DEV(POWER_LIMIT);
    NONNULL(minLimit);
    NONNULL(maxLimit);
    *minLimit = (unsigned int)lround(G->power_min_limit_w * 1000);
    *maxLimit = (unsigned int)lround(G->power_limit_w * 1000);
    return NVML_SUCCESS;
}

/* mJ since the first nvmlInit of this process, integrating the current pattern. */
static unsigned long long energy_mj(const scn_t *s, const gpu_t *g) {
    int i = (int)(g - s->gpus);
    double now = mono_now();
    pthread_mutex_lock(&g_energy_lock);
    if (!g_energy[i].started) {
        g_energy[i].started = 1;
        g_energy[i].t_last = g_lib_t0 >= 0 ? g_lib_t0 : now;
        g_energy[i].mj = 0;
    }
    double t0 = g_energy[i].t_last;
    if (now > t0) {
        double busy = power_frac_between(s, g, t0, now) * (now - t0);
        g_energy[i].mj +=
            1000.0 * (g->power_idle_w * (now - t0) + (g->power_busy_w - g->power_idle_w) * busy);
        g_energy[i].t_last = now;
    }
    double mj = g_energy[i].mj;
    pthread_mutex_unlock(&g_energy_lock);
    return (unsigned long long)llround(mj);
}

API nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device,
                                                     unsigned long long *energy) {
    DEV(ENERGY);
    NONNULL(energy);
    *energy = energy_mj(S, G);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ clocks */
static unsigned int sm_clock_now(const scn_t *s, const gpu_t *g) {
    if (!g->sm_clock_idle_mhz || busy_at(s, g, mono_now())) return g->sm_clock_mhz;
    return g->sm_clock_idle_mhz;
}

static nvmlReturn_t clock_value(const scn_t *s, const gpu_t *g, int type, int maxv,
                                unsigned int *mhz) {
    NONNULL(mhz);
    switch (type) {
    case 0: case 1: *mhz = maxv ? g->sm_clock_max_mhz : sm_clock_now(s, g); break;
    case 2: *mhz = g->mem_clock_mhz; break;
    case 3: *mhz = maxv ? 1980 : 1755; break;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    DEV(CLOCKS);
    return clock_value(S, G, type, 0, clock);
}

API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    DEV(CLOCKS);
    return clock_value(S, G, type, 1, clock);
}

API nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t device, int type,
                                                unsigned int *clock) {
    DEV(CLOCKS);
    return clock_value(S, G, type, 1, clock);
}

API nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t device, int type,
                                                       unsigned int *clock) {
    DEV(CLOCKS);
    return clock_value(S, G, type, 1, clock);
}

API nvmlReturn_t nvmlDeviceGetMaxCustomerBoostClock(nvmlDevice_t device, int type,
                                                    unsigned int *clock) {
    DEV(CLOCKS);
    return clock_value(S, G, type, 1, clock);
}

API nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, int type, int id, unsigned int *clock) {
    DEV(CLOCKS);
    return clock_value(S, G, type, id != 0, clock);
}

API nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                        unsigned long long *reasons) {
    DEV(CLOCK_REASONS);
    NONNULL(reasons);
    *reasons = G->clock_reasons | (busy_at(S, G, mono_now()) ? 0ULL : 0x1ULL);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                           unsigned long long *reasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

API nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t device,
                                                          unsigned long long *reasons) {
    DEV(CLOCK_REASONS);
    (void)G;
    NONNULL(reasons);
    *reasons = 0x1FFULL;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t device,
                                                             unsigned long long *reasons) {
    return nvmlDeviceGetSupportedClocksEventReasons(device, reasons);
}

/* ------------------------------------------------------------------ pcie, thermal, fan, pstate */
API nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, int counter,
                                             unsigned int *value) {
    DEV(PCIE);
    NONNULL(value);
    if (counter == 0) *value = G->pcie_tx_kbps;
    else if (counter == 1) *value = G->pcie_rx_kbps;
    else return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    DEV(TEMPERATURE);
    NONNULL(temp);
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = (unsigned int)G->temperature_c;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temp) {
    DEV(TEMPERATURE);
    NONNULL(temp);
    if (temp->version != NVML_STRUCT_VERSION(nvmlTemperature_t, 1U))
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temp->sensorType != 0) return NVML_ERROR_INVALID_ARGUMENT;
    temp->temperature = G->temperature_c;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, int which,
                                                   unsigned int *temp) {
    DEV(TEMPERATURE);
    (void)G;
    NONNULL(temp);
    static const unsigned int th[] = {92, 89, 95, 87};
    if (which < 0 || which > 3) return NVML_ERROR_NOT_SUPPORTED;
    *temp = th[which];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t device, unsigned int *n) {
    DEV(FAN);
    (void)G;
    NONNULL(n);
    *n = 1;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed) {
    DEV(FAN);
    NONNULL(speed);
    *speed = G->fan_pct;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan,
                                          unsigned int *speed) {
    if (fan != 0 && g_inited_check()) return NVML_ERROR_INVALID_ARGUMENT;
    return nvmlDeviceGetFanSpeed(device, speed);
}

API nvmlReturn_t nvmlDeviceGetTargetFanSpeed(nvmlDevice_t device, unsigned int fan,
                                             unsigned int *speed) {
    return nvmlDeviceGetFanSpeed_v2(device, fan, speed);
}

static unsigned int pstate_now(const scn_t *s, const gpu_t *g) {
    return frac_last_1s(s, g, mono_now()) > 0 ? 0U : g->pstate_idle;
}

UINT_GETTER(nvmlDeviceGetPerformanceState, PSTATE, pstate_now(S, G))
UINT_GETTER(nvmlDeviceGetPowerState, PSTATE, pstate_now(S, G))

/* ------------------------------------------------------------------ processes */
static nvmlReturn_t procs_size_query(unsigned int n, unsigned int *count, int have_buf) {
    if (!have_buf || *count < n) {
        *count = n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    return (nvmlReturn_t)-1; /* go on and fill */
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                         unsigned int *count,
                                                         nvmlProcessInfo_t *infos) {
    DEV(PROCESSES);
    NONNULL(count);
    proc_t procs[MAX_PROCS];
    unsigned int n = (unsigned int)gpu_procs(G, procs);
    nvmlReturn_t r = procs_size_query(n, count, infos != NULL);
    if (r != (nvmlReturn_t)-1) return r;
    for (unsigned int i = 0; i < n; i++) {
        infos[i].pid = procs[i].pid;
        infos[i].usedGpuMemory = procs[i].mem;
        infos[i].gpuInstanceId = 0xFFFFFFFFU;
        infos[i].computeInstanceId = 0xFFFFFFFFU;
    }
    *count = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                         unsigned int *count,
                                                         nvmlProcessInfo_t *infos) {
    return nvmlDeviceGetComputeRunningProcesses_v3(device, count, infos);
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                      nvmlProcessInfo_v1_t *infos) {
    DEV(PROCESSES);
    NONNULL(count);
    proc_t procs[MAX_PROCS];
    unsigned int n = (unsigned int)gpu_procs(G, procs);
    nvmlReturn_t r = procs_size_query(n, count, infos != NULL);
    if (r != (nvmlReturn_t)-1) return r;
    for (unsigned int i = 0; i < n; i++) {
        infos[i].pid = procs[i].pid;
        infos[i].usedGpuMemory = procs[i].mem;
    }
    *count = n;
    return NVML_SUCCESS;
}

/* Graphics and MPS process lists: always empty on these compute GPUs. */
#define EMPTY_PROCS(fn)                                                               \
    API nvmlReturn_t fn(nvmlDevice_t device, unsigned int *count, void *infos) {      \
        DEV(PROCESSES);                                                               \
        (void)G;                                                                      \
        (void)infos;                                                                  \
        NONNULL(count);                                                               \
        *count = 0;                                                                   \
        return NVML_SUCCESS;                                                          \
    }
EMPTY_PROCS(nvmlDeviceGetGraphicsRunningProcesses_v3)
EMPTY_PROCS(nvmlDeviceGetGraphicsRunningProcesses_v2)
EMPTY_PROCS(nvmlDeviceGetGraphicsRunningProcesses)
EMPTY_PROCS(nvmlDeviceGetMPSComputeRunningProcesses_v3)
EMPTY_PROCS(nvmlDeviceGetMPSComputeRunningProcesses_v2)
EMPTY_PROCS(nvmlDeviceGetMPSComputeRunningProcesses)

/* Timestamp of the newest driver sample: per-process samples carry it. */
static unsigned long long last_sample_ts(const scn_t *s, const gpu_t *g) {
    long long sp = sample_period_us(g);
    return (unsigned long long)((scn_ts_us(s) / sp) * sp);
}

static unsigned int proc_sm(const scn_t *s, const gpu_t *g, const proc_t *p) {
    if (p->sm >= 0) return (unsigned int)p->sm;
    (void)s;
    double now = mono_now();
    return clamp_pct(util_between(g, now - 1.0, now));
}

API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                 nvmlProcessUtilizationSample_t *utilization,
                                                 unsigned int *count,
                                                 unsigned long long lastSeenTimeStamp) {
    DEV(PROCESS_UTILIZATION);
    NONNULL(count);
    unsigned long long ts = last_sample_ts(S, G);
    proc_t procs[MAX_PROCS];
    unsigned int n = ts > lastSeenTimeStamp ? (unsigned int)gpu_procs(G, procs) : 0U;
    if (n == 0) {
        *count = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    if (!utilization || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) {
        const proc_t *p = &procs[i];
        memset(&utilization[i], 0, sizeof utilization[i]);
        utilization[i].pid = p->pid;
        utilization[i].timeStamp = ts;
        utilization[i].smUtil = proc_sm(S, G, p);
        utilization[i].memUtil = (unsigned int)p->memutil;
    }
    *count = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device,
                                                       nvmlProcessesUtilizationInfo_t *info) {
    DEV(PROCESS_UTILIZATION);
    NONNULL(info);
    if (info->version != NVML_STRUCT_VERSION(nvmlProcessesUtilizationInfo_t, 1U))
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long ts = last_sample_ts(S, G);
    proc_t procs[MAX_PROCS];
    unsigned int n = ts > info->lastSeenTimeStamp ? (unsigned int)gpu_procs(G, procs) : 0U;
    if (n == 0) {
        info->processSamplesCount = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    if (!info->procUtilArray || info->processSamplesCount < n) {
        info->processSamplesCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) {
        const proc_t *p = &procs[i];
        nvmlProcessUtilizationInfo_v1_t *o = &info->procUtilArray[i];
        memset(o, 0, sizeof *o);
        o->pid = p->pid;
        o->timeStamp = ts;
        o->smUtil = proc_sm(S, G, p);
        o->memUtil = (unsigned int)p->memutil;
    }
    info->processSamplesCount = n;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ events */
#define EVENT_SET_MAGIC 0x45565431U /* "EVT1" */

typedef struct nvmlEventSet_st {
    unsigned int magic;
    pthread_mutex_t lock;
    unsigned long long types[MAX_GPUS]; /* event types registered per GPU */
    double since[MAX_GPUS];             /* the newest event delivered (or registration) */
} *nvmlEventSet_t;

API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    SYS(EVENTS);
    NONNULL(set);
    nvmlEventSet_t e = calloc(1, sizeof *e);
    if (!e) return NVML_ERROR_MEMORY;
    e->magic = EVENT_SET_MAGIC;
    pthread_mutex_init(&e->lock, NULL);
    *set = e;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (!g_inited_check()) return NVML_ERROR_UNINITIALIZED;
    if (!set || set->magic != EVENT_SET_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    set->magic = 0;
    pthread_mutex_destroy(&set->lock);
    free(set);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                  unsigned long long *types) {
    DEV(EVENTS);
    (void)G;
    NONNULL(types);
    *types = SUPPORTED_EVENT_TYPES;
    return NVML_SUCCESS;
}

/* Events of `types` on this GPU are delivered from now on (not the ones before). */
API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                          nvmlEventSet_t set) {
    DEV(EVENTS);
    if (!set || set->magic != EVENT_SET_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~SUPPORTED_EVENT_TYPES) return NVML_ERROR_NOT_SUPPORTED;
    int i = (int)(G - S->gpus);
    pthread_mutex_lock(&set->lock);
    if (!set->types[i]) set->since[i] = mono_now();
    set->types[i] |= types;
    pthread_mutex_unlock(&set->lock);
    return NVML_SUCCESS;
}

/* The oldest XID of a registered GPU not delivered by this set and due by `now`; 0 if none.
 * Caller holds set->lock.  A lost GPU's errors are delivered too (XID 79 is how it goes). */
static int next_xid(const scn_t *s, nvmlEventSet_t set, double now, int *gpu, int *k) {
    int found = 0;
    double best = 0;
    for (int i = 0; i < s->ngpu; i++) {
        if (!(set->types[i] & NVML_EVENT_TYPE_XID)) continue;
        const gpu_t *g = &s->gpus[i];
        for (int j = 0; j < g->nxid; j++) {
            double t = g->xid[j].t;
            if (t > set->since[i] && t <= now && (!found || t < best)) {
                found = 1;
                best = t;
                *gpu = i;
                *k = j;
            }
        }
    }
    return found;
}

static nvmlReturn_t event_wait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms,
                               int v2) {
    if (!g_inited_check()) return NVML_ERROR_UNINITIALIZED;
    COUNT(EVENTS);
    if (!set || set->magic != EVENT_SET_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    NONNULL(data);
    double deadline = mono_now() + timeoutms / 1000.0;
    for (;;) {
        const scn_t *S = cur();
        if (S->err[C_EVENTS]) return S->err[C_EVENTS];
        double now = mono_now();
        int gpu = 0, k = 0;
        pthread_mutex_lock(&set->lock);
        int found = next_xid(S, set, now, &gpu, &k);
        if (found) {
            set->since[gpu] = S->gpus[gpu].xid[k].t;
            data->device = &g_handles[gpu];
            data->eventType = NVML_EVENT_TYPE_XID;
            data->eventData = S->gpus[gpu].xid[k].code;
            if (v2) data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFU;
        }
        pthread_mutex_unlock(&set->lock);
        if (found) return NVML_SUCCESS;
        if (now >= deadline) return NVML_ERROR_TIMEOUT;
        struct timespec ms = {0, 1000000L};
        nanosleep(&ms, NULL);
    }
}

API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                     unsigned int timeoutms) {
    return event_wait(set, data, timeoutms, 1);
}

API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data,
                                  unsigned int timeoutms) {
    return event_wait(set, data, timeoutms, 0);
}

/* ------------------------------------------------------------------ field values */
API nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                          nvmlFieldValue_t *values) {
    DEV(FIELD_VALUES);
    NONNULL(values);
    if (valuesCount < 0) return NVML_ERROR_INVALID_ARGUMENT;
    double now = mono_now();
    long long wall = clock_us(CLOCK_REALTIME);
    double since = g_lib_t0 >= 0 ? now - g_lib_t0 : 0.0;
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = wall;
        v->latencyUsec = 0;
        v->value.ullVal = 0;
        v->nvmlReturn = NVML_SUCCESS;
/* A field of a call the scenario fails (or says NOT_SUPPORTED for) fails alone. */
#define FIELD_OF(call)                                                 \
    if (G->err[C_##call]) {                                            \
        v->nvmlReturn = G->err[C_##call];                              \
        break;                                                         \
    }
        switch (v->fieldId) {
        case 1: /* NVML_FI_DEV_ECC_CURRENT */
            FIELD_OF(ECC);
            v->valueType = 1;
            v->value.uiVal = 1;
            break;
        case 3: case 4: case 5: case 6: /* NVML_FI_DEV_ECC_{SBE,DBE}_{VOL,AGG}_TOTAL */
            FIELD_OF(ECC);
            v->valueType = 3;
            v->value.ullVal = G->ecc[v->fieldId == 3 ? 0 : v->fieldId == 4 ? 1
                                     : v->fieldId == 5 ? 2 : 3];
            break;
        case 82: /* NVML_FI_DEV_MEMORY_TEMP */
            FIELD_OF(MEMORY_TEMPERATURE);
            v->valueType = 1;
            v->value.uiVal = (unsigned int)G->memory_temperature_c;
            break;
        case 94: /* NVML_FI_DEV_PCIE_REPLAY_COUNTER */
            FIELD_OF(PCIE_REPLAY);
            v->valueType = 1;
            v->value.uiVal = G->pcie_replays;
            break;
        case 138: case 139: /* NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX: KiB, scopeId a
                             * link or UINT_MAX for all */
            FIELD_OF(NVLINK);
            if (!G->nvlink_links) {
                v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
                break;
            }
            if (v->scopeId != 0xFFFFFFFFU && v->scopeId >= G->nvlink_links) {
                v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
                break;
            }
            v->valueType = 3;
            {
                double kib = (v->fieldId == 138 ? G->nvlink_tx_kbps : G->nvlink_rx_kbps) * since;
                if (v->scopeId != 0xFFFFFFFFU) kib /= G->nvlink_links;
                v->value.ullVal = (unsigned long long)kib;
            }
            break;
        case 185: /* NVML_FI_DEV_POWER_AVERAGE */
            v->valueType = 1;
            v->value.uiVal = (unsigned int)lround(power_w(G, power_frac_between(S, G, now - 1.0, now)) * 1000);
            break;
        case 186: /* NVML_FI_DEV_POWER_INSTANT */
            v->valueType = 1;
            v->value.uiVal = (unsigned int)lround(
                power_w(G, emu_on(G) ? emu_at(G, now).power : busy_at(S, G, now)) * 1000);
            break;
        case 83: /* NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION */
            FIELD_OF(ENERGY);
            v->valueType = 3;
            v->value.ullVal = energy_mj(S, G);
            break;
        case 142: case 143: case 144: case 145: /* NVML_FI_DEV_REMAPPED_{COR,UNC,PENDING,
                                                 * FAILURE} */
            FIELD_OF(REMAPPED_ROWS);
            v->valueType = 1;
            v->value.uiVal = v->fieldId == 142   ? G->remap_corrected
                             : v->fieldId == 143 ? G->remap_uncorrected
                             : v->fieldId == 144 ? G->remap_pending
                                                 : G->remap_failed;
            break;
        case 197: /* NVML_FI_DEV_PCIE_COUNT_TX_BYTES */
            v->valueType = 3;
            v->value.ullVal = (unsigned long long)(G->pcie_tx_kbps * 1024.0 * since);
            break;
        case 198: /* NVML_FI_DEV_PCIE_COUNT_RX_BYTES */
            v->valueType = 3;
            v->value.ullVal = (unsigned long long)(G->pcie_rx_kbps * 1024.0 * since);
            break;
        default:
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
#undef FIELD_OF
    }
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ test hooks */
/* sizeof of the structs filled here, so tests can compare with pynvml's ctypes layouts. */
API int fakenvml_sizeof(const char *name) {
    static const struct {
        const char *n;
        int sz;
    } t[] = {
        {"nvmlSample_t", sizeof(nvmlSample_t)},
        {"nvmlValue_t", sizeof(nvmlValue_t)},
        {"nvmlMemory_t", sizeof(nvmlMemory_t)},
        {"nvmlMemory_v2_t", sizeof(nvmlMemory_v2_t)},
        {"nvmlPciInfo_t", sizeof(nvmlPciInfo_t)},
        {"nvmlProcessInfo_v1_t", sizeof(nvmlProcessInfo_v1_t)},
        {"nvmlProcessInfo_t", sizeof(nvmlProcessInfo_t)},
        {"nvmlProcessUtilizationSample_t", sizeof(nvmlProcessUtilizationSample_t)},
        {"nvmlProcessUtilizationInfo_v1_t", sizeof(nvmlProcessUtilizationInfo_v1_t)},
        {"nvmlProcessesUtilizationInfo_t", sizeof(nvmlProcessesUtilizationInfo_t)},
        {"nvmlUtilization_t", sizeof(nvmlUtilization_t)},
        {"nvmlFieldValue_t", sizeof(nvmlFieldValue_t)},
        {"nvmlTemperature_t", sizeof(nvmlTemperature_t)},
        {"nvmlBAR1Memory_t", sizeof(nvmlBAR1Memory_t)},
        {"nvmlGpmSupport_t", sizeof(nvmlGpmSupport_t)},
        {"nvmlGpmMetric_t", sizeof(nvmlGpmMetric_t)},
        {"nvmlGpmMetricsGet_t.metrics", offsetof(nvmlGpmMetricsGet_t, metrics)},
        {"nvmlFanSpeedInfo_t", sizeof(nvmlFanSpeedInfo_t)},
        {"nvmlEventData_t", sizeof(nvmlEventData_t)},
    };
    if (!name) return -1;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strcmp(t[i].n, name) == 0) return t[i].sz;
    return -1;
}

/* How many calls of `name` (a call name of the scenario: "gpm", "samples", ...) this process
 * made since it loaded the library. */
API long long fakenvml_calls(const char *name) {
    int ci = name ? call_index(name) : -1;
    return ci < 0 ? -1 : atomic_load(&g_calls[ci]);
}

/* Re-read the scenario now (instead of within ~10 ms); returns the load generation. */
API long long fakenvml_reload(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    maybe_reload((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec, 1);
    return atomic_load(&g_generation);
}

/* How many times a scenario has been (re)loaded in this process. */
API long long fakenvml_generation(void) { return atomic_load(&g_generation); }
