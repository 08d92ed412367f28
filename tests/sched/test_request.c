/*
 * test_request.c: the API request parser: routes, a good submission read
 * back field by field (random values), and every kind of bad input with the
 * status and message it must get.
 */
#include "testutil.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpc/sched.h"

static int parse(const char *method, const char *path, const char *body, gpcd_request *req,
                 char *error) {
    return gpcd_request_parse(method, path, NULL, 0, body, body ? strlen(body) : 0, 1000, "alice",
                              req, error, 512);
}

static void expect(const char *method, const char *path, const char *body, int status,
                   const char *needle) {
    gpcd_request req;
    char error[512] = "";
    int got = parse(method, path, body, &req, error);
    if (got != status || !strstr(error, needle))
        fail_msg("%s %s %s: got %d '%s', want %d with '%s'", method, path, body ? body : "", got,
                 error, status, needle);
    assert_null(req.job);
    gpcd_request_clear(&req);
}

static void test_routes(void **state) {
    (void)state;
    gpcd_request req;
    char error[512];
    assert_int_equal(parse("GET", "/jobs", NULL, &req, error), 200);
    assert_int_equal(req.kind, GPCD_REQ_LIST);
    assert_int_equal(parse("GET", "/jobs/42", NULL, &req, error), 200);
    assert_int_equal(req.kind, GPCD_REQ_SHOW);
    assert_int_equal(req.job_id, 42);
    assert_int_equal(parse("DELETE", "/jobs/7", NULL, &req, error), 200);
    assert_int_equal(req.kind, GPCD_REQ_CANCEL);
    assert_int_equal(req.job_id, 7);
    assert_int_equal(parse("POST", "/jobs/9007199254740992/cancel", NULL, &req, error), 200);
    assert_int_equal(req.job_id, 9007199254740992LL);
    const char *simple[] = {"/gpus", "/alerts", "/metrics", "/status"};
    gpcd_request_kind kinds[] = {GPCD_REQ_GPUS, GPCD_REQ_ALERTS, GPCD_REQ_METRICS, GPCD_REQ_STATUS};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(parse("GET", simple[i], NULL, &req, error), 200);
        assert_int_equal(req.kind, kinds[i]);
    }
    gpcd_query_arg args[] = {{"offset", "123"}, {"limit", "4096"}};
    assert_int_equal(gpcd_request_parse("GET", "/jobs/3/logs", args, 2, NULL, 0, 0, "root", &req,
                                        error, sizeof error),
                     200);
    assert_int_equal(req.kind, GPCD_REQ_LOGS);
    assert_int_equal(req.offset, 123);
    assert_int_equal(req.limit, 4096);
    gpcd_query_arg list_args[] = {{"all", "1"}, {"state", "queued,failed"}};
    assert_int_equal(gpcd_request_parse("GET", "/jobs", list_args, 2, NULL, 0, 0, "root", &req,
                                        error, sizeof error),
                     200);
    assert_int_equal(req.all, 1);
    assert_int_equal(req.state_mask, (1u << GPCD_QUEUED) | (1u << GPCD_FAILED));
    assert_int_equal(req.recent, 0);
    gpcd_query_arg recent_args[] = {{"state", "completed"}, {"recent", "20"}};
    assert_int_equal(gpcd_request_parse("GET", "/jobs", recent_args, 2, NULL, 0, 0, "root", &req,
                                        error, sizeof error),
                     200);
    assert_int_equal(req.recent, 20);
}

