/*
 * cmd_sched_tool.c: gpc sched, gpcd's helper tools:
 *
 *   gpc sched options   every gpcd config key with its default and meaning
 *                       (the table docs/gpcd.md is written from)
 */
#include "cli/cmd_sched.h"

#include <stdio.h>
#include <string.h>

int cmd_sched(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        printf("usage: gpc sched options\n\n"
               "Tools for gpcd. 'options' prints every config key with its default and meaning.\n");
        return argc < 2 ? CLI_EXIT_USAGE : CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "options") == 0) {
        if (argc > 2) return cli_usage_error("sched", "'options' takes no arguments");
        sched_config_write_markdown(stdout);
        return CLI_EXIT_OK;
    }
    return cli_usage_error("sched", "unknown tool '%s' (use: options)", argv[1]);
}
