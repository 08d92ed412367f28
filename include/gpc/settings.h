/*
 * gpc settings: the one table of the GPC_* environment variables gpc reads
 * or sets, with each one's type, default and one line of help, and the
 * accessors that read them.
 *
 * Every GPC_* variable goes through this table, so `gpc help env` and
 * docs/environment.md list them all and a test finds any that is read
 * without an entry. Values are read at each call, not cached: tests change
 * the environment between calls. Code on a hot path keeps the answer itself
 * (the CUDA switches read theirs at their first call).
 *
 * A value comes from, in order: an override (gpc_settings_override, how a
 * command-line flag beats the environment), the environment, the table's
 * default. An empty value counts as unset. A value that does not parse as
 * its type is named in one warning, and the default is used.
 *
 * Asking for a name that is not in the table is a bug in gpc: it is logged
 * as an error at each call, and the accessors answer as if the variable were
 * unset and had no default (NULL, 0).
 */
#ifndef GPC_SETTINGS_H
#define GPC_SETTINGS_H

#include <stddef.h>

#include "gpc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    GPC_SETTING_FLAG,   /* 1/on/true/yes or 0/off/false/no */
    GPC_SETTING_INT,    /* a decimal integer, within [min, max] where min < max */
    GPC_SETTING_DOUBLE, /* a number, within [min, max] where min < max */
    GPC_SETTING_STRING, /* text, one of choices where choices is not NULL */
} gpc_setting_type;

typedef struct {
    const char *name; /* "GPC_ATTENTION_BWD" */
    gpc_setting_type type;
    const char *default_value; /* as text; NULL: none */
    const char *group;   /* "everyday", "numerics", "benchmarks", "distributed", "gpcd", "tests" */
    const char *help;    /* one line */
    double min, max;     /* INT and DOUBLE: the values allowed; min == max: any */
    const char *choices; /* STRING: "a|b|c" when only these are meaningful; else NULL */
} gpc_setting_info;

size_t gpc_settings_count(void);
/* The table's entries, grouped, in the order `gpc help env` prints them;
 * NULL past the end. */
const gpc_setting_info *gpc_settings_at(size_t index);
/* NULL when name is not in the table (no error logged: for asking). */
const gpc_setting_info *gpc_settings_find(const char *name);

/* The value given (override, else environment), else the default (may be
 * NULL). Any type: the text as given, unchecked; callers of STRING settings
 * with choices check the value themselves. */
const char *gpc_setting_str(const char *name);
/* 1 when text is one of name's choices in the table, or the setting has
 * none; 0 otherwise (and for a name not in the table). */
int gpc_setting_is_choice(const char *name, const char *text);
/* The value given (override, else environment), NULL when none: for callers
 * that must tell "unset" from the default. */
const char *gpc_setting_given(const char *name);
/* 1/on/true/yes -> 1, 0/off/false/no -> 0 (any case), unset -> the default;
 * anything else: a warning once, and the default. */
int gpc_setting_flag(const char *name);
/* Parsed, range-checked where the table says; a bad value: a warning once,
 * and the default (0 when the table has none). */
long gpc_setting_int(const char *name);
double gpc_setting_double(const char *name);
/* gpc_setting_int for a setting whose bad value must stop the command
 * rather than fall back to the default: GPC_ERR_INVALID_ARG naming what is
 * allowed ("GPC_LOADER_DELAY_MS must be a whole number from 0 to 60000, not
 * 'x'"). *out is the value, or the default when unset. */
gpc_status gpc_setting_int_checked(const char *name, long *out);

/* Sets name's value for this process, ahead of the environment: how a
 * command-line flag (gpc train --attention-backward) reaches a setting read
 * deep in a backend. value NULL removes the override. The value is checked
 * against the setting's type, range and choices: GPC_ERR_INVALID_ARG with a
 * message naming what is allowed. Settings that are read once (the CUDA
 * switches) must be overridden before the first use; call it at start-up,
 * before other threads run. */
gpc_status gpc_settings_override(const char *name, const char *value);

#ifdef __cplusplus
}
#endif

#endif /* GPC_SETTINGS_H */
