/*
 * test_dist.c: the data-parallel pieces that need no second process or GPU:
 * bootstrap from the environment (gpc launch, mpirun, srun) and its errors,
 * Slurm node lists, gradient bucket planning against a brute-force check of
 * which gradients are final when, ZeRO-1 shard offsets,
 * the TCP rendezvous across forked processes, and choosing a backend.
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpc/ddp.h"
#include "gpc/dist.h"
#include "testutil.h"

/* ------------------------------------------------------------ environment */

typedef struct {
    const char *pairs[32]; /* name, value, name, value, ..., NULL */
} fake_env;

static const char *fake_get(const char *name, void *user) {
    const fake_env *e = user;
    for (int i = 0; e->pairs[i]; i += 2)
        if (strcmp(e->pairs[i], name) == 0) return e->pairs[i + 1];
    return NULL;
}

static void test_env_sources(void **state) {
    (void)state;
    gpc_dist_env env;
    fake_env none = {{"PATH", "/bin", NULL}};
    TEST_OK(gpc_dist_env_parse(fake_get, &none, &env));
    assert_int_equal(env.world_size, 1);
    assert_string_equal(env.source, "none");

    fake_env launch = {{"GPC_RANK", "3", "GPC_WORLD_SIZE", "8", "GPC_LOCAL_RANK", "1",
                        "GPC_LOCAL_WORLD_SIZE", "2", "GPC_MASTER_ADDR", "node7", "GPC_MASTER_PORT",
                        "29600", "OMPI_COMM_WORLD_RANK", "0", NULL}};
    TEST_OK(gpc_dist_env_parse(fake_get, &launch, &env));
    assert_string_equal(env.source, "gpc launch"); /* gpc launch wins over mpirun */
    assert_int_equal(env.rank, 3);
    assert_int_equal(env.world_size, 8);
    assert_int_equal(env.local_rank, 1);
    assert_int_equal(env.local_world_size, 2);
    assert_string_equal(env.master_addr, "node7");
    assert_int_equal(env.master_port, 29600);

    fake_env mpi = {{"OMPI_COMM_WORLD_RANK", "2", "OMPI_COMM_WORLD_SIZE", "4",
                     "OMPI_COMM_WORLD_LOCAL_RANK", "0", "SLURM_PROCID", "0", "SLURM_STEP_ID", "0",
                     NULL}};
    TEST_OK(gpc_dist_env_parse(fake_get, &mpi, &env));
    assert_string_equal(env.source, "mpirun"); /* mpirun inside an allocation */
    assert_int_equal(env.rank, 2);
    assert_int_equal(env.world_size, 4);

    fake_env slurm = {{"SLURM_PROCID", "5", "SLURM_NTASKS", "16", "SLURM_LOCALID", "1",
                       "SLURM_STEP_ID", "0", "SLURM_JOB_ID", "123456", "SLURM_JOB_NODELIST",
                       "gpu[07-08,11]", NULL}};
    TEST_OK(gpc_dist_env_parse(fake_get, &slurm, &env));
    assert_string_equal(env.source, "slurm");
    assert_int_equal(env.rank, 5);
    assert_int_equal(env.world_size, 16);
    assert_int_equal(env.local_rank, 1);
    assert_string_equal(env.master_addr, "gpu07");
    assert_int_equal(env.master_port, 20000 + 123456 % 20000);

    /* a batch script: SLURM_PROCID without a step is one process */
    fake_env batch = {{"SLURM_PROCID", "0", "SLURM_NTASKS", "16", NULL}};
    TEST_OK(gpc_dist_env_parse(fake_get, &batch, &env));
    assert_int_equal(env.world_size, 1);
}

