/*
 * cmd_merge.c: `gpc merge RUN --out RUN2`: a LoRA run's adapters folded
 * into its base, as a plain run folder. The work is gpc_lora_merge
 * (src/train/lora_run.c).
 */
#include "cli.h"
#include "gpc/train.h"

#include <stdio.h>

#define NAME "merge"

int cmd_merge(int argc, char **argv) {
    const char *out = NULL, *positional[1] = {NULL};
    int positional_count = 0;
    const cli_option options[] = {
        {"out", CLI_STRING, &out, "RUN2", "run folder to write (must not exist)"},
        {NULL, 0, NULL, NULL, NULL},
    };
    const cli_spec spec = {
        NAME,
        "merge RUN --out RUN2",
        "Folds the LoRA adapters of RUN (trained with gpc train --lora) into the weights of its "
        "base run, W += alpha/R * B.A, and writes a plain run folder that gpc sample, gpc eval, "
        "gpc export hf and gpc train --init-from use.",
        options,
        1,
        positional,
        &positional_count,
    };
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (positional_count != 1) return cli_usage_error(NAME, "give the LoRA run folder to merge");
    if (!out) return cli_usage_error(NAME, "--out RUN2 is required");
    gpc_status s = gpc_lora_merge(positional[0], out);
    if (s != GPC_OK) return cli_fail(NAME, s);
    printf("merged the adapters of %s into %s\n", positional[0], out);
    return CLI_EXIT_OK;
}