static void test_bad_routes(void **state) {
    (void)state;
    expect("GET", "/nope", NULL, 404, "no such endpoint");
    expect("GET", "/jobs/abc", NULL, 404, "not a job id");
    expect("GET", "/jobs/0", NULL, 404, "not a job id");
    expect("GET", "/jobs/99999999999999999", NULL, 404, "not a job id");
    expect("GET", "/jobs/1/other", NULL, 404, "no such endpoint");
    expect("PUT", "/jobs", NULL, 405, "GET or POST");
    expect("POST", "/gpus", NULL, 405, "takes GET");
    expect("GET", "/jobs/1/cancel", NULL, 405, "takes POST");
    expect("POST", "/jobs/1/logs", NULL, 405, "takes GET");
    expect("PATCH", "/jobs/1", NULL, 405, "GET or DELETE");
    gpcd_request req;
    char error[512];
    gpcd_query_arg bad_offset[] = {{"offset", "-1"}};
    assert_int_equal(gpcd_request_parse("GET", "/jobs/3/logs", bad_offset, 1, NULL, 0, 0, "r", &req,
                                        error, sizeof error),
                     400);
    assert_non_null(strstr(error, "offset must be"));
    gpcd_query_arg bad_limit[] = {{"limit", "0"}};
    assert_int_equal(gpcd_request_parse("GET", "/jobs/3/logs", bad_limit, 1, NULL, 0, 0, "r", &req,
                                        error, sizeof error),
                     400);
    assert_non_null(strstr(error, "limit must be"));
    gpcd_query_arg bad_state[] = {{"state", "sleeping"}};
    assert_int_equal(gpcd_request_parse("GET", "/jobs", bad_state, 1, NULL, 0, 0, "r", &req, error,
                                        sizeof error),
                     400);
    assert_non_null(strstr(error, "unknown job state 'sleeping'"));
    gpcd_query_arg bad_all[] = {{"all", "yes"}};
    assert_int_equal(
        gpcd_request_parse("GET", "/jobs", bad_all, 1, NULL, 0, 0, "r", &req, error, sizeof error),
        400);
    assert_non_null(strstr(error, "all must be 1 or 0"));
    const char *bad_recent[] = {"0", "-3", "10001", "ten", "5x", ""};
    for (int i = 0; i < 6; i++) {
        gpcd_query_arg arg[] = {{"recent", bad_recent[i]}};
        assert_int_equal(
            gpcd_request_parse("GET", "/jobs", arg, 1, NULL, 0, 0, "r", &req, error, sizeof error),
            400);
        assert_non_null(strstr(error, "recent must be a number of jobs from 1 to 10000"));
    }
}