static void test_env_errors(void **state) {
    (void)state;
    gpc_dist_env env;
    fake_env outside = {{"GPC_RANK", "2", "GPC_WORLD_SIZE", "2", NULL}};
    TEST_FAILS(gpc_dist_env_parse(fake_get, &outside, &env), GPC_ERR_INVALID_ARG,
               "GPC_RANK=2 is outside the world of GPC_WORLD_SIZE=2");
    fake_env word = {{"GPC_RANK", "one", "GPC_WORLD_SIZE", "2", NULL}};
    TEST_FAILS(gpc_dist_env_parse(fake_get, &word, &env), GPC_ERR_INVALID_ARG,
               "GPC_RANK=one is not a non-negative number");
    fake_env no_size = {{"OMPI_COMM_WORLD_RANK", "1", NULL}};
    TEST_FAILS(gpc_dist_env_parse(fake_get, &no_size, &env), GPC_ERR_INVALID_ARG,
               "OMPI_COMM_WORLD_SIZE is not");
    fake_env no_nodes = {{"SLURM_PROCID", "1", "SLURM_NTASKS", "2", "SLURM_STEP_ID", "0", NULL}};
    TEST_FAILS(gpc_dist_env_parse(fake_get, &no_nodes, &env), GPC_ERR_INVALID_ARG,
               "SLURM_JOB_NODELIST is not set");
    fake_env port = {{"GPC_RANK", "0", "GPC_WORLD_SIZE", "2", "GPC_MASTER_PORT", "70000", NULL}};
    TEST_FAILS(gpc_dist_env_parse(fake_get, &port, &env), GPC_ERR_INVALID_ARG, "master port 70000");
}

static void test_slurm_nodelist(void **state) {
    (void)state;
    const char *cases[][2] = {
        {"node[01-04,07],other", "node01"}, {"a,b,c", "a"},       {"gpu-[3-5]", "gpu-3"},
        {"rack[1-2]-n[7-8]", "rack1-n7"},   {"single", "single"}, {"h[9]", "h9"},
        {"x[010-012]y", "x010y"},
    };
    char out[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TEST_OK(gpc_slurm_first_node(cases[i][0], out, sizeof out));
        assert_string_equal(out, cases[i][1]);
    }
    TEST_FAILS(gpc_slurm_first_node("x[1-2", out, sizeof out), GPC_ERR_INVALID_ARG,
               "cannot read the first node");
    TEST_FAILS(gpc_slurm_first_node("", out, sizeof out), GPC_ERR_INVALID_ARG, "empty");
}

/* ------------------------------------------------------------ buckets */

/* Layout offsets as gpt_create computes them. */
static size_t layout(const gpt_config *c, size_t *offsets) {
    size_t L = (size_t)c->layers, C = (size_t)c->channels;
    size_t sizes[GPT_NUM_PARAM_TENSORS] = {(size_t)c->padded_vocab * C,
                                           (size_t)c->max_context * C,
                                           L * C,
                                           L * C,
                                           L * 3 * C * C,
                                           L * 3 * C,
                                           L * C * C,
                                           L * C,
                                           L * C,
                                           L * C,
                                           L * 4 * C * C,
                                           L * 4 * C,
                                           L * C * 4 * C,
                                           L * C,
                                           C,
                                           C};
    size_t off = 0;
    for (int i = 0; i < GPT_NUM_PARAM_TENSORS; i++) {
        offsets[i] = off;
        off += sizes[i];
    }
    return off;
}

/* The hook value at which element e's gradient is final, found by brute
 * force: L for lnf, its layer for per-layer tensors, -1 for wte and wpe. */
static int final_at(const gpt_config *c, const size_t *offsets, size_t P, size_t e) {
    int t = GPT_NUM_PARAM_TENSORS - 1;
    while (offsets[t] > e)
        t--;
    if (t <= 1) return -1;
    if (t >= 14) return c->layers;
    size_t end = t + 1 < GPT_NUM_PARAM_TENSORS ? offsets[t + 1] : P;
    size_t per = (end - offsets[t]) / (size_t)c->layers;
    return (int)((e - offsets[t]) / per);
}

