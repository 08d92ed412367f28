/*
 * help_env.c: `gpc help env`: the table of settings (src/core/settings.c),
 * grouped, one line each: name, default, help; then the GPC_* variables set
 * here, naming those that are no setting. With --markdown, the same as
 * the tables of docs/environment.md, which tests/cli/test_settings.sh checks
 * against this output so that the document cannot drift from the table.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "gpc/settings.h"

static const char *NAME = "help env";

/* Each group's heading, in the table's order. */
static const char *group_title(const char *group) {
    static const char *const titles[][2] = {
        {"everyday", "Everyday"},
        {"numerics", "Numerics"},
        {"distributed", "Distributed runs"},
        {"gpcd", "gpcd and its jobs"},
        {"benchmarks", "Benchmarks and diagnosis"},
        {"tests", "Tests"},
    };
    for (size_t i = 0; i < sizeof titles / sizeof titles[0]; i++)
        if (strcmp(titles[i][0], group) == 0) return titles[i][1];
    return group;
}

static const char *type_name(gpc_setting_type type) {
    switch (type) {
    case GPC_SETTING_FLAG:
        return "flag";
    case GPC_SETTING_INT:
        return "integer";
    case GPC_SETTING_DOUBLE:
        return "number";
    case GPC_SETTING_STRING:
        return "text";
    }
    return "?";
}

/* "auto|two|fused" as "`auto`, `two` or `fused`" (code) or "auto, two or
 * fused" (plain) into buf. */
static void choices_text(const char *choices, int code, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (const char *c = choices; *c && used < size;) {
        size_t len = strcspn(c, "|");
        const char *next = c + len + (c[len] == '|');
        const char *sep = c == choices ? "" : *next ? ", " : " or ";
        int n = snprintf(buf + used, size - used, "%s%s%.*s%s", sep, code ? "`" : "", (int)len, c,
                         code ? "`" : "");
        if (n < 0) break;
        used += (size_t)n;
        c = next;
    }
}

/* What values a setting takes beyond its help: its choices or its range. */
static void values_text(const gpc_setting_info *s, int code, char *buf, size_t size) {
    buf[0] = '\0';
    if (s->choices) {
        char list[256];
        choices_text(s->choices, code, list, sizeof list);
        snprintf(buf, size, "; %s", list);
    } else if (s->min < s->max) {
        snprintf(buf, size, "; %g to %g", s->min, s->max);
    }
}

static void print_plain(void) {
    printf("gpc reads these environment variables; a command-line flag comes first where there "
           "is one.\nFlags take 1/on/true/yes or 0/off/false/no. docs/environment.md explains "
           "each.\n");
    const char *group = "";
    for (size_t i = 0; i < gpc_settings_count(); i++) {
        const gpc_setting_info *s = gpc_settings_at(i);
        if (strcmp(s->group, group) != 0) {
            group = s->group;
            printf("\n%s:\n", group_title(group));
        }
        char values[300];
        values_text(s, 0, values, sizeof values);
        printf("  %-24s %-10s %s%s\n", s->name, s->default_value ? s->default_value : "-", s->help,
               values);
    }
}

extern char **environ;

/* The GPC_* variables of this environment that are (known 1) or are not
 * (known 0) in the table, under heading; known ones with their values. */
static void list_environment(int known, const char *heading) {
    int listed = 0;
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "GPC_", 4) != 0) continue;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(*e, "="), *e);
        if ((gpc_settings_find(name) != NULL) != known) continue;
        if (!listed++) printf("\n%s:\n", heading);
        printf("  %s\n", known ? *e : name);
    }
}

static void print_markdown(void) {
    printf("<!-- begin: gpc help env --markdown (from src/core/settings.c; do not edit) -->\n");
    const char *group = "";
    for (size_t i = 0; i < gpc_settings_count(); i++) {
        const gpc_setting_info *s = gpc_settings_at(i);
        if (strcmp(s->group, group) != 0) {
            group = s->group;
            printf("\n## %s\n\n| variable | type | default | effect |\n| --- | --- | --- | --- |\n",
                   group_title(group));
        }
        char values[300], dflt[300];
        values_text(s, 1, values, sizeof values);
        if (s->default_value)
            snprintf(dflt, sizeof dflt, "`%s`", s->default_value);
        else
            snprintf(dflt, sizeof dflt, "none");
        printf("| `%s` | %s | %s | %s%s |\n", s->name, type_name(s->type), dflt, s->help, values);
    }
    printf("\n<!-- end: gpc help env --markdown -->\n");
}

int cli_help_env(int argc, char **argv) {
    int markdown = 0;
    const cli_option options[] = {
        {"markdown", CLI_FLAG, &markdown, NULL,
         "the tables of docs/environment.md, in Markdown, instead"},
        {NULL, 0, NULL, NULL, NULL},
    };
    const cli_spec spec = {
        NAME,
        "help env [--markdown]",
        "Lists the GPC_* environment variables gpc reads or sets, grouped, with each one's "
        "default and what it does.",
        options,
        0,
        NULL,
        NULL,
    };
    CLI_PARSE_OR_RETURN(&spec, argc, argv);
    if (markdown)
        print_markdown();
    else {
        print_plain();
        list_environment(1, "Set here");
        /* a misspelt name is otherwise silent: nothing reads it */
        list_environment(0, "Set here but not settings of gpc (nothing reads them)");
    }
    return CLI_EXIT_OK;
}
