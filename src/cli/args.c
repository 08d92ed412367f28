/*
 * args.c: the one option parser every gpc subcommand uses, so flags behave
 * the same everywhere: --name VALUE or --name=VALUE, --help, and a clear
 * usage error naming the flag and the command's help.
 */
#include "cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_usage_error(const char *command, const char *fmt, ...) {
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    /* "help env" is its own help topic: see 'gpc help env' */
    const char *topic = strncmp(command, "help ", 5) == 0 ? command + 5 : command;
    fprintf(stderr, "gpc %s: error: %s (see 'gpc help %s')\n", command, message, topic);
    return CLI_EXIT_USAGE;
}

int cli_fail(const char *command, gpc_status status) {
    fprintf(stderr, "gpc %s: error: %s\n", command, gpc_last_error());
    return status == GPC_ERR_INVALID_ARG ? CLI_EXIT_USAGE : CLI_EXIT_RUNTIME;
}

static int set_value(const char *command, const cli_option *opt, const char *value) {
    char *end;
    errno = 0;
    switch (opt->type) {
    case CLI_INT:
    case CLI_INT64: {
        long long v = strtoll(value, &end, 10);
        /* accept 1e6-style integers, common for token counts */
        if (*end == 'e' || *end == 'E') {
            double d = strtod(value, &end);
            if (!*end && d == floor(d) && fabs(d) < 9e18) v = (long long)d;
        }
        if (*end || end == value || errno)
            return cli_usage_error(command, "--%s needs a whole number, not '%s'", opt->name,
                                   value);
        if (opt->type == CLI_INT) {
            if (v < -2147483647LL || v > 2147483647LL)
                return cli_usage_error(command, "--%s %s is out of range", opt->name, value);
            *(int *)opt->dest = (int)v;
        } else {
            *(int64_t *)opt->dest = v;
        }
        return 0;
    }
    case CLI_FLOAT: {
        double v = strtod(value, &end);
        if (*end || end == value || errno || !isfinite(v))
            return cli_usage_error(command, "--%s needs a number, not '%s'", opt->name, value);
        *(double *)opt->dest = v;
        return 0;
    }
    case CLI_STRING:
        *(const char **)opt->dest = value;
        return 0;
    case CLI_BYTES:
        if (gpc_parse_bytes(value, (uint64_t *)opt->dest) != GPC_OK)
            return cli_usage_error(command, "--%s needs a size such as 40G or 512M, not '%s'",
                                   opt->name, value);
        return 0;
    default:
        return 0;
    }
}

int cli_parse(const cli_spec *spec, int argc, char **argv) {
    if (spec->positional_count) *spec->positional_count = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            cli_print_help(spec);
            return CLI_HELP_SHOWN;
        }
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            if (spec->positional && spec->positional_count &&
                *spec->positional_count < spec->max_positional) {
                spec->positional[(*spec->positional_count)++] = arg;
                continue;
            }
            return cli_usage_error(spec->name, "unexpected argument '%s'", arg);
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        const cli_option *opt = NULL;
        for (const cli_option *o = spec->options; o && o->name; o++)
            if (strlen(o->name) == name_len && strncmp(o->name, name, name_len) == 0) opt = o;
        if (!opt) return cli_usage_error(spec->name, "unknown option --%.*s", (int)name_len, name);
        if (opt->type == CLI_FLAG) {
            if (eq) return cli_usage_error(spec->name, "--%s takes no value", opt->name);
            *(int *)opt->dest = 1;
            continue;
        }
        if (opt->type == CLI_STRING_LIST) {
            cli_list *list = opt->dest;
            list->items = (const char **)&argv[i + 1];
            list->count = 0;
            if (eq) return cli_usage_error(spec->name, "write --%s PATH [PATH...]", opt->name);
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
                i++;
                list->count++;
            }
            if (list->count == 0)
                return cli_usage_error(spec->name, "--%s needs at least one value", opt->name);
            continue;
        }
        const char *value = eq ? eq + 1 : NULL;
        if (!value) {
            if (i + 1 >= argc)
                return cli_usage_error(spec->name, "--%s needs a value (%s)", opt->name,
                                       opt->metavar ? opt->metavar : "VALUE");
            value = argv[++i];
        }
        int rc = set_value(spec->name, opt, value);
        if (rc) return rc;
    }
    return 0;
}

void cli_print_help(const cli_spec *spec) {
    printf("usage: gpc %s\n\n%s\n", spec->usage, spec->summary);
    if (spec->options && spec->options->name) printf("\noptions:\n");
    for (const cli_option *o = spec->options; o && o->name; o++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->metavar ? " " : "",
                 o->metavar ? o->metavar : "");
        printf("  %-26s %s\n", left, o->help);
    }
}

const char *cli_format_bytes(double bytes, char *buf, size_t size) {
    return gpc_format_bytes(bytes, buf, size);
}

const char *cli_format_duration(double seconds, char *buf, size_t size) {
    if (!(seconds >= 0) || seconds > 1e8) {
        snprintf(buf, size, "?");
        return buf;
    }
    long s = (long)(seconds + 0.5);
    if (s >= 3600)
        snprintf(buf, size, "%ldh%02ldm", s / 3600, (s / 60) % 60);
    else if (s >= 60)
        snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
    else
        snprintf(buf, size, "%lds", s);
    return buf;
}

int cli_precision(const char *command, const char *value, int *dtype) {
    const char *name = strcmp(value, "fp16") == 0   ? "f16"
                       : strcmp(value, "fp32") == 0 ? "f32"
                                                    : value;
    gpc_dtype d;
    if (gpc_dtype_parse(name, &d) != GPC_OK || (d != GPC_F32 && d != GPC_BF16 && d != GPC_F16))
        return cli_usage_error(command, "--precision must be f32, bf16 or fp16, not '%s'", value);
    *dtype = (int)d;
    return 0;
}
