/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * A stand-in for libnvidia-ml.so.1, for tests on machines with no GPU: the
 * NVML calls scx_zernel makes (through nvml-wrapper), with the ABI of the
 * real library, answered from a fake-GPU file in the GPU file provider's
 * format (the one zernel-workload's fake GPU writes):
 *
 *   {"devices":[{"index":0,"uuid":"GPU-..","pci_bus_id":"..","util":87}],
 *    "processes":[{"pid":4242,"device":0,"sm_util":85}]}
 *
 * The file is $ZERNEL_FAKE_NVML_FILE, re-read on every nvmlDeviceGetCount.
 * Like NVML, nvmlDeviceGetProcessUtilization returns only samples newer
 * than the caller's lastSeenTimeStamp: a process's sample is stamped with
 * the file's modification time, so a file older than the caller's window
 * yields no samples. Each call that asks for samples (lastSeenTimeStamp
 * set) appends "window_us <now - lastSeenTimeStamp>" to
 * $ZERNEL_FAKE_NVML_LOG when that is set, so a test can check the window
 * the caller asked for.
 *
 * Build: cc -shared -fPIC -O2 -o libnvidia-ml.so.1 fake_nvml.c
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;

enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_UNINITIALIZED = 1,
	NVML_ERROR_INVALID_ARGUMENT = 2,
	NVML_ERROR_NOT_FOUND = 6,
	NVML_ERROR_INSUFFICIENT_SIZE = 7,
};

typedef struct {
	unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
	char busIdLegacy[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} nvmlPciInfo_t;

typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
	unsigned int pid;
	unsigned long long timeStamp;
	unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

#define MAX_DEVS	16
#define MAX_PROCS	256

static struct dev {
	unsigned int util;
	char uuid[96];
	char bus_id[32];
} devs[MAX_DEVS];
static struct proc {
	unsigned int pid, dev, sm_util;
} procs[MAX_PROCS];
static unsigned int nr_devs, nr_procs;
static unsigned long long file_mtime_us;
static int initialized;

static unsigned long long now_us(void)
{
	struct timeval tv;

	gettimeofday(&tv, NULL);
	return (unsigned long long)tv.tv_sec * 1000000ULL + tv.tv_usec;
}

/* The text of "key" in the object [obj, end): a number or a quoted string. */
static const char *field(const char *obj, const char *end, const char *key)
{
	char pat[32];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\"", key);
	p = strstr(obj, pat);
	if (!p || p >= end)
		return NULL;
	p = strchr(p + strlen(pat), ':');
	if (!p || p >= end)
		return NULL;
	p++;
	while (*p == ' ')
		p++;
	return p;
}

static unsigned int num(const char *obj, const char *end, const char *key,
			unsigned int dflt)
{
	const char *p = field(obj, end, key);

	return p ? (unsigned int)strtoul(p, NULL, 10) : dflt;
}

static void str(const char *obj, const char *end, const char *key, char *out,
		size_t len)
{
	const char *p = field(obj, end, key);
	size_t n = 0;

	if (p && *p == '"')
		for (p++; *p && *p != '"' && p < end && n + 1 < len; p++)
			out[n++] = *p;
	out[n] = 0;
}

/* Calls @fn for each {...} object of the array "key". */
static void each(const char *text, const char *key,
		 void (*fn)(const char *obj, const char *end))
{
	const char *p = field(text, text + strlen(text), key), *end;

	if (!p || *p != '[')
		return;
	for (p++; (p = strpbrk(p, "{]")) && *p == '{'; p = end + 1) {
		end = strchr(p, '}');
		if (!end)
			return;
		fn(p, end);
	}
}

static void add_dev(const char *o, const char *e)
{
	struct dev *d;
	unsigned int i = num(o, e, "index", nr_devs);

	if (i >= MAX_DEVS)
		return;
	d = &devs[i];
	d->util = num(o, e, "util", 0);
	str(o, e, "uuid", d->uuid, sizeof(d->uuid));
	str(o, e, "pci_bus_id", d->bus_id, sizeof(d->bus_id));
	if (i + 1 > nr_devs)
		nr_devs = i + 1;
}

