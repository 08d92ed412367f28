/*
 * metrics.c: gpcd's state in the Prometheus text exposition format (0.0.4),
 * served at /metrics: GPU readings, jobs by state, the queue, alerts and the
 * scheduler's own timing. Names follow Prometheus conventions (base units,
 * _total for counters) so `promtool check metrics` passes; readings the
 * driver does not give (-1) are left out rather than exported as fake zeros.
 */
#include "sched/sched_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void header(FILE *f, const char *name, const char *type, const char *help) {
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Label values escape backslash, double quote and newline. */
static void label_escaped(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            fprintf(f, "\\%c", *s);
        else if (*s == '\n')
            fputs("\\n", f);
        else
            fputc(*s, f);
    }
}

typedef enum {
    GPU_UTIL,
    GPU_MEM_USED,
    GPU_MEM_TOTAL,
    GPU_TEMP,
    GPU_SLOWDOWN,
    GPU_POWER,
    GPU_POWER_LIMIT,
    GPU_SM_CLOCK,
    GPU_MEM_CLOCK,
    GPU_THROTTLE,
    GPU_ECC,
    GPU_BUSY
} gpu_field;

static double gpu_value(const gpcd_gpu_reading *r, gpu_field field) {
    switch (field) {
    case GPU_UTIL:
        return r->util < 0 ? -1 : r->util / 100.0;
    case GPU_MEM_USED:
        return (double)r->mem_used;
    case GPU_MEM_TOTAL:
        return (double)r->mem_total;
    case GPU_TEMP:
        return r->temperature;
    case GPU_SLOWDOWN:
        return r->slowdown_temperature;
    case GPU_POWER:
        return r->power;
    case GPU_POWER_LIMIT:
        return r->power_limit;
    case GPU_SM_CLOCK:
        return r->sm_clock_mhz < 0 ? -1 : r->sm_clock_mhz * 1e6;
    case GPU_MEM_CLOCK:
        return r->mem_clock_mhz < 0 ? -1 : r->mem_clock_mhz * 1e6;
    case GPU_THROTTLE:
        return (double)r->throttle_reasons;
    case GPU_ECC:
        return (double)r->ecc_uncorrected;
    case GPU_BUSY:
        return r->busy;
    }
    return -1;
}

char *gpcd_metrics_render(const gpcd_metrics_input *in) {
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    if (!f) return NULL;
    header(f, "gpcd_up", "gauge", "1 while gpcd answers.");
    fprintf(f, "gpcd_up 1\n");
    header(f, "gpcd_uptime_seconds", "gauge", "Seconds since gpcd started.");
    fprintf(f, "gpcd_uptime_seconds %.3f\n", in->uptime_seconds);

    header(f, "gpcd_gpu_info", "gauge", "One series per GPU carrying its name.");
    for (int g = 0; g < in->gpu_count; g++) {
        fprintf(f, "gpcd_gpu_info{gpu=\"%d\",name=\"", g);
        label_escaped(f, in->gpus[g].name);
        fprintf(f, "\"} 1\n");
    }
    static const struct {
        gpu_field field;
        const char *name, *help;
    } series[] = {
        {GPU_UTIL, "gpcd_gpu_utilization_ratio", "Fraction of time a kernel ran (0-1)."},
        {GPU_MEM_USED, "gpcd_gpu_memory_used_bytes", "GPU memory in use."},
        {GPU_MEM_TOTAL, "gpcd_gpu_memory_total_bytes", "GPU memory in all."},
        {GPU_TEMP, "gpcd_gpu_temperature_celsius", "GPU temperature."},
        {GPU_SLOWDOWN, "gpcd_gpu_slowdown_temperature_celsius",
         "Temperature at which the GPU slows itself down."},
        {GPU_POWER, "gpcd_gpu_power_watts", "Power drawn."},
        {GPU_POWER_LIMIT, "gpcd_gpu_power_limit_watts", "Enforced power limit."},
        {GPU_SM_CLOCK, "gpcd_gpu_sm_clock_hertz", "SM clock."},
        {GPU_MEM_CLOCK, "gpcd_gpu_memory_clock_hertz", "Memory clock."},
        {GPU_THROTTLE, "gpcd_gpu_throttle_reasons", "Bit mask of NVML clock throttle reasons."},
        {GPU_ECC, "gpcd_gpu_ecc_uncorrected_errors",
         "Uncorrectable ECC errors since the driver loaded."},
        {GPU_BUSY, "gpcd_gpu_busy", "1 while a gpcd job runs on the GPU."},
    };
    for (size_t s = 0; s < sizeof series / sizeof series[0]; s++) {
        header(f, series[s].name, "gauge", series[s].help);
        for (int g = 0; g < in->gpu_count; g++) {
            double v = gpu_value(&in->gpus[g], series[s].field);
            if (v < 0) continue;
            fprintf(f, "%s{gpu=\"%d\"} %.17g\n", series[s].name, g, v);
        }
    }

    header(f, "gpcd_jobs", "gauge", "Jobs in the database by state.");
    for (int s = 0; s < GPCD_STATE_COUNT; s++)
        fprintf(f, "gpcd_jobs{state=\"%s\"} %lld\n", gpcd_state_name((gpcd_state)s),
                (long long)in->jobs_by_state[s]);
    header(f, "gpcd_queue_length", "gauge", "Jobs waiting for GPUs (queued or preempted).");
    fprintf(f, "gpcd_queue_length %d\n", in->pending);
    header(f, "gpcd_running_jobs", "gauge", "Jobs running now.");
    fprintf(f, "gpcd_running_jobs %d\n", in->running);
    header(f, "gpcd_queue_oldest_wait_seconds", "gauge",
           "How long the oldest waiting job has waited.");
    fprintf(f, "gpcd_queue_oldest_wait_seconds %.3f\n", in->oldest_wait_seconds);
    header(f, "gpcd_jobs_submitted_total", "counter", "Jobs accepted since gpcd started.");
    fprintf(f, "gpcd_jobs_submitted_total %lld\n", (long long)in->submitted_total);
    header(f, "gpcd_jobs_started_total", "counter", "Job starts since gpcd started.");
    fprintf(f, "gpcd_jobs_started_total %lld\n", (long long)in->started_total);
    header(f, "gpcd_jobs_preempted_total", "counter", "Preemptions since gpcd started.");
    fprintf(f, "gpcd_jobs_preempted_total %lld\n", (long long)in->preempted_total);
    header(f, "gpcd_schedule_pass_seconds", "gauge", "Duration of the last scheduling pass.");
    fprintf(f, "gpcd_schedule_pass_seconds %.9f\n", in->last_pass_seconds);

    int by_kind[GPCD_ALERT_KIND_COUNT] = {0};
    for (int i = 0; i < in->alert_count; i++)
        by_kind[in->alerts[i].kind]++;
    header(f, "gpcd_alerts_active", "gauge", "Active alerts by kind.");
    for (int k = 0; k < GPCD_ALERT_KIND_COUNT; k++)
        fprintf(f, "gpcd_alerts_active{kind=\"%s\"} %d\n", gpcd_alert_kind_name(k), by_kind[k]);
    header(f, "gpcd_alert_active", "gauge", "1 for each active alert, by GPU and kind.");
    for (int i = 0; i < in->alert_count; i++)
        fprintf(f, "gpcd_alert_active{gpu=\"%d\",kind=\"%s\"} 1\n", in->alerts[i].gpu,
                gpcd_alert_kind_name(in->alerts[i].kind));
    fclose(f);
    return text;
}