static void test_good_submission(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 21);
    for (int trial = 0; trial < 50; trial++) {
        int gpus = 1 + (int)gpc_rng_below(&rng, GPCD_MAX_GPUS);
        int prio = (int)gpc_rng_below(&rng, 101);
        long long mem = (long long)gpc_rng_below(&rng, 1u << 30) * 64;
        int type = (int)gpc_rng_below(&rng, GPCD_TYPE_COUNT);
        double limit = 1 + gpc_rng_below(&rng, 100000);
        char arg[32];
        snprintf(arg, sizeof arg, "x%u", gpc_rng_u32(&rng));
        json_t *o =
            json_pack("{s:[s,s],s:i,s:I,s:i,s:s,s:s,s:f,s:s,s:{s:s},s:s}", "command", "train.sh",
                      arg, "gpus", gpus, "mem", (json_int_t)mem, "priority", prio, "type",
                      gpcd_type_name((gpcd_job_type)type), "data", "/datasets/x", "time_limit",
                      limit, "cwd", "/home/alice", "env", "HOME", "/home/alice", "name", "exp 1");
        char *body = json_dumps(o, 0);
        json_decref(o);
        gpcd_request req;
        char error[512];
        assert_int_equal(parse("POST", "/jobs", body, &req, error), 200);
        free(body);
        gpcd_job *j = req.job;
        assert_non_null(j);
        assert_int_equal(j->gpus, gpus);
        assert_true(j->mem == (uint64_t)mem);
        assert_int_equal(j->priority, prio);
        assert_int_equal(j->type, type);
        assert_true(j->time_limit == limit);
        assert_string_equal(j->data, "/datasets/x");
        assert_string_equal(j->cwd, "/home/alice");
        assert_string_equal(j->owner, "alice");
        assert_int_equal(j->owner_uid, 1000);
        assert_string_equal(j->name, "exp 1");
        assert_true(j->data_hash == gpcd_data_hash("/datasets/x"));
        char want[128];
        snprintf(want, sizeof want, "[\"train.sh\",\"%s\"]", arg);
        assert_string_equal(j->command, want);
        assert_string_equal(j->env, "{\"HOME\":\"/home/alice\"}");
        gpcd_request_clear(&req);
    }
    /* the text forms: sizes, names, durations; defaults for the rest */
    gpcd_request req;
    char error[512];
    assert_int_equal(parse("POST", "/jobs",
                           "{\"command\":[\"a\"],\"mem\":\"40G\",\"priority\":\"high\","
                           "\"time_limit\":\"1h30m\"}",
                           &req, error),
                     200);
    assert_true(req.job->mem == 40ull << 30);
    assert_int_equal(req.job->priority, GPCD_PRIORITY_HIGH);
    assert_true(req.job->time_limit == 5400);
    assert_int_equal(req.job->gpus, 1);
    assert_int_equal(req.job->type, GPCD_TYPE_TRAIN);
    assert_string_equal(req.job->cwd, "/");
    assert_null(req.job->data);
    gpcd_request_clear(&req);
    /* an elastic range; a range of one count is a fixed count */
    assert_int_equal(parse("POST", "/jobs", "{\"command\":[\"a\"],\"gpus\":\"1-4\"}", &req, error),
                     200);
    assert_true(gpcd_job_elastic(req.job));
    assert_int_equal(req.job->gpus_min, 1);
    assert_int_equal(req.job->gpus_max, 4);
    assert_int_equal(req.job->gpus, 4);
    gpcd_request_clear(&req);
    assert_int_equal(parse("POST", "/jobs", "{\"command\":[\"a\"],\"gpus\":\"2-2\"}", &req, error),
                     200);
    assert_false(gpcd_job_elastic(req.job));
    assert_int_equal(req.job->gpus, 2);
    gpcd_request_clear(&req);
}

static void test_bad_submissions(void **state) {
    (void)state;
    expect("POST", "/jobs", NULL, 400, "empty request body");
    expect("POST", "/jobs", "{\"command\":", 400, "not valid JSON");
    expect("POST", "/jobs", "[1,2]", 400, "must be a JSON object");
    expect("POST", "/jobs", "{}", 400, "'command' is missing");
    expect("POST", "/jobs", "{\"command\":[]}", 400, "non-empty array");
    expect("POST", "/jobs", "{\"command\":\"ls\"}", 400, "non-empty array");
    expect("POST", "/jobs", "{\"command\":[1]}", 400, "item 0 is not a string");
    expect("POST", "/jobs", "{\"command\":[\"a\\u0000b\"]}", 400, "not allowed");
    expect("POST", "/jobs", "{\"command\":[\"\"]}", 400, "empty program name");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"command\":[\"b\"]}", 400, "not valid JSON");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"gpus\":0}", 400, "'gpus' must be");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"gpus\":65}", 400, "'gpus' must be");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"gpus\":1.5}", 400, "'gpus' must be");
    const char *ranges[] = {"4-1", "0-2", "1-65", "1-", "-3", "1-2-3", "a", "1 - 2", ""};
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"command\":[\"a\"],\"gpus\":\"%s\"}", ranges[i]);
        expect("POST", "/jobs", body, 400, "or a range \"MIN-MAX\"");
    }
    int lo, hi;
    TEST_FAILS(gpcd_gpus_parse("4-1", &lo, &hi), GPC_ERR_INVALID_ARG,
               "write the smaller count first (1-4)");
    TEST_FAILS(gpcd_gpus_parse("x", &lo, &hi), GPC_ERR_INVALID_ARG, "not N or MIN-MAX");
    TEST_OK(gpcd_gpus_parse("3", &lo, &hi));
    assert_int_equal(lo * 100 + hi, 303);
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"mem\":-1}", 400, "'mem' must be");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"mem\":\"40Q\"}", 400, "'mem': size");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"priority\":101}", 400, "outside 0-100");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"priority\":\"urgent\"}", 400, "'priority'");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"priority\":true}", 400, "'priority' must");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"type\":\"gaming\"}", 400, "'type' must be");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"data\":\"relative/x\"}", 400, "absolute");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"cwd\":5}", 400, "'cwd' must be");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"time_limit\":0}", 400, "'time_limit' must");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"time_limit\":\"soon\"}", 400, "'time_limit'");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"env\":[]}", 400, "'env' must be");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"env\":{\"A=B\":\"c\"}}", 400, "without '='");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"env\":{\"A\":1}}", 400, "string value");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"name\":\"a\\nb\"}", 400, "control character");
    expect("POST", "/jobs", "{\"command\":[\"a\"],\"gpu\":2}", 400, "unknown field 'gpu'");
}

