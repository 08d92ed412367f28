/*
 * cmd_doctor.c: `gpc doctor`, the checks of gpc/doctor.h printed as they are
 * made: the host, the GPU stack and each GPU's health, an NCCL all-reduce
 * on two or more GPUs, and, given a process (--pid) or a gpcd job (--job), a
 * few seconds of watching it with concrete advice for the usual failures.
 * This file parses options, asks gpcd for a job's process and GPUs, and
 * prints.
 *
 * Every finding is one line: "ok", "info" or "PROBLEM" with advice under it.
 * Exit status 0 when no problem was found, 1 when one was, 2 for usage
 * errors. A machine without a GPU is a supported machine: "no GPU" is info.
 */
#include "cli/cli.h"
#include "gpc/doctor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef GPC_HAVE_SCHED
#include "gpc/sched.h"
#include <jansson.h>
#endif

static void print_finding(void *user, gpc_doctor_kind kind, const char *text) {
    if (user) return; /* --json -: stdout carries the JSON alone */
    if (kind == GPC_DOCTOR_ADVICE)
        printf("           -> %s\n", text);
    else if (kind == GPC_DOCTOR_SECTION)
        printf("\n%s:\n", text);
    else
        printf("  %-8s %s\n", gpc_doctor_kind_name(kind), text);
}

/* ------------------------------------------------------------- the job */

#ifdef GPC_HAVE_SCHED
/* The run folder a finished job trained into: the value of --out in its
 * command, taken from the job's working directory when relative. 0 when the
 * command names none. */
static int job_run_dir(json_t *o, char *run, size_t size) {
    json_t *command = json_object_get(o, "command");
    const char *cwd = json_string_value(json_object_get(o, "cwd"));
    const char *out = NULL;
    for (size_t i = 0; json_is_array(command) && i < json_array_size(command); i++) {
        const char *a = json_string_value(json_array_get(command, i));
        if (!a) continue;
        if (!strcmp(a, "--out") && i + 1 < json_array_size(command))
            out = json_string_value(json_array_get(command, i + 1));
        else if (!strncmp(a, "--out=", 6))
            out = a + 6;
    }
    if (!out || !*out) return 0;
    if (out[0] == '/' || !cwd)
        snprintf(run, size, "%s", out);
    else
        snprintf(run, size, "%s/%s", cwd, out);
    return 1;
}

/* Copies a job's log from gpcd into a new file at path, in pieces (gpcd
 * sends at most 1 MiB a request), up to 64 MiB. */
static gpc_status job_log(long long job, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return gpc_error(GPC_ERR_IO, "cannot write %s", path);
    gpc_status st = GPC_OK;
    for (long long offset = 0; offset < (64ll << 20);) {
        char url[128];
        snprintf(url, sizeof url, "/jobs/%lld/logs?offset=%lld", job, offset);
        gpcd_response r;
        memset(&r, 0, sizeof r);
        st = gpcd_client_request(gpcd_client_socket(NULL), "GET", url, NULL, &r);
        if (st) break;
        size_t got = r.status == 200 ? r.body_len : 0;
        if (got) fwrite(r.body, 1, got, f);
        gpcd_response_free(&r);
        if (!got) break;
        offset += (long long)got;
    }
    if (fclose(f) != 0 && st == GPC_OK) st = gpc_error(GPC_ERR_IO, "cannot write %s", path);
    return st;
}
#endif

/* A gpcd job: its process and GPUs while it runs; once it has ended, the
 * run folder it trained into (*run, from its --out) and a copy of its log
 * (*log), for the post-mortem of --run. */
static int resolve_job(long long job, int *pid, int *gpus, int *ngpus, char *run, size_t run_size,
                       char *log, size_t log_size) {
#ifdef GPC_HAVE_SCHED
    char path[64];
    gpcd_response response;
    memset(&response, 0, sizeof response);
    snprintf(path, sizeof path, "/jobs/%lld", job);
    gpc_status st = gpcd_client_request(gpcd_client_socket(NULL), "GET", path, NULL, &response);
    if (st) return cli_fail("doctor", st);
    if (response.status != 200) {
        fprintf(stderr, "gpc doctor: error: gpcd answered %d for job %lld: %s\n", response.status,
                job, response.body ? response.body : "");
        gpcd_response_free(&response);
        return response.status == 404 ? CLI_EXIT_USAGE : CLI_EXIT_RUNTIME;
    }
    json_error_t err;
    json_t *o = json_loads(response.body ? response.body : "", 0, &err);
    gpcd_response_free(&response);
    json_t *p = o ? json_object_get(o, "pid") : NULL;
    if (!p || !json_is_integer(p)) {
        const char *state = o ? json_string_value(json_object_get(o, "state")) : NULL;
        int ended = state && (!strcmp(state, "completed") || !strcmp(state, "failed") ||
                              !strcmp(state, "cancelled"));
        if (ended && job_run_dir(o, run, run_size)) {
            json_decref(o);
            const char *tmp = getenv("TMPDIR");
            snprintf(log, log_size, "%s/gpc-doctor-job-%lld-%d.log", tmp && *tmp ? tmp : "/tmp",
                     job, (int)getpid());
            st = job_log(job, log);
            if (st) {
                unlink(log);
                log[0] = 0;
                return cli_fail("doctor", st);
            }
            return 0;
        }
        fprintf(stderr, "gpc doctor: error: job %lld has no running process (state %s)%s\n", job,
                state ? state : "unknown",
                ended ? " and its command names no run folder (--out): give the folder with "
                        "--run RUN"
                      : "; doctor watches a job while it runs and reads its run folder once it "
                        "has ended");
        json_decref(o);
        return CLI_EXIT_RUNTIME;
    }
    *pid = (int)json_integer_value(p);
    json_t *assigned = json_object_get(o, "assigned_gpus");
    *ngpus = 0;
    for (size_t i = 0; json_is_array(assigned) && i < json_array_size(assigned) && i < 64; i++)
        gpus[(*ngpus)++] = (int)json_integer_value(json_array_get(assigned, i));
    json_decref(o);
    return 0;
#else
    (void)pid, (void)gpus, (void)ngpus, (void)run, (void)run_size, (void)log, (void)log_size;
    fprintf(stderr,
            "gpc doctor: error: --job %lld needs gpcd, and this gpc was built without the "
            "scheduler; install libsqlite3-dev libmicrohttpd-dev libjansson-dev libinih-dev "
            "and rebuild, or pass the job's process with --pid\n",
            job);
    return CLI_EXIT_RUNTIME;
#endif
}

