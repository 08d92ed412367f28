/*
 * cmd_quantize.c: `gpc quantize RUN --to int8|fp8 [--scales channel|tensor]
 * --out RUN2`: a run's weights quantized for inference. The work is
 * gpc_quantize_run (src/train/quant_run.c).
 */
#include "cli.h"
#include "gpc/train.h"

#include <stdio.h>

#define NAME "quantize"

int cmd_quantize(int argc, char **argv) {
    const char *out = NULL, *to = NULL, *scales = NULL, *positional[1] = {NULL};
    int positional_count = 0;
    const cli_option options[] = {
        {"to", CLI_STRING, &to, "TYPE", "int8 or fp8 (E4M3)"},
        {"scales", CLI_STRING, &scales, "S",
         "channel (a scale per output channel, the default) or tensor (one per matrix; fp8 "
         "only)"},
        {"out", CLI_STRING, &out, "RUN2", "run folder to write (absent or empty)"},
        {NULL, 0, NULL, NULL, NULL},
    };
    const cli_spec spec = {
        NAME,
        "quantize RUN --to int8|fp8 [--scales channel|tensor] --out RUN2",
        "Quantizes the matrix weights of RUN (qkv, attention projection, fc, fc projection) to "
        "int8 or fp8 E4M3 with f32 scales and writes RUN2 for inference: gpc sample, gpc eval "
        "and gpc serve read it; gpc train does not.",
        options,
        1,
        positional,
        &positional_count,
    };
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (positional_count != 1) return cli_usage_error(NAME, "give the run folder to quantize");
    if (!to) return cli_usage_error(NAME, "--to int8 or --to fp8 is required");
    if (!out) return cli_usage_error(NAME, "--out RUN2 is required");
    gpt_quant_options quant;
    gpc_status s = gpt_quant_parse(to, scales, &quant);
    if (s != GPC_OK) return cli_usage_error(NAME, "%s", gpc_last_error());
    gpc_quantize_summary summary;
    s = gpc_quantize_run(positional[0], out, &quant, &summary);
    if (s != GPC_OK) return cli_fail(NAME, s);
    printf("quantized %s to %s (%s): weights %.1f MiB in bf16, %.1f MiB quantized; relative "
           "error of the matrices %.3g\n",
           positional[0], out, gpt_quant_name(&quant), (double)summary.bf16_bytes / (1 << 20),
           (double)summary.quant_bytes / (1 << 20), summary.relative_error);
    return CLI_EXIT_OK;
}
