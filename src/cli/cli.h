/*
 * cli.h: what the gpc subcommands share: the option parser, error reporting
 * with the exit-status contract, and the progress line.
 *
 * Exit status: 0 success, 1 runtime error, 2 usage error. Every error prints
 * one line, "gpc CMD: error: what was wrong and what to do".
 */
#ifndef GPC_CLI_H
#define GPC_CLI_H

#include "gpc/core.h"

#define CLI_EXIT_OK 0
#define CLI_EXIT_RUNTIME 1
#define CLI_EXIT_USAGE 2
#define CLI_HELP_SHOWN (-1) /* cli_parse printed --help: the command returns 0 */

typedef enum {
    CLI_FLAG,        /* int, set to 1 */
    CLI_INT,         /* int */
    CLI_INT64,       /* int64_t */
    CLI_FLOAT,       /* double */
    CLI_STRING,      /* const char * */
    CLI_STRING_LIST, /* cli_list: every following argument up to the next option */
    CLI_BYTES,       /* uint64_t, with optional K/M/G/T suffix (powers of 1024) */
} cli_option_type;

typedef struct {
    const char **items;
    int count;
} cli_list;

typedef struct {
    const char *name; /* without the leading dashes */
    cli_option_type type;
    void *dest;
    const char *metavar; /* shown in help, e.g. "N" */
    const char *help;    /* one line; the default is part of it */
} cli_option;

typedef struct {
    const char *name;    /* "train", "data prepare" */
    const char *usage;   /* the synopsis after "gpc " */
    const char *summary; /* one paragraph */
    const cli_option *options;
    int max_positional; /* positional arguments allowed; they land in positional */
    const char **positional;
    int *positional_count;
} cli_spec;

/* Parses argv[1..argc-1] (argv[0] is the command name). Returns 0, CLI_HELP_SHOWN
 * after printing help for --help/-h, or CLI_EXIT_USAGE after printing the error. */
int cli_parse(const cli_spec *spec, int argc, char **argv);
/* In a command's function: parses, returns CLI_EXIT_OK after --help and the
 * usage error's status after an error, and goes on otherwise. */
#define CLI_PARSE_OR_RETURN(spec, argc, argv)                                                      \
    do {                                                                                           \
        int parsed_ = cli_parse(spec, argc, argv);                                                 \
        if (parsed_ == CLI_HELP_SHOWN) return CLI_EXIT_OK;                                         \
        if (parsed_) return parsed_;                                                               \
    } while (0)
void cli_print_help(const cli_spec *spec);

/* Prints "gpc CMD: error: <gpc_last_error()>" and returns the exit status for
 * the status: 2 for GPC_ERR_INVALID_ARG (the user asked for something
 * impossible), 1 otherwise. */
int cli_fail(const char *command, gpc_status status);
/* Prints a usage error and returns 2. */
int cli_usage_error(const char *command, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* --precision's value: f32, bf16 or fp16 (also f16, fp32) into *dtype (a
 * gpc_dtype). Returns 0, or prints the usage error and returns 2. */
int cli_precision(const char *command, const char *value, int *dtype);

/* Before a command runs: OpenMP's passive wait policy unless the user chose
 * one (gpc executes itself again to set it: src/cli/openmp.c says why) and
 * no more threads than the cores this process may use. */
void cli_openmp_setup(char **argv);

/* Human-readable sizes and durations: "1.5 GiB", "3m12s". */
const char *cli_format_bytes(double bytes, char *buf, size_t size);
const char *cli_format_duration(double seconds, char *buf, size_t size);

/* A live progress line: rewritten in place on a terminal, one line per
 * update (at most every `interval` seconds) when stderr is a file or pipe. */
typedef struct {
    int tty;
    double last;
    double interval;
    int open; /* a line is on screen without its newline */
} cli_progress;

void cli_progress_init(cli_progress *p);
void cli_progress_update(cli_progress *p, int force, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void cli_progress_end(cli_progress *p);

/* Ctrl-C and SIGTERM as a request to stop cleanly (stop.c): after
 * cli_catch_stop, cli_stop_signal() is the signal received, 0 before one,
 * and `hook` (if not NULL; it runs in the signal handler, so it may only set
 * a flag) is called at each; a second signal stops the process at once. */
void cli_catch_stop(void (*hook)(void));
int cli_stop_signal(void);
const char *cli_stop_name(void); /* "Ctrl-C" or "SIGTERM" */

/* Subcommands. Each lives in its own cmd_*.c file. */
typedef int (*cli_command_fn)(int argc, char **argv);

/* `gpc help env [--markdown]` (help_env.c): the table of settings. */
int cli_help_env(int argc, char **argv);

#endif /* GPC_CLI_H */