typedef struct {
    char *body;
    int status;
    char error[512];
} deep_case;

static void *parse_deep(void *arg) {
    deep_case *c = arg;
    gpcd_request req;
    c->status = gpcd_request_parse("POST", "/jobs", NULL, 0, c->body, strlen(c->body), 1000,
                                   "alice", &req, c->error, sizeof c->error);
    gpcd_request_clear(&req);
    return NULL;
}

/* {"command": ARRAY} with the string inside `depth` arrays, parsed on a
 * thread with the HTTP threads' stack size, as gpcd parses it. */
static int parse_nested(int depth, char *error) {
    size_t len = 32 + 2 * (size_t)depth;
    deep_case c = {malloc(len), 0, ""};
    assert_non_null(c.body);
    size_t n = (size_t)snprintf(c.body, len, "{\"command\":");
    for (int i = 0; i < depth; i++)
        c.body[n++] = '[';
    n += (size_t)snprintf(c.body + n, len - n, "\"a\"");
    for (int i = 0; i < depth; i++)
        c.body[n++] = ']';
    snprintf(c.body + n, len - n, "}");
    pthread_attr_t attr;
    pthread_t thread;
    assert_int_equal(pthread_attr_init(&attr), 0);
    assert_int_equal(pthread_attr_setstacksize(&attr, GPCD_HTTP_THREAD_STACK), 0);
    assert_int_equal(pthread_create(&thread, &attr, parse_deep, &c), 0);
    pthread_join(thread, NULL);
    pthread_attr_destroy(&attr);
    free(c.body);
    snprintf(error, 512, "%s", c.error);
    return c.status;
}

/* A body nested thousands deep used to overflow an HTTP thread's stack
 * inside jansson: the depth is refused before anything recurses. Brackets
 * inside strings do not count. */
static void test_deep_nesting(void **state) {
    (void)state;
    char error[512];
    int depths[] = {1000, 2047, 100000, 1000000};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(parse_nested(depths[i], error), 400);
        assert_non_null(strstr(error, "more than 16 deep"));
    }
    /* 15 arrays inside the object: 16 levels, the most accepted; the command
     * is then not an array of strings, which is the error it gets */
    assert_int_equal(parse_nested(15, error), 400);
    assert_non_null(strstr(error, "'command' item 0"));
    assert_int_equal(parse_nested(16, error), 400);
    assert_non_null(strstr(error, "more than 16 deep"));
    const char *in_strings[] = {"{\"command\":[\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"]}",
                                "{\"command\":[\"\\\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"]}"};
    for (int i = 0; i < 2; i++) {
        gpcd_request req;
        assert_int_equal(parse("POST", "/jobs", in_strings[i], &req, error), 200);
        assert_non_null(req.job);
        gpcd_request_clear(&req);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routes),          cmocka_unit_test(test_bad_routes),
        cmocka_unit_test(test_good_submission), cmocka_unit_test(test_bad_submissions),
        cmocka_unit_test(test_deep_nesting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