int cmd_doctor(int argc, char **argv) {
    long long job = 0;
    int pid = -1; /* -1: not given */
    double seconds = 5;
    const char *run = NULL, *log = NULL, *json = NULL;
    const cli_option options[] = {
        {"job", CLI_INT64, &job, "ID",
         "watch a running gpcd job, or read the run folder of one that ended"},
        {"pid", CLI_INT, &pid, "PID", "watch a running process (and its children)"},
        {"seconds", CLI_FLOAT, &seconds, "S", "how long to watch (default 5)"},
        {"run", CLI_STRING, &run, "RUN",
         "post-mortem of a gpc train run folder (no machine checks)"},
        {"log", CLI_STRING, &log, "FILE", "the run's log for --run (default: a *.log in RUN)"},
        {"json", CLI_STRING, &json, "FILE",
         "also write the findings as JSON to FILE ('-': stdout)"},
        {0},
    };
    const cli_spec spec = {
        "doctor",
        "doctor [--job ID | --pid PID] [--seconds S] | --run RUN [--log FILE]; [--json FILE]",
        "Checks the machine: CPU, memory, OpenMP and OpenBLAS threads, disk, NVIDIA driver, "
        "CUDA runtime, NCCL, and each GPU's memory, temperature, clocks, throttle reasons, "
        "PCIe link and errors; with two or more GPUs an NCCL all-reduce against the link's "
        "rate. With --pid or --job it watches the process for a few seconds and says what "
        "holds it back (for gpc train, also from its run folder's wait for input). With --run it "
        "reads a finished run folder: an out-of-memory end and "
        "what would fit, its MFU, and what its metrics show; --job of a job that has ended "
        "reads its run folder (its --out) and its log the same way. Exit status 0: no problem "
        "found; 1: "
        "problems found (each with advice).",
        options,
        0,
        NULL,
        NULL};
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (job && pid > 0) return cli_usage_error("doctor", "give --job or --pid, not both");
    if (run && (job || pid > 0))
        return cli_usage_error("doctor",
                               "--run reads a finished run: give it without --job or --pid");
    if (log && !run) return cli_usage_error("doctor", "--log goes with --run RUN");
    if (job < 0) return cli_usage_error("doctor", "--job %lld is not a job id", job);
    if (pid == 0 || pid < -1) return cli_usage_error("doctor", "--pid %d is not a process id", pid);
    if (seconds <= 0 || seconds > 3600)
        return cli_usage_error("doctor",
                               "--seconds %g is out of range: use more than 0 and at "
                               "most 3600",
                               seconds);
    int job_gpus[64], njob_gpus = 0;
    char job_run[4096] = "", job_log_path[4200] = "";
    if (job) {
        int rc = resolve_job(job, &pid, job_gpus, &njob_gpus, job_run, sizeof job_run, job_log_path,
                             sizeof job_log_path);
        if (rc) return rc;
        if (job_run[0]) { /* the job has ended: its run folder's post-mortem */
            run = job_run;
            log = job_log_path[0] ? job_log_path : NULL;
        }
    }
    if (pid > 0 && !gpc_doctor_process_exists(pid))
        return cli_usage_error("doctor", "no process with pid %d (is it still running?)", pid);

    gpc_doctor *d;
    int quiet = json && !strcmp(json, "-");
    gpc_status st = gpc_doctor_open(print_finding, quiet ? &quiet : NULL, &d);
    if (st) return cli_fail("doctor", st);
    if (run) {
        st = gpc_doctor_run(d, run, log);
        if (st) {
            gpc_doctor_close(d);
            if (job_log_path[0]) unlink(job_log_path);
            return cli_fail("doctor", st);
        }
    } else {
        if (!quiet) printf("gpc doctor: machine\n");
        gpc_doctor_check_machine(d);
    }
    if (pid > 0) {
        st = gpc_doctor_watch(d, pid, job_gpus, njob_gpus, seconds);
        if (st) {
            gpc_doctor_close(d);
            /* the process ended between the check above and the watch */
            return st == GPC_ERR_INVALID_ARG ? cli_usage_error("doctor", "%s", gpc_last_error())
                                             : cli_fail("doctor", st);
        }
    }
    int problems = gpc_doctor_problems(d);
    if (json) st = gpc_doctor_write_json(d, json);
    gpc_doctor_close(d);
    if (job_log_path[0]) unlink(job_log_path);
    if (st) return cli_fail("doctor", st);
    if (quiet) return problems ? CLI_EXIT_RUNTIME : CLI_EXIT_OK;
    if (problems)
        printf("\n%d problem%s found (see the advice under each)\n", problems,
               problems == 1 ? "" : "s");
    else
        printf("\nno problems found\n");
    return problems ? CLI_EXIT_RUNTIME : CLI_EXIT_OK;
}