static void test_bucket_plan(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 11);
    for (int trial = 0; trial < 40; trial++) {
        int heads = 1 + (int)gpc_rng_below(&rng, 3);
        gpt_config c;
        TEST_OK(gpt_config_init(
            &c, 1 + (int)gpc_rng_below(&rng, 6), heads, heads * (4 + (int)gpc_rng_below(&rng, 6)),
            4 + (int)gpc_rng_below(&rng, 20), 10 + (int)gpc_rng_below(&rng, 90)));
        size_t offsets[GPT_NUM_PARAM_TENSORS];
        size_t P = layout(&c, offsets);
        assert_int_equal(P, gpt_config_num_params(&c));
        size_t bucket = trial % 5 == 0 ? 0 : 1 + gpc_rng_below(&rng, (uint32_t)(P / 2));
        gpc_ddp_plan plan;
        TEST_OK(gpc_ddp_plan_buckets(&c, offsets, P, bucket, &plan));
        unsigned char *seen = calloc(P, 1);
        int last_ready = c.layers + 1;
        for (int b = 0; b < plan.bucket_count; b++) {
            const gpc_ddp_bucket *k = &plan.buckets[b];
            assert_true(k->ready_layer <= last_ready); /* launch order follows backward */
            last_ready = k->ready_layer;
            size_t elements = 0;
            for (int r = 0; r < k->range_count; r++) {
                const gpc_ddp_range *g = &plan.ranges[k->first_range + r];
                if (r) assert_true(g->offset > plan.ranges[k->first_range + r - 1].offset);
                for (size_t e = g->offset; e < g->offset + g->count; e++) {
                    assert_int_equal(seen[e], 0);
                    seen[e] = 1;
                    /* only gradients final by the time the bucket is launched */
                    assert_true(final_at(&c, offsets, P, e) >= k->ready_layer);
                }
                elements += g->count;
            }
            assert_int_equal(elements, k->elements);
            /* full buckets, except the last of the blocks and wte/wpe */
            if (bucket && b + 2 < plan.bucket_count) assert_true(k->elements >= bucket);
        }
        for (size_t e = 0; e < P; e++)
            assert_int_equal(seen[e], 1);
        if (!bucket) {
            assert_int_equal(plan.bucket_count, 1);
            assert_int_equal(plan.ranges[0].count, P);
        }
        assert_int_equal(plan.buckets[plan.bucket_count - 1].ready_layer, -1);
        free(seen);
        gpc_ddp_plan_free(&plan);
    }
}

static void test_shards(void **state) {
    (void)state;
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 12);
    gpt_config c;
    TEST_OK(gpt_config_init(&c, 3, 2, 16, 12, 70));
    size_t offsets[GPT_NUM_PARAM_TENSORS];
    size_t P = layout(&c, offsets);
    for (int trial = 0; trial < 200; trial++) {
        int W = 1 + (int)gpc_rng_below(&rng, 9);
        size_t align = trial % 2 ? 64 : 1 + gpc_rng_below(&rng, 7);
        size_t sh[10];
        gpc_dist_shard_offsets(P, W, align, sh);
        assert_int_equal(sh[0], 0);
        assert_int_equal(sh[W], P);
        for (int r = 0; r < W; r++) {
            assert_true(sh[r] <= sh[r + 1]);
            if (sh[r + 1] < P) assert_int_equal(sh[r + 1] % align, 0);
        }
    }
}

/* ------------------------------------------------------------ rendezvous */

