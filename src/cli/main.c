/*
 * main.c: the gpc command: finds the subcommand and runs it.
 *
 * Subcommands are declared weak, so a build without some layer (the
 * scheduler without its libraries, say) still links; a missing subcommand
 * says how to get it instead of failing to link.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

#define COMMAND(fn) int fn(int argc, char **argv) __attribute__((weak))
COMMAND(cmd_data);
COMMAND(cmd_train);
COMMAND(cmd_sample);
COMMAND(cmd_import);
COMMAND(cmd_export);
COMMAND(cmd_merge);
COMMAND(cmd_quantize);
COMMAND(cmd_tokenize);
COMMAND(cmd_eval);
COMMAND(cmd_launch);
COMMAND(cmd_bench);
COMMAND(cmd_plan);
COMMAND(cmd_doctor);
COMMAND(cmd_report);
COMMAND(cmd_serve);
COMMAND(cmd_md);
COMMAND(cmd_stencil);
COMMAND(cmd_submit);
COMMAND(cmd_queue);
COMMAND(cmd_show);
COMMAND(cmd_logs);
COMMAND(cmd_cancel);
COMMAND(cmd_top);
COMMAND(cmd_gpu);
COMMAND(cmd_sched);

typedef struct {
    const char *name;
    cli_command_fn run;
    const char *summary;
    const char *needs; /* what to install when run is missing */
} command_entry;

static const command_entry commands[] = {
    {"data", cmd_data, "prepare token shards from text (prepare) or random tokens (synth)", NULL},
    {"train", cmd_train, "train a GPT model on token shards", NULL},
    {"sample", cmd_sample, "generate text from a trained run", NULL},
    {"import", cmd_import, "read a Hugging Face GPT-2 folder into a run folder (import hf)", NULL},
    {"export", cmd_export, "write a run as a Hugging Face GPT-2 folder (export hf)", NULL},
    {"merge", cmd_merge, "fold a LoRA run's adapters into a plain run", NULL},
    {"quantize", cmd_quantize, "int8 or fp8 weights of a run, for inference", NULL},
    {"tokenize", cmd_tokenize, "token ids of a text with a run's tokenizer, or back", NULL},
    {"eval", cmd_eval, "cross-entropy and perplexity of a run on data or a text", NULL},
    {"launch", cmd_launch, "start one training process per GPU", NULL},
    {"bench", cmd_bench, "measure GEMM, copies, overlap and attention on this machine", NULL},
    {"plan", cmd_plan, "memory a training run needs and which GPUs fit it", NULL},
    {"doctor", cmd_doctor, "check the machine and diagnose a slow or failing job", NULL},
    {"report", cmd_report, "write an HTML report of a training run", NULL},
    {"serve", cmd_serve, "serve a run over HTTP (OpenAI-style completions)", "libmicrohttpd"},
    {"md", cmd_md, "Lennard-Jones molecular dynamics", NULL},
    {"stencil", cmd_stencil, "3D finite-difference stencil solver", NULL},
    {"submit", cmd_submit, "submit a job to gpcd", "gpcd"},
    {"queue", cmd_queue, "list gpcd's jobs", "gpcd"},
    {"show", cmd_show, "show one gpcd job", "gpcd"},
    {"logs", cmd_logs, "print a gpcd job's output", "gpcd"},
    {"cancel", cmd_cancel, "cancel a gpcd job", "gpcd"},
    {"top", cmd_top, "live view of GPUs, jobs and alerts", "gpcd"},
    {"gpu", cmd_gpu, "drain a GPU from gpcd's service or resume it", "gpcd"},
    {"sched", cmd_sched, "scheduler tools (simulate a job trace)", "gpcd"},
};

static void print_overview(FILE *out) {
    fprintf(out,
            "gpc %s: train and sample GPT models, measure and share GPU servers\n\nusage: gpc "
            "COMMAND [OPTIONS]\n\n"
            "commands:\n",
            GPC_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (commands[i].run) fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(out,
            "  %-8s %s\n\nRun 'gpc help COMMAND' for a command's options, 'gpc help env' for "
            "the environment variables.\n",
            "help", "show help for a command");
}

static const command_entry *find(const char *name) {
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, name) == 0) return &commands[i];
    return NULL;
}

static int run_command(const command_entry *c, int argc, char **argv) {
    if (!c->run && !c->needs) {
        fprintf(stderr, "gpc %s: error: this command is not part of gpc %s yet\n", c->name,
                GPC_VERSION);
        return CLI_EXIT_RUNTIME;
    }
    if (!c->run) {
        fprintf(stderr,
                "gpc %s: error: this gpc was built without %s; install its libraries (make "
                "setup) and rebuild\n",
                c->name, c->needs);
        return CLI_EXIT_RUNTIME;
    }
    return c->run(argc, argv);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_overview(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--version") == 0 || strcmp(name, "version") == 0) {
        printf("gpc %s\n", GPC_VERSION);
        return CLI_EXIT_OK;
    }
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
        print_overview(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(name, "help") == 0) {
        if (argc < 3) {
            print_overview(stdout);
            return CLI_EXIT_OK;
        }
        /* gpc help env [--markdown]: the table of settings */
        if (strcmp(argv[2], "env") == 0) return cli_help_env(argc - 2, argv + 2);
        const command_entry *c = find(argv[2]);
        if (!c) {
            fprintf(stderr, "gpc help: error: unknown command '%s' (see 'gpc help')\n", argv[2]);
            return CLI_EXIT_USAGE;
        }
        /* gpc help data prepare -> gpc data prepare --help */
        char *help_argv[4] = {argv[2], argc > 3 ? argv[3] : "--help", "--help", NULL};
        return run_command(c, argc > 3 ? 3 : 2, help_argv);
    }
    const command_entry *c = find(name);
    if (!c) {
        fprintf(stderr, "gpc: error: unknown command '%s' (see 'gpc help')\n", name);
        return CLI_EXIT_USAGE;
    }
    cli_openmp_setup(argv);
    return run_command(c, argc - 1, argv + 1);
}