static void add_proc(const char *o, const char *e)
{
	if (nr_procs >= MAX_PROCS)
		return;
	procs[nr_procs].pid = num(o, e, "pid", 0);
	procs[nr_procs].dev = num(o, e, "device", 0);
	procs[nr_procs].sm_util = num(o, e, "sm_util", 0);
	nr_procs++;
}

/* Re-reads the file; a missing or unreadable one means no GPUs. */
static void load(void)
{
	const char *path = getenv("ZERNEL_FAKE_NVML_FILE");
	char text[65536];
	struct stat st;
	size_t n = 0;
	FILE *f;

	nr_devs = nr_procs = 0;
	memset(devs, 0, sizeof(devs));
	if (!path || !(f = fopen(path, "r")))
		return;
	if (!fstat(fileno(f), &st))
		file_mtime_us = (unsigned long long)st.st_mtim.tv_sec * 1000000ULL +
				st.st_mtim.tv_nsec / 1000;
	n = fread(text, 1, sizeof(text) - 1, f);
	fclose(f);
	text[n] = 0;
	each(text, "devices", add_dev);
	each(text, "processes", add_proc);
}

static int dev_index(nvmlDevice_t d, unsigned int *index)
{
	uintptr_t i = (uintptr_t)d;

	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	if (i == 0 || i > nr_devs)
		return NVML_ERROR_INVALID_ARGUMENT;
	*index = (unsigned int)(i - 1);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void)
{
	initialized = 1;
	load();
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void)
{
	initialized = 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	load();
	*count = nr_devs;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *d)
{
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	if (index >= nr_devs)
		return NVML_ERROR_INVALID_ARGUMENT;
	*d = (nvmlDevice_t)(uintptr_t)(index + 1);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len)
{
	unsigned int i;
	int r = dev_index(d, &i);

	if (r)
		return r;
	if (strlen(devs[i].uuid) + 1 > len)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(uuid, devs[i].uuid);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci)
{
	unsigned int i;
	int r = dev_index(d, &i);

	if (r)
		return r;
	memset(pci, 0, sizeof(*pci));
	snprintf(pci->busId, sizeof(pci->busId), "%s", devs[i].bus_id);
	snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%s", devs[i].bus_id);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
	unsigned int i;
	int r = dev_index(d, &i);

	if (r)
		return r;
	u->gpu = devs[i].util;
	u->memory = 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d,
						     unsigned int *count,
						     nvmlProcessInfo_t *infos)
{
	unsigned int i, k, n = 0;
	int r = dev_index(d, &i);

	if (r)
		return r;
	for (k = 0; k < nr_procs; k++)
		if (procs[k].dev == i) {
			if (infos && n < *count)
				infos[n] = (nvmlProcessInfo_t){ .pid = procs[k].pid };
			n++;
		}
	r = !infos && n ? NVML_ERROR_INSUFFICIENT_SIZE :
	    n > *count ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
	*count = n;
	return r;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d,
					     nvmlProcessUtilizationSample_t *s,
					     unsigned int *count,
					     unsigned long long last_seen)
{
	const char *log = getenv("ZERNEL_FAKE_NVML_LOG");
	unsigned long long now = now_us();
	unsigned int i, k, n = 0;
	int r = dev_index(d, &i);

	if (r)
		return r;
	if (!s && last_seen && log) {
		FILE *f = fopen(log, "a");

		if (f) {
			fprintf(f, "window_us %llu\n", now - last_seen);
			fclose(f);
		}
	}
	/* NVML keeps samples newer than last_seen; none at all is NOT_FOUND. */
	if (file_mtime_us <= last_seen)
		return NVML_ERROR_NOT_FOUND;
	for (k = 0; k < nr_procs; k++)
		if (procs[k].dev == i) {
			if (s && n < *count)
				s[n] = (nvmlProcessUtilizationSample_t){
					.pid = procs[k].pid,
					.timeStamp = file_mtime_us,
					.smUtil = procs[k].sm_util,
				};
			n++;
		}
	if (!n)
		return NVML_ERROR_NOT_FOUND;
	r = !s || n > *count ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
	*count = n;
	return r;
}