static int some_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void test_rendezvous(void **state) {
    (void)state;
    int port = some_free_port();
    unsigned char blob[128], want[128];
    gpc_rng rng;
    gpc_rng_seed(&rng, test_seed(), 13);
    for (int i = 0; i < 128; i++)
        want[i] = (unsigned char)gpc_rng_u32(&rng);
    const int world = 4;
    pid_t kids[4];
    for (int r = 1; r < world; r++) {
        kids[r] = fork();
        if (kids[r] == 0) {
            memset(blob, 0, sizeof blob);
            gpc_status s = gpc_dist_rendezvous("127.0.0.1", port, r, world, blob, sizeof blob, 20);
            _exit(s == GPC_OK && memcmp(blob, want, sizeof blob) == 0 ? 0 : 1);
        }
    }
    memcpy(blob, want, sizeof blob);
    TEST_OK(gpc_dist_rendezvous("127.0.0.1", port, 0, world, blob, sizeof blob, 20));
    for (int r = 1; r < world; r++) {
        int status;
        waitpid(kids[r], &status, 0);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    /* nobody listens: a clear message after the timeout, not a hang */
    double t0 = gpc_time_seconds();
    TEST_FAILS(gpc_dist_rendezvous("127.0.0.1", some_free_port(), 1, 2, blob, sizeof blob, 0.3),
               GPC_ERR_IO, "could not reach rank 0");
    assert_true(gpc_time_seconds() - t0 < 5);
    /* rank 0 alone: the others never come */
    TEST_FAILS(gpc_dist_rendezvous("127.0.0.1", some_free_port(), 0, 3, blob, sizeof blob, 0.3),
               GPC_ERR_IO, "only 1 of 3 ranks");
    TEST_FAILS(gpc_dist_rendezvous("", 0, 1, 2, blob, sizeof blob, 1), GPC_ERR_INVALID_ARG,
               "GPC_MASTER_ADDR");
}

/* ------------------------------------------------------------ backends */

static void test_backends(void **state) {
    (void)state;
    gpc_dist_env env;
    memset(&env, 0, sizeof env);
    env.world_size = 1;
    env.source = "none";
    gpc_dist *d;
    TEST_OK(gpc_dist_create(&d, &env, gpc_cpu(), "auto"));
    assert_string_equal(d->ops->name, "none");
    float x[3] = {1.5f, -2.0f, 3.25f};
    size_t offs[2] = {0, 3};
    TEST_OK(d->ops->all_reduce_sum(d, x, 3, GPC_F32, NULL));
    TEST_OK(d->ops->reduce_scatter_sum(d, x, offs, GPC_F32, NULL));
    TEST_OK(d->ops->all_gather(d, x, offs, GPC_F32, NULL));
    double h[2] = {0.5, 7};
    TEST_OK(d->ops->all_reduce_host(d, h, 2));
    assert_true(x[0] == 1.5f && x[1] == -2.0f && x[2] == 3.25f && h[0] == 0.5 && h[1] == 7);
    gpc_dist_destroy(d);

    TEST_FAILS(gpc_dist_create(&d, &env, gpc_cpu(), "gloo"), GPC_ERR_INVALID_ARG,
               "unknown collective backend 'gloo'");
    env.world_size = 2;
    env.source = "gpc launch";
    TEST_FAILS(gpc_dist_create(&d, &env, gpc_cpu(), "none"), GPC_ERR_INVALID_ARG,
               "serve one process, not 2");
    TEST_FAILS(gpc_dist_create(&d, &env, gpc_cpu(), "nccl"), GPC_ERR_UNSUPPORTED,
               "mpirun -np 2 gpc train");
    if (gpc_dist_have_mpi())
        TEST_FAILS(gpc_dist_create(&d, &env, gpc_cpu(), "auto"), GPC_ERR_INVALID_ARG,
                   "need processes started by mpirun (found gpc launch)");
    else
        TEST_FAILS(gpc_dist_create(&d, &env, gpc_cpu(), "auto"), GPC_ERR_UNSUPPORTED,
                   "built without MPI");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_sources),    cmocka_unit_test(test_env_errors),
        cmocka_unit_test(test_slurm_nodelist), cmocka_unit_test(test_bucket_plan),
        cmocka_unit_test(test_shards),         cmocka_unit_test(test_rendezvous),
        cmocka_unit_test(test_backends),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
