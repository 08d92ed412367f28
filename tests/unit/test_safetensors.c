/* test_safetensors.c: safetensors files written by gpc read back exactly,
 * and every kind of lying or broken file (truncated, a 2^63 header length,
 * offsets past the end, overlaps, holes, shapes that disagree with the byte
 * count, unknown dtypes, bad JSON, deep nesting) is a one-line error. The bad
 * files are written byte by byte here, from the format's description. */
#include "testutil.h"

#include "gpc/hf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dir;

static int setup(void **state) {
    (void)state;
    dir = test_tmpdir("safetensors");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    test_rmtree(dir);
    gpc_free(dir);
    return 0;
}

/* Writes 8-byte length + header + data bytes; header_length overrides the
 * length field when not 0. Returns the path (static buffer). */
static const char *write_raw(const char *name, uint64_t header_length, const char *header,
                             size_t data_bytes) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t n = header_length ? header_length : strlen(header);
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < data_bytes; i++)
        fputc((int)(i & 0xff), f);
    fclose(f);
    return path;
}

static void test_round_trip(void **state) {
    (void)state;
    float a[6] = {1, -2, 3.5f, 1e-30f, -0.0f, 7};
    uint16_t b[3] = {gpc_f32_to_bf16(1.5f), gpc_f32_to_bf16(-2), 0x7f80};
    int32_t c[2] = {-7, 123456};
    gpc_st_write_tensor t[3] = {
        {"a.weight", GPC_F32, 2, {2, 3}, a},
        {"b", GPC_BF16, 1, {3}, b},
        {"c", GPC_I32, 1, {2}, c},
    };
    char path[4096];
    snprintf(path, sizeof path, "%s/ok.safetensors", dir);
    TEST_OK(gpc_safetensors_write(path, t, 3));
    gpc_safetensors *st;
    TEST_OK(gpc_safetensors_open(&st, path));
    assert_int_equal(gpc_safetensors_count(st), 3);
    const gpc_st_tensor *x = gpc_safetensors_find(st, "a.weight");
    assert_non_null(x);
    assert_string_equal(x->dtype, "F32");
    assert_int_equal(x->gpc_dtype, GPC_F32);
    assert_int_equal(x->ndim, 2);
    assert_int_equal(x->shape[0], 2);
    assert_int_equal(x->shape[1], 3);
    assert_int_equal(x->numel, 6);
    assert_memory_equal(x->data, a, sizeof a);
    x = gpc_safetensors_find(st, "b");
    assert_string_equal(x->dtype, "BF16");
    assert_memory_equal(x->data, b, sizeof b);
    x = gpc_safetensors_find(st, "c");
    assert_memory_equal(x->data, c, sizeof c);
    assert_null(gpc_safetensors_find(st, "d"));
    /* the data area starts 8-aligned, as transformers writes it */
    char *bytes;
    size_t size;
    TEST_OK(gpc_read_file(path, &bytes, &size));
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | (unsigned char)bytes[i];
    assert_int_equal(n % 8, 0);
    assert_int_equal(size, 8 + n + sizeof a + sizeof b + sizeof c);
    assert_non_null(strstr(bytes + 8, "\"__metadata__\":{\"format\":\"pt\"}"));
    gpc_free(bytes);
    gpc_safetensors_close(st);
}

static void test_bad_files(void **state) {
    (void)state;
    gpc_safetensors *st = NULL;
    const char *p;
    p = write_raw("short", 0, "", 0);
    {
        FILE *f = fopen(p, "wb");
        fputs("abc", f);
        fclose(f);
    }
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "truncated");
    p = write_raw("huge", (uint64_t)1 << 63, "{}", 0);
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "over the format's limit");
    p = write_raw("long", 1000, "{}", 0);
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "truncated");
    p = write_raw("notjson", 0, "{\"a\": [1, 2", 0);
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "not valid JSON");
    p = write_raw("array", 0, "[1]", 0);
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "not a JSON object");
    p = write_raw("past", 0, "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
                  8);
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "ends at byte 16 of a 8-byte");
    p = write_raw("overlap", 0,
                  "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                  12);
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "overlaps");
    p = write_raw("hole", 0,
                  "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"v\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                  12);
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "belong to no tensor");
    p = write_raw("tail", 0, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 9);
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "belong to no tensor");
    p = write_raw("shape", 0, "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
                  8);
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "8 bytes for a F32 shape of 3");
    p = write_raw("shape_overflow", 0,
                  "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
                  "\"data_offsets\":[0,8]}}",
                  8);
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "over ");
    p = write_raw("dtype", 0, "{\"w\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "unknown dtype 'Q4'");
    p = write_raw("negative", 0,
                  "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8);
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "not a range");
    p = write_raw("bigint", 0,
                  "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],"
                  "\"data_offsets\":[0,18446744073709551615]}}",
                  8);
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "not valid JSON");
    p = write_raw("dup", 0,
                  "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                  8);
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "not valid JSON");
    p = write_raw("missing", 0, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 0);
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "needs");
    p = write_raw("dims", 0,
                  "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                  "\"data_offsets\":[0,4]}}",
                  4);
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "dimensions");
    /* nesting far deeper than any header: refused, not a stack overflow */
    size_t depth = 100000;
    char *deep = malloc(2 * depth + 16);
    strcpy(deep, "{\"a\":");
    size_t n = strlen(deep);
    for (size_t i = 0; i < depth; i++)
        deep[n++] = '[';
    for (size_t i = 0; i < depth; i++)
        deep[n++] = ']';
    deep[n++] = '}';
    deep[n] = '\0';
    p = write_raw("deep", 0, deep, 0);
    free(deep);
    TEST_FAILS(gpc_safetensors_open(&st, p), GPC_ERR_FORMAT, "not valid JSON");
    TEST_FAILS(gpc_safetensors_open(&st, "/nonexistent/x.safetensors"), GPC_ERR_IO, "cannot open");
    assert_null(st);
    /* an empty header with no data is a valid, empty file */
    p = write_raw("empty", 0, "{}", 0);
    TEST_OK(gpc_safetensors_open(&st, p));
    assert_int_equal(gpc_safetensors_count(st), 0);
    gpc_safetensors_close(st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
